// INT8 lowering: structure and numbers together. Small QDQ graphs built here are run as float
// simulation and after lowering; each test asserts the node counts the pass must produce and
// compares the outputs, and the fused kernels are checked against the plain-loop integer reference
// (runtime/kernels/integer/int8_reference.h) on the very integers they received.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <tuple>

#include "runtime/fusions/execution_fusions.h"
#include "runtime/kernels/integer/int8_common.h"
#include "runtime/kernels/integer/int8_depthwise.h"
#include "runtime/kernels/integer/int8_reference.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/ptq.h"
#include "quant/int8_test_util.h"
#include "test_util.h"
#include "graph_builder.h"

using namespace slimquant;
using test::count_op;
namespace i8 = runtime::int8;

namespace {


// The nodes that produce `value` and, going up through each one's first input, its producers: at
// most `depth` of them, nearest first.
std::vector<const ir::Node*> producer_chain(const ir::Graph& g, std::string value, size_t depth) {
  std::vector<const ir::Node*> chain;
  while (chain.size() < depth) {
    const int p = g.producer(value);
    if (p < 0) break;
    chain.push_back(&g.nodes[static_cast<size_t>(p)]);
    if (chain.back()->inputs.empty()) break;
    value = chain.back()->inputs[0];
  }
  return chain;
}
std::vector<std::string> op_types(const std::vector<const ir::Node*>& nodes) {
  std::vector<std::string> ops;
  for (const ir::Node* n : nodes) ops.push_back(n->op_type);
  return ops;
}

// Runs `value` through the float simulation (qdq) and the lowered graph on the same feeds; returns
// how many of its 8-bit elements (of type `type` in both) differ by more than one step.
int64_t beyond_one_step_of_simulation(const ir::Graph& qdq, const ir::Graph& lowered,
                                      const std::map<std::string, Tensor>& feeds, const std::string& value,
                                      DType type) {
  runtime::RunOptions want;
  want.outputs = {value};
  runtime::Session sim(qdq), integer(lowered);
  const Tensor qs = sim.run(feeds, want).at(value), qi = integer.run(feeds, want).at(value);
  EXPECT_EQ(qs.dtype(), type);
  EXPECT_EQ(qi.dtype(), type);
  if (qs.dtype() != type || qi.dtype() != type || qs.shape() != qi.shape()) return qs.numel();
  auto at = [&](const Tensor& t, int64_t i) {
    return type == DType::kUInt8 ? int{t.data<uint8_t>()[i]} : int{t.data<int8_t>()[i]};
  };
  int64_t differ = 0;
  for (int64_t i = 0; i < qs.numel(); ++i) differ += std::abs(at(qs, i) - at(qi, i)) > 1;
  return differ;
}

// Codes of two 8-bit tensors (u8 or s8, the same type) that differ: fails for any pair more than
// one step apart. Fused and unfused executions round at near-ties differently, one step at most.
int64_t codes_one_step_apart(const Tensor& a, const Tensor& b, const std::string& what = "") {
  EXPECT_EQ(a.dtype(), b.dtype());
  EXPECT_EQ(a.shape(), b.shape());
  if (a.dtype() != b.dtype() || a.shape() != b.shape()) return a.numel();
  auto at = [](const Tensor& t, int64_t i) {
    return t.dtype() == DType::kUInt8 ? int{t.data<uint8_t>()[i]} : int{t.data<int8_t>()[i]};
  };
  int64_t differ = 0;
  for (int64_t i = 0; i < a.numel(); ++i) {
    const int d = std::abs(at(a, i) - at(b, i));
    EXPECT_LE(d, 1) << what << "[" << i << "]";
    differ += d != 0;
  }
  return differ;
}

// Builds small QDQ graphs the way PTQ exports them: Q/DQ pairs on activations, DQ on int8 weights.
class QdqBuilder {
 public:
  explicit QdqBuilder(uint32_t seed = 7) : rng_(seed) { g_.opset = 13; }

  std::string input(const std::string& name, const Shape& shape) {
    ir::ValueInfo vi{name, DType::kFloat32, std::vector<ir::Dim>{}};
    for (int64_t d : shape) vi.dims->push_back(ir::Dim{d, ""});
    g_.inputs.push_back(vi);
    return name;
  }
  std::string constant(const std::string& base, Tensor t) {
    const std::string name = g_.unique_value_name(base);
    g_.initializers[name] = std::move(t);
    return name;
  }
  std::string node(const std::string& op, std::vector<std::string> inputs, std::map<std::string, ir::AttributeValue> attrs = {}) {
    ir::Node n;
    n.op_type = op;
    n.name = op + "_" + std::to_string(g_.nodes.size());
    n.inputs = std::move(inputs);
    n.outputs = {g_.unique_value_name(n.name + "_out")};
    n.attrs = std::move(attrs);
    g_.value_info[n.outputs[0]] = {n.outputs[0], DType::kUndefined, std::nullopt};  // reserves the name
    g_.nodes.push_back(n);
    return n.outputs[0];
  }
  Tensor zero_point(DType t, int32_t z) {
    return t == DType::kUInt8 ? Tensor::scalar<uint8_t>(static_cast<uint8_t>(z)) : Tensor::scalar<int8_t>(static_cast<int8_t>(z));
  }
  // x -> Q -> DQ with per-tensor parameters; returns the Q and DQ outputs.
  struct QdqValues {
    std::string q, dq;
  };
  QdqValues qdq_values(const std::string& x, float scale, int32_t zp, DType t) {
    const std::string s = constant("s", Tensor::scalar<float>(scale)), z = constant("z", zero_point(t, zp));
    const std::string q = node("QuantizeLinear", {x, s, z});
    return {q, node("DequantizeLinear", {q, s, z})};
  }
  // The same, returning the DQ output only.
  std::string qdq(const std::string& x, float scale, int32_t zp, DType t) { return qdq_values(x, scale, zp, t).dq; }
  // A random int8 weight with per-channel scales along `axis`, zero points `zp`; returns the DQ output.
  std::string weight(const Shape& shape, int64_t axis, int32_t zp = 0, int max_abs = 127) {
    Tensor w(DType::kInt8, shape);
    std::uniform_int_distribution<int> dist(-max_abs, max_abs);
    for (auto& v : w.values<int8_t>()) v = static_cast<int8_t>(dist(rng_));
    const int64_t channels = shape[static_cast<size_t>(axis)];
    std::vector<float> scales(static_cast<size_t>(channels));
    std::uniform_real_distribution<float> sd(0.002f, 0.01f);
    for (auto& s : scales) s = sd(rng_);
    const std::string wq = constant("w", w), s = constant("ws", Tensor::from_vector<float>({channels}, scales));
    const std::string z = constant("wz", Tensor::from_vector<int8_t>({channels}, std::vector<int8_t>(channels, static_cast<int8_t>(zp))));
    return node("DequantizeLinear", {wq, s, z}, {{"axis", axis}});
  }
  std::string bias(int64_t n) {
    Tensor b(DType::kFloat32, {n});
    std::uniform_real_distribution<float> d(-0.5f, 0.5f);
    for (auto& v : b.values<float>()) v = d(rng_);
    return constant("b", b);
  }
  Tensor random_input(const Shape& shape, float lo, float hi) {
    Tensor t(DType::kFloat32, shape);
    std::uniform_real_distribution<float> d(lo, hi);
    for (auto& v : t.values<float>()) v = d(rng_);
    return t;
  }
  ir::Graph finish(const std::string& output) { return finish(std::vector<std::string>{output}); }
  ir::Graph finish(const std::vector<std::string>& outputs) {
    for (const std::string& o : outputs) g_.outputs.push_back({o, DType::kFloat32, std::nullopt});
    g_.value_info.clear();
    g_.validate();
    return g_;
  }

 private:
  ir::Graph g_;
  std::mt19937 rng_;
};

// ---- One table of fused-kernel cases: each builds a group, lowers it, and checks structure,
// parity with the simulation, and kernel == integer reference.

struct KernelCase {
  const char* name;
  const char* op;            // Conv, Gemm, MatMul
  DType x_type;              // activation type
  int32_t x_zp;
  const char* activation;    // "", "Relu", "Clip", or any other fusable ONNX activation
  DType y_type;              // kFloat32: the group has no trailing Q
  int32_t y_zp;
  int64_t group, stride, pad, kernel;  // Conv
  int64_t trans_b;                      // Gemm
  const char* compute;       // "int8" or "f32"
  int64_t size = 9;          // Conv: input height and width
  int weight_max = 127;      // 63: 7-bit weights (weight_bits 7), exact int8 without VNNI too
};

std::string case_name(const ::testing::TestParamInfo<KernelCase>& info) {
  return std::string(info.param.name) + "_" + info.param.compute + (info.param.weight_max <= 63 ? "_w7" : "");
}

class FusedKernel : public ::testing::TestWithParam<KernelCase> {};

TEST_P(FusedKernel, LowersAndMatchesSimulationAndReference) {
  const KernelCase& c = GetParam();
  const bool seven_bit = c.weight_max <= i8::kMaxExactWeightWithoutVnni;
  // kAuto picks the int8 primitives for 7-bit weights on every CPU.
  const bool int8 = std::string(c.compute) == "int8" || (std::string(c.compute) == "auto" && seven_bit);
  if (int8 && !seven_bit && c.x_type == DType::kInt8 && !i8::cpu_has_exact_int8_dot())
    GTEST_SKIP() << "s8 x s8 int8 primitives with 8-bit weights are inexact without VNNI (oneDNN halves the "
                    "weights); Compute::kAuto uses the f32 path there";
  QdqBuilder b;
  const std::string op = c.op;
  // With 8-bit weights unsigned activations stay below 128 so the int8 path is exact on CPUs
  // without VNNI too (vpmaddubsw sums two u8*s8 products in 16 bits: 2*127*127 fits, 2*255*127
  // does not); 7-bit weights take the full u8 range (2*255*63 fits).
  const float u8_top = seven_bit ? 255.f : 127.f;
  const float x_scale = c.x_type == DType::kUInt8 ? 1.f / 127.f : 1.f / 100.f;
  const float x_lo = c.x_type == DType::kUInt8 ? -static_cast<float>(c.x_zp) * x_scale : -1.28f;
  const float x_hi = c.x_type == DType::kUInt8 ? (u8_top - c.x_zp) * x_scale : 1.27f;
  Shape x_shape, w_shape;
  int64_t w_axis = 0, channels = 0;
  std::map<std::string, ir::AttributeValue> attrs;
  if (op == "Conv") {
    const int64_t cin = c.group > 1 ? c.group : 8, cout = c.group > 1 ? c.group : 12;
    x_shape = {2, cin, c.size, c.size};
    w_shape = {cout, cin / c.group, c.kernel, c.kernel};
    channels = cout;
    attrs = {{"group", c.group}, {"strides", std::vector<int64_t>{c.stride, c.stride}},
             {"pads", std::vector<int64_t>{c.pad, c.pad, c.pad, c.pad}}};
  } else if (op == "Gemm") {
    x_shape = {5, 40};
    w_shape = c.trans_b ? Shape{24, 40} : Shape{40, 24};
    w_axis = c.trans_b ? 0 : 1;
    channels = 24;
    attrs = {{"transB", c.trans_b}, {"alpha", 0.75f}, {"beta", 1.5f}};
  } else {
    x_shape = {2, 7, 40};
    w_shape = {40, 24};
    w_axis = 1;
    channels = 24;
  }
  const std::string x = b.input("x", x_shape);
  const std::string xdq = b.qdq(x, x_scale, c.x_zp, c.x_type);
  const std::string w = b.weight(w_shape, w_axis, 0, c.weight_max);
  std::string y = op == "MatMul" ? b.node("MatMul", {xdq, w}) : b.node(op, {xdq, w, b.bias(channels)}, attrs);
  if (op == "MatMul") y = b.node("Add", {b.bias(channels), y});  // PyTorch's order: bias first
  const std::string act = c.activation;
  if (act == "Clip")
    y = b.node("Clip", {y, b.constant("lo", Tensor::scalar<float>(-0.3f)), b.constant("hi", Tensor::scalar<float>(0.6f))});
  else if (act == "LeakyRelu") y = b.node(act, {y}, {{"alpha", 0.1f}});
  else if (act == "HardSigmoid") y = b.node(act, {y}, {{"alpha", 0.25f}, {"beta", 0.4f}});
  else if (act == "Elu") y = b.node(act, {y}, {{"alpha", 0.7f}});
  else if (!act.empty()) y = b.node(act, {y});
  // Activations applied to real values (all but Relu / Clip / LeakyRelu) run as oneDNN's
  // approximations of exp / tanh, not libm's: rarely one rounding step apart from the reference.
  const bool approximated = !act.empty() && act != "Relu" && act != "Clip" && act != "LeakyRelu";
  const bool quantized_out = c.y_type != DType::kFloat32;
  const float y_scale = 0.02f;
  if (quantized_out) y = b.qdq(y, y_scale, c.y_zp, c.y_type);
  ir::Graph g = b.finish(y);

  quant::LoweringOptions lo;
  lo.compute = c.compute;
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, lo, &report);
  // Structure: one fused node; Q stays for the float input, a DQ only for the float graph output.
  ASSERT_EQ(report.lowered(), 1) << (report.skipped.empty() ? "" : report.skipped[0].reason);
  EXPECT_EQ(count_op(lowered, std::string("Q") + op), 1);
  EXPECT_EQ(count_op(lowered, op), 0);
  EXPECT_EQ(count_op(lowered, "QuantizeLinear"), 1);
  EXPECT_EQ(count_op(lowered, "DequantizeLinear"), quantized_out ? 1 : 0);
  EXPECT_EQ(count_op(lowered, "Relu") + count_op(lowered, "Clip") + count_op(lowered, "Add"), 0);
  if (!act.empty()) {
    EXPECT_EQ(count_op(lowered, act), 0) << act << " is fused";
  }
  EXPECT_EQ(lowered.nodes.size(), quantized_out ? 3u : 2u);

  // Numbers: simulation vs integer execution.
  const Tensor input = b.random_input(x_shape, x_lo, x_hi);
  runtime::Session sim(g);
  runtime::Session integer(lowered);
  const Tensor ys = sim.run_single(input), yi = integer.run_single(input);
  ASSERT_EQ(ys.shape(), yi.shape());
  double max_diff = 0;
  int64_t differing = 0;
  for (int64_t i = 0; i < ys.numel(); ++i) {
    const double d = std::fabs(static_cast<double>(ys.data<float>()[i]) - yi.data<float>()[i]);
    max_diff = std::max(max_diff, d);
    differing += d > 1e-6;
  }
  if (quantized_out) {
    // Same integers up to a rare one-step flip where float rounding of the scale products differs.
    EXPECT_LE(max_diff, y_scale * 1.001) << c.name;
    EXPECT_LE(differing, std::max<int64_t>(1, ys.numel() / 100)) << c.name;
  } else {
    double max_abs = 0;
    for (float v : ys.values<float>()) max_abs = std::max(max_abs, static_cast<double>(std::fabs(v)));
    EXPECT_LE(max_diff, 1e-4 * std::max(1.0, max_abs)) << c.name;
  }

  // Kernel vs reference on the same integers: read x_q and the fused output from the session.
  const ir::Node& fused = *std::find_if(lowered.nodes.begin(), lowered.nodes.end(),
                                        [](const ir::Node& n) { return n.domain == i8::kDomain; });
  runtime::RunOptions wanted;
  wanted.outputs = {fused.inputs[0], fused.outputs[0]};
  auto values = integer.run({{"x", input}}, wanted);
  const Tensor& xq = values.at(fused.inputs[0]);
  const Tensor& yq = values.at(fused.outputs[0]);
  const i8::QLinearAttrs q = i8::QLinearAttrs::parse(fused);
  const Tensor& wq = *lowered.initializer(fused.inputs[1]);
  const Tensor* bias = lowered.initializer(fused.inputs.at(2));
  Tensor ref(q.y.dtype, yq.shape());
  if (op == "Conv") {
    const i8::Requant r = i8::make_requant(fused, q, channels, bias);
    i8::ConvProblem p{x_shape[0], x_shape[1], channels, c.group, {c.size, c.size}, {yq.dim(2), yq.dim(3)}, {c.kernel, c.kernel},
                      {c.stride, c.stride}, {1, 1}, {c.pad, c.pad}};
    i8::reference_qconv(q, r, p, xq, wq, ref);
  } else {
    const float alpha = op == "Gemm" ? 0.75f : 1.f, beta = op == "Gemm" ? 1.5f : 1.f;
    const i8::Requant r = i8::make_requant(fused, q, channels, bias, alpha, beta);
    i8::reference_qmatmul(q, r, xq, xq.numel() / x_shape.back(), x_shape.back(), false, wq, channels, c.trans_b != 0,
                          ref);
  }
  // The int8 path computes exactly the reference's float expression; the f32 path folds the
  // multiplier into the weights (conv) so rounding may differ by one step, rarely.
  int64_t mismatches = 0;
  double worst = 0;
  const std::vector<float> a = yq.to_float_vector(), e = ref.to_float_vector();
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - e[i]);
    worst = std::max(worst, d);
    mismatches += d > (quantized_out ? 0.0 : 1e-4 * std::max(1.0, std::fabs(static_cast<double>(e[i]))));
  }
  if (quantized_out) {
    EXPECT_LE(worst, 1.0) << c.name;
    EXPECT_LE(mismatches, int8 && !approximated ? 0 : std::max<int64_t>(1, static_cast<int64_t>(a.size()) / 100))
        << c.name;
  } else if (approximated) {
    EXPECT_LE(worst, 1e-4 * 4) << c.name;  // oneDNN's exp / tanh against libm's
  } else {
    EXPECT_EQ(mismatches, 0) << c.name << " worst " << worst;
  }
}

constexpr DType kU8 = DType::kUInt8, kS8 = DType::kInt8, kF32 = DType::kFloat32;
// name, op, x type, x zp, activation, y type, y zp, group, stride, pad, kernel, transB, compute
#define SQ_KERNEL_CASES(compute)                                                                       \
  KernelCase{"conv3x3_u8_relu_u8", "Conv", kU8, 0, "Relu", kU8, 0, 1, 1, 1, 3, 0, compute},             \
      KernelCase{"conv3x3_u8zp_clip_s8", "Conv", kU8, 9, "Clip", kS8, 3, 1, 1, 1, 3, 0, compute},       \
      KernelCase{"conv3x3_s8_f32", "Conv", kS8, 0, "", kF32, 0, 1, 2, 1, 3, 0, compute},                \
      KernelCase{"conv1x1_u8_u8zp", "Conv", kU8, 0, "", kU8, 17, 1, 1, 0, 1, 0, compute},               \
      KernelCase{"conv1x1_large_u8_clip_u8", "Conv", kU8, 0, "Clip", kU8, 0, 1, 1, 0, 1, 0, compute, 14}, \
      KernelCase{"conv1x1_large_s8_relu_f32", "Conv", kS8, 0, "Relu", kF32, 0, 1, 1, 0, 1, 0, compute, 14}, \
      KernelCase{"dwconv3x3_s8_relu_u8", "Conv", kS8, 0, "Relu", kU8, 0, 16, 2, 1, 3, 0, compute},      \
      /* 64+ channels, 5x5 or 33 columns: the direct depthwise kernel on AVX-512 VNNI (int8_depthwise.h) */ \
      KernelCase{"dwconv5x5_c64_u8zp_hardswish_s8", "Conv", kU8, 7, "HardSwish", kS8, -3, 64, 1, 2, 5, 0, compute}, \
      KernelCase{"dwconv3x3_c80_s8_relu_u8_stride2", "Conv", kS8, 0, "Relu", kU8, 0, 80, 2, 1, 3, 0, compute, 66}, \
      KernelCase{"gemm_u8_transb_f32", "Gemm", kU8, 0, "", kF32, 0, 1, 1, 0, 1, 1, compute},            \
      KernelCase{"gemm_s8_relu_u8", "Gemm", kS8, 0, "Relu", kU8, 0, 1, 1, 0, 1, 0, compute},            \
      KernelCase{"matmul3d_s8_bias_f32", "MatMul", kS8, 0, "", kF32, 0, 1, 1, 0, 1, 0, compute},        \
      KernelCase{"matmul3d_u8zp_bias_clip_s8", "MatMul", kU8, 5, "Clip", kS8, -4, 1, 1, 0, 1, 0, compute},     \
      /* s8 sources with a zero point: the int8 primitives read them as u8 x + 128 (shifted_u8_source) */ \
      KernelCase{"conv1x1_s8zp_u8", "Conv", kS8, -6, "", kU8, 0, 1, 1, 0, 1, 0, compute},                 \
      KernelCase{"matmul3d_s8zp_relu_u8", "MatMul", kS8, 11, "Relu", kU8, 0, 1, 1, 0, 1, 0, compute}

// 7-bit weights (weight_bits 7), full-range u8/s8 activations: the int8 primitives must be exact
// on every CPU, s8 sources included (the kernel doubles the weights oneDNN halves without VNNI).
#define SQ_KERNEL_CASES_W7(compute)                                                                        \
  KernelCase{"conv3x3_u8_relu_u8", "Conv", kU8, 0, "Relu", kU8, 0, 1, 1, 1, 3, 0, compute, 9, 63},          \
      KernelCase{"conv3x3_u8zp_clip_s8", "Conv", kU8, 9, "Clip", kS8, 3, 1, 1, 1, 3, 0, compute, 9, 63},    \
      KernelCase{"conv3x3_s8_f32", "Conv", kS8, 0, "", kF32, 0, 1, 2, 1, 3, 0, compute, 9, 63},             \
      KernelCase{"conv1x1_large_s8_relu_f32", "Conv", kS8, 0, "Relu", kF32, 0, 1, 1, 0, 1, 0, compute, 14, 63}, \
      KernelCase{"dwconv3x3_s8_relu_u8", "Conv", kS8, 0, "Relu", kU8, 0, 16, 2, 1, 3, 0, compute, 9, 63},   \
      KernelCase{"gemm_u8_transb_f32", "Gemm", kU8, 0, "", kF32, 0, 1, 1, 0, 1, 1, compute, 9, 63},         \
      KernelCase{"gemm_s8_relu_u8", "Gemm", kS8, 0, "Relu", kU8, 0, 1, 1, 0, 1, 0, compute, 9, 63},         \
      KernelCase{"matmul3d_s8_bias_f32", "MatMul", kS8, 0, "", kF32, 0, 1, 1, 0, 1, 0, compute, 9, 63},     \
      KernelCase{"matmul3d_u8zp_bias_clip_s8", "MatMul", kU8, 5, "Clip", kS8, -4, 1, 1, 0, 1, 0, compute, 9, 63}, \
      KernelCase{"conv1x1_s8zp_u8", "Conv", kS8, -6, "", kU8, 0, 1, 1, 0, 1, 0, compute, 9, 63},            \
      KernelCase{"matmul3d_s8zp_relu_u8", "MatMul", kS8, 11, "Relu", kU8, 0, 1, 1, 0, 1, 0, compute, 9, 63}

INSTANTIATE_TEST_SUITE_P(Int8, FusedKernel, ::testing::Values(SQ_KERNEL_CASES("int8")), case_name);
INSTANTIATE_TEST_SUITE_P(F32, FusedKernel, ::testing::Values(SQ_KERNEL_CASES("f32")), case_name);
INSTANTIATE_TEST_SUITE_P(Int8W7, FusedKernel, ::testing::Values(SQ_KERNEL_CASES_W7("int8")), case_name);

// Every fusable activation, on a conv with a u8 output (real-valued activations then 1 / s_y) and
// a Gemm with a float one, through both accumulation paths.
#define SQ_ACTIVATION_CASES(compute)                                                                           \
  KernelCase{"conv_hardswish_u8", "Conv", kU8, 0, "HardSwish", kS8, 2, 1, 1, 1, 3, 0, compute, 9, 63},          \
      KernelCase{"conv_sigmoid_u8", "Conv", kS8, 0, "Sigmoid", kU8, 0, 1, 1, 1, 3, 0, compute, 9, 63},          \
      KernelCase{"conv_hardsigmoid_u8", "Conv", kU8, 3, "HardSigmoid", kU8, 5, 1, 1, 1, 3, 0, compute, 9, 63},  \
      KernelCase{"conv_tanh_s8", "Conv", kU8, 0, "Tanh", kS8, 0, 1, 1, 1, 3, 0, compute, 9, 63},                \
      KernelCase{"conv_leakyrelu_s8", "Conv", kS8, 0, "LeakyRelu", kS8, -3, 1, 1, 1, 3, 0, compute, 9, 63},     \
      KernelCase{"dwconv_elu_s8", "Conv", kS8, 0, "Elu", kS8, 0, 16, 1, 1, 3, 0, compute, 9, 63},               \
      KernelCase{"gemm_hardswish_f32", "Gemm", kU8, 0, "HardSwish", kF32, 0, 1, 1, 0, 1, 1, compute, 9, 63},    \
      KernelCase{"matmul3d_sigmoid_u8", "MatMul", kS8, 0, "Sigmoid", kU8, 0, 1, 1, 0, 1, 0, compute, 9, 63},    \
      KernelCase{"conv_gelu_s8", "Conv", kU8, 0, "Gelu", kS8, -20, 1, 1, 1, 3, 0, compute, 9, 63},              \
      KernelCase{"matmul3d_gelu_f32", "MatMul", kS8, 0, "Gelu", kF32, 0, 1, 1, 0, 1, 0, compute, 9, 63},       \
      /* quantized outputs after a Gelu: the AVX-512 pass fused with the rounding (gelu_avx512.h) */        \
      KernelCase{"matmul3d_gelu_u8zp", "MatMul", kS8, 3, "Gelu", kU8, 9, 1, 1, 0, 1, 0, compute, 9, 63},     \
      KernelCase{"gemm_gelu_s8", "Gemm", kU8, 0, "Gelu", kS8, -20, 1, 1, 0, 1, 1, compute, 9, 63}
INSTANTIATE_TEST_SUITE_P(Activations, FusedKernel,
                         ::testing::Values(SQ_ACTIVATION_CASES("int8"), SQ_ACTIVATION_CASES("f32")), case_name);
INSTANTIATE_TEST_SUITE_P(AutoW7, FusedKernel, ::testing::Values(SQ_KERNEL_CASES_W7("auto")), case_name);

TEST(Int8Compute, AutoUsesInt8PrimitivesWhereTheyAreExact) {
  EXPECT_EQ(i8::resolve_compute(i8::Compute::kAuto, 63), i8::Compute::kInt8);
  EXPECT_EQ(i8::resolve_compute(i8::Compute::kAuto, 0), i8::Compute::kInt8);
  const i8::Compute full = i8::cpu_has_exact_int8_dot() ? i8::Compute::kInt8 : i8::Compute::kF32;
  EXPECT_EQ(i8::resolve_compute(i8::Compute::kAuto, 64), full);
  EXPECT_EQ(i8::resolve_compute(i8::Compute::kAuto, 127), full);
  EXPECT_EQ(i8::resolve_compute(i8::Compute::kAuto, -1), full);  // run-time weights
  EXPECT_EQ(i8::resolve_compute(i8::Compute::kF32, 0), i8::Compute::kF32);
  EXPECT_EQ(i8::resolve_compute(i8::Compute::kInt8, 127), i8::Compute::kInt8);
}

// ---- Selector rules: what is left in simulation, and why.

TEST(Lowering, CandidatesThatBreakARuleStayInSimulationWithTheReason) {
  QdqBuilder b;
  const std::string x = b.input("x", {3, 16});
  const std::string xdq = b.qdq(x, 0.01f, 0, kS8);
  // Weight zero point 3: not an s8 symmetric weight.
  const std::string y1 = b.node("Gemm", {xdq, b.weight({16, 8}, 1, 3)});
  // Activation x activation MatMul whose second operand is u8: oneDNN needs s8 there.
  const std::string y1dq = b.qdq(y1, 0.05f, 0, kS8);
  const std::string y2 = b.node("MatMul", {y1dq, b.qdq(b.node("Transpose", {y1}), 0.05f, 0, kU8)});
  ir::Graph g = b.finish(y2);
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  EXPECT_EQ(report.lowered(), 0);
  ASSERT_EQ(report.skipped.size(), 2u);
  EXPECT_NE(report.skipped[0].reason.find("weight zero point must be 0 for s8 weights (got 3)"), std::string::npos)
      << report.skipped[0].reason;
  EXPECT_NE(report.skipped[1].reason.find("not int8 with zero point 0"), std::string::npos) << report.skipped[1].reason;
  EXPECT_EQ(count_op(lowered, "Gemm"), 1);
  EXPECT_EQ(count_op(lowered, "MatMul"), 1);
  // Still runs, as simulation.
  const Tensor in = b.random_input({3, 16}, -1.f, 1.f);
  runtime::Session a(g), c(lowered);
  const Tensor ya = a.run_single(in), yc = c.run_single(in);
  for (int64_t i = 0; i < ya.numel(); ++i) EXPECT_EQ(ya.data<float>()[i], yc.data<float>()[i]);
  // Turning activation x activation lowering off names the option.
  quant::LoweringOptions off;
  off.activation_matmul = false;
  QdqBuilder b2;
  const std::string p = b2.input("p", {2, 4}), q = b2.input("q", {4, 3});
  ir::Graph g2 = b2.finish(b2.node("MatMul", {b2.qdq(p, 0.01f, 0, kS8), b2.qdq(q, 0.01f, 0, kS8)}));
  quant::lower_to_int8(g2, off, &report);
  ASSERT_EQ(report.skipped.size(), 1u);
  EXPECT_NE(report.skipped[0].reason.find("lowering is disabled"), std::string::npos) << report.skipped[0].reason;
}

// Attention-style MatMul of two activations: batched, with a broadcast batch dim, u8 or s8 x s8 -> s8.
// The s8 source (query-like, zero point -5) is read as u8 x + 128 by the int8 primitive.
class ActivationMatMul : public ::testing::TestWithParam<std::tuple<const char*, DType>> {};

TEST_P(ActivationMatMul, LowersWithARunTimeWeightAndMatchesSimulationAndReference) {
  const std::string compute = std::get<0>(GetParam());
  const DType a_type = std::get<1>(GetParam());
  if (a_type == kS8 && compute == "int8" && !i8::cpu_has_exact_int8_dot())
    GTEST_SKIP() << "full-range s8 x s8 products saturate oneDNN's int8 kernels without VNNI (kAuto takes f32 there)";
  QdqBuilder b;
  const std::string a = b.input("a", {2, 3, 5, 8}), w = b.input("w", {1, 3, 8, 6});
  // u8 values stay below 128: exact without VNNI.
  const std::string adq = a_type == kU8 ? b.qdq(a, 1.f / 127.f, 4, kU8) : b.qdq(a, 1.f / 100.f, -5, kS8);
  const std::string wdq = b.qdq(w, 1.f / 100.f, 0, kS8);
  const std::string y = b.qdq(b.node("MatMul", {adq, wdq}), 0.02f, -3, kS8);
  ir::Graph g = b.finish(y);
  quant::LoweringOptions lo;
  lo.compute = compute;
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, lo, &report);
  ASSERT_EQ(report.matmul, 1) << (report.skipped.empty() ? "" : report.skipped[0].reason);
  EXPECT_EQ(count_op(lowered, "QMatMul"), 1);
  EXPECT_EQ(count_op(lowered, "QuantizeLinear"), 2);    // both inputs are float graph inputs
  EXPECT_EQ(count_op(lowered, "DequantizeLinear"), 1);  // the float graph output

  const std::map<std::string, Tensor> feeds = {{"a", a_type == kU8 ? b.random_input({2, 3, 5, 8}, -4.f / 127, 123.f / 127)
                                                                  : b.random_input({2, 3, 5, 8}, -1.2f, 1.3f)},
                                               {"w", b.random_input({1, 3, 8, 6}, -1.f, 1.f)}};
  runtime::Session sim(g), integer(lowered);
  const Tensor ys = sim.run(feeds).at(y), yi = integer.run(feeds).at(y);
  ASSERT_EQ(yi.shape(), (Shape{2, 3, 5, 6}));
  for (int64_t i = 0; i < ys.numel(); ++i) EXPECT_NEAR(ys.data<float>()[i], yi.data<float>()[i], 0.02f * 1.001f);

  const ir::Node& fused = *std::find_if(lowered.nodes.begin(), lowered.nodes.end(),
                                        [](const ir::Node& n) { return n.domain == i8::kDomain; });
  runtime::RunOptions wanted;
  wanted.outputs = {fused.inputs[0], fused.inputs[1], fused.outputs[0]};
  auto v = integer.run(feeds, wanted);
  const i8::QLinearAttrs q = i8::QLinearAttrs::parse(fused);
  Tensor ref(q.y.dtype, v.at(fused.outputs[0]).shape());
  i8::reference_qmatmul_batched(q, i8::make_requant(fused, q, 1, nullptr), v.at(fused.inputs[0]), v.at(fused.inputs[1]),
                                ref);
  const auto got = v.at(fused.outputs[0]).to_int64_vector(), want = ref.to_int64_vector();
  int64_t mismatches = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    EXPECT_LE(std::abs(got[i] - want[i]), 1);
    mismatches += got[i] != want[i];
  }
  // One step apart, rarely, where float rounding of the requantization differs from the reference's
  // (the f32 path; an int8 source with a zero point too, shifted or not).
  EXPECT_LE(mismatches, compute == "int8" && a_type == kU8 ? 0 : 1);
}

INSTANTIATE_TEST_SUITE_P(Compute, ActivationMatMul,
                         ::testing::Combine(::testing::Values("int8", "f32"), ::testing::Values(kU8, kS8)),
                         [](const ::testing::TestParamInfo<std::tuple<const char*, DType>>& info) {
                           return std::string(std::get<0>(info.param)) +
                                  (std::get<1>(info.param) == kU8 ? "_u8" : "_s8");
                         });

TEST(Lowering, GraphWithoutQdqIsLeftAlone) {
  ir::Graph g = ir::load_onnx(test::fixture_model("resnet_small"));
  EXPECT_FALSE(quant::has_qdq_nodes(g));
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  EXPECT_EQ(report.lowered(), 0);
  EXPECT_TRUE(report.skipped.empty());
  EXPECT_EQ(count_op(lowered, "Conv"), 16);
  EXPECT_FALSE(lowered.extra_opsets.count(i8::kDomain));
}

TEST(Lowering, WrongComputeOptionIsAnErrorNamingTheAttribute) {
  QdqBuilder b;
  const std::string x = b.input("x", {2, 8});
  ir::Graph g = b.finish(b.node("Gemm", {b.qdq(x, 0.01f, 0, kS8), b.weight({8, 4}, 1)}));
  quant::LoweringOptions lo;
  lo.compute = "fast";
  try {
    quant::lower_to_int8(g, lo);
    FAIL();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("int8_compute"), std::string::npos) << e.what();
  }
}

// ---- A real PTQ model: every Conv and the Gemm become fused nodes, integers flow between them.

class LoweringOnResnet : public ::testing::Test {
 protected:
  static void SetUpTestSuite() {
    qdq_ = new ir::Graph(test::calibrated_qdq("resnet_small", 64));
  }
  static void TearDownTestSuite() { delete qdq_; }
  static ir::Graph* qdq_;
};
ir::Graph* LoweringOnResnet::qdq_ = nullptr;

TEST_F(LoweringOnResnet, EveryConvAndGemmIsFusedAndIntegersFlowBetweenThem) {
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(*qdq_, {}, &report);
  EXPECT_EQ(report.conv, 16);
  EXPECT_EQ(report.gemm, 1);
  EXPECT_TRUE(report.skipped.empty()) << report.skipped.front().reason;
  EXPECT_EQ(count_op(lowered, "Conv"), 0);
  EXPECT_EQ(count_op(lowered, "Gemm"), 0);
  EXPECT_EQ(count_op(lowered, "QConv"), 16);
  EXPECT_EQ(count_op(lowered, "QGemm"), 1);
  // The stem and each block's first conv end in ReLU -> Q read only by other convs: u8 outputs.
  // The second convs and the shortcuts feed the residual Add (float), and so output float32.
  int u8_out = 0, f32_out = 0;
  for (const auto& n : lowered.nodes)
    if (n.op_type == "QConv") (n.attr_int("y_type", 1) == static_cast<int64_t>(DType::kUInt8) ? u8_out : f32_out)++;
  EXPECT_EQ(u8_out, 7);
  EXPECT_EQ(f32_out, 9);
  std::map<std::string, const ir::Node*> producer;
  for (const auto& n : lowered.nodes) producer[n.outputs[0]] = &n;
  for (const auto& n : lowered.nodes) {
    if (n.op_type == "DequantizeLinear") {
      // Weights are gone from DQ; a DQ left is the boundary into a float op.
      EXPECT_FALSE(lowered.is_initializer(n.inputs[0])) << n.name;
      for (const auto& m : lowered.nodes) {
        if (std::find(m.inputs.begin(), m.inputs.end(), n.outputs[0]) != m.inputs.end()) {
          EXPECT_NE(m.domain, i8::kDomain) << m.name << " reads a dequantized value instead of the integers";
        }
      }
    }
    if (n.op_type == "QuantizeLinear") {
      // A Q left quantizes a float value (graph input or a float op's output), never a fused one's.
      auto it = producer.find(n.inputs[0]);
      if (it != producer.end()) {
        EXPECT_NE(it->second->domain, i8::kDomain) << n.name;
      }
    }
  }
  // One Q per float -> integer boundary: the input, the outputs of the 5 residual blocks that feed
  // convolutions (the last one feeds the pooling) and the pooled features read by the Gemm; one DQ
  // per integer -> float boundary: none (all integer values are read by fused nodes only).
  EXPECT_EQ(report.quantize_kept, 7);
  EXPECT_EQ(report.dequantize_kept, 0);

  // Numbers: the same decisions and logits within the parity bound on a few test images.
  data::DataOptions o;
  o.spec = "fashion-mnist:test";
  o.limit = 128;
  auto ds = data::open_dataset(o);
  const data::Batch batch = data::BatchLoader(*ds, 128).batch(0);
  runtime::Session sim(*qdq_);
  runtime::Session integer = quant::make_int8_session(*qdq_);
  const Tensor ys = sim.run_single(batch.inputs), yi = integer.run_single(batch.inputs);
  EXPECT_EQ(test::last_layer(lowered).op_type, "QGemm");
  const std::vector<float> steps = test::logit_steps(lowered);  // bound explained in int8_parity_test.cpp
  int agree = 0;
  for (int64_t i = 0; i < ys.dim(0); ++i) {
    const float* s = ys.data<float>() + i * 10;
    const float* q = yi.data<float>() + i * 10;
    agree += (std::max_element(s, s + 10) - s) == (std::max_element(q, q + 10) - q);
    for (int c = 0; c < 10; ++c) EXPECT_LE(std::fabs(s[c] - q[c]), 2 * steps[c]) << i << "," << c;
  }
  EXPECT_GE(agree, 127);
}

}  // namespace

namespace {

TEST_F(LoweringOnResnet, LoweredGraphExportsAsCheckedOnnxAndRunsAgain) {
  ir::Graph lowered = quant::lower_to_int8(*qdq_);
  // The com.slimquant schemas are registered with ONNX: the checker and shape inference know them.
  EXPECT_NO_THROW(ir::check_onnx(lowered));
  test::TempDir tmp("lowered");
  ir::save_onnx(lowered, tmp.path("r8.onnx"));
  ir::Graph back = ir::load_onnx(tmp.path("r8.onnx"));
  EXPECT_EQ(count_op(back, "QConv"), 16);
  Tensor input(DType::kFloat32, {4, 1, 28, 28});
  for (int64_t i = 0; i < input.numel(); ++i) input.data<float>()[i] = static_cast<float>(i % 255) / 255.f;
  runtime::Session a(lowered), b(back);
  const Tensor ya = a.run_single(input), yb = b.run_single(input);
  for (int64_t i = 0; i < ya.numel(); ++i) EXPECT_EQ(ya.data<float>()[i], yb.data<float>()[i]);
}

TEST_F(LoweringOnResnet, CliEvaluatesQdqModelsAsIntegerExecutionUnlessSimulateIsGiven) {
  test::TempDir tmp("cli_int8");
  ir::save_onnx(*qdq_, tmp.path("q.onnx"));
  const std::string args = "eval " + tmp.path("q.onnx") + " --dataset fashion-mnist:test --limit 200 --json";
  const auto integer = test::run_cli(args), simulated = test::run_cli(args + " --simulate");
  ASSERT_EQ(integer.exit_code, 0) << integer.output;
  ASSERT_EQ(simulated.exit_code, 0) << simulated.output;
  auto top1 = [](const std::string& out) { return std::stod(out.substr(out.rfind("\"top1\":") + 7)); };
  EXPECT_NEAR(top1(integer.output), top1(simulated.output), 1.0 / 200 + 1e-9);
  const auto bench = test::run_cli("bench " + tmp.path("q.onnx") + " --shape 2x1x28x28 --runs 2 --warmup 1");
  EXPECT_EQ(bench.exit_code, 0) << bench.output;
}

// Every value of one run of `lowered` with its QConvs on `compute`, fused (as sessions run by
// default) or unfused (the reference), cloned from the hook.
std::map<std::string, Tensor> observe_lowered(const ir::Graph& lowered, const char* compute, bool fused,
                                              const std::map<std::string, Tensor>& feeds) {
  ir::Graph g = lowered;
  for (auto& n : g.nodes)
    if (n.op_type == i8::kQConv) n.attrs[i8::attr::kCompute] = std::string(compute);
  runtime::SessionOptions options;
  options.fuse_activations = fused;
  runtime::Session session(g, options);
  std::map<std::string, Tensor> seen;
  runtime::RunOptions o;
  o.on_value = [&](const std::string& name, const Tensor& t) { seen[name] = t.clone(); };
  session.run(feeds, o);
  return seen;
}

// The output of the QuantizeLinear in `g` that reads `value` (empty when none does).
std::string quantized_output_of(const ir::Graph& g, const std::string& value) {
  for (const auto& n : g.nodes)
    if (n.op_type == "QuantizeLinear" && n.inputs[0] == value) return n.outputs[0];
  return {};
}

// Conv -> Add(float residual) -> Clip -> Q(s8, zero point 3) -> DQ -> Conv: at execution the first
// QConv takes the Add, the Clip and the Q and writes the s8 tensor itself.
TEST(Lowering, ResidualAddClipAndSignedQuantizeFoldIntoTheConv) {
  QdqBuilder b;
  const std::string x = b.input("x", {2, 8, 9, 9});
  const std::string xdq = b.qdq(x, 1.f / 127.f, 0, kS8);
  const std::vector<int64_t> pads{1, 1, 1, 1};
  const std::string c = b.node("Conv", {xdq, b.weight({8, 8, 3, 3}, 0), b.bias(8)}, {{"pads", pads}});
  const std::string sum = b.node("Add", {c, x});
  const std::string lo = b.constant("lo", Tensor::scalar<float>(-0.6f)), hi = b.constant("hi", Tensor::scalar<float>(0.9f));
  const std::string clipped = b.node("Clip", {sum, lo, hi});
  const std::string ydq = b.qdq(clipped, 0.006f, 3, kS8);
  const std::string out = b.node("Conv", {ydq, b.weight({4, 8, 3, 3}, 0), b.bias(4)}, {{"pads", pads}});
  const ir::Graph qdq = b.finish(out);
  const ir::Graph lowered = quant::lower_to_int8(qdq);
  ASSERT_EQ(count_op(lowered, "QConv"), 2);
  const std::string quantized = quantized_output_of(lowered, clipped);  // the s8 tensor the first QConv is to write
  ASSERT_FALSE(quantized.empty());
  const Tensor input = b.random_input({2, 8, 9, 9}, -1.f, 1.f);
  for (const char* compute : {"auto", "f32"}) {
    SCOPED_TRACE(compute);
    const auto got = observe_lowered(lowered, compute, true, {{"x", input}});
    const auto want = observe_lowered(lowered, compute, false, {{"x", input}});
    EXPECT_FALSE(got.count(sum));
    EXPECT_FALSE(got.count(clipped));
    const Tensor &a = got.at(quantized), &e = want.at(quantized);
    ASSERT_EQ(a.dtype(), DType::kInt8);
    EXPECT_LE(codes_one_step_apart(a, e), a.numel() / 100);
    // Both ends of the Clip are reached, and the zero point shifts them: -0.6 / 0.006 + 3 = -97.
    const auto [mn, mx] = std::minmax_element(e.data<int8_t>(), e.data<int8_t>() + e.numel());
    EXPECT_EQ(*mn, -97);
    EXPECT_EQ(*mx, 127);
  }
}

// U-Net's residual block (U^2-Net's RSU): Conv -> Relu -> Add(float residual) -> Q -> DQ -> Conv.
// Where the QConv computes on the int8 primitives, it takes the Add after its Relu and the Q
// (relu, then the addend, then the rounding); on the exact f32 path the Add stays a node (oneDNN's
// f32 AVX2 convolutions with an activation before a sum are its reference implementation).
TEST(Lowering, ResidualAddAfterTheActivationFoldsIntoAnInt8Conv) {
  QdqBuilder b;
  const std::string x = b.input("x", {1, 8, 12, 10});
  const std::string xdq = b.qdq(x, 1.f / 255.f, 0, kU8);
  const std::vector<int64_t> pads{1, 1, 1, 1};
  const std::string c = b.node("Conv", {xdq, b.weight({8, 8, 3, 3}, 0), b.bias(8)}, {{"pads", pads}});
  const std::string relu = b.node("Relu", {c});
  const std::string sum = b.node("Add", {relu, x});
  const std::string ydq = b.qdq(sum, 0.01f, 0, kU8);
  const std::string out = b.node("Conv", {ydq, b.weight({4, 8, 3, 3}, 0), b.bias(4)}, {{"pads", pads}});
  const ir::Graph lowered = quant::lower_to_int8(b.finish(out));
  ASSERT_EQ(count_op(lowered, "QConv"), 2);
  const std::string quantized = quantized_output_of(lowered, sum);
  ASSERT_FALSE(quantized.empty());
  const Tensor input = b.random_input({1, 8, 12, 10}, 0.f, 1.f);
  for (const char* compute : {"auto", "f32"}) {
    SCOPED_TRACE(compute);
    const bool int8 = std::string(compute) == "auto" && i8::cpu_has_exact_int8_dot();
    const auto got = observe_lowered(lowered, compute, true, {{"x", input}});
    const auto want = observe_lowered(lowered, compute, false, {{"x", input}});
    // Fused, the QConv's own output (the Relu's) is no value of the run.
    EXPECT_EQ(got.count(relu), int8 ? 0u : 1u);
    const Tensor &a = got.at(quantized), &e = want.at(quantized);
    ASSERT_EQ(a.dtype(), DType::kUInt8);
    EXPECT_LE(codes_one_step_apart(a, e), a.numel() / 100);
    EXPECT_GT(*std::max_element(e.data<uint8_t>(), e.data<uint8_t>() + e.numel()), 100);
  }
}

TEST_F(LoweringOnResnet, ResidualOutputsReadOnlyByAQuantizeAreWrittenAsIntegersByTheirConv) {
  const ir::Graph lowered = quant::lower_to_int8(*qdq_);
  // Relu(Add(QConv, r)) -> Q with no other reader: blocks 1 and 3 (the other blocks' outputs are
  // also the next block's float residual addend, and the last one feeds the pooling).
  auto producer = [&](const std::string& v) -> const ir::Node* {
    const int p = lowered.producer(v);
    return p < 0 ? nullptr : &lowered.nodes[p];
  };
  std::vector<std::string> folded, quantized;
  for (const auto& q : lowered.nodes) {
    if (q.op_type != "QuantizeLinear") continue;
    const ir::Node* relu = producer(q.inputs[0]);
    if (relu && relu->op_type == "Relu" && producer(relu->inputs[0])->op_type == "Add" &&
        lowered.consumers(q.inputs[0]).size() == 1) {
      folded.push_back(q.inputs[0]);
      quantized.push_back(q.outputs[0]);
    }
  }
  ASSERT_EQ(folded.size(), 2u);

  // The int8 primitives (binary-add epilogue) and the exact float path (sum, then the dst reorder).
  for (const char* compute : {"auto", "f32"}) {
    SCOPED_TRACE(compute);
    Tensor input(DType::kFloat32, {8, 1, 28, 28});
    for (int64_t i = 0; i < input.numel(); ++i) input.data<float>()[i] = static_cast<float>((i * 37) % 256) / 255.f;
    const auto got = observe_lowered(lowered, compute, true, {{"input", input}});
    const auto want = observe_lowered(lowered, compute, false, {{"input", input}});
    for (size_t k = 0; k < folded.size(); ++k) {
      EXPECT_FALSE(got.count(folded[k])) << folded[k] << " should not exist: its QConv writes " << quantized[k];
      ASSERT_TRUE(want.count(folded[k]));
      const Tensor &a = got.at(quantized[k]), &b = want.at(quantized[k]);
      ASSERT_EQ(a.dtype(), DType::kUInt8);
      // Q(x) = round(x / s) there, x * (1 / s) here: at most one step apart, and only at near-ties
      // (how many depends on oneDNN's kernels: 18 of 12544 with its AVX2 ones; bound 0.4%).
      EXPECT_LE(codes_one_step_apart(a, b, quantized[k]), a.numel() / 250) << quantized[k];
    }
  }
}

}  // namespace

namespace {
// Conv -> an activation as exporters spell it -> Q/DQ: hard-swish before opset 14 as PyTorch
// writes it (x * HardSigmoid(x; 1/6, 0.5)) and as paddle2onnx does (x * Clip(x + 3, 0, 6) / 6),
// and swish / SiLU (x * Sigmoid(x)).
enum class Spelling { kHardSwishTorch, kHardSwishPaddle, kSwish };

ir::Graph spelled_activation_graph(int32_t weight_zero_point, Spelling spelling) {
  QdqBuilder b;
  const std::string x = b.input("x", {2, 8, 9, 9});
  const std::string xdq = b.qdq(x, 1.f / 127.f, 0, kU8);
  const std::string c = b.node("Conv", {xdq, b.weight({12, 8, 3, 3}, 0, weight_zero_point, 63), b.bias(12)},
                               {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  auto scalar = [&](float v) { return b.constant("k", Tensor::from_vector<float>({}, {v})); };
  std::string y;
  switch (spelling) {
    case Spelling::kHardSwishTorch:
      y = b.node("Mul", {c, b.node("HardSigmoid", {c}, {{"alpha", 1.f / 6.f}, {"beta", 0.5f}})});
      break;
    case Spelling::kHardSwishPaddle: {
      const std::string clip = b.node("Clip", {b.node("Add", {c, scalar(3.f)}), scalar(0.f), scalar(6.f)});
      y = b.node("Div", {b.node("Mul", {c, clip}), scalar(6.f)});
      break;
    }
    case Spelling::kSwish: y = b.node("Mul", {b.node("Sigmoid", {c}), c}); break;
  }
  return b.finish(b.qdq(y, 0.02f, 3, kS8));
}

class SpelledActivationLowering : public ::testing::TestWithParam<Spelling> {};

TEST_P(SpelledActivationLowering, FusesIntoTheConvAndIsRestoredWhereNotLowered) {
  const Spelling spelling = GetParam();
  const bool swish = spelling == Spelling::kSwish;
  const char* gate = swish ? "Sigmoid" : "HardSigmoid";
  const ir::Graph g = spelled_activation_graph(0, spelling);
  quant::LoweringReport report;
  const ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  ASSERT_EQ(report.lowered(), 1);
  for (const char* op : {gate, "Mul", "HardSwish", "Add", "Clip", "Div"}) EXPECT_EQ(count_op(lowered, op), 0) << op;
  const ir::Node& fused = *std::find_if(lowered.nodes.begin(), lowered.nodes.end(),
                                        [](const ir::Node& n) { return n.domain == i8::kDomain; });
  EXPECT_EQ(fused.attr_string(i8::attr::kActivation, ""), swish ? "Swish" : "HardSwish");
  QdqBuilder data(11);
  const Tensor input = data.random_input({2, 8, 9, 9}, 0.f, 2.f);
  const Tensor ys = runtime::Session(g).run_single(input), yi = runtime::Session(lowered).run_single(input);
  int64_t differing = 0;
  for (int64_t i = 0; i < ys.numel(); ++i) {
    const float d = std::fabs(ys.data<float>()[i] - yi.data<float>()[i]);
    EXPECT_LE(d, 0.02f * 1.001f) << i;
    differing += d > 1e-6f;
  }
  EXPECT_LE(differing, ys.numel() / 100);

  // A Conv that cannot be lowered (weight zero point 3) keeps a standard gate + Mul (opset 13).
  const ir::Graph kept = quant::lower_to_int8(spelled_activation_graph(3, spelling), {}, &report);
  EXPECT_EQ(report.lowered(), 0);
  EXPECT_EQ(count_op(kept, "HardSwish"), 0);
  EXPECT_EQ(count_op(kept, gate), 1);
  EXPECT_EQ(count_op(kept, "Mul"), 1);
  for (const auto& n : kept.nodes) EXPECT_TRUE(n.domain.empty()) << n.describe();
  const Tensor yk = runtime::Session(kept).run_single(input);
  const Tensor yo = runtime::Session(spelled_activation_graph(3, spelling)).run_single(input);
  for (int64_t i = 0; i < yo.numel(); ++i) EXPECT_NEAR(yk.data<float>()[i], yo.data<float>()[i], 1e-6f) << i;
}
INSTANTIATE_TEST_SUITE_P(Lowering, SpelledActivationLowering,
                         ::testing::Values(Spelling::kHardSwishTorch, Spelling::kHardSwishPaddle, Spelling::kSwish),
                         [](const auto& info) {
                           return std::string(info.param == Spelling::kSwish            ? "Swish"
                                              : info.param == Spelling::kHardSwishTorch ? "HardSwishTorch"
                                                                                        : "HardSwishPaddle");
                         });
}  // namespace

namespace {
// Runs the QDQ graph as simulation and lowered, and checks the lowered outputs agree to within one
// output quantization step.
void expect_lowered_matches_simulation(const ir::Graph& g, const ir::Graph& lowered, const std::string& y,
                                       const std::map<std::string, Tensor>& feeds, float step) {
  runtime::Session sim(g), integer(lowered);
  const Tensor ys = sim.run(feeds).at(y), yi = integer.run(feeds).at(y);
  ASSERT_EQ(ys.shape(), yi.shape());
  int64_t off_by_one = 0;
  for (int64_t i = 0; i < ys.numel(); ++i) {
    const float d = std::fabs(ys.data<float>()[i] - yi.data<float>()[i]);
    EXPECT_LE(d, step * 1.001f) << "element " << i;
    off_by_one += d > step * 0.5f;
  }
  EXPECT_LE(off_by_one, ys.numel() / 20) << "most outputs must be identical";
}
}  // namespace

// Attention scores as PyTorch exports them: (Q K^T) * (1 / sqrt d). The scalar Mul becomes a factor
// of the QMatMul's output scale instead of a float pass over the scores.
TEST(Lowering, ScalarMulAfterAttentionMatMulFoldsIntoTheOutputScale) {
  QdqBuilder b;
  const std::string a = b.input("a", {2, 5, 8}), w = b.input("w", {2, 8, 5});
  const std::string mm = b.node("MatMul", {b.qdq(a, 1.f / 64.f, 0, kS8), b.qdq(w, 1.f / 64.f, 0, kS8)});
  const std::string scaled = b.node("Mul", {mm, b.constant("inv_sqrt_d", Tensor::scalar<float>(0.35355339f))});
  const float step = 0.004f;
  const std::string y = b.qdq(scaled, step, 0, kS8);
  ir::Graph g = b.finish(y);
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  ASSERT_EQ(report.matmul, 1) << (report.skipped.empty() ? "" : report.skipped[0].reason);
  EXPECT_EQ(count_op(lowered, "Mul"), 0);
  EXPECT_EQ(count_op(lowered, "QMatMul"), 1);
  expect_lowered_matches_simulation(g, lowered, y, {{"a", b.random_input({2, 5, 8}, -1.f, 1.f)},
                                                    {"w", b.random_input({2, 8, 5}, -1.f, 1.f)}}, step);

  // A negative factor would flip the sign of the output scale: it stays a float Mul.
  QdqBuilder n;
  const std::string na = n.input("a", {2, 5, 8}), nw = n.input("w", {2, 8, 5});
  const std::string nmm = n.node("MatMul", {n.qdq(na, 1.f / 64.f, 0, kS8), n.qdq(nw, 1.f / 64.f, 0, kS8)});
  ir::Graph ng = n.finish(n.qdq(n.node("Mul", {nmm, n.constant("neg", Tensor::scalar<float>(-0.5f))}), step, 0, kS8));
  EXPECT_EQ(count_op(quant::lower_to_int8(ng), "Mul"), 1);
}

// A transformer MLP's first layer: MatMul + bias + the erf GELU chain PyTorch exports before
// opset 20 (Div, Erf, Add, Mul, Mul) run as one QMatMul with a GELU post-op and an integer output.
TEST(Lowering, ErfGeluAfterMatMulBecomesTheFusedActivation) {
  QdqBuilder b;
  const std::string x = b.input("x", {3, 4, 16});
  const std::string mm = b.node("MatMul", {b.qdq(x, 1.f / 64.f, 0, kS8), b.weight({16, 12}, 1)});
  const std::string biased = b.node("Add", {mm, b.bias(12)});
  const std::string div = b.node("Div", {biased, b.constant("sqrt2", Tensor::scalar<float>(std::sqrt(2.f)))});
  const std::string erf = b.node("Erf", {div});
  const std::string one = b.node("Add", {erf, b.constant("one", Tensor::scalar<float>(1.f))});
  const std::string mul = b.node("Mul", {biased, one});
  const std::string gelu = b.node("Mul", {mul, b.constant("half", Tensor::scalar<float>(0.5f))});
  const float step = 0.003f;
  const std::string y = b.qdq(gelu, step, -100, kS8);
  ir::Graph g = b.finish(y);
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  ASSERT_EQ(report.matmul, 1) << (report.skipped.empty() ? "" : report.skipped[0].reason);
  for (const char* op : {"Erf", "Div", "Add", "Mul"}) EXPECT_EQ(count_op(lowered, op), 0) << op;
  const ir::Node& fused = *std::find_if(lowered.nodes.begin(), lowered.nodes.end(),
                                        [](const ir::Node& n) { return n.op_type == "QMatMul"; });
  const i8::QLinearAttrs q = i8::QLinearAttrs::parse(fused);
  EXPECT_EQ(q.activation, i8::Activation::kGelu);
  EXPECT_EQ(q.y.dtype, DType::kInt8);
  expect_lowered_matches_simulation(g, lowered, y, {{"x", b.random_input({3, 4, 16}, -1.f, 1.f)}}, step);
}

// ResNet-style stem without a residual reader: Conv -> Relu -> MaxPool -> Q. The Q moves before
// the pool (quantization is monotonic, so the swap itself is exact), ends the conv's group, and
// the pool runs on uint8: its output matches the simulation's to the conv's one-step rounding.
// A transformer's q/k/v projection: MatMul -> Add(bias) -> Reshape -> Transpose -> Q. The Q climbs
// both data-movement ops, ends the MatMul's group (integer output) and the two ops move bytes.
TEST(Lowering, QuantizeCommutesThroughReshapeAndTransposeIntoTheMatMul) {
  QdqBuilder b;
  const std::string x = b.input("x", {2, 6, 16});
  const std::string mm = b.node("MatMul", {b.qdq(x, 1.f / 64.f, 0, kS8), b.weight({16, 16}, 1)});
  const std::string biased = b.node("Add", {mm, b.bias(16)});
  const std::string shape = b.constant("shape", Tensor::from_vector<int64_t>({4}, {2, 6, 4, 4}));
  const std::string heads = b.node("Reshape", {biased, shape});
  const std::string moved = b.node("Transpose", {heads}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
  const auto [q, y] = b.qdq_values(moved, 0.02f, -2, kS8);
  ir::Graph g = b.finish(y);
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  ASSERT_EQ(report.matmul, 1);
  EXPECT_EQ(report.quantize_kept, 1);  // the model input's only
  // q is now written by the Transpose, which reads the Reshape, which reads the QMatMul's int8.
  const auto chain = producer_chain(lowered, q, 3);
  ASSERT_EQ(op_types(chain), (std::vector<std::string>{"Transpose", "Reshape", "QMatMul"}));
  EXPECT_EQ(i8::QLinearAttrs::parse(*chain[2]).y.dtype, DType::kInt8);

  const std::map<std::string, Tensor> feeds = {{"x", b.random_input({2, 6, 16}, -1.f, 1.f)}};
  // Within one step: int8 accumulation vs float simulation.
  EXPECT_EQ(beyond_one_step_of_simulation(g, lowered, feeds, q, DType::kInt8), 0);
}

// PyTorch's attention query: projection -> Reshape -> Transpose -> Div(sqrt d) -> Q. The Div goes
// into the Q's scale (s * 8), the Q then climbs to the QMatMul, and the codes stand for q / 8 as
// the simulation's do. A Mul by 1/8 the same.
TEST(Lowering, ScalarDivBeforeAQuantizeGoesIntoItsScaleAndTheQuantizeClimbs) {
  for (const char* op : {"Div", "Mul"}) {
    QdqBuilder b;
    const std::string x = b.input("x", {2, 6, 16});
    const std::string mm = b.node("MatMul", {b.qdq(x, 1.f / 64.f, 0, kS8), b.weight({16, 16}, 1)});
    const std::string biased = b.node("Add", {mm, b.bias(16)});
    const std::string shape = b.constant("shape", Tensor::from_vector<int64_t>({4}, {2, 6, 4, 4}));
    const std::string moved =
        b.node("Transpose", {b.node("Reshape", {biased, shape})}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
    const float k = op == std::string("Div") ? 8.f : 0.125f;
    const std::string scaled = b.node(op, {moved, b.constant("k", Tensor::scalar<float>(k))});
    const auto [q, y] = b.qdq_values(scaled, 0.0025f, 3, kS8);
    ir::Graph g = b.finish(y);
    quant::LoweringReport report;
    ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
    ASSERT_EQ(report.matmul, 1) << op;
    EXPECT_EQ(count_op(lowered, op), 0) << op;
    EXPECT_EQ(report.quantize_kept, 1) << op;  // the model input's only
    const auto chain = producer_chain(lowered, q, 3);
    ASSERT_EQ(op_types(chain), (std::vector<std::string>{"Transpose", "Reshape", "QMatMul"})) << op;
    const i8::QLinearAttrs attrs = i8::QLinearAttrs::parse(*chain[2]);
    EXPECT_EQ(attrs.y.dtype, DType::kInt8);
    ASSERT_EQ(attrs.y.scale.size(), 1u);
    EXPECT_FLOAT_EQ(attrs.y.scale[0], 0.0025f * 8.f) << op;
    EXPECT_EQ(attrs.y.zero_point.at(0), 3);
    const std::map<std::string, Tensor> feeds = {{"x", b.random_input({2, 6, 16}, -1.f, 1.f)}};
    EXPECT_EQ(beyond_one_step_of_simulation(g, lowered, feeds, q, DType::kInt8), 0) << op;
  }

}

// The whole of PyTorch's attention input: one projection with per-column weights [16, 48] and a
// bias, cut into q / k / v by Slices of the last axis, each split into heads (q also divided by
// sqrt(d)) and quantized. Each part becomes its own QMatMul on its 16 columns that writes int8:
// no Slice, no Div and no QuantizeLinear pass is left, and every code is within one step of the
// simulation's.
TEST(Lowering, PackedProjectionCutIntoQKVBecomesThreeQMatMulsWithIntegerOutputs) {
  QdqBuilder b;
  const std::string x = b.input("x", {2, 6, 16});
  const std::string mm = b.node("MatMul", {b.qdq(x, 1.f / 64.f, 0, kS8), b.weight({16, 48}, 1)});
  const std::string biased = b.node("Add", {b.bias(48), mm});
  auto ints = [&](const char* name, int64_t v) { return b.constant(name, Tensor::from_vector<int64_t>({1}, {v})); };
  const std::string shape = b.constant("shape", Tensor::from_vector<int64_t>({4}, {2, 6, 4, 4}));
  std::vector<std::string> codes, outputs;
  for (int64_t part = 0; part < 3; ++part) {
    const std::string cut = b.node("Slice", {biased, ints("start", part * 16), ints("end", part * 16 + 16), ints("axis", -1)});
    std::string heads = b.node("Transpose", {b.node("Reshape", {cut, shape})}, {{"perm", std::vector<int64_t>{0, 2, 1, 3}}});
    if (part == 0) heads = b.node("Div", {heads, b.constant("sqrt_d", Tensor::scalar<float>(2.f))});
    const auto [q, dq] = b.qdq_values(heads, 0.02f, static_cast<int32_t>(part), kS8);
    codes.push_back(q);
    outputs.push_back(dq);
  }
  ir::Graph g = b.finish(outputs);
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  EXPECT_EQ(report.matmul, 3);
  EXPECT_EQ(report.quantize_kept, 1);  // the model input's only
  for (const char* op : {"Slice", "Div", "MatMul", "Add"}) EXPECT_EQ(count_op(lowered, op), 0) << op;
  const std::map<std::string, Tensor> feeds = {{"x", b.random_input({2, 6, 16}, -1.f, 1.f)}};
  for (const std::string& q : codes) {
    const auto chain = producer_chain(lowered, q, 3);
    ASSERT_EQ(op_types(chain), (std::vector<std::string>{"Transpose", "Reshape", "QMatMul"})) << q;
    EXPECT_EQ(beyond_one_step_of_simulation(g, lowered, feeds, q, DType::kInt8), 0) << q;
  }
}

// A negative divisor would flip the sign of the Q's scale: it stays a float Div.
TEST(Lowering, NegativeDivisorBeforeAQuantizeStaysAFloatDiv) {
  QdqBuilder n;
  const std::string x = n.input("x", {2, 6, 16});
  const std::string mm = n.node("MatMul", {n.qdq(x, 1.f / 64.f, 0, kS8), n.weight({16, 16}, 1)});
  const std::string moved = n.node("Transpose", {mm}, {{"perm", std::vector<int64_t>{1, 0, 2}}});
  const std::string scaled = n.node("Div", {moved, n.constant("k", Tensor::scalar<float>(-8.f))});
  ir::Graph ng = n.finish(n.qdq(scaled, 0.0025f, 0, kS8));
  EXPECT_EQ(count_op(quant::lower_to_int8(ng), "Div"), 1);
}

TEST(Lowering, QuantizeCommutesThroughMaxPoolAndThePoolRunsOnIntegers) {
  QdqBuilder b;
  const std::string x = b.input("x", {2, 3, 10, 10});
  const std::string conv = b.node("Conv", {b.qdq(x, 1.f / 64.f, 0, kS8), b.weight({8, 3, 3, 3}, 0), b.bias(8)},
                                  {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const std::string pool = b.node("MaxPool", {b.node("Relu", {conv})},
                                  {{"kernel_shape", std::vector<int64_t>{3, 3}}, {"strides", std::vector<int64_t>{2, 2}},
                                   {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const auto [pooled_q, y] = b.qdq_values(pool, 0.01f, 0, kU8);
  ir::Graph g = b.finish(y);
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  ASSERT_EQ(report.conv, 1);
  EXPECT_EQ(report.quantize_kept, 1);  // the model input's only
  // pooled_q is now written by the MaxPool, which reads the QConv's uint8.
  const auto chain = producer_chain(lowered, pooled_q, 2);
  ASSERT_EQ(op_types(chain), (std::vector<std::string>{"MaxPool", "QConv"}));
  EXPECT_EQ(i8::QLinearAttrs::parse(*chain[1]).y.dtype, DType::kUInt8);

  const std::map<std::string, Tensor> feeds = {{"x", b.random_input({2, 3, 10, 10}, -1.f, 1.f)}};
  // Within one step: the conv's int8 accumulation vs float simulation.
  EXPECT_EQ(beyond_one_step_of_simulation(g, lowered, feeds, pooled_q, DType::kUInt8), 0);
}

// SqueezeNet's fire module: two convs -> Concat -> Q. The Q is applied to each input instead (the
// same elementwise map), each conv then writes uint8 itself and the concat copies bytes.
TEST(Lowering, QuantizeCommutesThroughConcatIntoEachProducingConv) {
  QdqBuilder b;
  const std::string x = b.input("x", {2, 4, 6, 6});
  const std::string xdq = b.qdq(x, 1.f / 64.f, 0, kS8);
  const std::string left = b.node("Relu", {b.node("Conv", {xdq, b.weight({5, 4, 1, 1}, 0), b.bias(5)})});
  const std::string right = b.node("Relu", {b.node("Conv", {xdq, b.weight({3, 4, 3, 3}, 0), b.bias(3)},
                                                   {{"pads", std::vector<int64_t>{1, 1, 1, 1}}})});
  const std::string cat = b.node("Concat", {left, right}, {{"axis", int64_t{1}}});
  const auto [cat_q, y] = b.qdq_values(cat, 0.01f, 0, kU8);
  ir::Graph g = b.finish(y);
  quant::LoweringReport report;
  ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  ASSERT_EQ(report.conv, 2);
  EXPECT_EQ(report.quantize_kept, 1);  // the model input's only
  for (const auto& n : lowered.nodes)
    if (n.op_type == "QConv") {
      EXPECT_EQ(i8::QLinearAttrs::parse(n).y.dtype, DType::kUInt8) << n.name;
    }

  const std::map<std::string, Tensor> feeds = {{"x", b.random_input({2, 4, 6, 6}, -1.f, 1.f)}};
  runtime::RunOptions want;
  want.outputs = {cat_q};
  runtime::Session sim(g), integer(lowered);
  const Tensor qs = sim.run(feeds, want).at(cat_q), qi = integer.run(feeds, want).at(cat_q);
  ASSERT_EQ(qi.dtype(), DType::kUInt8);
  ASSERT_EQ(qs.shape(), (Shape{2, 8, 6, 6}));
  ASSERT_EQ(qi.shape(), qs.shape());
  int64_t differ = 0;
  for (int64_t i = 0; i < qs.numel(); ++i) differ += std::abs(qs.data<uint8_t>()[i] - qi.data<uint8_t>()[i]) > 1;
  EXPECT_EQ(differ, 0);
}

namespace {
// PPLCNetV3's block as PTQ exports it once the affine pair before the activation is folded into
// the Conv: Conv -> hard-swish (paddle2onnx's spelling) -> Mul(scalar) -> Add(scalar) -> Q/DQ.
ir::Graph hardswish_affine_graph(float post_scale, float post_shift, bool with_mul, bool with_add) {
  QdqBuilder b;
  const std::string x = b.input("x", {2, 8, 9, 9});
  const std::string xdq = b.qdq(x, 1.f / 127.f, 0, kU8);
  const std::string c = b.node("Conv", {xdq, b.weight({12, 8, 3, 3}, 0, 0, 63), b.bias(12)},
                               {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  auto scalar = [&](float v) { return b.constant("k", Tensor::from_vector<float>({}, {v})); };
  const std::string clip = b.node("Clip", {b.node("Add", {c, scalar(3.f)}), scalar(0.f), scalar(6.f)});
  std::string y = b.node("Div", {b.node("Mul", {c, clip}), scalar(6.f)});
  // paddle2onnx writes the constant first in the Mul and as a [1] tensor.
  if (with_mul) y = b.node("Mul", {b.constant("s", Tensor::from_vector<float>({1}, {post_scale})), y});
  if (with_add) y = b.node("Add", {y, b.constant("t", Tensor::from_vector<float>({1}, {post_shift}))});
  return b.finish(b.qdq(y, 0.02f, 3, kS8));
}
}  // namespace

// The scalar Mul / Add after the hard-swish become the QConv's post affine map (one linear post-op
// with the requantization): no float pass is left, and the integer output stays within one step
// of the simulation, also for a negative scale.
TEST(Lowering, ScalarAffineAfterHardSwishBecomesThePostAffineMapOfTheQConv) {
  struct Case {
    float scale, shift;
    bool mul, add;
  };
  for (const Case& k : {Case{0.42f, -0.08f, true, true}, Case{-1.3f, 0.25f, true, true}, Case{0.7f, 0.f, true, false},
                        Case{1.f, -0.3f, false, true}}) {
    SCOPED_TRACE(std::to_string(k.scale) + " " + std::to_string(k.shift));
    const ir::Graph g = hardswish_affine_graph(k.scale, k.shift, k.mul, k.add);
    quant::LoweringReport report;
    const ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
    ASSERT_EQ(report.conv, 1) << (report.skipped.empty() ? "" : report.skipped[0].reason);
    for (const char* op : {"Mul", "Add", "Clip", "Div", "HardSwish"}) EXPECT_EQ(count_op(lowered, op), 0) << op;
    EXPECT_EQ(count_op(lowered, "QuantizeLinear"), 1);  // the input's; the output's is the QConv's
    const ir::Node& fused = *std::find_if(lowered.nodes.begin(), lowered.nodes.end(),
                                          [](const ir::Node& n) { return n.op_type == "QConv"; });
    const i8::QLinearAttrs q = i8::QLinearAttrs::parse(fused);
    EXPECT_EQ(q.activation, i8::Activation::kHardSwish);
    EXPECT_FLOAT_EQ(q.post_scale, k.mul ? k.scale : 1.f);
    EXPECT_FLOAT_EQ(q.post_shift, k.add ? k.shift : 0.f);
    EXPECT_EQ(q.y.dtype, DType::kInt8);
    QdqBuilder data(5);
    expect_lowered_matches_simulation(g, lowered, g.outputs[0].name, {{"x", data.random_input({2, 8, 9, 9}, 0.f, 2.f)}},
                                      0.02f);
  }
}

// The reference kernel (the fallback where oneDNN has no primitive) applies the same map.
TEST(Int8Reference, PostAffineMapFollowsTheRealUnitsActivation) {
  i8::QLinearAttrs q;
  q.x.scale = {1.f};
  q.w.scale = {1.f};
  q.activation = i8::Activation::kHardSwish;
  q.post_scale = -2.f;
  q.post_shift = 0.5f;
  q.y.dtype = DType::kInt8;
  q.y.scale = {0.25f};
  i8::Requant r;
  r.multiplier = {1.f};
  const i8::OutputStage stage(q, r);
  // hardswish(2) = 2 * 5/6; * -2 + 0.5 = -2.8333; / 0.25 = -11.333
  EXPECT_NEAR(stage.value(2, 0), (2.f * 5.f / 6.f * -2.f + 0.5f) / 0.25f, 1e-5f);
  // Needs a real-units activation: a Relu with a post map is refused.
  ir::Node n;
  n.op_type = "QConv";
  n.domain = i8::kDomain;
  q.activation = i8::Activation::kRelu;
  q.write(n);
  EXPECT_THROW(i8::QLinearAttrs::parse(n), Error);
}

namespace {
// Conv [-> activation [-> Mul -> Add]] -> QuantizeLinear per output channel (axis 1, zero point 0)
// -> DequantizeLinear(scale 1): the channel-wise input of a next convolution
// (PTQ::set_channel_wise_conv_inputs), here read as the integers themselves.
enum class ChannelWiseTail { kNone, kRelu, kClip, kHardSwishAffine };
ir::Graph conv_to_channel_wise_quantize(ChannelWiseTail tail, DType y_type) {
  QdqBuilder b(11);
  const std::string x = b.input("x", {2, 8, 9, 9});
  // 7-bit weights: the int8 primitives are exact on every CPU (int8_common.h).
  const std::string c = b.node("Conv", {b.qdq(x, 1.f / 127.f, 0, kU8), b.weight({12, 8, 3, 3}, 0, 0, 63), b.bias(12)},
                               {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  auto scalar = [&](float v) { return b.constant("k", Tensor::from_vector<float>({}, {v})); };
  std::string y = c;
  if (tail == ChannelWiseTail::kRelu) y = b.node("Relu", {c});
  if (tail == ChannelWiseTail::kClip) y = b.node("Clip", {c, scalar(-0.1f), scalar(0.15f)});
  if (tail == ChannelWiseTail::kHardSwishAffine) {
    const std::string clip = b.node("Clip", {b.node("Add", {c, scalar(3.f)}), scalar(0.f), scalar(6.f)});
    y = b.node("Div", {b.node("Mul", {c, clip}), scalar(6.f)});
    y = b.node("Mul", {b.constant("s", Tensor::from_vector<float>({1}, {-0.8f})), y});
    y = b.node("Add", {y, b.constant("t", Tensor::from_vector<float>({1}, {0.05f}))});
  }
  // Scales 0.01 to 0.34: channels land on very different grids.
  std::vector<float> scales(12);
  for (size_t m = 0; m < scales.size(); ++m) scales[m] = 0.01f * static_cast<float>(1 << (m % 5)) * (1.f + 0.1f * m);
  const std::string s = b.constant("ys", Tensor::from_vector<float>({12}, scales));
  const std::string z = b.constant("yz", y_type == kU8 ? Tensor(kU8, {12}) : Tensor(kS8, {12}));
  const std::string q = b.node("QuantizeLinear", {y, s, z}, {{"axis", int64_t{1}}});
  return b.finish(b.node("DequantizeLinear", {q, b.constant("one", Tensor::scalar<float>(1.f)),
                                              b.constant("z0", b.zero_point(y_type, 0))}));
}
}  // namespace

// A QuantizeLinear per output channel after a QConv folds into it (y_channel_scale): the QConv
// writes the integers, no QuantizeLinear pass is left for that tensor, and every compute path
// (int8 primitives, the exact f32 path, the plain-loop reference) gives the simulation's integers
// up to rare one-step ties. Relu folds 1 / s_y[m] into the output scales; Clip and the hard-swish
// with its affine map multiply by it after the activation.
TEST(Lowering, PerChannelQuantizeAfterConvFoldsIntoTheQConv) {
  for (const ChannelWiseTail tail :
       {ChannelWiseTail::kNone, ChannelWiseTail::kRelu, ChannelWiseTail::kClip, ChannelWiseTail::kHardSwishAffine})
    for (const DType y_type : {kU8, kS8})
      for (const char* compute : {"auto", "int8", "f32"}) {
        SCOPED_TRACE(std::to_string(static_cast<int>(tail)) + " " + dtype_name(y_type) + " " + compute);
        const ir::Graph g = conv_to_channel_wise_quantize(tail, y_type);
        quant::LoweringOptions options;
        options.compute = compute;
        quant::LoweringReport report;
        const ir::Graph lowered = quant::lower_to_int8(g, options, &report);
        ASSERT_EQ(report.conv, 1) << (report.skipped.empty() ? "" : report.skipped[0].reason);
        EXPECT_EQ(count_op(lowered, "QuantizeLinear"), 1);  // x's only
        const ir::Node& fused = *std::find_if(lowered.nodes.begin(), lowered.nodes.end(),
                                              [](const ir::Node& n) { return n.op_type == "QConv"; });
        const i8::QLinearAttrs q = i8::QLinearAttrs::parse(fused);
        EXPECT_EQ(q.y.dtype, y_type);
        ASSERT_EQ(q.y.scale.size(), 12u);
        EXPECT_FLOAT_EQ(q.y.scale[3], 0.01f * 8.f * 1.3f);
        EXPECT_EQ(q.folds_y_channel_scale(), tail == ChannelWiseTail::kNone || tail == ChannelWiseTail::kRelu);
        QdqBuilder data(5);
        const Tensor input = data.random_input({2, 8, 9, 9}, 0.f, 2.f);
        expect_lowered_matches_simulation(g, lowered, g.outputs[0].name, {{"x", input}}, 1.f);

        // The reference kernel on the session's integers.
        runtime::Session integer(lowered);
        runtime::RunOptions wanted;
        wanted.outputs = {fused.inputs[0], fused.outputs[0]};
        auto values = integer.run({{"x", input}}, wanted);
        const Tensor& xq = values.at(fused.inputs[0]);
        const Tensor& yq = values.at(fused.outputs[0]);
        ASSERT_EQ(yq.dtype(), y_type);
        const i8::Requant r = i8::make_requant(fused, q, 12, lowered.initializer(fused.inputs.at(2)));
        const i8::ConvProblem p{2, 8, 12, 1, {9, 9}, {9, 9}, {3, 3}, {1, 1}, {1, 1}, {1, 1}};
        Tensor ref(y_type, yq.shape());
        i8::reference_qconv(q, r, p, xq, *lowered.initializer(fused.inputs[1]), ref);
        int64_t differ = 0;
        for (int64_t i = 0; i < ref.numel(); ++i) {
          const int a = y_type == kU8 ? ref.data<uint8_t>()[i] : ref.data<int8_t>()[i];
          const int e = y_type == kU8 ? yq.data<uint8_t>()[i] : yq.data<int8_t>()[i];
          EXPECT_LE(std::abs(a - e), 1) << "element " << i;
          differ += a != e;
        }
        EXPECT_LE(differ, ref.numel() / 100);
      }
}

// The channel-wise input of a next QConv, which takes the producer's blocked layout: on the kF32
// path the host requantization applies 1 / s_y[m] in that layout (requantize_f32_per_channel)
// instead of a binary post-op. The chain still equals the simulation.
TEST(Lowering, PerChannelQuantizeBetweenTwoQConvsMatchesTheSimulation) {
  for (const char* compute : {"auto", "int8", "f32"}) {
    SCOPED_TRACE(compute);
    QdqBuilder b(13);
    const std::string x = b.input("x", {1, 8, 10, 12});
    const std::string c = b.node("Conv", {b.qdq(x, 1.f / 127.f, 0, kU8), b.weight({32, 8, 3, 3}, 0, 0, 63), b.bias(32)},
                                 {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
    auto scalar = [&](float v) { return b.constant("k", Tensor::from_vector<float>({}, {v})); };
    const std::string clip = b.node("Clip", {b.node("Add", {c, scalar(3.f)}), scalar(0.f), scalar(6.f)});
    std::string y = b.node("Div", {b.node("Mul", {c, clip}), scalar(6.f)});
    y = b.node("Add", {b.node("Mul", {y, b.constant("s", Tensor::from_vector<float>({1}, {0.6f}))}),
                       b.constant("t", Tensor::from_vector<float>({1}, {0.1f}))});
    std::vector<float> scales(32);
    for (size_t m = 0; m < scales.size(); ++m) scales[m] = 0.004f * static_cast<float>(1 + m % 7);
    const std::string q = b.node("QuantizeLinear", {y, b.constant("ys", Tensor::from_vector<float>({32}, scales)),
                                                    b.constant("yz", Tensor(kS8, {32}))}, {{"axis", int64_t{1}}});
    const std::string dq = b.node("DequantizeLinear", {q, b.constant("one", Tensor::scalar<float>(1.f)),
                                                       b.constant("z0", b.zero_point(kS8, 0))});
    // The second convolution's weights are small where the channel-wise scales are large.
    const std::string c2 = b.node("Conv", {dq, b.weight({16, 32, 1, 1}, 0, 0, 63)});
    const float step = 0.05f;
    const ir::Graph g = b.finish(b.qdq(c2, step, 0, kS8));
    quant::LoweringOptions options;
    options.compute = compute;
    quant::LoweringReport report;
    const ir::Graph lowered = quant::lower_to_int8(g, options, &report);
    ASSERT_EQ(report.conv, 2) << (report.skipped.empty() ? "" : report.skipped[0].reason);
    EXPECT_EQ(count_op(lowered, "QuantizeLinear"), 1);  // x's only
    QdqBuilder data(3);
    expect_lowered_matches_simulation(g, lowered, g.outputs[0].name,
                                      {{"x", data.random_input({1, 8, 10, 12}, 0.f, 2.f)}}, step);
  }
}

// The host requantization's channel of each element, plain and blocked.
TEST(Int8Requantize, PerChannelFactorFollowsTheLayout) {
  const int64_t outer = 2, channels = 16, inner = 3;
  std::vector<float> factor(channels);
  for (int64_t c = 0; c < channels; ++c) factor[c] = 1.f + static_cast<float>(c);
  for (const int64_t block : {int64_t{1}, int64_t{8}, channels}) {
    SCOPED_TRACE(block);
    const int64_t n = outer * channels * inner;
    std::vector<float> v(static_cast<size_t>(n), 0.5f);
    std::vector<int8_t> y(static_cast<size_t>(n));
    i8::requantize_f32_per_channel(v.data(), y.data(), DType::kInt8, n, factor.data(), channels, inner, block);
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t c = 0; c < channels; ++c)
        for (int64_t s = 0; s < inner; ++s) {
          const int64_t i = ((o * (channels / block) + c / block) * inner + s) * block + c % block;
          // 0.5 * (1 + c), rounded half to even, saturated at 127.
          const float expect = std::min(std::nearbyint(0.5f * factor[c]), 127.f);
          EXPECT_EQ(y[static_cast<size_t>(i)], static_cast<int8_t>(expect)) << o << " " << c << " " << s;
        }
  }
}

// DBNet's head: ConvTranspose(kernel == strides) -> Relu -> Q -> ConvTranspose -> Sigmoid -> Q. Each
// ConvTranspose becomes a QConv (1x1, s*s*M channels) and a DepthToSpace that moves the QConv's
// 8-bit codes; nothing float is left between them, and the result equals the simulation. A
// ConvTranspose whose kernel overlaps (4x4, stride 2) stays, with float weights.
TEST(Lowering, KernelSizedConvTransposeBecomesAQConvAndADepthToSpace) {
  for (const char* compute : {"auto", "int8", "f32"}) {
    SCOPED_TRACE(compute);
    QdqBuilder b(17);
    const std::string x = b.input("x", {2, 8, 5, 7});
    const std::vector<int64_t> two{2, 2};
    const std::string up1 = b.node("ConvTranspose", {b.qdq(x, 1.f / 127.f, 0, kU8), b.weight({8, 6, 2, 2}, 1, 0, 63), b.bias(6)},
                                   {{"strides", two}, {"kernel_shape", two}});
    const std::string relu = b.node("Relu", {up1});
    const std::string up2 = b.node("ConvTranspose", {b.qdq(relu, 0.02f, 0, kU8), b.weight({6, 3, 2, 2}, 1, 0, 63), b.bias(3)},
                                   {{"strides", two}});
    const float step = 1.f / 255.f;
    const ir::Graph g = b.finish(b.qdq(b.node("Sigmoid", {up2}), step, 0, kU8));
    quant::LoweringOptions options;
    options.compute = compute;
    quant::LoweringReport report;
    const ir::Graph lowered = quant::lower_to_int8(g, options, &report);
    ASSERT_EQ(report.conv, 2) << (report.skipped.empty() ? "" : report.skipped[0].reason);
    EXPECT_EQ(count_op(lowered, "ConvTranspose"), 0);
    EXPECT_EQ(count_op(lowered, "DepthToSpace"), 2);
    EXPECT_EQ(count_op(lowered, "QuantizeLinear"), 1);  // x's only
    EXPECT_EQ(count_op(lowered, "Relu") + count_op(lowered, "Sigmoid"), 0);  // fused into the QConvs
    for (const ir::Node& n : lowered.nodes)
      if (n.op_type == "DepthToSpace") {
        const int p = lowered.producer(n.inputs[0]);
        ASSERT_GE(p, 0);
        EXPECT_EQ(lowered.nodes[p].op_type, "QConv");
        EXPECT_EQ(i8::QLinearAttrs::parse(lowered.nodes[p]).y.dtype, kU8) << "the DepthToSpace moves 8-bit codes";
      }
    QdqBuilder data(4);
    const Tensor input = data.random_input({2, 8, 5, 7}, 0.f, 2.f);
    runtime::Session sim(g);
    EXPECT_EQ(sim.run({{"x", input}}).at(g.outputs[0].name).shape(), (Shape{2, 3, 20, 28}));
    expect_lowered_matches_simulation(g, lowered, g.outputs[0].name, {{"x", input}}, step);
  }
  QdqBuilder b(5);
  const std::string x = b.input("x", {1, 4, 6, 6});
  const std::string up = b.node("ConvTranspose", {b.qdq(x, 1.f / 127.f, 0, kU8), b.weight({4, 4, 4, 4}, 1, 0, 63)},
                                {{"strides", std::vector<int64_t>{2, 2}}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const std::string head = b.node("ConvTranspose", {b.qdq(x, 1.f / 127.f, 0, kU8), b.weight({4, 1, 2, 2}, 1, 0, 63)},
                                  {{"strides", std::vector<int64_t>{2, 2}}});
  const std::string sum = b.node("Add", {up, b.node("Sigmoid", {head})});
  const ir::Graph g = b.finish(sum);
  quant::LoweringReport report;
  const ir::Graph lowered = quant::lower_to_int8(g, {}, &report);
  EXPECT_EQ(report.conv, 1);
  EXPECT_EQ(count_op(lowered, "ConvTranspose"), 1);
  EXPECT_EQ(count_op(lowered, "DepthToSpace"), 1);
  for (const ir::Node& n : lowered.nodes) {
    // The overlapping one keeps float weights, folded once from the int8 ones (not dequantized per run).
    if (n.op_type == "ConvTranspose") {
      EXPECT_NE(lowered.initializer(n.inputs[1]), nullptr);
    }
    // With a float output, the Sigmoid stays after the DepthToSpace, a separate pass.
    if (n.op_type == "Sigmoid") {
      EXPECT_EQ(lowered.nodes[lowered.producer(n.inputs[0])].op_type, "DepthToSpace");
    }
  }
  QdqBuilder data(6);
  expect_lowered_matches_simulation(g, lowered, sum, {{"x", data.random_input({1, 4, 6, 6}, 0.f, 2.f)}}, 1e-5f);
}

namespace {

// A squeeze-excitation's pool over an INT8 depthwise convolution's float32 Swish output: the plan
// folds GlobalAveragePool into the QConv (fuse_channel_means), whose kernel sums each channel as it
// writes y. 96 channels over 40 columns (the direct kernel where AVX-512 VNNI runs it), over 12 and
// 16 channels (oneDNN's kernels, the means taken from y after it, in the layout it stays in): the
// pooled values are y's channel means, and match the unfused plan's pool.
TEST(Lowering, SqueezeExcitationPoolIsTakenWithTheDepthwiseOutput) {
  for (const auto& [channels, width] : {std::pair<int64_t, int64_t>{96, 40}, {96, 12}, {16, 12}})
    for (const bool y_is_output : {true, false}) {
      QdqBuilder b(11);
      const Shape xs{2, channels, 10, width};
      const std::string x = b.qdq(b.input("x", xs), 0.02f, 128, DType::kUInt8);
      const std::string conv = b.node(
          "Conv", {x, b.weight({channels, 1, 3, 3}, 0), b.bias(channels)},
          {{"group", channels}, {"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"kernel_shape", std::vector<int64_t>{3, 3}}});
      const std::string y = b.node("Mul", {conv, b.node("Sigmoid", {conv})});
      const std::string pooled = b.node("GlobalAveragePool", {y});
      // Without y among the outputs it may stay in the layout its convolution wrote: the gate reads
      // it there, and a projection reads the gate's codes (as in EfficientNet).
      const std::string gated = b.qdq(b.node("Mul", {y, pooled}), 0.02f, 128, DType::kUInt8);
      const std::string projected = b.node("Conv", {gated, b.weight({8, channels, 1, 1}, 0), b.bias(8)});
      ir::Graph qdq = b.finish(pooled);
      qdq.outputs.push_back({y_is_output ? y : projected, DType::kFloat32, std::nullopt});

      ir::Graph lowered = quant::lower_to_int8(qdq);
      runtime::optimize_graph(lowered);
      EXPECT_EQ(ir::count_of(runtime::apply_execution_fusions(lowered, {}), "fuse_channel_means"), 1) << channels;

      const Tensor input = b.random_input(xs, -1.f, 4.f);
      runtime::Session fused = quant::make_int8_session(qdq);
      runtime::SessionOptions plain;
      plain.fuse_activations = false;
      runtime::Session unfused = quant::make_int8_session(qdq, plain);
      const auto got = fused.run({{"x", input}}), want = unfused.run({{"x", input}});
      const Tensor& means = got.at(pooled);
      ASSERT_EQ(means.shape(), (Shape{2, channels, 1, 1}));
      const int64_t pixels = 10 * width;
      for (int64_t i = 0; i < 2 * channels; ++i) {
        // The unfused plan applies Swish apart (its own logistic): equal within float rounding.
        const float reference = want.at(pooled).data<float>()[i];
        EXPECT_NEAR(means.data<float>()[i], reference, 2e-4 * (std::fabs(reference) + 0.05)) << channels << " " << i;
        if (!y_is_output) continue;
        double sum = 0, magnitude = 0;
        for (int64_t p = 0; p < pixels; ++p) {
          sum += got.at(y).data<float>()[i * pixels + p];
          magnitude += std::fabs(got.at(y).data<float>()[i * pixels + p]);
        }
        EXPECT_NEAR(means.data<float>()[i], sum / pixels, 1e-5 * magnitude / pixels + 1e-7) << channels << " " << i;
      }
    }
}

// The same block, the gate's codes read by a 1x1 projection of identity weights (so its float
// output is the gated values): the depthwise y, read only by the gate Mul whose result is
// quantized, is held in half precision (SessionOptions::float16_storage). Each gated value is then
// within one step (0.02) of the float32 plan's, and some do move (the storage was taken). Where y is
// also returned, where a hook sees the run, and with the option off, the plan keeps y in float32:
// the same values as the float32 plan's.
TEST(Lowering, SqueezeExcitationInputIsHeldInHalfPrecisionForTheQuantizedGate) {
  if (!runtime::int8::direct_depthwise_available()) GTEST_SKIP() << "the direct depthwise kernel needs AVX-512 VNNI";
  // y of 4.7 MB: past half the L2 of any x86 core (below it the kernel keeps float32).
  constexpr int64_t kChannels = 96, kHeight = 48, kWidth = 128;
  for (const bool y_is_output : {false, true}) {
    QdqBuilder b(12);
    const Shape xs{2, kChannels, kHeight, kWidth};
    const std::string x = b.qdq(b.input("x", xs), 0.02f, 128, DType::kUInt8);
    const std::string conv = b.node("Conv", {x, b.weight({kChannels, 1, 3, 3}, 0), b.bias(kChannels)},
                                    {{"group", kChannels},
                                     {"pads", std::vector<int64_t>{1, 1, 1, 1}},
                                     {"kernel_shape", std::vector<int64_t>{3, 3}}});
    const std::string y = b.node("Mul", {conv, b.node("Sigmoid", {conv})});
    const std::string gate = b.node("Sigmoid", {b.node("GlobalAveragePool", {y})});
    const std::string gated = b.qdq(b.node("Mul", {y, gate}), 0.02f, 128, DType::kUInt8);
    Tensor identity(DType::kInt8, {kChannels, kChannels, 1, 1});
    for (int64_t c = 0; c < kChannels; ++c) identity.data<int8_t>()[c * kChannels + c] = 127;
    const std::string w = b.node("DequantizeLinear",
                                 {b.constant("w", identity),
                                  b.constant("ws", Tensor::from_vector<float>({kChannels}, std::vector<float>(kChannels, 1.f / 127))),
                                  b.constant("wz", Tensor::from_vector<int8_t>({kChannels}, std::vector<int8_t>(kChannels, 0)))},
                                 {{"axis", int64_t{0}}});
    const std::string projected = b.node("Conv", {gated, w});
    ir::Graph qdq = b.finish(projected);
    if (y_is_output) qdq.outputs.push_back({y, DType::kFloat32, std::nullopt});

    const Tensor input = b.random_input(xs, -1.f, 4.f);
    runtime::SessionOptions full_precision;
    full_precision.float16_storage = false;
    runtime::Session halves = quant::make_int8_session(qdq), floats = quant::make_int8_session(qdq, full_precision);
    const Tensor got = halves.run({{"x", input}}).at(projected), want = floats.run({{"x", input}}).at(projected);
    ASSERT_EQ(got.shape(), want.shape());
    int64_t moved = 0;
    for (int64_t i = 0; i < got.numel(); ++i) {
      const float d = std::fabs(got.data<float>()[i] - want.data<float>()[i]);
      EXPECT_LE(d, 0.0201f) << i;
      moved += d > 0;
    }
    if (y_is_output) {
      EXPECT_EQ(moved, 0);
    } else {
      EXPECT_GT(moved, 0);
      EXPECT_LT(moved, got.numel() / 100);
    }
    // A hooked run of the same session: a plan of its own, in float32.
    runtime::RunOptions hooked;
    int64_t seen = 0;
    hooked.on_value = [&](const std::string&, const Tensor& v) { seen += v.dtype() == DType::kFloat32; };
    const Tensor observed = halves.run({{"x", input}}, hooked).at(projected);
    EXPECT_GT(seen, 0);
    EXPECT_EQ(std::memcmp(observed.raw(), want.raw(), want.nbytes()), 0);
  }
}

}  // namespace
