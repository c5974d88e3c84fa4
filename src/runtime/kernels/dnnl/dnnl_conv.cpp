// Conv (ONNX opsets 1, 11): N-D convolution (1-D/2-D/3-D) with groups, strides, dilations,
// explicit or automatic pads and an optional bias, on oneDNN's convolution_forward. A fused
// activation (runtime/fused_ops/fused_activation.h) runs as an eltwise post-op.
//
// X may be the 8-bit codes of a folded per-tensor DequantizeLinear (Fold::kDequantizedInput): the
// reorder into the primitive's layout dequantizes them (oneDNN's scale and zero point, bit-exact
// with dequantize_linear), so a fake-quantized input needs no float copy beside the layout
// conversion (a layer's model in the sensitivity sweep quantizes a full-resolution input).
//
// Weights: a constant W is reordered once into the layout the primitive picks (format_tag::any)
// and kept; a runtime W is reordered on every run. Primitives are cached per input shapes.
#include <atomic>

#include "runtime/fused_ops/residual_conv.h"
#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/implementation_choice.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/elementwise/swish_avx512.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

std::atomic<ConvLayout> g_layout_override{ConvLayout::kAuto};

struct ConvAttrs {
  WindowAttrs window;
  int64_t group = 1;
};

// Blocked activations (nChw8c on AVX2, nChw16c on AVX-512) let oneDNN use its direct JIT kernels,
// at the cost of reordering src and dst around every call because neighbouring kernels exchange
// plain NCHW. With plain NCHW oneDNN falls back to im2col + GEMM, which beats the blocked path for
// 1x1 convolutions (a plain GEMM, no im2col, no reorders) but is far worse for spatial kernels and
// depthwise convolutions.
bool prefer_blocked(const Shape& w, const Shape& y, int64_t group, const std::vector<int64_t>& strides) {
  switch (g_layout_override.load()) {
    case ConvLayout::kPlain: return false;
    case ConvLayout::kBlocked: return true;
    case ConvLayout::kAuto: break;
  }
  bool pointwise = true;
  for (size_t i = 2; i < w.size(); ++i) pointwise = pointwise && w[i] == 1;
  bool strided = false;
  for (int64_t s : strides) strided = strided || s > 1;
  int64_t out_pixels = 1;
  for (size_t i = 2; i < y.size(); ++i) out_pixels *= y[i];
  // Measured (1 thread, AVX2, batch 1 and 32): plain wins for ungrouped 1x1 convolutions once the
  // GEMM has enough columns, and for strided 1x1 ones (the blocked path reorders the whole input
  // for a quarter of the outputs); for 1x1 on small maps and every spatial kernel blocked wins.
  constexpr int64_t kPlainPointwiseMinPixels = 128;
  return !(pointwise && group == 1 && (strided || out_pixels >= kPlainPointwiseMinPixels));
}

// Whether oneDNN's Winograd convolution (F(2x2, 3x3) or F(4x4, 3x3), its choice; AVX-512 only, in
// nChw16c) is worth asking for: an ungrouped 2-D 3x3 convolution at stride 1 without dilation,
// with enough channels to amortize the tile transforms. Measured per layer against the direct kernel (1 thread, AVX-512 VNNI Xeon):
// 64-512 output channels from 32-256 input channels gain 1.2-2.2x on maps from 14x14 to
// 1024x1024 (ResNet-18's 56x56 layers 1.21 -> 0.84 ms, a U-Net's 128 -> 64 channels at 512x512
// 207 -> 125 ms); 7x7 maps tie; 16-24 output channels or 16 input channels lose up to 2.5x
// (PP-OCRv4 det's 96 -> 24 heads 1.9 -> 2.7 ms).
bool winograd_pays(const Shape& w, int64_t group, const WindowGeometry& g) {
  constexpr int64_t kMinOutputChannels = 64, kMinInputChannels = 32, kMinOutputSide = 8;
  if (w.size() != 4 || group != 1 || w[2] != 3 || w[3] != 3 || w[0] < kMinOutputChannels || w[1] < kMinInputChannels)
    return false;
  for (size_t i = 0; i < 2; ++i)
    if (g.strides[i] != 1 || g.dilations[i] != 0 || g.out[i] < kMinOutputSide) return false;
  return true;
}

class ConvKernel final : public Kernel {
  // Input slots (runtime/fused_ops/residual_conv.h), after them the residual addend of an Add the
  // execution fusions put into this Conv (fused_ops::kConvAddend; not an ONNX input).
  static constexpr size_t kX = fused_ops::kConvX, kW = fused_ops::kConvW, kB = fused_ops::kConvBias;

 public:
  explicit ConvKernel(const KernelInit& init) : node_(init.node), winograd_(init.winograd) {
    attrs_.window = WindowAttrs::parse(node_);
    attrs_.group = node_.attr_int("group", 1);
    if (attrs_.group < 1)
      fail(ErrorKind::kInvalidModel, node_.describe() + ": group must be >= 1, got " + std::to_string(attrs_.group));
    check_fused_activation(node_);
    if (const Tensor* w = init.constant_input(kW)) {
      require_float32(node_, *w, "weights W");
      // weights_desc indexes the dims: a scalar or vector W (a Clip turned Conv) must stop here.
      if (w->rank() < 3 || w->dim(0) % attrs_.group != 0)
        fail(ErrorKind::kInvalidModel, node_.describe() + ": weights W of shape " + shape_str(w->shape()) +
                                           " must be [M, C/group, k...] with M divisible by group " +
                                           std::to_string(attrs_.group));
      const_weights_shape_ = w->shape();
      packed_weights_.set_source(*w, weights_desc(w->shape(), memory::format_tag::undef));
    }
    if (init.node.inputs.size() > kB && !init.node.inputs[kB].empty())
      if (const Tensor* b = init.constant_input(kB)) const_bias_ = *b;
    for (const FoldedDequantize& d : folded_dequantize(node_))
      if (d.input == kX) x_dequantize_ = d;
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    if (x_dequantize_) check_folded_codes(x, *x_dequantize_, node_.describe());
    else require_float32(node_, x, "input X");
    const Tensor* w = packed_weights_.has_source() ? nullptr : &ctx.input(kW);
    if (w) require_float32(node_, *w, "weights W");
    const Tensor* b = const_bias_.defined() ? &const_bias_ : ctx.optional_input(kB);
    if (b) require_float32(node_, *b, "bias B");
    const Shape& ws = w ? w->shape() : const_weights_shape_;

    const Tensor* sum = ctx.optional_input(fused_ops::kConvAddend);
    if (sum) require_float32(node_, *sum, "the fused residual addend");
    const Layout* x_layout = ctx.input_layout(kX);
    const Layout* sum_layout = sum ? ctx.input_layout(fused_ops::kConvAddend) : nullptr;
    const bool out_blocked = ctx.output_layout_allowed(0);
    // Within a plan the layouts a kernel sees are fixed, so flags are enough to key the cache.
    const int64_t tag = (x_layout ? 1 : 0) | (out_blocked ? 2 : 0) | (sum ? 4 : 0) | (sum_layout ? 8 : 0);
    ConvLikePlan& p = plans_.get(
        {&x.shape(), &ws, b ? &b->shape() : nullptr, sum ? &sum->shape() : nullptr},
        [&] {
          return make_plan(x.shape(), x.dtype(), ws, b ? &b->shape() : nullptr, x_layout, out_blocked, sum,
                           sum_layout);
        },
        tag);
    // The addend's buffer becomes the output when the plan donated it and it already is in the
    // primitive's dst layout: the sum post-op then reads it in place, no copy.
    if (sum && ctx.input_donated(fused_ops::kConvAddend) && !p.sum_reorder && !p.dst_reorder) ctx.set_output(0, *sum);
    else ctx.allocate_output(0, DType::kFloat32, p.out_shape);
    Tensor& y = ctx.output(0);
    if (y.numel() == 0) return;

    run_conv_like(p, x, w, b, y, sum);
    if (p.out_layout) ctx.set_output_layout(0, p.out_layout);
  }

 private:
  // Weights as oneDNN sees them (conv_weights_desc); format_tag::undef means plain.
  memory::desc weights_desc(const Shape& w, memory::format_tag tag) const {
    return conv_weights_desc(w, attrs_.group, dt::f32, tag);
  }

  ConvLikePlan make_plan(const Shape& xs, DType x_type, const Shape& ws, const Shape* bs, const Layout* x_layout,
                         bool out_blocked, const Tensor* sum, const Layout* sum_layout) {
    const std::string what = node_.describe();
    const int64_t group = attrs_.group;
    if (xs.size() < 3 || xs.size() > 5)
      fail(ErrorKind::kUnsupported, what + ": input X of shape " + shape_str(xs) +
                                        " (only 1-D, 2-D and 3-D convolutions: rank 3 to 5)");
    if (ws.size() != xs.size())
      fail(ErrorKind::kInvalidArgument, what + ": weights W of shape " + shape_str(ws) + " must have the rank of X " +
                                            shape_str(xs));
    const int64_t c = xs[1], m = ws[0];
    if (c % group != 0)
      fail(ErrorKind::kInvalidArgument, what + ": group " + std::to_string(group) + " does not divide " +
                                            std::to_string(c) + " input channels");
    if (m % group != 0)
      fail(ErrorKind::kInvalidArgument, what + ": group " + std::to_string(group) + " does not divide " +
                                            std::to_string(m) + " output channels");
    if (ws[1] * group != c)
      fail(ErrorKind::kInvalidArgument, what + ": weights W " + shape_str(ws) + " expect " +
                                            std::to_string(ws[1] * group) + " input channels, X " + shape_str(xs) +
                                            " has " + std::to_string(c));
    if (bs && (bs->size() != 1 || (*bs)[0] != m))
      fail(ErrorKind::kInvalidArgument, what + ": bias B of shape " + shape_str(*bs) + " must be [" +
                                            std::to_string(m) + "]");
    const size_t sp = xs.size() - 2;
    WindowAttrs a = attrs_.window;
    const Shape kernel(ws.begin() + 2, ws.end());
    if (!a.kernel.empty() && a.kernel != kernel)
      fail(ErrorKind::kInvalidArgument, what + ": kernel_shape disagrees with weights W " + shape_str(ws));
    a.kernel = kernel;
    a = a.resolved(node_, sp);
    WindowGeometry g = forward_geometry(node_, a, Shape(xs.begin() + 2, xs.end()), false);

    ConvLikePlan p;
    p.out_shape = {xs[0], m};
    p.out_shape.insert(p.out_shape.end(), g.out.begin(), g.out.end());
    if (sum && sum->shape() != p.out_shape)
      fail(ErrorKind::kInternal, what + ": fused residual addend " + shape_str(sum->shape()) +
                                     " does not match the output " + shape_str(p.out_shape));
    p.src_user = input_desc(x_layout, xs, to_dnnl_type(x_type));
    if (x_dequantize_) {
      p.src_reorder_attr.set_output_scales(0, {x_dequantize_->scale});
      p.src_reorder_attr.set_zero_points(DNNL_ARG_SRC, 0, {x_dequantize_->zero_point});
    }
    p.dst_user = plain_desc(p.out_shape);
    p.weights_user = weights_desc(ws, memory::format_tag::undef);
    if (bs) p.bias_user = plain_desc(*bs);

    // Neighbours exchanging blocked tensors make the blocked path reorder-free; a fused sum needs it
    // too (the GEMM path's post-ops are scalar loops).
    const bool blocked = x_layout || out_blocked || sum || prefer_blocked(ws, p.out_shape, group, a.strides);
    // A Swish that ends the chain (no residual sum after it) runs as our own pass over the output.
    const fused_ops::FusedActivation act = fused_ops::FusedActivation::parse(node_);
    if (act.kind == fused_ops::Activation::kSwish && !act.has_post_affine() && !act.has_post_clamp() && !sum &&
        ew::swish_pass_available())
      p.swish_pass_alpha = act.alpha;
    dnnl::primitive_attr attr = base_attr();
    if (blocked) {
      dnnl::post_ops ops;
      if (!p.swish_pass_alpha) append_fused_activation(ops, node_);
      if (sum) {
        ops.append_sum(1.f);
        append_sum_activation(ops);
      }
      attr.set_post_ops(ops);
    } else if (!p.swish_pass_alpha) {
      // The plain layout runs GEMM-based convolution, whose post-ops are scalar: a separate JIT
      // eltwise pass over the output is several times faster.
      p.activations = make_activation_primitives(node_, p.dst_user);
    }
    auto any = memory::format_tag::any;
    memory::desc src_md = blocked ? memory::desc(to_dnnl_dims(xs), dt::f32, any) : plain_desc(xs);
    memory::desc dst_md = blocked ? memory::desc(to_dnnl_dims(p.out_shape), dt::f32, any) : p.dst_user;
    memory::desc wei_md = weights_desc(ws, any);
    using cf = dnnl::convolution_forward;
    const auto pk = dnnl::prop_kind::forward_inference;
    auto conv_desc = [&](dnnl::algorithm alg) {
      return bs ? cf::desc(pk, alg, src_md, wei_md, p.bias_user, dst_md, g.strides, g.dilations, g.pad_begin,
                           g.pad_end)
                : cf::desc(pk, alg, src_md, wei_md, dst_md, g.strides, g.dilations, g.pad_begin, g.pad_end);
    };
    // Winograd where it pays and oneDNN has it for these post-ops and this ISA, else direct. Its
    // only implementation is not timed against others (they would compute other roundings).
    std::optional<cf::primitive_desc> winograd_pd;
    if (winograd_ && blocked && winograd_pays(ws, group, g)) {
      try {
        winograd_pd = cf::primitive_desc(conv_desc(dnnl::algorithm::convolution_winograd), attr, dnnl_engine());
      } catch (const dnnl::error&) {
        // none for this ISA (AVX2 and older) or post-op chain
      }
    }
    auto pd = winograd_pd ? *winograd_pd : make_pd(node_, "this convolution", [&] {
      cf::desc d = conv_desc(dnnl::algorithm::convolution_direct);
      if (!blocked) return cf::primitive_desc(d, attr, dnnl_engine());
      std::string key = "conv|" + describe(src_md) + "|" + describe(wei_md) + "|" + describe(dst_md) + "|" +
                        describe(attr) + (bs ? "|b" : "|");
      for (const Dims* v : {&g.strides, &g.dilations, &g.pad_begin, &g.pad_end})
        for (const auto e : *v) key.append(",").append(std::to_string(e));
      return fastest_implementation<cf::primitive_desc>(key, [&] { return cf::primitive_desc(d, attr, dnnl_engine()); });
    });
    p.out_layout = output_layout_for(pd.dst_desc(), p.out_shape, DType::kFloat32, out_blocked);
    if (p.out_layout) p.dst_user = p.out_layout->desc;
    p.has_sum = sum != nullptr;
    if (sum) p.sum_user = input_desc(sum_layout, sum->shape());
    p.finish<cf::primitive_desc, cf>(pd, packed_weights_.has_source() ? &packed_weights_ : nullptr, bs != nullptr);
    return p;
  }

  // The activation of a fused residual Add (after the sum), recorded by the plan as attributes.
  void append_sum_activation(dnnl::post_ops& ops) const {
    const fused_ops::SumActivation sum_act = fused_ops::SumActivation::parse(node_);
    if (sum_act.kind == fused_ops::Activation::kRelu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
    else if (sum_act.kind == fused_ops::Activation::kClip)
      ops.append_eltwise(1.f, dnnl::algorithm::eltwise_clip, sum_act.lo, sum_act.hi);
  }

  const ir::Node node_;
  const bool winograd_;  // KernelInit::winograd
  std::optional<FoldedDequantize> x_dequantize_;  // X holds the codes of a folded DequantizeLinear
  ConvAttrs attrs_;
  Shape const_weights_shape_;
  PackedWeights packed_weights_;
  Tensor const_bias_;
  ShapeCache<ConvLikePlan> plans_;
};

}  // namespace

void set_conv_layout_override(ConvLayout layout) { g_layout_override.store(layout); }

std::unique_ptr<Kernel> make_conv(const KernelInit& init) { return std::make_unique<ConvKernel>(init); }

}  // namespace slimquant::runtime::dnnl_kernels
