// Slice, Gather, GatherElements: index-driven reads. Slice is one strided view copy (contiguous
// runs become memcpy); Gather copies whole inner blocks per index.
#include <algorithm>
#include <limits>

#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

// ---- Slice -------------------------------------------------------------------------------------

class SliceKernel : public Kernel {
 public:
  explicit SliceKernel(const KernelInit& init) {
    // Slice-1: starts/ends/axes attributes, no steps. Slice-10+: inputs 1..4.
    if (init.opset < 10) {
      starts_ = IntListArg::from_attr(init.node, "starts");
      ends_ = IntListArg::from_attr(init.node, "ends");
      axes_ = IntListArg::from_attr(init.node, "axes");
    } else {
      starts_ = IntListArg::from_input(init, 1, "starts");
      ends_ = IntListArg::from_input(init, 2, "ends");
      axes_ = IntListArg::from_input(init, 3, "axes");
      steps_ = IntListArg::from_input(init, 4, "steps");
    }
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const int64_t r = static_cast<int64_t>(x.rank());
    const std::vector<int64_t> starts = starts_.get(ctx), ends = ends_.get(ctx);
    std::vector<int64_t> axes = axes_.get(ctx), steps = steps_.get(ctx);
    if (!axes_.present(ctx))
      for (size_t i = 0; i < starts.size(); ++i) axes.push_back(static_cast<int64_t>(i));
    if (!steps_.present(ctx)) steps.assign(starts.size(), 1);
    if (ends.size() != starts.size() || axes.size() != starts.size() || steps.size() != starts.size())
      fail(ErrorKind::kInvalidModel, node.describe() + ": starts/ends/axes/steps have different lengths (" +
                                         std::to_string(starts.size()) + "/" + std::to_string(ends.size()) + "/" +
                                         std::to_string(axes.size()) + "/" + std::to_string(steps.size()) + ")");

    Shape out_shape = x.shape();
    std::vector<int64_t> first(static_cast<size_t>(r), 0), step(static_cast<size_t>(r), 1);
    std::vector<bool> seen(static_cast<size_t>(r), false);
    for (size_t i = 0; i < starts.size(); ++i) {
      const size_t a = static_cast<size_t>(normalize_axis(axes[i], r, node.describe()));
      if (seen[a]) fail(ErrorKind::kInvalidModel, node.describe() + ": axis " + std::to_string(a) + " sliced twice");
      seen[a] = true;
      const int64_t s = steps[i], dim = x.dim(a);
      if (s == 0) fail(ErrorKind::kInvalidModel, node.describe() + ": step 0 on axis " + std::to_string(a));
      // Negative starts/ends count from the end; then clamp to the range the step direction can
      // reach ([0, dim] forward, [-1, dim-1] backward). INT64_MAX/INT64_MIN ends just clamp.
      int64_t b = starts[i], e = ends[i];
      if (b < 0) b = b < -dim ? -1 : b + dim;
      if (e < 0) e = e < -dim ? -1 : e + dim;
      int64_t count;
      if (s > 0) {
        b = std::clamp<int64_t>(b, 0, dim);
        e = std::clamp<int64_t>(e, 0, dim);
        count = e > b ? (e - b - 1) / s + 1 : 0;
      } else {
        b = std::clamp<int64_t>(b, 0, dim - 1);
        e = std::clamp<int64_t>(e, -1, dim - 1);
        // -s overflows for INT64_MIN: divide by the magnitude unsigned.
        count = b > e ? static_cast<int64_t>(static_cast<uint64_t>(b - e - 1) / (0 - static_cast<uint64_t>(s))) + 1 : 0;
      }
      out_shape[a] = count;
      first[a] = b;
      step[a] = s;
    }
    if (out_shape == x.shape() && std::all_of(step.begin(), step.end(), [](int64_t s) { return s == 1; })) {
      ctx.set_output(0, x);  // the whole tensor: a view
      return;
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    if (y.numel() == 0) return;
    const std::vector<int64_t> in_strides = contiguous_strides(x.shape());
    std::vector<int64_t> strides(static_cast<size_t>(r));
    int64_t base = 0;
    for (size_t d = 0; d < static_cast<size_t>(r); ++d) {
      base += first[d] * in_strides[d];
      strides[d] = in_strides[d] * step[d];
    }
    const size_t es = dtype_size(x.dtype());
    strided_copy(y.raw(), static_cast<const std::byte*>(x.raw()) + base * static_cast<int64_t>(es), out_shape,
                 strides, es);
  }

 private:
  IntListArg starts_, ends_, axes_, steps_;
};

// ---- Gather ------------------------------------------------------------------------------------

// Index values widened to int64 with negative ones wrapped; throws naming the bad index.
std::vector<int64_t> gather_indices(const Tensor& idx, int64_t dim, const ir::Node& node) {
  if (idx.dtype() != DType::kInt64 && idx.dtype() != DType::kInt32)
    fail(ErrorKind::kInvalidModel, node.describe() + ": indices must be int32 or int64, got " + dtype_name(idx.dtype()));
  std::vector<int64_t> v = idx.to_int64_vector();
  for (int64_t& i : v) {
    if (i < -dim || i >= dim)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": index " + std::to_string(i) +
                                            " out of range for axis of size " + std::to_string(dim));
    if (i < 0) i += dim;
  }
  return v;
}

class GatherKernel : public Kernel {
 public:
  explicit GatherKernel(const KernelInit& init) : axis_(init.node.attr_int("axis", 0)) {}

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const Tensor& idx_t = ctx.input(1);
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank()), node.describe()));
    const int64_t dim = x.dim(axis);
    const std::vector<int64_t> idx = gather_indices(idx_t, dim, node);

    Shape out_shape(x.shape().begin(), x.shape().begin() + static_cast<std::ptrdiff_t>(axis));
    out_shape.insert(out_shape.end(), idx_t.shape().begin(), idx_t.shape().end());
    out_shape.insert(out_shape.end(), x.shape().begin() + static_cast<std::ptrdiff_t>(axis) + 1, x.shape().end());
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);

    int64_t outer = 1, inner = 1;
    for (size_t d = 0; d < x.rank(); ++d) {
      if (d < axis) outer *= x.dim(d);
      if (d > axis) inner *= x.dim(d);
    }
    const size_t block = static_cast<size_t>(inner) * dtype_size(x.dtype());
    const int64_t n = static_cast<int64_t>(idx.size());
    const auto* src = static_cast<const std::byte*>(x.raw());
    auto* dst = static_cast<std::byte*>(y.raw());
    if (block == 0) return;
    // One block (everything right of the axis) per index: a single load for scalars, memcpy for rows.
    dispatch_elem_size(block, [&](auto sz) {
      constexpr size_t N = decltype(sz)::value;
      // Work unit u = (outer index u / n, index u % n); chunks run in parallel when large.
      parallel_chunks(outer * n, outer * n * static_cast<int64_t>(block) * 2, [&](int64_t u0, int64_t u1) {
        // Locals, not captures: byte stores may alias anything whose address escaped.
        const int64_t bs = static_cast<int64_t>(block), cnt = n, axis_dim = dim;
        const size_t size = block;
        const int64_t* ip = idx.data();
        for (int64_t u = u0; u < u1; ++u) {
          const int64_t o = u / cnt, k = u % cnt;
          copy_elem<N>(dst + u * bs, src + (o * axis_dim + ip[k]) * bs, size);
        }
      });
    });
  }

 private:
  int64_t axis_;
};

// ---- GatherElements ----------------------------------------------------------------------------

class GatherElementsKernel : public Kernel {
 public:
  explicit GatherElementsKernel(const KernelInit& init) : axis_(init.node.attr_int("axis", 0)) {}

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const Tensor& idx_t = ctx.input(1);
    const size_t r = x.rank();
    if (idx_t.rank() != r || r == 0)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": indices " + shape_str(idx_t.shape()) +
                                            " must have the rank of data " + shape_str(x.shape()));
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(r), node.describe()));
    for (size_t d = 0; d < r; ++d)
      if (d != axis && idx_t.dim(d) > x.dim(d))
        fail(ErrorKind::kInvalidArgument, node.describe() + ": indices " + shape_str(idx_t.shape()) +
                                              " exceed data " + shape_str(x.shape()) + " on axis " + std::to_string(d));
    const int64_t dim = x.dim(axis);
    const std::vector<int64_t> idx = gather_indices(idx_t, dim, node);
    Tensor& y = ctx.allocate_output(0, x.dtype(), idx_t.shape());
    if (y.numel() == 0) return;

    const size_t es = dtype_size(x.dtype());
    const std::vector<int64_t> xs = contiguous_strides(x.shape());
    const int64_t last = idx_t.dim(r - 1);
    // Walk the index tensor row by row; the data offset of a row ignores the gathered axis.
    const int64_t rows = idx_t.numel() / last;
    std::vector<int64_t> pos(r, 0);
    const auto* src = static_cast<const std::byte*>(x.raw());
    auto* dst = static_cast<std::byte*>(y.raw());
    const int64_t ax_stride = xs[axis];
    const int64_t last_stride = axis == r - 1 ? 0 : xs[r - 1];
    dispatch_elem_size(es, [&](auto sz) {
      constexpr size_t N = decltype(sz)::value;
      // Locals, not captures: byte stores may alias anything whose address escaped.
      const int64_t e = static_cast<int64_t>(es), n_last = last, step = last_stride, ax = ax_stride;
      const size_t size = es;
      const int64_t* ip = idx.data();
      const std::byte* in = src;
      std::byte* out = dst;
      for (int64_t row = 0; row < rows; ++row) {
        int64_t base = 0;
        for (size_t d = 0; d + 1 < r; ++d)
          if (d != axis) base += pos[d] * xs[d];
        for (int64_t j = 0; j < n_last; ++j, ++ip)
          copy_elem<N>(out + (row * n_last + j) * e, in + (base + j * step + *ip * ax) * e, size);
        for (size_t d = r - 1; d-- > 0;) {
          if (++pos[d] < idx_t.dim(d)) break;
          pos[d] = 0;
        }
      }
    });
  }

 private:
  int64_t axis_;
};

}  // namespace

std::unique_ptr<Kernel> make_slice(const KernelInit& init) { return std::make_unique<SliceKernel>(init); }
std::unique_ptr<Kernel> make_gather(const KernelInit& init) { return std::make_unique<GatherKernel>(init); }
std::unique_ptr<Kernel> make_gather_elements(const KernelInit& init) {
  return std::make_unique<GatherElementsKernel>(init);
}

}  // namespace slimquant::runtime::shape
