// Expand, Tile (replicating views: stride-0 dims fed to strided_copy) and Trilu (row-wise
// memcpy + memset).
#include <algorithm>

#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

class ExpandKernel : public Kernel {
 public:
  explicit ExpandKernel(const KernelInit& init) : shape_(IntListArg::from_input(init, 1, "shape")) {}

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const std::vector<int64_t> target = shape_.get(ctx);
    Shape out_shape;
    try {
      out_shape = broadcast_shapes(x.shape(), Shape(target.begin(), target.end()));
    } catch (const Error& e) {
      fail(ErrorKind::kInvalidArgument, node.describe() + ": " + e.what());
    }
    checked_numel(out_shape, node, "output shape");
    if (out_shape == x.shape()) {  // nothing to broadcast: a view
      ctx.set_output(0, x);
      return;
    }
    // Input dims align to the right; broadcast dims read with stride 0.
    const size_t r = out_shape.size(), off = r - x.rank();
    const std::vector<int64_t> xs = contiguous_strides(x.shape());
    std::vector<int64_t> strides(r, 0);
    for (size_t d = off; d < r; ++d) strides[d] = x.dim(d - off) == 1 ? 0 : xs[d - off];
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    strided_copy(y.raw(), x.raw(), out_shape, strides, dtype_size(x.dtype()));
  }

 private:
  IntListArg shape_;
};

class TileKernel : public Kernel {
 public:
  explicit TileKernel(const KernelInit& init) : opset_(init.opset) {
    if (opset_ >= 6) repeats_ = IntListArg::from_input(init, 1, "repeats");
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const size_t r = x.rank();
    std::vector<int64_t> reps;
    if (opset_ >= 6) {
      reps = repeats_.get(ctx);
    } else {
      // Tile-1: scalar `tiles` repeats along the scalar `axis`.
      const std::vector<int64_t> tiles = read_ints(ctx.input(1), node, "tiles");
      const std::vector<int64_t> axis = read_ints(ctx.input(2), node, "axis");
      if (tiles.size() != 1 || axis.size() != 1)
        fail(ErrorKind::kInvalidModel, node.describe() + ": tiles and axis must be scalars");
      reps.assign(r, 1);
      reps[static_cast<size_t>(normalize_axis(axis[0], static_cast<int64_t>(r), node.describe()))] = tiles[0];
    }
    if (reps.size() != r)
      fail(ErrorKind::kInvalidModel, node.describe() + ": " + std::to_string(reps.size()) + " repeats for input " +
                                         shape_str(x.shape()));
    // View the output as [rep0, d0, rep1, d1, ...]: the rep dims read the input with stride 0.
    const std::vector<int64_t> xs = contiguous_strides(x.shape());
    Shape out_shape(r), view(2 * r);
    std::vector<int64_t> strides(2 * r);
    for (size_t d = 0; d < r; ++d) {
      if (reps[d] < 0)
        fail(ErrorKind::kInvalidModel, node.describe() + ": negative repeat " + std::to_string(reps[d]));
      if (__builtin_mul_overflow(x.dim(d), reps[d], &out_shape[d]))
        fail(ErrorKind::kInvalidModel, node.describe() + ": repeat " + std::to_string(reps[d]) + " of axis " +
                                           std::to_string(d) + " overflows its size");
      view[2 * d] = reps[d];
      view[2 * d + 1] = x.dim(d);
      strides[2 * d] = 0;
      strides[2 * d + 1] = xs[d];
    }
    if (out_shape == x.shape()) {  // all repeats 1: a view
      ctx.set_output(0, x);
      return;
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    strided_copy(y.raw(), x.raw(), view, strides, dtype_size(x.dtype()));
  }

 private:
  int64_t opset_;
  IntListArg repeats_;
};

// Trilu: keep the upper (j - i >= k) or lower (j - i <= k) triangle of each trailing matrix, zero
// the rest. Zero is all-zero bytes for every dtype we hold.
class TriluKernel : public Kernel {
 public:
  explicit TriluKernel(const KernelInit& init)
      : upper_(init.node.attr_int("upper", 1) != 0), k_(IntListArg::from_input(init, 1, "k")) {}

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    if (x.rank() < 2)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": input must have rank >= 2, got " + shape_str(x.shape()));
    int64_t k = 0;
    if (k_.present(ctx)) {
      const std::vector<int64_t> kv = k_.get(ctx);
      if (kv.size() != 1) fail(ErrorKind::kInvalidModel, node.describe() + ": k must be a scalar");
      k = kv[0];
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    const int64_t rows = x.dim(x.rank() - 2), cols = x.dim(x.rank() - 1);
    if (y.numel() == 0) return;
    const int64_t mats = x.numel() / (rows * cols);
    const size_t es = dtype_size(x.dtype());
    const auto* src = static_cast<const std::byte*>(x.raw());
    auto* dst = static_cast<std::byte*>(y.raw());
    for (int64_t m = 0; m < mats; ++m) {
      for (int64_t i = 0; i < rows; ++i) {
        const size_t off = static_cast<size_t>((m * rows + i) * cols) * es;
        // Columns [lo, hi) are kept.
        int64_t lo, hi;
        if (upper_) {
          lo = std::clamp<int64_t>(i + k, 0, cols);
          hi = cols;
        } else {
          lo = 0;
          hi = std::clamp<int64_t>(i + k + 1, 0, cols);
        }
        std::memset(dst + off, 0, static_cast<size_t>(lo) * es);
        std::memcpy(dst + off + static_cast<size_t>(lo) * es, src + off + static_cast<size_t>(lo) * es,
                    static_cast<size_t>(hi - lo) * es);
        std::memset(dst + off + static_cast<size_t>(hi) * es, 0, static_cast<size_t>(cols - hi) * es);
      }
    }
  }

 private:
  bool upper_;
  IntListArg k_;
};

}  // namespace

std::unique_ptr<Kernel> make_expand(const KernelInit& init) { return std::make_unique<ExpandKernel>(init); }
std::unique_ptr<Kernel> make_tile(const KernelInit& init) { return std::make_unique<TileKernel>(init); }
std::unique_ptr<Kernel> make_trilu(const KernelInit& init) { return std::make_unique<TriluKernel>(init); }

}  // namespace slimquant::runtime::shape
