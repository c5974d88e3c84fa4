#include "runtime/kernels/integer/int8_common.h"

#include <algorithm>
#include <cstring>

#include <cfloat>
#include <cstdlib>
#include <string>

#include "runtime/kernels/cpu_clones.h"
#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/elementwise/gelu_avx512.h"

namespace slimquant::runtime::int8 {

using dnnl::memory;

Compute parse_compute(const std::string& c, const std::string& who) {
  if (c == "auto" || c.empty()) return Compute::kAuto;
  if (c == "int8") return Compute::kInt8;
  if (c == "f32") return Compute::kF32;
  fail(ErrorKind::kInvalidModel, who + ": attribute '" + attr::kCompute + "' must be auto, int8 or f32, got '" + c + "'");
}

Compute parse_compute(const ir::Node& node) { return parse_compute(node.attr_string(attr::kCompute, "auto"), node.describe()); }

const char* compute_name(Compute c) {
  switch (c) {
    case Compute::kAuto: return "auto";
    case Compute::kInt8: return "int8";
    case Compute::kF32: return "f32";
  }
  return "?";
}

bool cpu_has_exact_int8_dot() {
  static const bool has =
      effective_isa_includes(dnnl::cpu_isa::avx512_core_vnni) || effective_isa_includes(dnnl::cpu_isa::avx2_vnni);
  return has;
}

int max_abs_int8(const Tensor& w) {
  int m = 0;
  const int8_t* p = w.data<int8_t>();
  for (int64_t i = 0; i < w.numel(); ++i) m = std::max(m, std::abs(static_cast<int>(p[i])));
  return m;
}

Compute resolve_compute(Compute requested, int weight_max_abs) {
  if (requested != Compute::kAuto) return requested;
  // For benchmarks: SLIMQUANT_INT8_COMPUTE=int8 forces the int8 primitives (inexact for 8-bit
  // weights on CPUs without VNNI), =f32 the float path.
  if (const char* env = std::getenv("SLIMQUANT_INT8_COMPUTE")) {
    const std::string v = env;
    if (v == "int8") return Compute::kInt8;
    if (v == "f32") return Compute::kF32;
  }
  if (cpu_has_exact_int8_dot()) return Compute::kInt8;
  const bool exact = weight_max_abs >= 0 && weight_max_abs <= kMaxExactWeightWithoutVnni;
  return exact ? Compute::kInt8 : Compute::kF32;
}

namespace {
// The output-channel axis of a fused node's weight (as the lowering families state it): QConv's
// [M, C/group, k...] and QGemm's transposed B have it first, QMatMul's B and QGemm's plain B last.
int64_t weight_channel_axis(const ir::Node& node) {
  if (node.op_type == kQGemm) return node.attr_int("transB", 0) ? 0 : 1;
  return node.op_type == kQMatMul ? 1 : 0;
}
}  // namespace

QLinearAttrs QLinearAttrs::parse(const ir::Node& node) {
  QLinearAttrs q;
  auto require = [&](const char* name) {
    if (!node.has_attr(name))
      fail(ErrorKind::kInvalidModel, node.describe() + ": missing quantization attribute '" + name + "'");
  };
  require(attr::kXScale);
  require(attr::kWScale);
  q.x.scale = {node.attr_float(attr::kXScale, 1.f)};
  q.x.zero_point = {static_cast<int32_t>(node.attr_int(attr::kXZeroPoint, 0))};
  q.w.scale = node.attr_floats(attr::kWScale);
  q.w.zero_point.assign(q.w.scale.size(), 0);
  if (q.w.scale.size() > 1) q.w.axis = weight_channel_axis(node);
  const int64_t y_type = node.attr_int(attr::kYType, static_cast<int64_t>(DType::kFloat32));
  if (y_type != static_cast<int64_t>(DType::kFloat32) && y_type != static_cast<int64_t>(DType::kUInt8) &&
      y_type != static_cast<int64_t>(DType::kInt8))
    fail(ErrorKind::kInvalidModel, node.describe() + ": y_type must be 1 (float32), 2 (uint8) or 3 (int8), got " +
                                       std::to_string(y_type));
  q.y.dtype = static_cast<DType>(y_type);
  if (q.quantized_output()) {
    require(attr::kYScale);
    q.y.scale = {node.attr_float(attr::kYScale, 1.f)};
    q.y.zero_point = {static_cast<int32_t>(node.attr_int(attr::kYZeroPoint, 0))};
    if (node.has_attr(attr::kYChannelScale)) {
      std::vector<float> channel_scale = node.attr_floats(attr::kYChannelScale);
      if (channel_scale.empty() || q.y.scale[0] != 1.f || q.y.zero_point[0] != 0)
        fail(ErrorKind::kInvalidModel, node.describe() + ": y_channel_scale needs at least one scale, y_scale 1 and "
                                                         "y_zero_point 0");
      q.y.zero_point.assign(channel_scale.size(), 0);
      q.y.scale = std::move(channel_scale);
      q.y.axis = 1;
    }
  }
  const std::string act = node.attr_string(attr::kActivation, "");
  const std::optional<Activation> a = activation_from_name(act);
  if (!a || *a == Activation::kScale)
    fail(ErrorKind::kInvalidModel, node.describe() + ": activation must be one of Relu, Clip, LeakyRelu, Sigmoid, "
                                                     "Tanh, HardSigmoid, HardSwish, Elu, Swish, Gelu, got '" + act + "'");
  q.activation = *a;
  q.activation_min = node.attr_float(attr::kActivationMin, -INFINITY);
  q.activation_max = node.attr_float(attr::kActivationMax, INFINITY);
  q.activation_alpha = node.attr_float(attr::kActivationAlpha, 0.f);
  q.activation_beta = node.attr_float(attr::kActivationBeta, 0.f);
  q.post_scale = node.attr_float(attr::kPostScale, 1.f);
  q.post_shift = node.attr_float(attr::kPostShift, 0.f);
  if (!std::isfinite(q.post_scale) || !std::isfinite(q.post_shift))
    fail(ErrorKind::kInvalidModel, node.describe() + ": post_scale and post_shift must be finite");
  if (q.has_post_affine() && !q.real_units())
    fail(ErrorKind::kInvalidModel, node.describe() + ": post_scale / post_shift need an activation computed in real "
                                                     "units (Sigmoid, Tanh, HardSwish, Elu, Swish, Gelu), got '" +
                                       act + "'");
  q.compute = parse_compute(node);

  auto positive = [&](float s, const char* what) {
    if (!(s > 0.f) || !std::isfinite(s))
      fail(ErrorKind::kInvalidModel, node.describe() + ": " + what + " must be positive and finite, got " +
                                         std::to_string(s));
  };
  positive(q.x.scale[0], "x_scale");
  if (q.quantized_output()) positive(q.y_tensor_scale(), "y_scale");
  if (q.w.scale.empty()) fail(ErrorKind::kInvalidModel, node.describe() + ": w_scale is empty");
  for (float s : q.w.scale) positive(s, "w_scale");
  if (q.y_per_channel())
    for (float s : q.y.scale) positive(s, "y_channel_scale");
  const int32_t lo = q.y.dtype == DType::kUInt8 ? 0 : -128, hi = q.y.dtype == DType::kUInt8 ? 255 : 127;
  const int32_t y_zero_point = q.y_tensor_zero_point();
  if (q.quantized_output() && (y_zero_point < lo || y_zero_point > hi))
    fail(ErrorKind::kInvalidModel, node.describe() + ": y_zero_point " + std::to_string(y_zero_point) +
                                       " is outside the range of " + dtype_name(q.y.dtype));
  return q;
}

void QLinearAttrs::write(ir::Node& node) const {
  node.attrs[attr::kXScale] = x.scale.at(0);
  node.attrs[attr::kXZeroPoint] = static_cast<int64_t>(x.zero_point.at(0));
  node.attrs[attr::kWScale] = w.scale;
  node.attrs[attr::kYType] = static_cast<int64_t>(y.dtype);
  if (quantized_output()) {
    node.attrs[attr::kYScale] = y_tensor_scale();
    node.attrs[attr::kYZeroPoint] = static_cast<int64_t>(y_tensor_zero_point());
    if (!y.per_tensor()) node.attrs[attr::kYChannelScale] = y.scale;
  }
  if (activation != Activation::kNone) {
    node.attrs[attr::kActivation] = std::string(activation_name(activation));
    if (activation == Activation::kClip) {
      node.attrs[attr::kActivationMin] = activation_min;
      node.attrs[attr::kActivationMax] = activation_max;
    }
    if (activation == Activation::kLeakyRelu || activation == Activation::kHardSigmoid || activation == Activation::kElu ||
        activation == Activation::kSwish)
      node.attrs[attr::kActivationAlpha] = activation_alpha;
    if (activation == Activation::kHardSigmoid) node.attrs[attr::kActivationBeta] = activation_beta;
  }
  if (has_post_affine()) {
    node.attrs[attr::kPostScale] = post_scale;
    node.attrs[attr::kPostShift] = post_shift;
  }
  if (compute != Compute::kAuto) node.attrs[attr::kCompute] = std::string(compute_name(compute));
}

float QLinearAttrs::activate(float v) const {
  switch (activation) {
    case Activation::kNone: return v;
    case Activation::kRelu: return std::max(v, 0.f);
    case Activation::kClip: return std::min(std::max(v, activation_min), activation_max);
    case Activation::kLeakyRelu: return v >= 0.f ? v : activation_alpha * v;
    case Activation::kSigmoid: return 1.f / (1.f + std::exp(-v));
    case Activation::kTanh: return std::tanh(v);
    case Activation::kHardSigmoid: return std::min(std::max(activation_alpha * v + activation_beta, 0.f), 1.f);
    case Activation::kHardSwish: return v * std::min(std::max(v / 6.f + 0.5f, 0.f), 1.f);
    case Activation::kElu: return v >= 0.f ? v : activation_alpha * (std::exp(v) - 1.f);
    case Activation::kSwish: return v / (1.f + std::exp(-activation_alpha * v));
    case Activation::kGelu: return 0.5f * v * (1.f + std::erf(v * 0.70710678118654752f));
    case Activation::kScale: break;  // refused by parse
  }
  return v;
}

Requant make_requant(const ir::Node& node, const QLinearAttrs& q, int64_t channels, const Tensor* bias, float alpha,
                     float beta) {
  const int64_t ws = static_cast<int64_t>(q.w.scale.size());
  if (ws != 1 && ws != channels)
    fail(ErrorKind::kInvalidModel, node.describe() + ": " + std::to_string(ws) + " weight scales for " +
                                       std::to_string(channels) + " output channels");
  if (!(alpha != 0.f) || !std::isfinite(alpha))
    fail(ErrorKind::kUnsupported, node.describe() + ": alpha must be finite and non-zero for integer execution");
  if (q.y_per_channel() && static_cast<int64_t>(q.y.scale.size()) != channels)
    fail(ErrorKind::kInvalidModel, node.describe() + ": " + std::to_string(q.y.scale.size()) +
                                       " output scales (y_channel_scale) for " + std::to_string(channels) +
                                       " output channels");
  Requant r;
  r.per_channel = ws > 1 || q.folds_y_channel_scale();
  r.multiplier.resize(static_cast<size_t>(channels));
  // Activations that need real values get them: 1 / s_y comes after them (make_post_ops); so does a
  // per-channel 1 / s_y[c] that the activation does not commute with.
  const float y_scale = q.quantized_output() && !q.real_units() ? q.y_tensor_scale() : 1.f;
  for (int64_t c = 0; c < channels; ++c) {
    const float acc_scale = alpha * q.x.scale[0] * q.w.scale[ws == 1 ? 0 : c];  // value of one accumulator unit
    r.multiplier[c] = acc_scale / (q.folds_y_channel_scale() ? q.y.scale[c] : y_scale);
    if (bias) r.bias.push_back(beta * bias->data<float>()[c] / acc_scale);
  }
  return r;
}

dnnl::memory::desc channel_multiply_md(const QLinearAttrs& q, int dst_rank) {
  if (dst_rank < 2)
    fail(ErrorKind::kInternal, "a per-channel output scale needs an output of rank >= 2, got " + std::to_string(dst_rank));
  memory::dims dims(static_cast<size_t>(dst_rank), 1);
  dims[1] = static_cast<memory::dim>(q.y.scale.size());
  return memory::desc(dims, dt::f32, plain_tag(dims.size()));
}

int channel_multiply_arg(const QLinearAttrs& q, int dst_rank) {
  return DNNL_ARG_ATTR_MULTIPLE_POST_OP(make_post_ops(q, dst_rank).len() - 1) | DNNL_ARG_SRC_1;
}

dnnl::post_ops make_post_ops_before_channel_multiply(const QLinearAttrs& q) {
  dnnl::post_ops ops;
  const float inv = q.quantized_output() ? 1.f / q.y_tensor_scale() : 1.f;
  float alpha = q.activation_alpha, beta = q.activation_beta;
  if (q.activation == Activation::kClip) {
    // Bounds live in the output's units (v = y / s_y); infinite bounds become the float range.
    alpha = std::isfinite(q.activation_min) ? q.activation_min * inv : -FLT_MAX;
    beta = std::isfinite(q.activation_max) ? q.activation_max * inv : FLT_MAX;
  }
  const float output_zp = q.quantized_output() ? static_cast<float>(q.y_tensor_zero_point()) : 0.f;
  // kScale is refused by QLinearAttrs::parse. Relu, LeakyRelu and Clip run in the output's units
  // (make_requant put 1 / s_y into the output scales); HardSigmoid's steps land in them, zero point
  // included; the others run in real units (make_requant left 1 / s_y out).
  for (const dnnl_kernels::EltwiseStep& e : dnnl_kernels::activation_eltwise_steps(q.activation, alpha, beta, inv, output_zp))
    ops.append_eltwise(1.f, e.alg, e.alpha, e.beta);
  if (q.activation == Activation::kHardSigmoid) return ops;
  // One linear step for the post affine map, 1 / s_y and z_y together (a second eltwise_linear in
  // the chain would run with the first one's parameters, see activation_eltwise_steps).
  using alg = dnnl::algorithm;
  if (q.real_units() && (q.quantized_output() || q.has_post_affine()))
    ops.append_eltwise(1.f, alg::eltwise_linear, q.post_scale * inv, q.post_shift * inv + output_zp);
  else if (output_zp != 0.f) ops.append_eltwise(1.f, alg::eltwise_linear, 1.f, output_zp);
  return ops;
}

dnnl::post_ops make_post_ops(const QLinearAttrs& q, int dst_rank) {
  // A per-channel y has y_scale 1 and z_y 0: real units up to the binary multiply.
  dnnl::post_ops ops = make_post_ops_before_channel_multiply(q);
  if (q.needs_channel_multiply()) ops.append_binary(dnnl::algorithm::binary_mul, channel_multiply_md(q, dst_rank));
  return ops;
}

dnnl::primitive_attr make_attr(const QLinearAttrs& q, const Requant& r, int channel_mask, int dst_rank) {
  dnnl::primitive_attr a;
  a.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  if (r.per_channel) a.set_output_scales(channel_mask, r.multiplier);
  else a.set_output_scales(0, {r.multiplier.at(0)});
  a.set_post_ops(make_post_ops(q, dst_rank));
  return a;
}

dt dnnl_type(DType t) {
  switch (t) {
    case DType::kFloat32: return dt::f32;
    case DType::kUInt8: return dt::u8;
    case DType::kInt8: return dt::s8;
    case DType::kInt32: return dt::s32;
    case DType::kFloat16: return dt::f16;
    default: fail(ErrorKind::kUnsupported, std::string("no oneDNN data type for ") + dtype_name(t));
  }
}

memory::desc plain_md(const Shape& shape, dt type) {
  if (shape.empty()) return memory::desc({1}, type, memory::format_tag::a);
  return memory::desc(to_dnnl_dims(shape), type, plain_tag(shape.size()));
}

memory unbound(const memory::desc& desc) { return memory(desc, dnnl_engine(), DNNL_MEMORY_NONE); }

const memory& PackedConstant::get(const memory::desc& want) {
  for (const auto& [d, m] : packed_)
    if (d == want) return m;
  memory user(user_.dims() == want.dims() ? user_ : user_.reshape(want.dims()), dnnl_engine(),
              const_cast<void*>(source_.raw()));
  memory packed(want, dnnl_engine());
  dnnl::reorder(user, packed).execute(dnnl_stream(), user, packed);
  dnnl_stream().wait();
  packed_.emplace_back(want, std::move(packed));
  return packed_.back().second;
}

void PrimitivePlan::bind_common(const memory::desc& scratchpad, const memory& weights, const memory& bias,
                                int32_t src_zero_point, ZeroPointAt zero_point_at) {
  dnnl::primitive_attr reorder_attr;
  const bool zp_in_reorder = src_zero_point != 0 && zero_point_at == ZeroPointAt::kSrcReorder;
  if (zp_in_reorder) reorder_attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
  const size_t rank = src_user.dims().size();
  const bool plain_integers = (src_user.data_type() == dt::u8 || src_user.data_type() == dt::s8) &&
                              src_user == memory::desc(src_user.dims(), src_user.data_type(), plain_tag(rank));
  if (src_user.data_type() == dt::s8 && src_desc.data_type() == dt::u8 && !zp_in_reorder &&
      dnnl_kernels::same_blocking(Layout{src_desc}, Layout{src_user})) {
    host_src_shift_to_u8 = true;  // the same layout: element i of x is element i of src
  } else if (plain_integers && src_desc == memory::desc(src_user.dims(), dt::f32, plain_tag(rank))) {
    host_src_from = src_user.data_type() == dt::u8 ? DType::kUInt8 : DType::kInt8;
    host_src_zero_point = zp_in_reorder ? src_zero_point : 0;
  } else if (src_user != src_desc || zp_in_reorder) {
    src_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), src_user, dnnl_engine(), src_desc, reorder_attr));
  }
  const memory::desc plain_f32(dst_user.dims(), dt::f32, plain_tag(dst_user.dims().size()));
  const bool quantized_user = dst_user.data_type() == dt::u8 || dst_user.data_type() == dt::s8;
  // Also for a blocked y in the primitive's own blocking (the kF32 convolution handing its layout
  // to the next one): element i of the f32 dst is element i of y, and oneDNN 2.6's f32 -> u8/s8
  // reorder costs more than the vectorised loop.
  const bool same_blocking_f32 =
      quantized_user && dst_desc == dnnl_kernels::retyped_layout(Layout{dst_user}, DType::kFloat32)->desc;
  if (quantized_user && (dst_desc == plain_f32 || same_blocking_f32)) {
    requant_to = dst_user.data_type() == dt::u8 ? DType::kUInt8 : DType::kInt8;
  } else if (dst_desc != dst_user) {
    dst_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), dst_desc, dnnl_engine(), dst_user));
  }
  src_user_mem = unbound(src_user);
  src_mem = src_reorder || host_src_from != DType::kUndefined || host_src_shift_to_u8 ? unbound(src_desc) : src_user_mem;
  dst_user_mem = unbound(dst_user);
  dst_mem = dst_reorder || requant_to != DType::kUndefined ? unbound(dst_desc) : dst_user_mem;
  scratchpad_mem = unbound(scratchpad);
  args = {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, weights}, {DNNL_ARG_DST, dst_mem},
          {DNNL_ARG_SCRATCHPAD, scratchpad_mem}};
  if (bias) args.emplace(DNNL_ARG_BIAS, bias);
  src_reorder_args = {{DNNL_ARG_FROM, src_user_mem}, {DNNL_ARG_TO, src_mem}};
  dst_reorder_args = {{DNNL_ARG_FROM, dst_mem}, {DNNL_ARG_TO, dst_user_mem}};
  if (src_zero_point != 0 && zero_point_at != ZeroPointAt::kNone && host_src_from == DType::kUndefined) {
    zero_point_value = std::make_shared<int32_t>(src_zero_point);
    zero_point_mem = memory({{1}, dt::s32, memory::format_tag::a}, dnnl_engine(), zero_point_value.get());
    (zp_in_reorder ? src_reorder_args : args).emplace(DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, zero_point_mem);
  }
}

bool PrimitivePlan::set_requant_channel_factor(const float* factor) {
  if (requant_to == DType::kUndefined) return false;
  const memory::dims dims = dst_desc.dims();
  if (dims.size() < 3 || dims.size() > 5) return false;
  int64_t inner = 1;
  for (size_t d = 2; d < dims.size(); ++d) inner *= dims[d];
  using tag = memory::format_tag;
  const tag by8[] = {tag::aBc8b, tag::aBcd8b, tag::aBcde8b}, by16[] = {tag::aBc16b, tag::aBcd16b, tag::aBcde16b};
  const tag channels_last[] = {tag::acb, tag::acdb, tag::acdeb};  // one block of all channels
  const size_t r = dims.size() - 3;
  int64_t block = 0;
  if (dst_desc == memory::desc(dims, dt::f32, plain_tag(dims.size()))) block = 1;
  else if (dst_desc == memory::desc(dims, dt::f32, channels_last[r])) block = dims[1];
  else if (dims[1] % 8 == 0 && dst_desc == memory::desc(dims, dt::f32, by8[r])) block = 8;
  else if (dims[1] % 16 == 0 && dst_desc == memory::desc(dims, dt::f32, by16[r])) block = 16;
  if (block == 0) return false;
  requant_channel_factor = factor;
  requant_channels = dims[1];
  requant_inner = inner;
  requant_block = block;
  return true;
}

void PrimitivePlan::bind_runtime_weights(const memory::desc& user, const memory::desc& wanted) {
  weights_user_mem = unbound(user);
  if (user.data_type() == dt::s8 && wanted == memory::desc(user.dims(), dt::f32, plain_tag(user.dims().size())) &&
      user == memory::desc(user.dims(), dt::s8, plain_tag(user.dims().size()))) {
    host_weights_from = DType::kInt8;
    weights_mem = unbound(wanted);
  } else if (user != wanted) {
    weights_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), user, dnnl_engine(), wanted));
    weights_mem = unbound(wanted);
  } else {
    weights_mem = weights_user_mem;
  }
  args[DNNL_ARG_WEIGHTS] = weights_mem;
  weights_reorder_args = {{DNNL_ARG_FROM, weights_user_mem}, {DNNL_ARG_TO, weights_mem}};
}

void PrimitivePlan::bind_sum(const memory::desc& user) {
  has_sum = true;
  if (user != dst_desc) sum_reorder = dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), user, dnnl_engine(), dst_desc));
  sum_user_mem = unbound(user);
  sum_reorder_args = {{DNNL_ARG_FROM, sum_user_mem}, {DNNL_ARG_TO, dst_mem}};
}

void PrimitivePlan::bind_binary_addend(int arg, const memory::desc& user) {
  binary_addend_mem = unbound(user);
  args[arg] = binary_addend_mem;
}

void PrimitivePlan::run(const void* x, void* y, const void* w, const void* sum) {
  dnnl::stream& s = dnnl_stream();
  src_user_mem.set_data_handle(const_cast<void*>(x));
  if (src_reorder) {
    src_mem.set_data_handle(dnnl_scratch(DnnlScratch::kSrc, src_desc.get_size()));
    src_reorder->execute(s, src_reorder_args);
  } else if (host_src_shift_to_u8) {
    auto* u = static_cast<uint8_t*>(dnnl_scratch(DnnlScratch::kSrc, src_desc.get_size()));
    s8_to_shifted_u8(static_cast<const int8_t*>(x), u, static_cast<int64_t>(src_desc.get_size()));
    src_mem.set_data_handle(u);
  } else if (host_src_from != DType::kUndefined) {
    float* f = static_cast<float*>(dnnl_scratch(DnnlScratch::kSrc, src_desc.get_size()));
    integers_to_f32(x, host_src_from, f, static_cast<int64_t>(src_desc.get_size() / sizeof(float)), host_src_zero_point);
    src_mem.set_data_handle(f);
  }
  if (w) {
    weights_user_mem.set_data_handle(const_cast<void*>(w));
    if (host_weights_from != DType::kUndefined) {
      const size_t bytes = weights_mem.get_desc().get_size();
      float* f = static_cast<float*>(dnnl_scratch(DnnlScratch::kWeights, bytes));
      integers_to_f32(w, host_weights_from, f, static_cast<int64_t>(bytes / sizeof(float)), 0);
      weights_mem.set_data_handle(f);
    } else if (weights_reorder) {
      weights_mem.set_data_handle(dnnl_scratch(DnnlScratch::kWeights, weights_mem.get_desc().get_size()));
      weights_reorder->execute(s, weights_reorder_args);
    }
  }
  dst_user_mem.set_data_handle(y);
  const bool separate_dst = dst_reorder || requant_to != DType::kUndefined;
  if (separate_dst) dst_mem.set_data_handle(dnnl_scratch(DnnlScratch::kDst, dst_desc.get_size()));
  if (binary_addend_mem) {
    SQ_CHECK(sum != nullptr, ErrorKind::kInternal, "fused residual addend missing");
    binary_addend_mem.set_data_handle(const_cast<void*>(sum));
  }
  if (has_sum) {
    SQ_CHECK(sum != nullptr, ErrorKind::kInternal, "fused residual addend missing");
    if (sum_reorder) {
      sum_user_mem.set_data_handle(const_cast<void*>(sum));
      sum_reorder->execute(s, sum_reorder_args);
    } else if (dst_mem.get_data_handle() != sum) {
      std::memcpy(dst_mem.get_data_handle(), sum, dst_desc.get_size());
    }
  }
  if (const size_t size = scratchpad_mem.get_desc().get_size(); size > 0)
    scratchpad_mem.set_data_handle(dnnl_scratch(DnnlScratch::kScratchpad, size));
  prim.execute(s, args);
  if (dst_reorder) dst_reorder->execute(s, dst_reorder_args);
  s.wait();
  auto* v = static_cast<float*>(dst_mem.get_data_handle());  // scratch: requantize_f32_per_channel scales it in place
  const auto n = static_cast<int64_t>(dst_desc.get_size() / sizeof(float));
  if (gelu_epilogue) {
    SQ_CHECK(!requant_channel_factor && !dst_reorder, ErrorKind::kInternal, "GELU pass on a reordered dst");
    if (requant_to != DType::kUndefined) ew::gelu_requantize_avx512(v, y, requant_to, n, gelu_scale, gelu_shift);
    else ew::gelu_affine_avx512(v, v, n, gelu_scale, gelu_shift);
  } else if (requant_to != DType::kUndefined && requant_channel_factor)
    requantize_f32_per_channel(v, y, requant_to, n, requant_channel_factor, requant_channels, requant_inner,
                               requant_block);
  else if (requant_to != DType::kUndefined)
    requantize_f32(v, y, requant_to, n);
}

namespace {
// Saturation before rounding, then round half to even (quant_math::saturate_round; NaN gives lo).
// Vectorises.
template <typename T>
void requantize_typed(const float* __restrict v, T* __restrict y, int64_t n, float lo, float hi) {
#pragma omp parallel for if (n > (int64_t{1} << 16)) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(static_cast<int32_t>(quant_math::saturate_round(v[i], lo, hi)));
}
}  // namespace

namespace {
// v[i] *= factor of i's channel, in place (the rounding loop that follows is requantize_typed's).
// Separate from the rounding so that both loops vectorise: GCC keeps the clamp's branches when the
// multiply is in the same loop.
template <int B>  // a compile-time channel block, or 0: `block` at run time
void scale_runs(float* __restrict v, int64_t runs, int64_t block, const float* __restrict factor) {
  const int64_t n = B > 0 ? B : block;
  for (int64_t r = 0; r < runs; ++r)
    for (int64_t b = 0; b < n; ++b) v[r * n + b] *= factor[b];
}

void scale_per_channel(float* v, int64_t n, const float* factor, int64_t channels, int64_t inner, int64_t block) {
  const int64_t blocks = channels / block, outer = n / (channels * inner);
  for (int64_t o = 0; o < outer; ++o)
    for (int64_t cb = 0; cb < blocks; ++cb) {
      const float* f = factor + cb * block;
      float* run = v + (o * blocks + cb) * inner * block;
      if (block == 1) {  // plain: `inner` values of one channel
        const float g = f[0];
        for (int64_t i = 0; i < inner; ++i) run[i] *= g;
      } else if (block == 8) {  // oneDNN's channel blocks: `inner` runs of `block` channels
        scale_runs<8>(run, inner, 8, f);
      } else if (block == 16) {
        scale_runs<16>(run, inner, 16, f);
      } else {
        scale_runs<0>(run, inner, block, f);
      }
    }
}
}  // namespace

void requantize_f32_per_channel(float* v, void* y, DType y_type, int64_t n, const float* factor, int64_t channels,
                                int64_t inner, int64_t block) {
  scale_per_channel(v, n, factor, channels, inner, block);
  requantize_f32(v, y, y_type, n);
}

namespace {
template <typename T>
void integers_to_f32_typed(const T* __restrict x, float* __restrict y, int64_t n, float z) {
#pragma omp parallel for if (n > (int64_t{1} << 16)) schedule(static)
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(x[i]) - z;  // exact: small integers
}
}  // namespace

void integers_to_f32(const void* x, DType x_type, float* y, int64_t n, int32_t zero_point) {
  const float z = static_cast<float>(zero_point);
  if (x_type == DType::kUInt8) integers_to_f32_typed(static_cast<const uint8_t*>(x), y, n, z);
  else integers_to_f32_typed(static_cast<const int8_t*>(x), y, n, z);
}

SQ_AVX512_AVX2_CLONES void s8_to_shifted_u8(const int8_t* __restrict x, uint8_t* __restrict y, int64_t n) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<uint8_t>(x[i]) ^ 0x80;  // two's complement: x + 128
}

bool shifted_u8_source() {
  static const bool on = [] {
    const char* v = std::getenv("SLIMQUANT_S8_SOURCE");
    return !(v && std::string(v) == "keep");
  }();
  return on;
}

void requantize_f32(const float* v, void* y, DType y_type, int64_t n) {
  if (y_type == DType::kUInt8) requantize_typed(v, static_cast<uint8_t*>(y), n, 0.f, 255.f);
  else requantize_typed(v, static_cast<int8_t*>(y), n, -128.f, 127.f);
}

void require_quantized_input(const ir::Node& node, const Tensor& x) {
  if (x.dtype() != DType::kUInt8 && x.dtype() != DType::kInt8)
    fail(ErrorKind::kInvalidArgument, node.describe() + ": input x_q must be uint8 or int8, got " +
                                          dtype_name(x.dtype()));
}

const Tensor& require_constant_weight(const KernelInit& init, size_t index) {
  const Tensor* w = init.node.input(index).empty() ? nullptr : init.constant_input(index);
  if (!w)
    fail(ErrorKind::kUnsupported, init.node.describe() + ": the int8 weight (input " + std::to_string(index) +
                                      ") must be a constant");
  if (w->dtype() != DType::kInt8)
    fail(ErrorKind::kInvalidModel, init.node.describe() + ": the weight must be int8, got " + dtype_name(w->dtype()));
  return *w;
}

const Tensor* constant_bias(const KernelInit& init, size_t index, int64_t channels, const char* what) {
  if (init.node.input(index).empty()) return nullptr;
  const Tensor* b = init.constant_input(index);
  if (!b) fail(ErrorKind::kUnsupported, init.node.describe() + ": " + what + " must be a constant");
  if (b->dtype() != DType::kFloat32)
    fail(ErrorKind::kInvalidModel, init.node.describe() + ": " + what + " must be float32, got " + dtype_name(b->dtype()));
  const bool ok = b->numel() == channels && (b->rank() == 1 || (b->rank() == 2 && b->dim(0) == 1));
  if (!ok)
    fail(ErrorKind::kInvalidModel, init.node.describe() + ": " + what + " of shape " + shape_str(b->shape()) +
                                       " must hold one value per output channel (" + std::to_string(channels) + ")");
  return b;
}

}  // namespace slimquant::runtime::int8
