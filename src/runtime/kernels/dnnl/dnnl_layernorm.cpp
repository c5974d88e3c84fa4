// LayerNormalization (opset 17) on oneDNN's layer_normalization_forward.
//
// X is normalised over dims [axis, rank): viewed as [outer, inner] with inner = prod(X.shape[axis:])
// (same bytes), Y = (X - mean) / sqrt(var + epsilon) * Scale + B. oneDNN normalises the last dim
// with per-element scale/shift of that length, so Scale and B are broadcast to X.shape[axis:] first
// when they are smaller (once when constant). The optional Mean and InvStdDev outputs have shape
// X.shape[:axis] + [1] * (rank - axis); asking for them runs the primitive in training mode, which
// writes the statistics.
#include <cmath>

#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {


struct LayerNormPlan {
  dnnl::layer_normalization_forward prim;
  memory::desc channel;
  // Bound once, pointed at each call's data.
  memory src, dst, scale, shift, mean, variance, scratchpad;
  std::unordered_map<int, memory> args;
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
  enum LayerNormInput : size_t { kX = 0, kScale = 1, kBias = 2 };
  enum LayerNormOutput : size_t { kY = 0, kMean = 1, kInvStdDev = 2 };
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
    LayerNormPlan& p = plans_.get({&x.shape(), &scale.shape(), bias ? &bias->shape() : nullptr},
                                  [&] { return make_plan(x.shape(), bias != nullptr, want_stats); }, want_stats);
    Tensor& y = ctx.allocate_output(kY, DType::kFloat32, x.shape());
    if (y.numel() == 0) return;

    const Shape normalized(x.shape().begin() + axis_index(x), x.shape().end());
    p.src.set_data_handle(const_cast<void*>(x.raw()));
    p.dst.set_data_handle(y.raw());
    p.scale.set_data_handle(channel_data(p, kScale, scale, normalized, DnnlScratch::kWeights));
    if (bias) p.shift.set_data_handle(channel_data(p, kBias, *bias, normalized, DnnlScratch::kAux));
    float* var = nullptr;
    if (p.with_stats) {
      float* mean = output_requested(ctx, kMean)
                        ? ctx.allocate_output(kMean, DType::kFloat32, p.stat_shape).data<float>()
                        : static_cast<float*>(dnnl_scratch(DnnlScratch::kSrc, p.outer * sizeof(float)));
      // The variance lands in the InvStdDev output (or scratch) and is inverted in place below.
      var = output_requested(ctx, kInvStdDev)
                ? ctx.allocate_output(kInvStdDev, DType::kFloat32, p.stat_shape).data<float>()
                : static_cast<float*>(dnnl_scratch(DnnlScratch::kDst, p.outer * sizeof(float)));
      p.mean.set_data_handle(mean);
      p.variance.set_data_handle(var);
    }
    bind_scratchpad(p.scratchpad);
    execute(p.prim, p.args);
    if (p.with_stats)
      for (int64_t i = 0; i < p.outer; ++i) var[i] = 1.f / std::sqrt(var[i] + epsilon_);
  }

 private:
  int64_t axis_index(const Tensor& x) const { return normalize_axis(axis_, x.rank(), node_.describe() + " axis"); }

  // Scale or B as a dense [inner] vector: the tensor itself when it already has that many
  // elements, otherwise broadcast (cached for a constant, into scratch for a runtime input).
  void* channel_data(const LayerNormPlan& p, size_t input, const Tensor& t, const Shape& normalized,
                     DnnlScratch slot) {
    if (t.numel() == p.inner) return const_cast<void*>(t.raw());
    Tensor& cached = expanded_[input];
    if (constant_[input].defined()) {
      if (!cached.defined() || cached.numel() != p.inner) {
        cached = Tensor(DType::kFloat32, {p.inner});
        broadcast_into(t, normalized, cached.data<float>(), node_, input == kScale ? "Scale" : "B");
      }
      return cached.raw();
    }
    auto* buf = static_cast<float*>(dnnl_scratch(slot, p.inner * sizeof(float)));
    broadcast_into(t, normalized, buf, node_, input == kScale ? "Scale" : "B");
    return buf;
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
    const memory::desc data({p.outer, p.inner}, dt::f32, memory::format_tag::ab);
    const memory::desc stat({p.outer}, dt::f32, memory::format_tag::a);
    p.channel = memory::desc({p.inner}, dt::f32, memory::format_tag::a);
    auto flags = dnnl::normalization_flags::use_scale;
    if (with_bias) flags = flags | dnnl::normalization_flags::use_shift;
    const auto pk = with_stats ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    using ln = dnnl::layer_normalization_forward;
    auto pd = make_pd(node_, "this layer normalization", [&] {
      return ln::primitive_desc(ln::desc(pk, data, stat, epsilon_, flags), base_attr(), dnnl_engine());
    });
    p.prim = ln(pd);
    p.src = unbound_memory(data);
    p.dst = unbound_memory(data);
    p.scale = unbound_memory(p.channel);
    p.scratchpad = unbound_memory(pd.scratchpad_desc());
    p.args = {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_DST, p.dst}, {DNNL_ARG_SCALE, p.scale},
              {DNNL_ARG_SCRATCHPAD, p.scratchpad}};
    if (with_bias) {
      p.shift = unbound_memory(p.channel);
      p.args.emplace(DNNL_ARG_SHIFT, p.shift);
    }
    if (with_stats) {
      p.mean = unbound_memory(stat);
      p.variance = unbound_memory(stat);
      p.args.emplace(DNNL_ARG_MEAN, p.mean);
      p.args.emplace(DNNL_ARG_VARIANCE, p.variance);
    }
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
