#include "slimquant/core/tensor_slices.h"

#include <algorithm>
#include <cstring>

namespace slimquant {

namespace {

// A tensor seen as [outer, extent, inner bytes] around `axis`.
struct AxisLayout {
  size_t outer = 1, extent = 0, inner_bytes = 0;
};

AxisLayout layout_around(const Tensor& t, size_t axis) {
  AxisLayout l;
  for (size_t d = 0; d < axis; ++d) l.outer *= static_cast<size_t>(t.dim(d));
  l.extent = static_cast<size_t>(t.dim(axis));
  l.inner_bytes = dtype_size(t.dtype());
  for (size_t d = axis + 1; d < t.rank(); ++d) l.inner_bytes *= static_cast<size_t>(t.dim(d));
  return l;
}

}  // namespace

Tensor slice_along(const Tensor& t, size_t axis, int64_t first, int64_t count) {
  SQ_CHECK(axis < t.rank() && first >= 0 && count >= 0 && first + count <= t.dim(axis), ErrorKind::kInvalidArgument,
           "tensor of shape " + shape_str(t.shape()) + " has no entries " + std::to_string(first) + ".." +
               std::to_string(first + count) + " along axis " + std::to_string(axis));
  Shape shape = t.shape();
  shape[axis] = count;
  Tensor out(t.dtype(), std::move(shape));
  const AxisLayout l = layout_around(t, axis);
  const size_t taken = static_cast<size_t>(count) * l.inner_bytes;
  const auto* src = static_cast<const std::byte*>(t.raw()) + static_cast<size_t>(first) * l.inner_bytes;
  auto* dst = static_cast<std::byte*>(out.raw());
  for (size_t o = 0; o < l.outer && taken > 0; ++o)
    std::memcpy(dst + o * taken, src + o * l.extent * l.inner_bytes, taken);
  return out;
}

Tensor concat_along(const std::vector<Tensor>& parts, size_t axis) {
  SQ_CHECK(!parts.empty(), ErrorKind::kInvalidArgument, "concat_along: no tensors");
  const Tensor& first = parts.front();
  SQ_CHECK(axis < first.rank(), ErrorKind::kInvalidArgument,
           "concat_along: axis " + std::to_string(axis) + " of a tensor of shape " + shape_str(first.shape()));
  Shape shape = first.shape();
  shape[axis] = 0;
  for (const Tensor& p : parts) {
    bool fits = p.dtype() == first.dtype() && p.rank() == first.rank();
    for (size_t d = 0; fits && d < p.rank(); ++d) fits = d == axis || p.dim(d) == first.dim(d);
    SQ_CHECK(fits, ErrorKind::kInvalidArgument,
             "concat_along: shapes " + shape_str(first.shape()) + " and " + shape_str(p.shape()) +
                 " differ off axis " + std::to_string(axis) + " (or their dtypes do)");
    shape[axis] += p.dim(axis);
  }
  Tensor out(first.dtype(), std::move(shape));
  int64_t at = 0;
  for (const Tensor& p : parts) {
    copy_along(p, out, axis, at);
    at += p.dim(axis);
  }
  return out;
}

void copy_along(const Tensor& part, Tensor& whole, size_t axis, int64_t first) {
  bool fits = part.dtype() == whole.dtype() && part.rank() == whole.rank() && axis < whole.rank() && first >= 0 &&
              first + part.dim(axis) <= whole.dim(axis);
  for (size_t d = 0; fits && d < part.rank(); ++d) fits = d == axis || part.dim(d) == whole.dim(d);
  SQ_CHECK(fits, ErrorKind::kInvalidArgument,
           "copy_along: " + shape_str(part.shape()) + " does not fit into " + shape_str(whole.shape()) + " at " +
               std::to_string(first) + " along axis " + std::to_string(axis));
  const AxisLayout l = layout_around(part, axis), w = layout_around(whole, axis);
  const size_t block = l.extent * l.inner_bytes;
  const auto* src = static_cast<const std::byte*>(part.raw());
  auto* dst = static_cast<std::byte*>(whole.raw()) + static_cast<size_t>(first) * w.inner_bytes;
  for (size_t o = 0; o < l.outer && block > 0; ++o)
    std::memcpy(dst + o * w.extent * w.inner_bytes, src + o * block, block);
}

}  // namespace slimquant
