// QConv (com.slimquant): Conv on u8/s8 activations (per tensor) and s8 weights (per output
// channel, zero point 0), float32 bias, fused Relu/Clip, requantized u8/s8 or float32 output.
//
//   acc[n,m,p] = sum_{c,k} (x_q[n,c,p+k] - z_x) * w_q[m,c,k]               s32; padding is real 0
//   v          = act(M[m] * (acc + B'[m]))   M[m] = s_x*s_w[m]/s_y,  B'[m] = b[m]/(s_x*s_w[m])
//   y_q        = saturate(round_half_even(v) + z_y)        (y = v for a float32 output)
//
// Compute::kInt8: oneDNN's int8 convolution (u8/s8 src, s8 weights reordered once with their
// s8-src compensation, f32 bias, per-channel output scales, src zero point as a runtime argument so
// padded taps count as x_q == z_x, activation and + z_y as eltwise post-ops; rounding is oneDNN's
// float->int conversion under the default MXCSR mode: half to even, saturating).
// Without VNNI, kInt8 is chosen (kAuto) only for 7-bit weights, and s8 sources get 2*w (see
// int8_common.h: oneDNN halves those weights).
// Compute::kF32: x_q - z_x converted to float32 by the src reorder, weights prepacked as
// w_q * M[m] (f32 convolutions take no per-channel output scale), bias M[m] * B'[m], the same
// post-ops, and the f32 -> u8/s8 dst reorder rounding half to even and saturating.
// A per-channel quantized y (y_channel_scale, a folded channel-wise input of the next convolution):
// 1 / s_y[m] is a factor of M[m] after Relu / LeakyRelu / no activation; after the others it is a
// binary_mul post-op by a {1, M, 1, ...} vector, except on the kF32 path where the host
// requantization multiplies (PrimitivePlan::set_requant_channel_factor) when dst's layout allows it.
// Where oneDNN has no fast int8 implementation for a shape (none, or only its reference one), the
// exact kF32 path runs instead; with no f32 implementation either, the plain-loop reference
// (int8_reference.cpp).
// A 2-D depthwise kInt8 convolution (one filter per channel, no dilation, no fused addend) runs the
// direct kernel of int8_depthwise.h instead of oneDNN's on CPUs with AVX-512 VNNI, channels-last.
#include <algorithm>
#include <cmath>
#include <optional>

#include <unistd.h>

#include "runtime/fused_ops/residual_conv.h"
#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/dnnl/implementation_choice.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/elementwise/swish_avx512.h"
#include "runtime/kernels/integer/int8_common.h"
#include "runtime/kernels/integer/int8_conv_bands.h"
#include "runtime/kernels/integer/int8_depthwise.h"
#include "runtime/kernels/integer/int8_reference.h"

namespace slimquant::runtime::int8 {

namespace {

// The float32 bytes from which a y is stored in half precision: half the core's L2. Smaller maps
// stay in L2 until their reader comes, and there the conversions (one when written, one when read)
// cost more than the bytes they save (MobileNetV3-small at batch 1, 14x14x240 maps: gate Mul
// 0.0065 -> 0.009 ms); larger ones pass through L3 (EfficientNet-B0 at batch 32: 5% less time).
size_t float16_storage_min_bytes() {
  static const size_t bytes = [] {
    const long l2 = sysconf(_SC_LEVEL2_CACHE_SIZE);
    return l2 > 0 ? static_cast<size_t>(l2) / 2 : size_t{1} << 20;
  }();
  return bytes;
}

using dnnl::memory;
using Dims = memory::dims;
using dnnl_kernels::WindowAttrs;

// fused_ops::kConvAddend: the residual addend (float32) of an Add the execution fusions put into this
// QConv (runtime/fused_ops/residual_conv.h), added after the activation. With a float32 output it is a sum
// post-op; when the plan also folded the QuantizeLinear after the Add (y_scale / y_zero_point then
// describe that Q), the int8 primitive adds it with a binary post-op and quantizes in its epilogue:
//   y_q = saturate(round_half_even(act_add(M[m] * (acc + B'[m]) + r) / s_y) + z_y),  M[m] = s_x*s_w[m]
// (the kF32 fallback: a sum post-op into float32, then the same scaling and the dst reorder).
struct ConvPlan {
  PrimitivePlan prim;
  ConvProblem problem;
  bool reference = false;  // oneDNN had no implementation: run reference_qconv
  LayoutPtr out_layout;    // y's layout handed to readers (null: plain)
  // The direct depthwise kernel or the banded convolution, when one runs instead of a primitive:
  // they read and write channels-last, with a reorder before (x in another layout) and after (y
  // must be plain). The bands read u8: an s8 x is shifted to x + 128 on the way.
  std::shared_ptr<const DirectDepthwise> direct;
  std::shared_ptr<ConvBands> bands;
  std::optional<dnnl::reorder> nhwc_src_reorder, nhwc_dst_reorder;
  memory::desc nhwc_src_user, nhwc_src, nhwc_dst, nhwc_dst_plain;
};

class QConvKernel final : public Kernel {
  static constexpr size_t kX = fused_ops::kConvX, kW = fused_ops::kConvW, kB = fused_ops::kConvBias;

 public:
  explicit QConvKernel(const KernelInit& init) : node_(init.node) {
    q_ = QLinearAttrs::parse(node_);
    // The QuantizeLinear the plan folded after a float32 output (Fold::kTensorQuantize).
    if (std::optional<FoldedQuantize> folded = folded_quantize(node_)) {
      if (q_.quantized_output())
        fail(ErrorKind::kInvalidModel, node_.describe() + ": a folded QuantizeLinear after an already quantized output");
      q_.y = *folded;
    }
    // A fused residual Add followed by a folded QuantizeLinear: the convolution itself works in
    // real units (q_ with a float32 output) and the output parameters apply after the addend.
    const bool has_sum = fused_ops::has_residual_addend(node_);
    if (has_sum && q_.y_per_channel())
      fail(ErrorKind::kUnsupported, node_.describe() + ": a fused residual addend with a per-channel quantized "
                                                       "output (y_channel_scale)");
    output_ = q_.y;
    if (has_sum && q_.quantized_output()) q_.y = QLinearAttrs::unit_param(DType::kFloat32);
    window_ = WindowAttrs::parse(node_);
    group_ = node_.attr_int("group", 1);
    if (group_ < 1)
      fail(ErrorKind::kInvalidModel, node_.describe() + ": group must be >= 1, got " + std::to_string(group_));
    w_ = require_constant_weight(init, kW);
    if (w_.rank() < 3 || w_.rank() > 5)
      fail(ErrorKind::kUnsupported, node_.describe() + ": weights of shape " + shape_str(w_.shape()) +
                                        " (only 1-D, 2-D and 3-D convolutions)");
    const int64_t m = w_.dim(0);
    if (m % group_ != 0)
      fail(ErrorKind::kInvalidModel, node_.describe() + ": group " + std::to_string(group_) + " does not divide " +
                                         std::to_string(m) + " output channels");
    const Tensor* b = constant_bias(init, kB, m, "bias B");
    requant_ = make_requant(node_, q_, m, b);
    if (q_.needs_channel_multiply()) {
      channel_multiplier_ = Tensor(DType::kFloat32, {m});
      for (int64_t c = 0; c < m; ++c) channel_multiplier_.data<float>()[c] = 1.f / q_.y.scale[c];
    }
    const int w_max = max_abs_int8(w_);
    compute_ = resolve_compute(q_.compute, w_max);
    if (compute_ == Compute::kInt8) {
      int8_.weights = PackedConstant(w_, weights_md(dt::s8, memory::format_tag::undef));
      int8_.requant = requant_;
      if (b) int8_.set_bias(m);
      if (!cpu_has_exact_int8_dot() && w_max <= kMaxExactWeightWithoutVnni) {
        // Without VNNI oneDNN halves the weights of s8-src convolutions (rounding odd ones): give it
        // 2*w, exactly halved back, with half the weight scale.
        Tensor doubled(DType::kInt8, w_.shape());
        for (int64_t i = 0; i < w_.numel(); ++i) doubled.data<int8_t>()[i] = static_cast<int8_t>(2 * w_.data<int8_t>()[i]);
        QLinearAttrs half = q_;
        for (float& s : half.w.scale) s *= 0.5f;
        int8_s8_src_.emplace();
        int8_s8_src_->weights = PackedConstant(doubled, weights_md(dt::s8, memory::format_tag::undef));
        int8_s8_src_->requant = make_requant(node_, half, m, b);
        if (b) int8_s8_src_->set_bias(m);
      }
    } else {
      prepare_f32(b);
    }
    bias_ = b ? *b : Tensor();
    const bool one_filter_per_channel = w_.rank() == 4 && w_.dim(1) == 1 && group_ == m;
    direct_depthwise_ = compute_ == Compute::kInt8 && !has_sum && one_filter_per_channel &&
                        w_.dim(2) <= kMaxKernelHeight && (m >= kMinDirectDepthwiseChannels || m == 16 || m == 32) &&
                        direct_depthwise_available() && direct_depthwise_supports(q_);
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    require_quantized_input(node_, x);
    // Blocked input / output (the plan lets neighbouring convolutions exchange the primitive's
    // layout); within a plan these flags are fixed, so they key the cache.
    const Layout* x_layout = ctx.input_layout(kX);
    const bool out_blocked = ctx.output_layout_allowed(0);
    const Tensor* sum = ctx.optional_input(fused_ops::kConvAddend);
    if (sum && (sum->dtype() != DType::kFloat32 || q_.quantized_output()))
      fail(ErrorKind::kInternal, node_.describe() + ": a fused residual addend needs a float32 input");
    const Layout* sum_layout = sum ? ctx.input_layout(fused_ops::kConvAddend) : nullptr;
    const int tag = (x_layout ? 1 : 0) | (out_blocked ? 2 : 0) | (sum ? 4 : 0) | (sum_layout ? 8 : 0);
    ConvPlan& p = plans_.get(
        x.shape(), x.dtype(), [&] { return make_plan(x.shape(), x.dtype(), x_layout, out_blocked, sum, sum_layout); },
        tag);
    // A float32 y the direct kernel writes in the plan's layout as float16 where the plan allows it,
    // every value it can write is finite in half precision, and y is large enough to pay.
    const bool float16_y = p.direct && p.out_layout && output_.dtype == DType::kFloat32 &&
                           ctx.output_float16_allowed(0) && p.direct->float16_holds_outputs() &&
                           shape_numel(p.prim.out_shape) * sizeof(float) >= float16_storage_min_bytes();
    Tensor& y = ctx.allocate_output(0, float16_y ? DType::kFloat16 : output_.dtype, p.prim.out_shape);
    float* means = nullptr;
    if (node_.outputs.size() > 1 && !node_.outputs[1].empty()) {
      if (output_.dtype != DType::kFloat32 || y.rank() != 4 || y.dim(2) * y.dim(3) == 0)
        fail(ErrorKind::kInternal, node_.describe() + ": channel means need a float32 output with pixels, got " +
                                       shape_str(y.shape()));
      means = ctx.allocate_output(1, DType::kFloat32, {y.dim(0), y.dim(1), 1, 1}).data<float>();
    }
    if (y.numel() == 0) return;
    if (p.direct || p.bands) {
      run_channels_last(p, x, y, p.direct ? means : nullptr, float16_y);
      if (p.out_layout)
        ctx.set_output_layout(0, float16_y ? dnnl_kernels::retyped_layout(*p.out_layout, DType::kFloat16) : p.out_layout);
      if (means && p.direct) {
        const auto pixels = static_cast<float>(y.dim(2) * y.dim(3));
        for (int64_t i = 0; i < y.dim(0) * y.dim(1); ++i) means[i] /= pixels;
      } else if (means) {
        dnnl_kernels::global_average_floats(y, p.out_layout.get(), means);
      }
      return;
    }
    if (p.reference) {
      const Tensor xp = x_layout ? dnnl_kernels::to_plain(x, *x_layout) : x;
      Tensor real = requantizes_sum() ? Tensor(DType::kFloat32, y.shape()) : Tensor();
      Tensor& v = requantizes_sum() ? real : y;
      reference_qconv(q_, requant_, p.problem, xp, w_, v);
      if (sum) add_sum_reference(v, sum_layout ? dnnl_kernels::to_plain(*sum, *sum_layout) : *sum);
      if (requantizes_sum()) quantize_reference(real, y);
      if (means) dnnl_kernels::global_average_floats(y, nullptr, means);
      return;
    }
    p.prim.run(x.raw(), y.raw(), nullptr, sum ? sum->raw() : nullptr);
    if (p.out_layout) ctx.set_output_layout(0, p.out_layout);
    if (means) dnnl_kernels::global_average_floats(y, p.out_layout.get(), means);
  }

 private:
  // The kF32 weights: the per-channel multiplier folded into float weights and bias (see the header
  // comment). Also the fallback when oneDNN has no fast int8 implementation for a shape.
  void prepare_f32(const Tensor* b) {
    if (f32_.weights.defined()) return;
    const int64_t m = w_.dim(0);
    Tensor wf(DType::kFloat32, w_.shape());
    const int64_t per = w_.numel() / m;
    const int8_t* src = w_.data<int8_t>();
    float* dst = wf.data<float>();
    for (int64_t c = 0; c < m; ++c)
      for (int64_t i = 0; i < per; ++i) dst[c * per + i] = static_cast<float>(src[c * per + i]) * requant_.multiplier[c];
    f32_.weights = PackedConstant(wf, weights_md(dt::f32, memory::format_tag::undef));
    if (b) {
      f32_.bias = Tensor(DType::kFloat32, {m});
      for (int64_t c = 0; c < m; ++c) f32_.bias.data<float>()[c] = requant_.bias[c] * requant_.multiplier[c];
      f32_.bias_mem = memory({{m}, dt::f32, memory::format_tag::a}, dnnl_engine(), f32_.bias.raw());
    }
  }

  // The direct depthwise kernel's plan.
  void plan_direct(ConvPlan& p, const Shape& xs, DType x_type, const Layout* x_layout, bool out_blocked) {
    std::shared_ptr<const DirectDepthwise>& packed = direct_packed_[x_type == DType::kInt8 ? 1 : 0];
    if (!packed) packed = std::make_shared<const DirectDepthwise>(q_, requant_, w_, x_type, pixel_group_for(p.problem));
    p.direct = packed;
    plan_channels_last(p, xs, x_type, x_layout, out_blocked);
  }

  // The banded convolution (int8_conv_bands.h) where the output stage is one the AVX-512 pass runs
  // and oneDNN has a kernel for every band; false otherwise.
  bool plan_bands(ConvPlan& p, const Shape& xs, DType x_type, const Layout* x_layout, bool out_blocked) {
    GatedOutputStage stage;
    if (compute_ != Compute::kInt8 || !ew::swish_pass_available() || xs.size() != 4 || !gated_output_stage(q_, stage))
      return false;
    const int32_t zx = q_.x.zero_point[0] + (x_type == DType::kInt8 ? 128 : 0);  // u8 codes x + 128 for an s8 x
    auto bands = std::make_shared<ConvBands>(p.problem, weights_md(dt::s8, memory::format_tag::any), int8_.weights,
                                             int8_.bias_mem, int8_.requant, zx, std::move(stage));
    if (!bands->usable()) return false;
    p.bands = std::move(bands);
    plan_channels_last(p, xs, x_type, x_layout, out_blocked);
    return true;
  }

  // Channels-last x and y for the direct kernel or the bands, reorders where they are not.
  void plan_channels_last(ConvPlan& p, const Shape& xs, DType x_type, const Layout* x_layout, bool out_blocked) {
    const auto channels_last = memory::format_tag::acdb;
    p.nhwc_src = memory::desc(to_dnnl_dims(xs), dnnl_type(x_type), channels_last);
    p.nhwc_src_user = x_layout ? x_layout->desc : plain_md(xs, dnnl_type(x_type));
    p.nhwc_src_reorder = dnnl_kernels::make_reorder(p.nhwc_src_user, p.nhwc_src);
    p.nhwc_dst = memory::desc(to_dnnl_dims(p.prim.out_shape), dnnl_type(output_.dtype), channels_last);
    p.nhwc_dst_plain = plain_md(p.prim.out_shape, dnnl_type(output_.dtype));
    p.out_layout = dnnl_kernels::output_layout_for(p.nhwc_dst, p.prim.out_shape, output_.dtype, out_blocked);
    if (!p.out_layout) p.nhwc_dst_reorder = dnnl_kernels::make_reorder(p.nhwc_dst, p.nhwc_dst_plain);
  }

  // x and y through the shared per-thread scratch where they are not channels-last.
  // float16_y: a direct kernel's float32 y written as float16 (y then holds that storage).
  void run_channels_last(ConvPlan& p, const Tensor& x, Tensor& y, float* channel_sums = nullptr,
                         bool float16_y = false) const {
    const void* src = x.raw();
    if (p.nhwc_src_reorder) {
      memory from(p.nhwc_src_user, dnnl_engine(), const_cast<void*>(x.raw()));
      memory to = dnnl_scratch_memory(DnnlScratch::kSrc, p.nhwc_src);
      p.nhwc_src_reorder->execute(dnnl_stream(), from, to);
      dnnl_stream().wait();
      src = to.get_data_handle();
    }
    if (p.bands && x.dtype() == DType::kInt8) {
      // In place when the reorder wrote the scratch (element by element, so aliasing is fine).
      auto* u = static_cast<uint8_t*>(src == x.raw() ? dnnl_scratch(DnnlScratch::kSrc, x.nbytes()) : const_cast<void*>(src));
      s8_to_shifted_u8(static_cast<const int8_t*>(src), u, x.numel());
      src = u;
    }
    void* dst = p.nhwc_dst_reorder ? dnnl_scratch(DnnlScratch::kDst, p.nhwc_dst.get_size()) : y.raw();
    if (p.bands) p.bands->run(static_cast<const uint8_t*>(src), dst);
    else p.direct->run(p.problem, src, dst, channel_sums, float16_y);
    if (!p.nhwc_dst_reorder) return;
    memory from(p.nhwc_dst, dnnl_engine(), dst), to(p.nhwc_dst_plain, dnnl_engine(), y.raw());
    p.nhwc_dst_reorder->execute(dnnl_stream(), from, to);
    dnnl_stream().wait();
  }

  // oneDNN's view of the weights: [G, M/G, C/G, k...] when grouped (same bytes as ONNX's layout).
  memory::desc weights_md(dt type, memory::format_tag tag) const {
    return dnnl_kernels::conv_weights_desc(w_.shape(), group_, type, tag);
  }

  // A quantized output after a fused residual Add (see fused_ops::kConvAddend).
  bool requantizes_sum() const { return output_.dtype != q_.y.dtype; }

  // y_q = saturate(round_half_even(v / s_y) + z_y): the folded QuantizeLinear on the reference path.
  void quantize_reference(const Tensor& v, Tensor& y) const {
    const int32_t lo = output_.qmin(), hi = output_.qmax(), z = output_.zero_point[0];
    const float s = output_.scale[0];
    const float* in = v.data<float>();
    // NaN gives the low end, as the primitives' conversion saturates it.
    for (int64_t i = 0; i < v.numel(); ++i) {
      const int32_t q = quant_math::quantize(in[i], s, z, lo, hi);
      if (output_.dtype == DType::kUInt8) y.data<uint8_t>()[i] = static_cast<uint8_t>(q);
      else y.data<int8_t>()[i] = static_cast<int8_t>(q);
    }
  }

  // y += sum, then the fused Add's activation (the reference path's sum post-op).
  void add_sum_reference(Tensor& y, const Tensor& sum) const {
    const fused_ops::SumActivation sum_act = fused_ops::SumActivation::parse(node_);
    const bool relu = sum_act.kind == Activation::kRelu;
    const float lo = relu ? 0.f : sum_act.empty() ? -INFINITY : sum_act.lo;
    const float hi = relu || sum_act.empty() ? INFINITY : sum_act.hi;
    float* out = y.data<float>();
    const float* add = sum.data<float>();
    for (int64_t i = 0; i < y.numel(); ++i) {
      const float v = out[i] + add[i];
      out[i] = sum_act.empty() ? v : std::min(std::max(v, lo), hi);
    }
  }

  ConvPlan make_plan(const Shape& xs, DType x_type, const Layout* x_layout, bool out_blocked, const Tensor* sum,
                     const Layout* sum_layout) {
    const std::string what = node_.describe();
    const Shape& ws = w_.shape();
    if (xs.size() != ws.size())
      fail(ErrorKind::kInvalidArgument, what + ": input x_q of shape " + shape_str(xs) + " must have the rank of the "
                                               "weights " + shape_str(ws));
    const int64_t c = xs[1], m = ws[0];
    if (c % group_ != 0 || ws[1] * group_ != c)
      fail(ErrorKind::kInvalidArgument, what + ": weights " + shape_str(ws) + " with group " + std::to_string(group_) +
                                            " expect " + std::to_string(ws[1] * group_) + " input channels, x_q " +
                                            shape_str(xs) + " has " + std::to_string(c));
    const size_t sp = xs.size() - 2;
    WindowAttrs a = window_;
    const Shape kernel(ws.begin() + 2, ws.end());
    if (!a.kernel.empty() && a.kernel != kernel)
      fail(ErrorKind::kInvalidModel, what + ": kernel_shape disagrees with the weights " + shape_str(ws));
    a.kernel = kernel;
    a = a.resolved(node_, sp);
    const auto g = dnnl_kernels::forward_geometry(node_, a, Shape(xs.begin() + 2, xs.end()), false);

    ConvPlan p;
    p.prim.out_shape = {xs[0], m};
    p.prim.out_shape.insert(p.prim.out_shape.end(), g.out.begin(), g.out.end());
    p.problem = {xs[0], c, m, group_, Shape(xs.begin() + 2, xs.end()), Shape(g.out.begin(), g.out.end()), kernel,
                 a.strides, a.dilations, Shape(g.pad_begin.begin(), g.pad_begin.end())};
    p.prim.src_user = x_layout ? x_layout->desc : plain_md(xs, dnnl_type(x_type));
    p.prim.dst_user = plain_md(p.prim.out_shape, dnnl_type(output_.dtype));

    const bool dense = std::all_of(a.dilations.begin(), a.dilations.end(), [](int64_t d) { return d == 1; });
    // x's zero point as one of its codes (a hand-written QConv may say otherwise: oneDNN's path takes it).
    const int32_t zx = q_.x.zero_point[0];
    const bool zero_point_is_a_code = zx >= qmin_of(x_type) && zx <= qmax_of(x_type);
    if (direct_depthwise_ && !sum && xs.size() == 4 && c == group_ && dense && zero_point_is_a_code &&
        direct_depthwise_pays(p.problem)) {
      plan_direct(p, xs, x_type, x_layout, out_blocked);
      return p;
    }
    if (!sum && zero_point_is_a_code && plan_bands(p, xs, x_type, x_layout, out_blocked)) return p;

    // Completes p with an int8 or f32 primitive; false when oneDNN has none (or, for int8, only its
    // reference implementation, orders of magnitude slower).
    const ConvPlan base = p;
    const int dst_rank = static_cast<int>(p.prim.out_shape.size());
    // host_channel_multiply (kF32, q_.needs_channel_multiply()): 1 / s_y[m] applied by the host
    // requantization instead of a binary post-op; false when dst's layout does not allow it.
    // shift (int8): an s8 x read as u8 x + 128 with a constant zero point z_x + 128
    // (shifted_u8_source()), where the primitive takes x's own layout (one pass over x, no reorder).
    auto try_primitive = [&](bool int8, bool host_channel_multiply, bool shift) -> bool {
      p = base;
      // What the primitive multiplies: the int8 weights (doubled for s8 sources without VNNI) or
      // the multiplier-folded float ones.
      PrimitiveWeights& pw =
          !int8 ? f32_ : (x_type == DType::kInt8 && !shift && int8_s8_src_) ? *int8_s8_src_ : int8_;
      const auto any = memory::format_tag::any;
      const memory::desc src_md(to_dnnl_dims(xs), !int8 ? dt::f32 : shift ? dt::u8 : dnnl_type(x_type), any);
      const memory::desc dst_md(to_dnnl_dims(p.prim.out_shape), int8 ? dnnl_type(output_.dtype) : dt::f32, any);
      const memory::desc wei_md = weights_md(int8 ? dt::s8 : dt::f32, any);
      dnnl::primitive_attr attr;
      if (int8) {
        attr = make_attr(q_, pw.requant, 1 << 1, dst_rank);
        if (shift) attr.set_zero_points(DNNL_ARG_SRC, 0, {q_.x.zero_point[0] + 128});
        else if (q_.x.zero_point[0] != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
      } else {
        attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
        attr.set_post_ops(host_channel_multiply ? make_post_ops_before_channel_multiply(q_)
                                                : make_post_ops(q_, dst_rank));
      }
      int binary_index = -1;
      const memory::desc sum_md = sum ? dnnl_kernels::input_desc(sum_layout, sum->shape()) : memory::desc();
      if (sum) {
        if (sum->shape() != p.prim.out_shape)
          fail(ErrorKind::kInternal, node_.describe() + ": fused residual addend " + shape_str(sum->shape()) +
                                         " does not match the output " + shape_str(p.prim.out_shape));
        dnnl::post_ops ops = attr.get_post_ops();
        // int8 with a quantized dst: the float32 addend cannot sit in dst (sum), so a binary add.
        if (int8 && requantizes_sum()) {
          binary_index = ops.len();
          ops.append_binary(dnnl::algorithm::binary_add, sum_md);
        } else {
          ops.append_sum(1.f);
        }
        const fused_ops::SumActivation sum_act = fused_ops::SumActivation::parse(node_);
        if (sum_act.kind == Activation::kRelu) ops.append_eltwise(1.f, dnnl::algorithm::eltwise_relu, 0.f, 0.f);
        else if (sum_act.kind == Activation::kClip)
          ops.append_eltwise(1.f, dnnl::algorithm::eltwise_clip, sum_act.lo, sum_act.hi);
        // To the output's units; the dst conversion (int8 primitive or kF32's dst reorder) rounds
        // half to even and saturates.
        if (requantizes_sum())
          ops.append_eltwise(1.f, dnnl::algorithm::eltwise_linear, 1.f / output_.scale[0],
                             static_cast<float>(output_.zero_point[0]));
        attr.set_post_ops(ops);
      }
      using cf = dnnl::convolution_forward;
      try {
        const auto pk = dnnl::prop_kind::forward_inference;
        const auto alg = dnnl::algorithm::convolution_direct;
        const cf::desc d = pw.bias.defined()
                               ? cf::desc(pk, alg, src_md, wei_md, pw.bias_mem.get_desc(), dst_md, g.strides, g.dilations,
                                          g.pad_begin, g.pad_end)
                               : cf::desc(pk, alg, src_md, wei_md, dst_md, g.strides, g.dilations, g.pad_begin, g.pad_end);
        using dnnl_kernels::describe;
        std::string key = std::string(int8 ? "qconv|" : "qconv-f32|") + describe(src_md) + "|" + describe(wei_md) + "|" +
                          describe(dst_md) + "|" + describe(attr) + (pw.bias.defined() ? "|b" : "|") +
                          (shift ? "s" : q_.x.zero_point[0] != 0 ? "z" : "");
        for (const Dims* v : {&g.strides, &g.dilations, &g.pad_begin, &g.pad_end})
          for (const auto e : *v) key.append(",").append(std::to_string(e));
        const cf::primitive_desc pd = dnnl_kernels::fastest_implementation<cf::primitive_desc>(
            key, [&] { return cf::primitive_desc(d, attr, dnnl_engine()); });
        if (int8 && std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return false;
        if (shift && !dnnl_kernels::same_blocking(Layout{pd.src_desc()}, Layout{p.prim.src_user}))
          return false;  // x would need a reorder: no shifting pass
        // y in the primitive's layout (as y's dtype) when readers take it: no dst layout reorder.
        const Layout chosen{pd.dst_desc()};
        p.out_layout = dnnl_kernels::output_layout_for(dnnl_kernels::retyped_layout(chosen, output_.dtype)->desc,
                                                       p.prim.out_shape, output_.dtype, out_blocked);
        if (p.out_layout) p.prim.dst_user = p.out_layout->desc;
        p.prim.finish<cf::primitive_desc, cf>(pd, pw.weights.get(pd.weights_desc()), pw.bias_mem,
                                              shift ? 0 : q_.x.zero_point[0],
                                              int8 ? PrimitivePlan::ZeroPointAt::kPrimitive
                                                   : PrimitivePlan::ZeroPointAt::kSrcReorder);
        if (sum && binary_index >= 0) p.prim.bind_binary_addend(DNNL_ARG_ATTR_MULTIPLE_POST_OP(binary_index) | DNNL_ARG_SRC_1, sum_md);
        else if (sum) p.prim.bind_sum(sum_md);
        if (host_channel_multiply) {
          if (!p.prim.set_requant_channel_factor(channel_multiplier_.data<float>())) return false;
        } else if (q_.needs_channel_multiply()) {
          p.prim.args[channel_multiply_arg(q_, dst_rank)] =
              memory(channel_multiply_md(q_, dst_rank), dnnl_engine(), channel_multiplier_.raw());
        }
      } catch (const dnnl::error&) {
        return false;  // e.g. an int8 configuration oneDNN does not implement on this CPU
      }
      return true;
    };
    // int8 primitives where chosen, else (or when oneDNN has no fast int8 kernel for this shape on
    // this CPU) the exact f32 path; the plain-loop reference only when neither exists.
    const bool shift = x_type == DType::kInt8 && shifted_u8_source();
    if (compute_ == Compute::kInt8 && ((shift && try_primitive(true, false, true)) || try_primitive(true, false, false)))
      return p;
    prepare_f32(bias_.defined() ? &bias_ : nullptr);
    if (q_.needs_channel_multiply() && try_primitive(false, true, false)) return p;
    if (try_primitive(false, false, false)) return p;
    p = base;
    p.reference = true;
    return p;
  }

  const ir::Node node_;
  QLinearAttrs q_;  // what the convolution computes (real units when requantizes_sum())
  // y's type and per-tensor quantization (q_'s, or the folded QuantizeLinear's); dtype kFloat32 for
  // a float32 output.
  QuantParam output_;
  Compute compute_ = Compute::kInt8;
  bool direct_depthwise_ = false;  // kInt8 depthwise on a CPU the direct kernel runs on
  // Its packed weights for u8 [0] and s8 [1] inputs (they differ by the zero code), built once.
  std::shared_ptr<const DirectDepthwise> direct_packed_[2];
  WindowAttrs window_;
  int64_t group_ = 1;
  Tensor w_;        // s8, ONNX layout (the reference reads it)
  Requant requant_;  // of the ONNX weights w_ (the reference path)
  // Weights, requantization and bias (B' for kInt8, M*B' for kF32) as one primitive takes them.
  struct PrimitiveWeights {
    PackedConstant weights;
    Requant requant;
    Tensor bias;
    memory bias_mem;
    void set_bias(int64_t m) {
      bias = Tensor::from_vector<float>({m}, requant.bias);
      bias_mem = memory({{m}, dt::f32, memory::format_tag::a}, dnnl_engine(), bias.raw());
    }
  };
  PrimitiveWeights int8_, f32_;  // f32_ also prepared lazily as the fallback of int8_
  Tensor bias_;                  // the float bias B (empty when absent), for prepare_f32
  Tensor channel_multiplier_;    // 1 / s_y[m] when q_.needs_channel_multiply() (a binary post-op reads it)
  std::optional<PrimitiveWeights> int8_s8_src_;  // kInt8 without VNNI, s8 sources: 2*w
  PlanCache<ConvPlan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_qconv(const KernelInit& init) { return std::make_unique<QConvKernel>(init); }

}  // namespace slimquant::runtime::int8
