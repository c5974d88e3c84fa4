// ReverseSequence and EyeLike: small data-movement / generator ops of sequence and detection models.
#include <algorithm>
#include <cstring>

#include "runtime/kernels/shape/index_common.h"

namespace slimquant::runtime::indexing {

namespace {

// ---- ReverseSequence ---------------------------------------------------------------------------

// x is [time, batch, ...] (time_axis 0) or [batch, time, ...] (time_axis 1). For batch entry b the
// first sequence_lens[b] time steps are reversed and the rest copied unchanged.
class ReverseSequenceKernel : public Kernel {
 public:
  explicit ReverseSequenceKernel(const KernelInit& init)
      : batch_axis_(init.node.attr_int("batch_axis", 1)), time_axis_(init.node.attr_int("time_axis", 0)) {
    const bool valid = (batch_axis_ == 0 && time_axis_ == 1) || (batch_axis_ == 1 && time_axis_ == 0);
    if (!valid)
      fail(ErrorKind::kInvalidModel, init.node.describe() + ": batch_axis " + std::to_string(batch_axis_) +
                                         " and time_axis " + std::to_string(time_axis_) +
                                         " must be 0 and 1 in some order");
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const Tensor& lens_t = ctx.input(1);
    if (x.rank() < 2)
      fail(ErrorKind::kInvalidArgument,
           node.describe() + ": input must have rank >= 2, got shape " + shape_str(x.shape()));
    const int64_t batch = x.dim(static_cast<size_t>(batch_axis_)), steps = x.dim(static_cast<size_t>(time_axis_));
    if (lens_t.rank() != 1 || lens_t.dim(0) != batch)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": sequence_lens " + shape_str(lens_t.shape()) +
                                            " must be 1-D with one length per batch entry (" +
                                            std::to_string(batch) + ")");
    const std::vector<int64_t> lens = read_indices(lens_t, node, "sequence_lens");
    for (int64_t len : lens)
      if (len < 0 || len > steps)
        fail(ErrorKind::kInvalidArgument, node.describe() + ": sequence length " + std::to_string(len) +
                                              " is outside [0, " + std::to_string(steps) + "]");

    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    // Each (time, batch) position holds one block of the trailing dims.
    const int64_t inner = shape_numel(Shape(x.shape().begin() + 2, x.shape().end()));
    const int64_t batch_stride = time_axis_ == 0 ? 1 : steps, time_stride = time_axis_ == 0 ? batch : 1;
    std::vector<int64_t> src_blocks(static_cast<size_t>(batch * steps));
    for (int64_t b = 0; b < batch; ++b) {
      const int64_t len = lens[static_cast<size_t>(b)];
      for (int64_t t = 0; t < steps; ++t) {
        const int64_t src_t = t < len ? len - 1 - t : t;
        src_blocks[static_cast<size_t>(b * batch_stride + t * time_stride)] = b * batch_stride + src_t * time_stride;
      }
    }
    gather_blocks(y.raw(), x.raw(), src_blocks, static_cast<size_t>(inner) * dtype_size(x.dtype()));
  }

 private:
  int64_t batch_axis_, time_axis_;
};

// ---- EyeLike -----------------------------------------------------------------------------------

// A 2-D tensor shaped like the input: ones on diagonal k (k > 0 above the main one), zeros elsewhere,
// of type `dtype` (default: the input's).
class EyeLikeKernel : public Kernel {
 public:
  explicit EyeLikeKernel(const KernelInit& init) : k_(init.node.attr_int("k", 0)) {
    if (init.node.has_attr("dtype"))
      dtype_ = dtype_from_onnx(static_cast<int>(init.node.attr_int("dtype", 0)));
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    if (x.rank() != 2)
      fail(ErrorKind::kInvalidArgument,
           node.describe() + ": input must be 2-D, got shape " + shape_str(x.shape()));
    const DType out_type = dtype_ == DType::kUndefined ? x.dtype() : dtype_;
    Tensor& y = ctx.allocate_output(0, out_type, x.shape());
    if (y.nbytes() > 0) std::memset(y.raw(), 0, y.nbytes());  // all-zero bytes are zero in every dtype
    const int64_t rows = x.dim(0), cols = x.dim(1);
    if (k_ >= cols || k_ <= -rows) return;  // the diagonal misses the matrix
    // Row i has its one at column i + k, when that column exists.
    const int64_t first = std::max<int64_t>(0, -k_), end = std::min<int64_t>(rows, cols - k_);
    dispatch_dtype(out_type, [&](auto tag) {
      using T = decltype(tag);
      T* p = y.data<T>();
      for (int64_t i = first; i < end; ++i) p[i * cols + i + k_] = T(1);
    });
  }

 private:
  int64_t k_;
  DType dtype_ = DType::kUndefined;
};

}  // namespace

std::unique_ptr<Kernel> make_reverse_sequence(const KernelInit& init) {
  return std::make_unique<ReverseSequenceKernel>(init);
}
std::unique_ptr<Kernel> make_eye_like(const KernelInit& init) { return std::make_unique<EyeLikeKernel>(init); }

}  // namespace slimquant::runtime::indexing
