// GatherND, ScatterND, ScatterElements (and its opset 9-10 name Scatter).
//
// Each op first turns its index tensor into offsets, validating and wrapping every index (negative
// ones count from the end), so nothing is written before an out-of-range index is reported. The
// scatters then copy `data` to the output and apply the updates in index order: with duplicate
// indices and reduction none the last update wins; add/mul/max/min fold every update in.
#include <cmath>
#include <cstring>
#include <type_traits>

#include "runtime/kernels/shape/index_common.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::indexing {

namespace {

// ---- shared scatter machinery ------------------------------------------------------------------

enum class Reduction { kNone, kAdd, kMul, kMax, kMin };

// The `reduction` attribute (opset 16: none/add/mul, opset 18: max/min); absent means none.
Reduction parse_reduction(const ir::Node& node) {
  const std::string r = node.attr_string("reduction", "none");
  if (r == "none") return Reduction::kNone;
  if (r == "add") return Reduction::kAdd;
  if (r == "mul") return Reduction::kMul;
  if (r == "max") return Reduction::kMax;
  if (r == "min") return Reduction::kMin;
  fail(ErrorKind::kInvalidModel,
       node.describe() + ": unknown reduction '" + r + "' (expected none, add, mul, max or min)");
}

// x combined with update u. Integers wrap (two's complement, computed in uint64) rather than
// overflow; bool add/mul act as or/and; float max/min propagate NaN (numpy.maximum/minimum).
template <Reduction R, typename T>
inline T combine(T x, T u) {
  if constexpr (R == Reduction::kAdd || R == Reduction::kMul) {
    if constexpr (std::is_integral_v<T>) {
      const uint64_t a = static_cast<uint64_t>(x), b = static_cast<uint64_t>(u);
      return static_cast<T>(R == Reduction::kAdd ? a + b : a * b);
    } else {
      return R == Reduction::kAdd ? x + u : x * u;
    }
  } else {
    const bool take_u = R == Reduction::kMax ? u > x : u < x;
    if constexpr (std::is_floating_point_v<T>) return take_u || std::isnan(u) ? u : x;
    else return take_u ? u : x;
  }
}

template <Reduction R, typename T>
void scatter_reduce(T* out, const T* updates, std::span<const int64_t> dst_offsets, int64_t slice) {
  for (size_t t = 0; t < dst_offsets.size(); ++t) {
    T* o = out + dst_offsets[t];
    const T* u = updates + static_cast<int64_t>(t) * slice;
    for (int64_t j = 0; j < slice; ++j) o[j] = combine<R>(o[j], u[j]);
  }
}

// Applies update slice t (`slice` elements, contiguous in `updates`) at element offset
// dst_offsets[t] of `out`, in order, so duplicates behave as described at the top of the file.
void scatter_slices(Tensor& out, const Tensor& updates, std::span<const int64_t> dst_offsets, int64_t slice,
                    Reduction reduction) {
  if (slice == 0 || dst_offsets.empty()) return;
  if (reduction == Reduction::kNone) {
    const size_t block = static_cast<size_t>(slice) * dtype_size(out.dtype());
    const auto* src = static_cast<const std::byte*>(updates.raw());
    auto* dst = static_cast<std::byte*>(out.raw());
    const int64_t es = static_cast<int64_t>(dtype_size(out.dtype()));
    shape::dispatch_elem_size(block, [&](auto sz) {
      constexpr size_t N = decltype(sz)::value;
      const int64_t bs = static_cast<int64_t>(block);
      for (size_t t = 0; t < dst_offsets.size(); ++t)
        shape::copy_elem<N>(dst + dst_offsets[t] * es, src + static_cast<int64_t>(t) * bs, block);
    });
    return;
  }
  dispatch_dtype(out.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* o = out.data<T>();
    const T* u = updates.data<T>();
    switch (reduction) {
      case Reduction::kAdd: scatter_reduce<Reduction::kAdd>(o, u, dst_offsets, slice); break;
      case Reduction::kMul: scatter_reduce<Reduction::kMul>(o, u, dst_offsets, slice); break;
      case Reduction::kMax: scatter_reduce<Reduction::kMax>(o, u, dst_offsets, slice); break;
      case Reduction::kMin: scatter_reduce<Reduction::kMin>(o, u, dst_offsets, slice); break;
      case Reduction::kNone: break;
    }
  });
}

// Output 0 = a copy of data, with updates checked to have data's dtype.
Tensor& copy_data_to_output(KernelContext& ctx, const Tensor& data, const Tensor& updates) {
  if (updates.dtype() != data.dtype())
    fail(ErrorKind::kInvalidModel, ctx.node().describe() + ": updates are " + dtype_name(updates.dtype()) +
                                       " but data is " + dtype_name(data.dtype()));
  Tensor& y = ctx.allocate_output(0, data.dtype(), data.shape());
  if (data.nbytes() > 0) std::memcpy(y.raw(), data.raw(), data.nbytes());
  return y;
}

// Shape of the first `n` dims of s, and of the dims from `n` on.
Shape head(const Shape& s, size_t n) { return Shape(s.begin(), s.begin() + static_cast<std::ptrdiff_t>(n)); }
Shape tail(const Shape& s, size_t n) { return Shape(s.begin() + static_cast<std::ptrdiff_t>(n), s.end()); }

// ---- GatherND ----------------------------------------------------------------------------------

// data [B..., D..., S...] (b batch dims, k indexed dims), indices [B..., I..., k]:
// output [B..., I..., S...], each S-slice copied from data[batch, index tuple].
class GatherNDKernel : public Kernel {
 public:
  explicit GatherNDKernel(const KernelInit& init) : batch_dims_(init.node.attr_int("batch_dims", 0)) {}

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& data = ctx.input(0);
    const Tensor& idx_t = ctx.input(1);
    const size_t r = data.rank(), q = idx_t.rank();
    if (q == 0 || r == 0)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": data " + shape_str(data.shape()) + " and indices " +
                                            shape_str(idx_t.shape()) + " must both have rank >= 1");
    if (batch_dims_ < 0 || static_cast<size_t>(batch_dims_) >= std::min(q, r))
      fail(ErrorKind::kInvalidModel, node.describe() + ": batch_dims " + std::to_string(batch_dims_) +
                                         " must be in [0, min(rank(data), rank(indices)))");
    const size_t b = static_cast<size_t>(batch_dims_);
    const int64_t k = idx_t.dim(q - 1);
    if (k < 1 || b + static_cast<size_t>(k) > r)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": indices " + shape_str(idx_t.shape()) +
                                            " have tuples of length " + std::to_string(k) + ", data " +
                                            shape_str(data.shape()) + " allows 1 to " + std::to_string(r - b));
    if (head(data.shape(), b) != head(idx_t.shape(), b))
      fail(ErrorKind::kInvalidArgument, node.describe() + ": the " + std::to_string(b) + " batch dims of data " +
                                            shape_str(data.shape()) + " and indices " + shape_str(idx_t.shape()) +
                                            " differ");
    const size_t ku = static_cast<size_t>(k);
    Shape out_shape = head(idx_t.shape(), q - 1);
    const Shape slice_shape = tail(data.shape(), b + ku);
    out_shape.insert(out_shape.end(), slice_shape.begin(), slice_shape.end());
    Tensor& y = ctx.allocate_output(0, data.dtype(), out_shape);

    // Offsets in whole slices: data viewed as [B..., D...] blocks of one slice each.
    const Shape block_grid = head(data.shape(), b + ku);
    const std::vector<int64_t> block_strides = contiguous_strides(block_grid);
    const int64_t blocks_per_batch = shape_numel(tail(block_grid, b));
    const int64_t batches = shape_numel(head(data.shape(), b));
    const int64_t tuples = shape_numel(head(idx_t.shape(), q - 1));
    const int64_t tuples_per_batch = batches == 0 ? 0 : tuples / batches;
    const std::vector<int64_t> idx = read_indices(idx_t, node, "indices");
    std::vector<int64_t> src_blocks(static_cast<size_t>(tuples));
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t off = t / tuples_per_batch * blocks_per_batch;
      for (size_t j = 0; j < ku; ++j)
        off += wrap_index(idx[static_cast<size_t>(t * k) + j], data.dim(b + j), node, "index") * block_strides[b + j];
      src_blocks[static_cast<size_t>(t)] = off;
    }
    gather_blocks(y.raw(), data.raw(), src_blocks,
                  static_cast<size_t>(shape_numel(slice_shape)) * dtype_size(data.dtype()));
  }

 private:
  int64_t batch_dims_;
};

// ---- ScatterND ---------------------------------------------------------------------------------

// data [D..., S...] (k indexed dims), indices [I..., k], updates [I..., S...]: output = data with
// the S-slice at each index tuple replaced by (or reduced with) the matching updates slice.
class ScatterNDKernel : public Kernel {
 public:
  explicit ScatterNDKernel(const KernelInit& init) : reduction_(parse_reduction(init.node)) {}

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& data = ctx.input(0);
    const Tensor& idx_t = ctx.input(1);
    const Tensor& updates = ctx.input(2);
    const size_t r = data.rank(), q = idx_t.rank();
    if (q == 0)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": indices must have rank >= 1, got a scalar");
    const int64_t k = idx_t.dim(q - 1);
    if (k < 0 || static_cast<size_t>(k) > r)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": indices " + shape_str(idx_t.shape()) +
                                            " have tuples of length " + std::to_string(k) + ", more than rank " +
                                            std::to_string(r) + " of data " + shape_str(data.shape()));
    const size_t ku = static_cast<size_t>(k);
    Shape want_updates = head(idx_t.shape(), q - 1);
    const Shape slice_shape = tail(data.shape(), ku);
    want_updates.insert(want_updates.end(), slice_shape.begin(), slice_shape.end());
    if (updates.shape() != want_updates)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": updates " + shape_str(updates.shape()) +
                                            " must have shape " + shape_str(want_updates) + " for data " +
                                            shape_str(data.shape()) + " and indices " + shape_str(idx_t.shape()));

    const std::vector<int64_t> strides = contiguous_strides(data.shape());
    const int64_t tuples = shape_numel(head(idx_t.shape(), q - 1));
    const std::vector<int64_t> idx = read_indices(idx_t, node, "indices");
    std::vector<int64_t> dst_offsets(static_cast<size_t>(tuples));
    for (int64_t t = 0; t < tuples; ++t) {
      int64_t off = 0;
      for (size_t j = 0; j < ku; ++j)
        off += wrap_index(idx[static_cast<size_t>(t * k) + j], data.dim(j), node, "index") * strides[j];
      dst_offsets[static_cast<size_t>(t)] = off;
    }
    Tensor& y = copy_data_to_output(ctx, data, updates);
    scatter_slices(y, updates, dst_offsets, shape_numel(slice_shape), reduction_);
  }

 private:
  Reduction reduction_;
};

// ---- ScatterElements / Scatter -----------------------------------------------------------------

// indices and updates share a shape of data's rank; element p of updates goes to data at p with
// p[axis] replaced by indices[p].
class ScatterElementsKernel : public Kernel {
 public:
  explicit ScatterElementsKernel(const KernelInit& init)
      : axis_(init.node.attr_int("axis", 0)), reduction_(parse_reduction(init.node)) {}

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& data = ctx.input(0);
    const Tensor& idx_t = ctx.input(1);
    const Tensor& updates = ctx.input(2);
    const size_t r = data.rank();
    if (r == 0 || idx_t.rank() != r)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": indices " + shape_str(idx_t.shape()) +
                                            " must have the rank of data " + shape_str(data.shape()) + " (>= 1)");
    if (updates.shape() != idx_t.shape())
      fail(ErrorKind::kInvalidArgument, node.describe() + ": updates " + shape_str(updates.shape()) +
                                            " must have the shape of indices " + shape_str(idx_t.shape()));
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(r), node.describe()));
    for (size_t d = 0; d < r; ++d)
      if (d != axis && idx_t.dim(d) > data.dim(d))
        fail(ErrorKind::kInvalidArgument, node.describe() + ": indices " + shape_str(idx_t.shape()) +
                                              " exceed data " + shape_str(data.shape()) + " on axis " +
                                              std::to_string(d));

    const std::vector<int64_t> ds = contiguous_strides(data.shape());
    const std::vector<int64_t> idx = read_indices(idx_t, node, "indices");
    std::vector<int64_t> dst_offsets(idx.size());
    if (!idx.empty()) {
      // Walk indices row by row (last dim); `pos` is the row's position in the other dims.
      const int64_t last = idx_t.dim(r - 1), axis_dim = data.dim(axis), ax_stride = ds[axis];
      const int64_t last_stride = axis == r - 1 ? 0 : ds[r - 1];
      std::vector<int64_t> pos(r, 0);
      for (size_t row_start = 0; row_start < idx.size(); row_start += static_cast<size_t>(last)) {
        int64_t base = 0;
        for (size_t d = 0; d + 1 < r; ++d)
          if (d != axis) base += pos[d] * ds[d];
        for (int64_t j = 0; j < last; ++j) {
          const size_t e = row_start + static_cast<size_t>(j);
          dst_offsets[e] = base + j * last_stride + wrap_index(idx[e], axis_dim, node, "index") * ax_stride;
        }
        for (size_t d = r - 1; d-- > 0;) {
          if (++pos[d] < idx_t.dim(d)) break;
          pos[d] = 0;
        }
      }
    }
    Tensor& y = copy_data_to_output(ctx, data, updates);
    scatter_slices(y, updates, dst_offsets, 1, reduction_);
  }

 private:
  int64_t axis_;
  Reduction reduction_;
};

}  // namespace

std::unique_ptr<Kernel> make_gather_nd(const KernelInit& init) { return std::make_unique<GatherNDKernel>(init); }
std::unique_ptr<Kernel> make_scatter_nd(const KernelInit& init) { return std::make_unique<ScatterNDKernel>(init); }
std::unique_ptr<Kernel> make_scatter_elements(const KernelInit& init) {
  return std::make_unique<ScatterElementsKernel>(init);
}

}  // namespace slimquant::runtime::indexing
