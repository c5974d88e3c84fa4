#pragma once
// The contract between INT8 lowering (src/quant/lowering.cpp writes these nodes) and the INT8
// kernels (int8_conv.cpp, int8_matmul.cpp read them), plus the oneDNN pieces those kernels share.
//
// Fused ops live in domain "com.slimquant". Each replaces a QDQ group
//     DQ(x_q) , DQ(w_q) [, bias] -> Conv | Gemm | MatMul [-> Add(bias)] [-> Relu | Clip] [-> Q]
// and reads the integer tensors directly:
//     QConv   (x_q, w_q [, B])   Conv attributes + quantization attributes below
//     QGemm   (x_q, w_q [, C])   Gemm attributes (transA, transB, alpha, beta) + quantization
//     QMatMul (x_q, w_q [, B])   B: the per-column bias of a fused MatMul -> Add
// with x_q u8/s8 (per tensor), w_q a constant s8 tensor (per tensor or per output channel, zero
// point 0) and float32 biases. The output is y_q (u8/s8, when the group ended in a
// QuantizeLinear) or float32.
//
// Arithmetic, for output channel c (exact s32 accumulation, one rounding at the end):
//     acc[c] = sum_k (x_q[k] - z_x) * w_q[c, k]                           (s32)
//     v      = M[c] * (acc[c] + B'[c])        M[c] = alpha * s_x * s_w[c] / s_y   (s_y = 1 for f32 y)
//                                             B'[c] = beta * b[c] / (alpha * s_x * s_w[c])
//     v      = act(v)                         Relu, or Clip with its bounds divided by s_y
//     y_q    = saturate(round_half_even(v) + z_y)       or  y = v  for a float32 output
// which is the QDQ float simulation's  Q(act(conv(DQ(x), DQ(w)) + b))  reassociated; the two differ
// only by float32 rounding of the scale products (ties of round_half_even can land differently).
#include <cstdint>
#include <cmath>
#include <memory>
#include <optional>
#include <unordered_map>
#include <string>
#include <utility>
#include <vector>

#include "runtime/dnnl_context.h"
#include "runtime/fused_ops/fused_activation.h"
#include "slimquant/core/quant_param.h"
#include "slimquant/ir/graph.h"
#include "slimquant/ir/rewrite.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::int8 {

inline constexpr const char* kDomain = ir::kSlimquantDomain;
inline constexpr const char* kQConv = "QConv";
inline constexpr const char* kQGemm = "QGemm";
inline constexpr const char* kQMatMul = "QMatMul";
inline constexpr const char* kSwish = "Swish";  // ir::merge_swish's node, run by the elementwise kernels

// Attribute names of the quantization parameters (one place, read and written through QLinearAttrs).
namespace attr {
inline constexpr const char* kXScale = "x_scale";            // float
inline constexpr const char* kXZeroPoint = "x_zero_point";   // int
inline constexpr const char* kWScale = "w_scale";            // floats: 1 (per tensor) or one per output channel
inline constexpr const char* kYScale = "y_scale";            // float (absent for a float32 output)
// floats, QConv only: one scale per output channel (a folded QuantizeLinear with axis 1 and zero
// point 0, e.g. a channel-wise convolution input); y_scale is then 1 and y_zero_point 0.
inline constexpr const char* kYChannelScale = "y_channel_scale";
inline constexpr const char* kYZeroPoint = "y_zero_point";   // int
inline constexpr const char* kYType = "y_type";              // int: ONNX TensorProto type of y (1 f32, 2 u8, 3 s8)
inline constexpr const char* kActivation = "activation";     // string: "", "Relu", "Clip", "LeakyRelu", "Sigmoid",
                                                             // "Tanh", "HardSigmoid", "HardSwish", "Elu", "Swish", "Gelu"
inline constexpr const char* kActivationMin = "activation_min";  // float: Clip's min (-inf when absent)
inline constexpr const char* kActivationMax = "activation_max";  // float: Clip's max (+inf when absent)
inline constexpr const char* kActivationAlpha = "activation_alpha";  // float: LeakyRelu / HardSigmoid / Elu alpha
inline constexpr const char* kActivationBeta = "activation_beta";    // float: HardSigmoid beta
inline constexpr const char* kPostScale = "post_scale";    // float: act(v) * post_scale + post_shift (default 1)
inline constexpr const char* kPostShift = "post_shift";    // float: (default 0); only after real-units activations
inline constexpr const char* kCompute = "int8_compute";      // string: "auto" (default), "int8", "f32"
}  // namespace attr

// The activation fused after the requantization. Relu, Clip, LeakyRelu and HardSigmoid (with its
// bounds and offset scaled) run in the output's units; the others (real_units()) run on real
// values, with 1 / s_y applied after them.
// The runtime's one activation vocabulary (fused_ops::Activation), without kScale, which QLinearAttrs
// refuses: a scale after the product is part of the output scale here.
using fused_ops::Activation;
using fused_ops::activation_from_name;
using fused_ops::activation_name;

// How the products are accumulated. kInt8: oneDNN u8/s8 x s8 -> s32 primitives (VNNI dot products).
// kF32: the same integers converted to float32 and accumulated by oneDNN's f32 primitives (exact
// while |acc| < 2^24). kAuto picks kInt8 where the int8 dot product is exact: on CPUs with VNNI,
// and elsewhere for constant weights within +-kMaxExactWeightWithoutVnni. Without VNNI oneDNN
// multiplies u8 x s8 pairs with vpmaddubsw, whose 16-bit pair sums saturate for full-range weights
// (2*255*127 > 32767) but not for 7-bit ones (2*255*63 < 32767), and it halves the weights of s8-src
// convolutions (exact when they are even: the QConv kernel passes 2*w with half the scale).
enum class Compute { kAuto, kInt8, kF32 };
Compute parse_compute(const std::string& value, const std::string& who);  // "auto", "int8", "f32"
Compute parse_compute(const ir::Node& node);
const char* compute_name(Compute c);
// True when the CPU has exact int8 dot products (AVX-512 VNNI, AVX-VNNI or AMX).
bool cpu_has_exact_int8_dot();
// Weights within +-63 (7-bit, e.g. quantized with weight_bits 7) make oneDNN's int8 primitives
// exact without VNNI (checked for conv incl. depthwise and matmul, u8 and s8 sources).
inline constexpr int kMaxExactWeightWithoutVnni = 63;
// max |w| of an int8 tensor.
int max_abs_int8(const Tensor& w);
// kAuto -> kInt8 when the CPU has VNNI or the constant weights' max |w| is within
// kMaxExactWeightWithoutVnni (weight_max_abs < 0: run-time weights, unknown), else kF32.
// SLIMQUANT_INT8_COMPUTE=int8|f32 overrides kAuto (benchmarks).
Compute resolve_compute(Compute requested, int weight_max_abs);

// The quantization attributes of a fused node, parsed once (and written once by lowering).
struct QLinearAttrs {
  // A per-tensor parameter of scale 1 and zero point 0 (y's of a float32 output).
  static QuantParam unit_param(DType dtype) {
    QuantParam p;
    p.dtype = dtype;
    p.scale = {1.f};
    p.zero_point = {0};
    return p;
  }

  // x: per tensor (x_scale, x_zero_point); its element type is the input tensor's (kUndefined here).
  QuantParam x = unit_param(DType::kUndefined);
  // w: s8, zero point 0; one scale (w_scale, per tensor) or one per output channel.
  QuantParam w = [] {
    QuantParam p;
    p.dtype = DType::kInt8;
    return p;
  }();
  // y: dtype kFloat32 (y_type 1) for a float32 output, with scale 1 and zero point 0; else u8/s8
  // per tensor (y_scale, y_zero_point), or, QConv only, one scale s_y[m] per output channel along
  // axis 1 with zero point 0 (y_channel_scale). With Relu, LeakyRelu or no activation, 1 / s_y[m]
  // is one more factor of the output scale M[m] (they commute with a positive per-channel factor);
  // otherwise the activation and post affine map run in real units and a per-channel multiply by
  // 1 / s_y[m] follows them (needs_channel_multiply()).
  QuantParam y = unit_param(DType::kFloat32);
  Activation activation = Activation::kNone;
  float activation_min = -INFINITY, activation_max = INFINITY;
  float activation_alpha = 0.f, activation_beta = 0.f;  // LeakyRelu / HardSigmoid / Elu parameters
  // A scalar affine map after the activation (PPLCNetV3's hard-swish -> Mul -> Add), in real units:
  // y = act(v) * post_scale + post_shift, then quantized. Only with real_units() activations.
  float post_scale = 1.f, post_shift = 0.f;
  Compute compute = Compute::kAuto;

  bool quantized_output() const { return y.dtype != DType::kFloat32; }
  // s_y and z_y of a per-tensor output: 1 and 0 for a float32 one and for a per-channel one (whose
  // scales y.scale apply per channel).
  float y_tensor_scale() const { return y.per_tensor() ? y.scale.at(0) : 1.f; }
  int32_t y_tensor_zero_point() const { return y.per_tensor() ? y.zero_point.at(0) : 0; }
  bool real_units() const {
    return activation != Activation::kNone && activation != Activation::kRelu && activation != Activation::kClip &&
           activation != Activation::kLeakyRelu && activation != Activation::kHardSigmoid;
  }
  // The activation applied to a real value (the reference kernels and the tests), without the
  // post affine map.
  float activate(float v) const;
  bool has_post_affine() const { return post_scale != 1.f || post_shift != 0.f; }
  bool y_per_channel() const { return quantized_output() && !y.per_tensor(); }
  // 1 / s_y[m] folded into the output scales (see y).
  bool folds_y_channel_scale() const {
    return y_per_channel() &&
           (activation == Activation::kNone || activation == Activation::kRelu || activation == Activation::kLeakyRelu);
  }
  // 1 / s_y[m] applied after the activation and post affine map (make_post_ops' binary multiply).
  bool needs_channel_multiply() const { return y_per_channel() && !folds_y_channel_scale(); }
  // Throws kInvalidModel naming the node for missing or inconsistent attributes.
  static QLinearAttrs parse(const ir::Node& node);
  void write(ir::Node& node) const;
};

// What one output channel needs after the s32 accumulation (see the arithmetic above).
struct Requant {
  std::vector<float> multiplier;  // M[c], one per channel (expanded from a per-tensor weight scale)
  std::vector<float> bias;        // B'[c] (empty when there is no bias)
  bool per_channel = false;       // multipliers differ between channels
};
// channels: output channel count; bias: float32 [channels] or nullptr; alpha/beta: Gemm's.
Requant make_requant(const ir::Node& node, const QLinearAttrs& q, int64_t channels, const Tensor* bias,
                     float alpha = 1.f, float beta = 1.f);

// Post-ops for act(v) and + z_y, appended in that order (oneDNN applies them after the output scale).
// With q.needs_channel_multiply() the last one is a binary multiply by channel_multiply_md() (dst
// rank `dst_rank`, channels on dim 1), whose memory the kernel binds (channel_multiply_arg()).
dnnl::post_ops make_post_ops(const QLinearAttrs& q, int dst_rank = 0);
// The same without that binary multiply: for a kernel that applies 1 / s_y[m] itself
// (PrimitivePlan::requant_channel_factor).
dnnl::post_ops make_post_ops_before_channel_multiply(const QLinearAttrs& q);
// {1, C, 1, ...} float32: the per-channel 1 / s_y[m] factors of a per-channel quantized output.
dnnl::memory::desc channel_multiply_md(const QLinearAttrs& q, int dst_rank);
// The execution argument of that binary post-op (the last one of make_post_ops(q, rank)).
int channel_multiply_arg(const QLinearAttrs& q, int dst_rank);
// Primitive attributes: user scratchpad, output scales M (mask selects the channel dim of dst; a
// per-tensor M uses mask 0), post-ops. Callers add the src zero point where the primitive takes it.
dnnl::primitive_attr make_attr(const QLinearAttrs& q, const Requant& r, int channel_mask, int dst_rank = 0);

using dt = dnnl::memory::data_type;
dt dnnl_type(DType t);

// A constant tensor reordered once into each layout a primitive asks for (format_tag::any may pick
// different layouts for different batch sizes).
class PackedConstant {
 public:
  PackedConstant() = default;
  PackedConstant(Tensor source, const dnnl::memory::desc& user) : source_(std::move(source)), user_(user) {}
  bool defined() const { return source_.defined(); }
  const Tensor& source() const { return source_; }
  const dnnl::memory& get(const dnnl::memory::desc& want);

 private:
  Tensor source_;
  dnnl::memory::desc user_;
  std::vector<std::pair<dnnl::memory::desc, dnnl::memory>> packed_;
};

// One primitive with the reorders between the plain tensors the kernel exchanges and the layouts
// (and, for Compute::kF32, the data types) the primitive picked. Argument memories are created once
// and re-pointed per call. The src zero point goes either to the primitive (int8 primitives
// subtract it, padding included) or to the src reorder (kF32: x_f = x_q - z_x, so padding is 0).
struct PrimitivePlan {
  dnnl::primitive prim;
  dnnl::memory::desc src_desc, dst_desc;  // as the primitive wants them
  dnnl::memory::desc src_user, dst_user;  // as the tensors are stored (plain)
  std::optional<dnnl::reorder> src_reorder, dst_reorder;
  dnnl::memory src_user_mem, src_mem, dst_mem, dst_user_mem, scratchpad_mem, zero_point_mem;
  std::unordered_map<int, dnnl::memory> args, src_reorder_args, dst_reorder_args, weights_reorder_args;
  std::optional<dnnl::reorder> weights_reorder;  // run-time weights only
  dnnl::memory weights_user_mem, weights_mem;
  Shape out_shape;
  std::shared_ptr<int32_t> zero_point_value;  // storage behind zero_point_mem (stable address)
  // Plain f32 dst -> plain u8/s8 y (Compute::kF32 matmul) is converted by requantize_f32: oneDNN
  // 2.6 has only a slow generic reorder (rnn_data_reorder, ~15x slower) for that pair.
  DType requant_to = DType::kUndefined;  // set by finish()
  // With requant_to: y = saturate(round_half_even(v * factor[c])) for a per-channel quantized
  // output whose 1 / s_y[c] the primitive left out (on CPUs without VNNI, oneDNN 2.6's f32
  // convolutions run markedly slower with a per-channel binary post-op than this loop costs).
  // Set with set_requant_channel_factor() after finish(); false when dst's layout is not one it reads.
  bool set_requant_channel_factor(const float* factor);
  const float* requant_channel_factor = nullptr;
  int64_t requant_channels = 0, requant_inner = 1, requant_block = 1;  // dst: [N, C/block, inner, block]
  // A GELU the primitive left out (its dst is f32 and real-valued), run by the AVX-512 pass
  // (ew::gelu_pass_available()) fused with what follows it: y = gelu(v) * gelu_scale + gelu_shift,
  // rounded and saturated for a u8/s8 y (requant_to), in place for an f32 y. Set after finish().
  bool gelu_epilogue = false;
  float gelu_scale = 1.f, gelu_shift = 0.f;
  // Plain u8/s8 -> plain f32 (Compute::kF32 matmul inputs) is converted by integers_to_f32, not a
  // reorder primitive: the same speed on large tensors, none of a primitive's call overhead on the
  // small ones (attention at batch 1).
  DType host_src_from = DType::kUndefined, host_weights_from = DType::kUndefined;  // set by finish()
  int32_t host_src_zero_point = 0;
  // Plain s8 x -> plain u8 src (x + 128, the primitive's zero point raised by 128: the same
  // integer sums): set by finish() when the primitive was made for u8 (shifted_u8_source()).
  bool host_src_shift_to_u8 = false;

  enum class ZeroPointAt { kNone, kPrimitive, kSrcReorder };
  // Binds everything from pd. weights: the packed constant for pd.weights_desc(); bias: empty or
  // the bias memory.
  template <class PrimitiveDesc, class Primitive>
  void finish(const PrimitiveDesc& pd, const dnnl::memory& weights, const dnnl::memory& bias, int32_t src_zero_point,
              ZeroPointAt zero_point_at);
  // For weights that are a run-time input (activation x activation MatMul): call after finish()
  // with the weights as stored; run() then takes them and reorders / converts them per call.
  void bind_runtime_weights(const dnnl::memory::desc& user, const dnnl::memory::desc& wanted);
  // x (plain, src_user) -> y (plain, dst_user, allocated with out_shape); w: the run-time weights
  // (nullptr for constant weights bound by finish()).
  void run(const void* x, void* y, const void* w = nullptr, const void* sum = nullptr);

  // A fused residual addend (float32 outputs only, the primitive has a sum post-op): run() copies
  // or reorders `sum` (stored as `user`) into dst before the primitive. Call after finish().
  void bind_sum(const dnnl::memory::desc& user);
  bool has_sum = false;
  // The same addend read by a binary post-op (argument `arg`) straight from `sum` (as `user`):
  // for outputs whose data type differs from the addend's. Call after finish().
  void bind_binary_addend(int arg, const dnnl::memory::desc& user);
  dnnl::memory binary_addend_mem;
  std::optional<dnnl::reorder> sum_reorder;
  dnnl::memory sum_user_mem;
  std::unordered_map<int, dnnl::memory> sum_reorder_args;

 private:
  void bind_common(const dnnl::memory::desc& scratchpad, const dnnl::memory& weights, const dnnl::memory& bias,
                   int32_t src_zero_point, ZeroPointAt zero_point_at);
};

dnnl::memory::desc plain_md(const Shape& shape, dt type);
dnnl::memory unbound(const dnnl::memory::desc& desc);
// y = saturate(round_half_even(v)) for n values into u8 or s8 (v already holds + z_y).
void requantize_f32(const float* v, void* y, DType y_type, int64_t n);
// The same with a per-channel factor first (v is scaled in place): v laid out [n / (channels *
// inner), channels / block, inner, block] (block 1: plain NC...; 8 or 16: oneDNN's aBcd8b /
// aBcd16b; channels: NHWC).
void requantize_f32_per_channel(float* v, void* y, DType y_type, int64_t n, const float* factor, int64_t channels,
                                int64_t inner, int64_t block);
// y = float(x - zero_point) for n u8 or s8 values.
void integers_to_f32(const void* x, DType x_type, float* y, int64_t n, int32_t zero_point);
// y = x + 128 as u8 for n s8 values (one flip of the sign bit).
void s8_to_shifted_u8(const int8_t* x, uint8_t* y, int64_t n);
// Whether an int8 primitive should read an s8 activation as u8 x + 128 with its zero point + 128:
// oneDNN 2.6's u8 x s8 kernels (VNNI's vpdpbusd, AVX2's vpmaddubsw) take an s8 source only by
// shifting it inside the kernel, which cost ViT-B/16's [197, 768] x [768, 3072] 1.94 ms against
// 1.34 ms from u8 with a constant zero point (one pass over x costs 0.01 ms there).
// SLIMQUANT_S8_SOURCE=keep turns it off (to compare).
bool shifted_u8_source();

template <class PrimitiveDesc, class Primitive>
void PrimitivePlan::finish(const PrimitiveDesc& pd, const dnnl::memory& weights, const dnnl::memory& bias,
                           int32_t src_zero_point, ZeroPointAt zero_point_at) {
  prim = Primitive(pd);
  src_desc = pd.src_desc();
  dst_desc = pd.dst_desc();
  bind_common(pd.scratchpad_desc(), weights, bias, src_zero_point, zero_point_at);
}

// Primitive plans cached by the input shape and dtype they were built for (shapes change rarely:
// the batch size), so a linear scan over a handful of entries is the cheapest lookup.
template <class V>
class PlanCache {
 public:
  // tag: anything else the plan depends on (layout flags).
  template <class Make>
  V& get(const Shape& shape, DType dtype, Make&& make, int tag = 0) {
    for (auto& e : entries_)
      if (e.dtype == dtype && e.tag == tag && e.shape == shape) return *e.value;
    if (entries_.size() >= kMaxEntries) entries_.erase(entries_.begin());
    entries_.push_back({shape, dtype, tag, std::make_unique<V>(make())});
    return *entries_.back().value;
  }

 private:
  struct Entry {
    Shape shape;
    DType dtype;
    int tag;
    std::unique_ptr<V> value;
  };
  static constexpr size_t kMaxEntries = 8;
  std::vector<Entry> entries_;
};

// Input checks with messages naming the node.
void require_quantized_input(const ir::Node& node, const Tensor& x);
const Tensor& require_constant_weight(const KernelInit& init, size_t index);
// A float32 bias of `channels` values (shape [channels] or [1, channels]); nullptr when absent.
const Tensor* constant_bias(const KernelInit& init, size_t index, int64_t channels, const char* what);

// Each family's factory is declared in int8_families.cpp, next to its schema and registration.

}  // namespace slimquant::runtime::int8
