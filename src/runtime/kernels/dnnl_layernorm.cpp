// LayerNormalization (opset 17) on oneDNN's layer_normalization_forward.
//
// X is normalised over dims [axis, rank): viewed as [outer, inner] with inner = prod(X.shape[axis:])
// (same bytes), Y = (X - mean) / sqrt(var + epsilon) * Scale + B. oneDNN normalises the last dim
// with per-element scale/shift of that length, so Scale and B are broadcast to X.shape[axis:] first
// when they are smaller (once when constant). The optional Mean and InvStdDev outputs have shape
// X.shape[:axis] + [1] * (rank - axis); asking for them runs the primitive in training mode, which
// writes the statistics.
#include <cmath>

#include "runtime/kernels/dnnl_common.h"
#include "runtime/kernels/dnnl_kernels.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

enum LayerNormInput : size_t { kX = 0, kScale = 1, kBias = 2 };
enum LayerNormOutput : size_t { kY = 0, kMean = 1, kInvStdDev = 2 };

struct LayerNormPlan {
  dnnl::layer_normalization_forward prim;
  memory::desc data, stat, channel, scratchpad;
  int64_t outer = 1, inner = 1;
  Shape stat_shape;
  bool with_stats = false;
};

// src broadcast (numpy rules, unidirectional) to `target`, written densely to dst.
void broadcast_into(const Tensor& src, const Shape& target, float* dst, const ir::Node& node, const char* what) {
  const Shape& s = src.shape();
  if (s.size() > target.size())
    fail(ErrorKind::kInvalidArgument, node.describe() + ": " + what + " of shape " + shape_str(s) +
                                          " does not broadcast to the normalized shape " + shape_str(target));
  const size_t off = target.size() - s.size();
  std::vector<int64_t> src_strides(target.size(), 0);
  const std::vector<int64_t> dense = contiguous_strides(s);
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != 1 && s[i] != target[off + i])
      fail(ErrorKind::kInvalidArgument, node.describe() + ": " + what + " of shape " + shape_str(s) +
                                            " does not broadcast to the normalized shape " + shape_str(target));
    src_strides[off + i] = s[i] == 1 ? 0 : dense[i];
  }
  const float* in = src.data<float>();
  const int64_t total = shape_numel(target);
  std::vector<int64_t> idx(target.size(), 0);
  for (int64_t o = 0; o < total; ++o) {
    int64_t pos = 0;
    for (size_t d = 0; d < target.size(); ++d) pos += idx[d] * src_strides[d];
    dst[o] = in[pos];
    for (size_t d = target.size(); d-- > 0;) {
      if (++idx[d] < target[d]) break;
      idx[d] = 0;
    }
  }
}

class LayerNormKernel final : public Kernel {
 public:
  explicit LayerNormKernel(const KernelInit& init) : node_(init.node) {
    reject_fused_activation(node_);
    axis_ = node_.attr_int("axis", -1);
    epsilon_ = node_.attr_float("epsilon", 1e-5f);
    for (size_t i : {kScale, kBias})
      if (node_.inputs.size() > i && !node_.inputs[i].empty())
        if (const Tensor* t = init.constant_input(i)) constant_[i] = *t;
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    require_float32(node_, x, "input X");
    const Tensor& scale = constant_[kScale].defined() ? constant_[kScale] : ctx.input(kScale);
    const Tensor* bias = constant_[kBias].defined() ? &constant_[kBias] : ctx.optional_input(kBias);
    require_float32(node_, scale, "Scale");
    if (bias) require_float32(node_, *bias, "B");
    const bool want_stats = output_requested(ctx, kMean) || output_requested(ctx, kInvStdDev);
    LayerNormPlan& p = plans_.get({x.shape(), scale.shape(), bias ? bias->shape() : Shape{-1}, Shape{want_stats}},
                                  [&] { return make_plan(x.shape(), bias != nullptr, want_stats); });
    Tensor& y = ctx.allocate_output(kY, DType::kFloat32, x.shape());
    if (y.numel() == 0) return;

    const Shape normalized(x.shape().begin() + axis_index(x), x.shape().end());
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, wrap(p.data, x.raw())}, {DNNL_ARG_DST, wrap(p.data, y.raw())}};
    args.emplace(DNNL_ARG_SCALE, channel_memory(p, kScale, scale, normalized, DnnlScratch::kWeights));
    if (bias) args.emplace(DNNL_ARG_SHIFT, channel_memory(p, kBias, *bias, normalized, DnnlScratch::kAux));
    float* mean = nullptr;
    float* var = nullptr;
    if (p.with_stats) {
      mean = output_requested(ctx, kMean) ? ctx.allocate_output(kMean, DType::kFloat32, p.stat_shape).data<float>()
                                          : static_cast<float*>(dnnl_scratch(DnnlScratch::kSrc, p.outer * sizeof(float)));
      // The variance lands in the InvStdDev output (or scratch) and is inverted in place below.
      var = output_requested(ctx, kInvStdDev)
                ? ctx.allocate_output(kInvStdDev, DType::kFloat32, p.stat_shape).data<float>()
                : static_cast<float*>(dnnl_scratch(DnnlScratch::kDst, p.outer * sizeof(float)));
      args.emplace(DNNL_ARG_MEAN, wrap(p.stat, mean));
      args.emplace(DNNL_ARG_VARIANCE, wrap(p.stat, var));
    }
    add_scratchpad(args, p.scratchpad);
    execute(p.prim, args);
    if (p.with_stats)
      for (int64_t i = 0; i < p.outer; ++i) var[i] = 1.f / std::sqrt(var[i] + epsilon_);
  }

 private:
  int64_t axis_index(const Tensor& x) const { return normalize_axis(axis_, x.rank(), node_.describe() + " axis"); }

  // Scale or B as a dense [inner] vector: the tensor itself when it already has that many
  // elements, otherwise broadcast (cached for a constant, into scratch for a runtime input).
  memory channel_memory(const LayerNormPlan& p, size_t input, const Tensor& t, const Shape& normalized,
                        DnnlScratch slot) {
    if (t.numel() == p.inner) return wrap(p.channel, t.raw());
    Tensor& cached = expanded_[input];
    if (constant_[input].defined()) {
      if (!cached.defined() || cached.numel() != p.inner) {
        cached = Tensor(DType::kFloat32, {p.inner});
        broadcast_into(t, normalized, cached.data<float>(), node_, input == kScale ? "Scale" : "B");
      }
      return wrap(p.channel, cached.raw());
    }
    auto* buf = static_cast<float*>(dnnl_scratch(slot, p.inner * sizeof(float)));
    broadcast_into(t, normalized, buf, node_, input == kScale ? "Scale" : "B");
    return wrap(p.channel, buf);
  }

  LayerNormPlan make_plan(const Shape& xs, bool with_bias, bool with_stats) const {
    const int64_t rank = static_cast<int64_t>(xs.size());
    if (rank == 0)
      fail(ErrorKind::kInvalidArgument, node_.describe() + ": input X must have rank >= 1");
    const int64_t axis = normalize_axis(axis_, rank, node_.describe() + " axis");
    LayerNormPlan p;
    for (int64_t i = 0; i < rank; ++i) (i < axis ? p.outer : p.inner) *= xs[i];
    p.stat_shape = Shape(xs.begin(), xs.begin() + axis);
    p.stat_shape.resize(xs.size(), 1);
    p.with_stats = with_stats;
    p.data = memory::desc({p.outer, p.inner}, dt::f32, memory::format_tag::ab);
    p.stat = memory::desc({p.outer}, dt::f32, memory::format_tag::a);
    p.channel = memory::desc({p.inner}, dt::f32, memory::format_tag::a);
    auto flags = dnnl::normalization_flags::use_scale;
    if (with_bias) flags = flags | dnnl::normalization_flags::use_shift;
    const auto pk = with_stats ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    using ln = dnnl::layer_normalization_forward;
    auto pd = make_pd(node_, "this layer normalization", [&] {
      return ln::primitive_desc(ln::desc(pk, p.data, p.stat, epsilon_, flags), base_attr(), dnnl_engine());
    });
    p.prim = ln(pd);
    p.scratchpad = pd.scratchpad_desc();
    return p;
  }

  const ir::Node node_;
  int64_t axis_ = -1;
  float epsilon_ = 1e-5f;
  Tensor constant_[3];  // constant Scale / B (index by input)
  Tensor expanded_[3];  // their broadcast to the normalized shape
  ShapeCache<LayerNormPlan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_layer_normalization(const KernelInit& init) {
  return std::make_unique<LayerNormKernel>(init);
}

}  // namespace slimquant::runtime::dnnl_kernels
