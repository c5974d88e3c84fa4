// Byte movers and argument readers shared by the shape kernels (see shape_common.h).
#include <algorithm>

#include "runtime/kernels/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

// One dim of a strided view: extent, source stride and destination stride, both in bytes.
struct ViewDim {
  int64_t n;
  int64_t src;
  int64_t dst;
};

// Calls fn(src_offset, dst_offset) for every multi-index over `dims` (row-major order), keeping
// the offsets up to date incrementally instead of recomputing them from the index.
template <typename Fn>
void for_each_index(const std::vector<ViewDim>& dims, Fn&& fn) {
  const size_t k = dims.size();
  if (k == 0) {
    fn(int64_t{0}, int64_t{0});
    return;
  }
  int64_t total = 1;
  for (const ViewDim& d : dims) total *= d.n;
  std::vector<int64_t> idx(k, 0);
  int64_t so = 0, dof = 0;
  for (int64_t it = 0; it < total; ++it) {
    fn(so, dof);
    for (size_t d = k; d-- > 0;) {
      so += dims[d].src;
      dof += dims[d].dst;
      if (++idx[d] < dims[d].n) break;
      so -= dims[d].src * dims[d].n;
      dof -= dims[d].dst * dims[d].n;
      idx[d] = 0;
    }
  }
}

// Tile edge for the 2-D transposing copy: 32x32 elements of up to 16 bytes stay within L1.
constexpr int64_t kTile = 32;

template <size_t N>
void copy_rows(std::byte* dst, const std::byte* src, const std::vector<ViewDim>& outer, const ViewDim& inner,
               size_t block) {
  const int64_t n = inner.n, s = inner.src;
  for_each_index(outer, [&](int64_t so, int64_t dof) {
    const std::byte* sp = src + so;
    std::byte* dp = dst + dof;
    for (int64_t i = 0; i < n; ++i) copy_elem<N>(dp + i * static_cast<int64_t>(block), sp + i * s, block);
  });
}

// Copies a 2-D block where dim `a` is contiguous in src and dim `b` is contiguous in dst,
// tile by tile so both the strided reads and the strided writes hit cache.
template <size_t N>
void copy_tiled(std::byte* dst, const std::byte* src, const std::vector<ViewDim>& outer, const ViewDim& a,
                const ViewDim& b, size_t block) {
  const int64_t bs = static_cast<int64_t>(block);
  for_each_index(outer, [&](int64_t so, int64_t dof) {
    const std::byte* sp = src + so;
    std::byte* dp = dst + dof;
    for (int64_t a0 = 0; a0 < a.n; a0 += kTile) {
      const int64_t a1 = std::min(a.n, a0 + kTile);
      for (int64_t b0 = 0; b0 < b.n; b0 += kTile) {
        const int64_t b1 = std::min(b.n, b0 + kTile);
        for (int64_t i = a0; i < a1; ++i) {
          const std::byte* s = sp + i * bs;
          std::byte* d = dp + i * a.dst;
          for (int64_t j = b0; j < b1; ++j) copy_elem<N>(d + j * bs, s + j * b.src, block);
        }
      }
    }
  });
}

}  // namespace

void fill_elems(void* dst, const void* value, size_t elem_size, int64_t count) {
  if (count <= 0) return;
  auto* d = static_cast<std::byte*>(dst);
  const auto* v = static_cast<const std::byte*>(value);
  // All-zero patterns (the common pad/constant value) are one memset.
  if (std::all_of(v, v + elem_size, [](std::byte b) { return b == std::byte{0}; })) {
    std::memset(d, 0, elem_size * static_cast<size_t>(count));
    return;
  }
  dispatch_elem_size(elem_size, [&](auto n) {
    constexpr size_t N = decltype(n)::value;
    for (int64_t i = 0; i < count; ++i) copy_elem<N>(d + i * static_cast<int64_t>(elem_size), v, elem_size);
  });
}

void strided_copy(void* dst_v, const void* src_v, const Shape& shape, const std::vector<int64_t>& src_strides,
                  size_t elem_size) {
  auto* dst = static_cast<std::byte*>(dst_v);
  const auto* src = static_cast<const std::byte*>(src_v);
  const int64_t es = static_cast<int64_t>(elem_size);

  // Drop size-1 dims, merge a dim into the next-inner one when the pair is contiguous in src
  // (dst is contiguous, so always mergeable there).
  std::vector<ViewDim> dims;
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] == 0) return;
    if (shape[d] == 1) continue;
    ViewDim v{shape[d], src_strides[d] * es, 0};
    if (!dims.empty() && dims.back().src == v.src * v.n) dims.back() = {dims.back().n * v.n, v.src, 0};
    else dims.push_back(v);
  }
  // A contiguous innermost dim becomes part of the element: one memcpy per run.
  size_t block = elem_size;
  if (!dims.empty() && dims.back().src == es) {
    block *= static_cast<size_t>(dims.back().n);
    dims.pop_back();
  }
  if (dims.empty()) {
    std::memcpy(dst, src, block);
    return;
  }
  int64_t dstride = static_cast<int64_t>(block);
  for (size_t d = dims.size(); d-- > 0;) {
    dims[d].dst = dstride;
    dstride *= dims[d].n;
  }

  const ViewDim inner = dims.back();
  // Transposing views: some outer dim is the one contiguous in src; copy (that dim x innermost)
  // in tiles. Small extents gain nothing from tiling.
  std::optional<size_t> contiguous;
  for (size_t d = 0; d + 1 < dims.size(); ++d)
    if (dims[d].src == static_cast<int64_t>(block) && dims[d].n >= 8) contiguous = d;
  if (contiguous && inner.n >= 8) {
    const ViewDim a = dims[*contiguous];
    std::vector<ViewDim> outer;
    for (size_t d = 0; d + 1 < dims.size(); ++d)
      if (d != *contiguous) outer.push_back(dims[d]);
    dispatch_elem_size(block, [&](auto n) { copy_tiled<decltype(n)::value>(dst, src, outer, a, inner, block); });
    return;
  }
  dims.pop_back();
  dispatch_elem_size(block, [&](auto n) { copy_rows<decltype(n)::value>(dst, src, dims, inner, block); });
}

void transpose_bytes(void* dst, const void* src, const Shape& in_shape, const std::vector<int64_t>& perm,
                     size_t elem_size) {
  const std::vector<int64_t> in_strides = contiguous_strides(in_shape);
  Shape out_shape(perm.size());
  std::vector<int64_t> strides(perm.size());
  for (size_t d = 0; d < perm.size(); ++d) {
    out_shape[d] = in_shape[static_cast<size_t>(perm[d])];
    strides[d] = in_strides[static_cast<size_t>(perm[d])];
  }
  strided_copy(dst, src, out_shape, strides, elem_size);
}

bool output_requested(const KernelContext& ctx, size_t i) {
  if (i >= ctx.num_outputs()) return false;
  const auto& names = ctx.node().outputs;
  return i >= names.size() || !names[i].empty();
}

std::vector<int64_t> read_ints(const Tensor& t, const ir::Node& node, const std::string& what) {
  switch (t.dtype()) {
    case DType::kInt64:
    case DType::kInt32:
    case DType::kInt16:
    case DType::kInt8:
    case DType::kUInt8:
    case DType::kUInt16:
    case DType::kUInt32:
    case DType::kUInt64: return t.to_int64_vector();
    default:
      fail(ErrorKind::kInvalidModel, node.describe() + ": " + what + " must be an integer tensor, got " +
                                         dtype_name(t.dtype()));
  }
}

int64_t checked_numel(const Shape& s, const ir::Node& node, const std::string& what) {
  for (int64_t d : s)
    SQ_CHECK(d >= 0, ErrorKind::kInvalidArgument,
             node.describe() + ": " + what + " " + shape_str(s) + " has a negative dimension");
  return shape_numel(s);
}

IntListArg IntListArg::from_attr(const ir::Node& node, const std::string& attr) {
  IntListArg a;
  if (node.has_attr(attr)) a.cached_ = node.attr_ints(attr);
  return a;
}

IntListArg IntListArg::from_input(const KernelInit& init, size_t input, std::string what) {
  IntListArg a;
  a.input_ = static_cast<int>(input);
  a.what_ = std::move(what);
  if (!init.node.input(input).empty() && init.constant_input)
    if (const Tensor* t = init.constant_input(input)) a.cached_ = read_ints(*t, init.node, a.what_);
  return a;
}

std::vector<int64_t> IntListArg::get(const KernelContext& ctx) const {
  if (cached_) return *cached_;
  if (input_ >= 0 && ctx.has_input(static_cast<size_t>(input_)))
    return read_ints(ctx.input(static_cast<size_t>(input_)), ctx.node(), what_);
  return {};
}

}  // namespace slimquant::runtime::shape
