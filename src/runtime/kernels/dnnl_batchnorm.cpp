// BatchNormalization, inference form (opsets 6-15): Y = scale * (X - mean) / sqrt(var + epsilon) + B
// per channel (dim 1), on oneDNN's batch_normalization_forward with global statistics.
// X of any rank >= 2 is viewed as [N, C, prod(spatial)], which is the same bytes.
//
// Training (opset 14+ training_mode=1; before that, asking for the mean/var outputs) and opset 7's
// per-activation mode (spatial=0) are rejected as kUnsupported.
#include "runtime/kernels/dnnl_common.h"
#include "runtime/kernels/dnnl_kernels.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

enum BatchNormInput : size_t { kX = 0, kScale = 1, kBias = 2, kMean = 3, kVar = 4 };

struct BatchNormPlan {
  dnnl::batch_normalization_forward prim;
  memory::desc data, channel, scratchpad;
  Shape out_shape;
};

class BatchNormKernel final : public Kernel {
 public:
  explicit BatchNormKernel(const KernelInit& init) : node_(init.node) {
    reject_fused_activation(node_);
    epsilon_ = node_.attr_float("epsilon", 1e-5f);
    if (init.opset >= 14 && node_.attr_int("training_mode", 0) != 0)
      fail(ErrorKind::kUnsupported, node_.describe() + ": training-mode BatchNormalization is not supported at inference");
    if (init.opset < 9 && node_.attr_int("spatial", 1) == 0)
      fail(ErrorKind::kUnsupported,
           node_.describe() + ": per-activation BatchNormalization (spatial=0) is not supported");
    // Before opset 14 only training produces the extra outputs (running/saved statistics).
    for (size_t i = 1; i < node_.outputs.size(); ++i)
      if (!node_.outputs[i].empty())
        fail(ErrorKind::kUnsupported, node_.describe() + ": output " + std::to_string(i) +
                                          " (batch statistics) is only produced in training mode, which is not "
                                          "supported at inference");
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    require_float32(node_, x, "input X");
    static const char* kNames[] = {"input X", "scale", "B", "input_mean", "input_var"};
    const Tensor* params[5];
    for (size_t i = kScale; i <= kVar; ++i) {
      params[i] = &ctx.input(i);
      require_float32(node_, *params[i], kNames[i]);
    }
    BatchNormPlan& p = plans_.get({x.shape()}, [&] { return make_plan(x.shape()); });
    for (size_t i = kScale; i <= kVar; ++i)
      if (params[i]->numel() != x.dim(1) || params[i]->rank() != 1)
        fail(ErrorKind::kInvalidArgument, node_.describe() + ": " + kNames[i] + " of shape " +
                                              shape_str(params[i]->shape()) + " must be [" +
                                              std::to_string(x.dim(1)) + "]");
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
    if (y.numel() == 0) return;
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(p.data, x.raw())},
                                         {DNNL_ARG_DST, wrap(p.data, y.raw())},
                                         {DNNL_ARG_SCALE, wrap(p.channel, params[kScale]->raw())},
                                         {DNNL_ARG_SHIFT, wrap(p.channel, params[kBias]->raw())},
                                         {DNNL_ARG_MEAN, wrap(p.channel, params[kMean]->raw())},
                                         {DNNL_ARG_VARIANCE, wrap(p.channel, params[kVar]->raw())}};
    add_scratchpad(args, p.scratchpad);
    execute(p.prim, args);
  }

 private:
  BatchNormPlan make_plan(const Shape& xs) const {
    if (xs.size() < 2)
      fail(ErrorKind::kInvalidArgument, node_.describe() + ": input X of shape " + shape_str(xs) +
                                            " must be [N, C, ...]");
    int64_t spatial = 1;
    for (size_t i = 2; i < xs.size(); ++i) spatial *= xs[i];
    BatchNormPlan p;
    p.out_shape = xs;
    p.data = memory::desc({xs[0], xs[1], spatial}, dt::f32, memory::format_tag::abc);
    p.channel = memory::desc({xs[1]}, dt::f32, memory::format_tag::a);
    using bn = dnnl::batch_normalization_forward;
    const auto flags = dnnl::normalization_flags::use_global_stats | dnnl::normalization_flags::use_scale |
                       dnnl::normalization_flags::use_shift;
    auto pd = make_pd(node_, "this batch normalization", [&] {
      return bn::primitive_desc(bn::desc(dnnl::prop_kind::forward_inference, p.data, epsilon_, flags), base_attr(),
                                dnnl_engine());
    });
    p.prim = bn(pd);
    p.scratchpad = pd.scratchpad_desc();
    return p;
  }

  const ir::Node node_;
  float epsilon_ = 1e-5f;
  ShapeCache<BatchNormPlan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_batch_normalization(const KernelInit& init) {
  return std::make_unique<BatchNormKernel>(init);
}

}  // namespace slimquant::runtime::dnnl_kernels
