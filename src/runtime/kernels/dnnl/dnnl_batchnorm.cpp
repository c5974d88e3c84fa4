// BatchNormalization, inference form (opsets 6-15): Y = scale * (X - mean) / sqrt(var + epsilon) + B
// per channel (dim 1), computed as Y = a[c] * X + b[c] with a = scale / sqrt(var + epsilon) and
// b = B - mean * a (once at creation when the four parameters are constant, as in real models).
//
// A plain loop rather than oneDNN's batch_normalization_forward: on plain NCHW oneDNN 2.6 picks
// ncsp_bnorm (4-D) or bnorm_ref (other ranks), measured 2x and 10-70x slower than this
// memory-bound multiply-add (1 thread, AVX2).
//
// Training (opset 14+ training_mode=1; before that, asking for the mean/var outputs) and opset 7's
// per-activation mode (spatial=0) are rejected as kUnsupported.
#include <cmath>
#include <vector>

#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

constexpr const char* kInputNames[] = {"input X", "scale", "B", "input_mean", "input_var"};

class BatchNormKernel final : public Kernel {
  enum BatchNormInput : size_t { kX = 0, kScale = 1, kBias = 2, kMean = 3, kVar = 4 };
 public:
  explicit BatchNormKernel(const KernelInit& init) : node_(init.node) {
    reject_fused_activation(node_);
    epsilon_ = node_.attr_float("epsilon", 1e-5f);
    if (init.opset >= 14 && node_.attr_int("training_mode", 0) != 0)
      fail(ErrorKind::kUnsupported,
           node_.describe() + ": training-mode BatchNormalization is not supported at inference");
    if (init.opset < 9 && node_.attr_int("spatial", 1) == 0)
      fail(ErrorKind::kUnsupported,
           node_.describe() + ": per-activation BatchNormalization (spatial=0) is not supported");
    // Before opset 14 only training produces the extra outputs (running/saved statistics).
    for (size_t i = 1; i < node_.outputs.size(); ++i)
      if (!node_.outputs[i].empty())
        fail(ErrorKind::kUnsupported, node_.describe() + ": output " + std::to_string(i) +
                                          " (batch statistics) is only produced in training mode, which is not "
                                          "supported at inference");
    const Tensor* params[5] = {};
    bool all_constant = true;
    for (size_t i = kScale; i <= kVar; ++i) {
      params[i] = init.constant_input(i);
      all_constant = all_constant && params[i] != nullptr;
    }
    if (all_constant) {
      fold(params, params[kScale]->numel());
      folded_ = true;
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    require_float32(node_, x, kInputNames[kX]);
    if (x.rank() < 2)
      fail(ErrorKind::kInvalidArgument, node_.describe() + ": input X of shape " + shape_str(x.shape()) +
                                            " must be [N, C, ...]");
    const int64_t c = x.dim(1);
    if (!folded_) {
      const Tensor* params[5] = {};
      for (size_t i = kScale; i <= kVar; ++i) params[i] = &ctx.input(i);
      fold(params, c);
    }
    if (static_cast<int64_t>(a_.size()) != c)
      fail(ErrorKind::kInvalidArgument, node_.describe() + ": parameters have " + std::to_string(a_.size()) +
                                            " channels, input X of shape " + shape_str(x.shape()) + " has " +
                                            std::to_string(c));
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
    const int64_t planes = x.dim(0) * c;
    if (planes == 0) return;
    const int64_t len = x.numel() / planes;
    const float* src = x.data<float>();
    float* dst = y.data<float>();
    parallel_rows(planes, len, [&](int64_t begin, int64_t end) {
      for (int64_t p = begin; p < end; ++p) {
        const float a = a_[p % c], b = b_[p % c];
        const float* in = src + p * len;
        float* out = dst + p * len;
        for (int64_t i = 0; i < len; ++i) out[i] = in[i] * a + b;
      }
    });
  }

 private:
  // a = scale / sqrt(var + eps), b = B - mean * a.
  void fold(const Tensor* const* params, int64_t c) {
    for (size_t i = kScale; i <= kVar; ++i) {
      require_float32(node_, *params[i], kInputNames[i]);
      if (params[i]->rank() != 1 || params[i]->numel() != c)
        fail(ErrorKind::kInvalidArgument, node_.describe() + ": " + kInputNames[i] + " of shape " +
                                              shape_str(params[i]->shape()) + " must be [" + std::to_string(c) + "]");
    }
    const float* scale = params[kScale]->data<float>();
    const float* bias = params[kBias]->data<float>();
    const float* mean = params[kMean]->data<float>();
    const float* var = params[kVar]->data<float>();
    a_.resize(c);
    b_.resize(c);
    for (int64_t i = 0; i < c; ++i) {
      a_[i] = scale[i] / std::sqrt(var[i] + epsilon_);
      b_[i] = bias[i] - mean[i] * a_[i];
    }
  }

  const ir::Node node_;
  float epsilon_ = 1e-5f;
  bool folded_ = false;
  std::vector<float> a_, b_;
};

}  // namespace

std::unique_ptr<Kernel> make_batch_normalization(const KernelInit& init) {
  return std::make_unique<BatchNormKernel>(init);
}

}  // namespace slimquant::runtime::dnnl_kernels
