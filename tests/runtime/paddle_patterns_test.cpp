// paddle2onnx's decomposed spellings run as one kernel: LayerNorm (ReduceMean, Sub, Pow,
// ReduceMean, Add, Sqrt, Div, Mul, Add) as LayerNormalization, and swish written with a Mul by 1
// (x * Sigmoid(x * 1)) as one Swish. Fused and unfused sessions agree up to float rounding, and a
// quantized form (Q/DQ around the pattern) agrees with the unfused simulation to one step.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "runtime/fused_ops/fused_activation.h"
#include "runtime/fusions/execution_fusions.h"
#include "slimquant/ir/passes.h"
#include "slimquant/runtime/optimize.h"
#include "slimquant/runtime/session.h"
#include "graph_builder.h"

using namespace slimquant;

namespace {

using test::count_op;
using test::random_tensor;

struct Builder : test::GraphBuilder {
  std::mt19937 rng{5};
  explicit Builder(int64_t opset) { g.opset = opset; }
  std::string input(const Shape& shape) {
    ir::ValueInfo vi{"x", DType::kFloat32, std::vector<ir::Dim>{}};
    for (int64_t d : shape) vi.dims->push_back(ir::Dim{d, ""});
    g.inputs.push_back(vi);
    return "x";
  }
  std::string qdq(const std::string& x, float scale, int8_t zp) {
    const std::string s = constant(Tensor::scalar<float>(scale)), z = constant(Tensor::scalar<int8_t>(zp));
    return node("DequantizeLinear", {node("QuantizeLinear", {x, s, z}), s, z});
  }
  // paddle2onnx's LayerNorm over the last axis of x (width n), opset 9 style ReduceMean(axes=[-1]).
  std::string layer_norm(const std::string& x, int64_t n, float eps) {
    const std::map<std::string, ir::AttributeValue> last = {{"axes", std::vector<int64_t>{-1}}};
    const std::string d = node("Sub", {x, node("ReduceMean", {x}, last)});
    const std::string var = node("ReduceMean", {node("Pow", {d, constant(Tensor::scalar<float>(2.f))})}, last);
    const std::string normed =
        node("Div", {d, node("Sqrt", {node("Add", {var, constant(Tensor::scalar<float>(eps))})})});
    const std::string scaled = node("Mul", {normed, constant(random_tensor({n}, rng, -1.5f, 1.5f))});
    return node("Add", {scaled, constant(random_tensor({n}, rng, -0.5f, 0.5f))});
  }
  ir::Graph finish(const std::string& y) {
    g.outputs.push_back({y, DType::kFloat32, std::nullopt});
    g.validate();
    return g;
  }
};


runtime::SessionOptions unfused() {
  runtime::SessionOptions o;
  o.fuse_activations = false;
  return o;
}

}  // namespace

TEST(PaddlePatterns, DecomposedLayerNormMergesIntoOneNodeWithTheSameOutputs) {
  Builder b(9);
  const std::string y = b.layer_norm(b.input({2, 40, 120}), 120, 1e-5f);
  const ir::Graph g = b.finish(y);
  ir::Graph merged = g;
  ir::bind_input_shapes(merged, {{"x", {2, 40, 120}}});
  EXPECT_EQ(ir::merge_layernorm(merged), 1);
  ASSERT_EQ(merged.nodes.size(), 1u);
  EXPECT_EQ(merged.nodes[0].op_type, "LayerNormalization");
  EXPECT_EQ(merged.nodes[0].outputs[0], y);
  EXPECT_FLOAT_EQ(merged.nodes[0].attr_float("epsilon", 0.f), 1e-5f);

  std::mt19937 rng(1);
  const Tensor x = random_tensor({2, 40, 120}, rng, -3.f, 5.f);
  const Tensor want = runtime::Session(g, unfused()).run_single(x), got = runtime::Session(g).run_single(x);
  ASSERT_EQ(want.shape(), got.shape());
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 2e-5f) << i;

  // An intermediate read elsewhere (or kept) blocks the merge.
  ir::Graph observed = g;
  ir::bind_input_shapes(observed, {{"x", {2, 40, 120}}});
  EXPECT_EQ(ir::merge_layernorm(observed, {observed.nodes[1].outputs[0]}), 0);
}

// The quantized form: DQ -> LayerNorm -> Q. The merged kernel's output quantizes to the unfused
// simulation's values within one step.
TEST(PaddlePatterns, QuantizedLayerNormMatchesTheSimulation) {
  Builder b(13);
  const float step = 0.03f;
  const std::string ln = b.layer_norm(b.qdq(b.input({1, 40, 120}), 0.05f, 0), 120, 1e-6f);
  const std::string s = b.constant(Tensor::scalar<float>(step)), z = b.constant(Tensor::scalar<int8_t>(2));
  const std::string yq = b.node("QuantizeLinear", {ln, s, z});
  const ir::Graph g = b.finish(yq);
  std::mt19937 rng(2);
  const Tensor x = random_tensor({1, 40, 120}, rng, -4.f, 4.f);
  const Tensor want = runtime::Session(g, unfused()).run_single(x), got = runtime::Session(g).run_single(x);
  ASSERT_EQ(got.dtype(), DType::kInt8);
  int64_t differ = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const int d = std::abs(int{want.data<int8_t>()[i]} - int{got.data<int8_t>()[i]});
    EXPECT_LE(d, 1) << i;
    differ += d != 0;
  }
  EXPECT_LE(differ, want.numel() / 100);
}

// paddle2onnx's swish: Mul(x, Sigmoid(Mul(x, 1))). The Mul by 1 goes (optimize_graph), and the
// rest is the x * Sigmoid(x) that merges into one Swish and fuses into the producing Conv.
TEST(PaddlePatterns, SwishWithAMulByOneRunsAsOneSwish) {
  Builder b(9);
  const std::string x = b.input({1, 4, 5, 5});
  const std::string c = b.node("Conv", {x, b.constant(random_tensor({6, 4, 1, 1}, b.rng, -1.f, 1.f))});
  const std::string one = b.node("Mul", {c, b.constant(Tensor::scalar<float>(1.f))});
  const std::string y = b.node("Mul", {c, b.node("Sigmoid", {one})});
  const ir::Graph g = b.finish(y);
  ir::Graph optimized = g;
  runtime::optimize_graph(optimized);
  EXPECT_EQ(count_op(optimized, "Mul"), 1);
  EXPECT_EQ(ir::merge_swish(optimized, [](const std::string&, const std::string&) { return true; }), 1);
  runtime::fuse_activations(optimized);
  ASSERT_EQ(optimized.nodes.size(), 1u);
  EXPECT_EQ(runtime::fused_ops::FusedActivation::parse(optimized.nodes[0]).kind, runtime::fused_ops::Activation::kSwish);

  std::mt19937 rng(3);
  const Tensor in = random_tensor({1, 4, 5, 5}, rng, -3.f, 3.f);
  runtime::SessionOptions plain = unfused();
  plain.optimize = false;
  const Tensor want = runtime::Session(g, plain).run_single(in), got = runtime::Session(g).run_single(in);
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f) << i;

  // A Mul by 1 of rank 1 could broadcast a scalar operand: left alone.
  Builder r(9);
  const std::string rx = r.input({1});
  ir::Graph kept = r.finish(r.node("Mul", {rx, r.constant(Tensor::from_vector<float>({1}, {1.f}))}));
  EXPECT_EQ(ir::neutral_elementwise_to_identity(kept), 0);
}

// PP-OCRv4 det's residual squeeze-excitation (RSE-FPN): y = x + x * HardSigmoid(Conv(GAP(x))),
// paddle2onnx writing the Mul as Mul(x, gate) or Mul(gate, x), becomes x * (gate + 1): one
// full-size Mul instead of a Mul and an Add, with the unfused outputs up to float rounding; the
// quantized form (Q after the Add, as the INT8 export has before the next Conv) agrees with the
// unfused simulation within one step.
TEST(PaddlePatterns, ResidualGateRunsAsOneMul) {
  for (const bool gate_first : {false, true}) {
    SCOPED_TRACE(gate_first ? "Mul(gate, x)" : "Mul(x, gate)");
    Builder b(13);
    const std::string x = b.input({1, 8, 12, 10});
    const std::string pooled = b.node("GlobalAveragePool", {x});
    const std::string gate = b.node(
        "HardSigmoid", {b.node("Conv", {pooled, b.constant(random_tensor({8, 8, 1, 1}, b.rng, -2.f, 2.f))})},
        {{"alpha", 0.2f}, {"beta", 0.5f}});
    const std::string product = gate_first ? b.node("Mul", {gate, x}) : b.node("Mul", {x, gate});
    const std::string y = b.node("Add", {x, product});
    const std::string s = b.constant(Tensor::scalar<float>(0.02f)), z = b.constant(Tensor::scalar<int8_t>(0));
    const std::string yq = b.node("QuantizeLinear", {y, s, z});
    ir::Graph g = b.finish(y);
    g.outputs.push_back({yq, DType::kInt8, std::nullopt});

    ir::Graph merged = g;
    ir::bind_input_shapes(merged, {{"x", {1, 8, 12, 10}}});
    EXPECT_EQ(ir::merge_residual_gate(merged, {product}), 0);  // a kept product blocks it
    EXPECT_EQ(ir::merge_residual_gate(merged), 1);
    EXPECT_EQ(count_op(merged, "Mul"), 1);
    EXPECT_EQ(count_op(merged, "Add"), 1);  // gate + 1, on [1, 8, 1, 1]
    for (const auto& n : merged.nodes)
      if (n.op_type == "Mul") {
        EXPECT_EQ(n.outputs[0], y);
      }
    merged.validate();

    std::mt19937 rng(7);
    const Tensor in = random_tensor({1, 8, 12, 10}, rng, -2.f, 2.f);
    runtime::RunOptions both;
    both.outputs = {y, yq};
    auto want = runtime::Session(g, unfused()).run({{"x", in}}, both);
    auto got = runtime::Session(g).run({{"x", in}}, both);
    const Tensor &wy = want.at(y), &gy = got.at(y);
    for (int64_t i = 0; i < wy.numel(); ++i)
      EXPECT_NEAR(gy.data<float>()[i], wy.data<float>()[i], 1e-5f * (1.f + std::fabs(wy.data<float>()[i]))) << i;
    // Requested as an output, y is kept: the quantized value is checked with y not requested.
    runtime::RunOptions only_q;
    only_q.outputs = {yq};
    const Tensor wq = runtime::Session(g, unfused()).run({{"x", in}}, only_q).at(yq);
    const Tensor gq = runtime::Session(g).run({{"x", in}}, only_q).at(yq);
    ASSERT_EQ(gq.dtype(), DType::kInt8);
    int64_t differ = 0;
    for (int64_t i = 0; i < wq.numel(); ++i) {
      const int d = std::abs(int{wq.data<int8_t>()[i]} - int{gq.data<int8_t>()[i]});
      EXPECT_LE(d, 1) << i;
      differ += d != 0;
    }
    EXPECT_LE(differ, wq.numel() / 100);
  }
}

// paddle2onnx's GELU (GeluMapper, approximate=False): Mul(Mul(x, Add(Erf(Div(x, [sqrt 2])), [1])),
// [0.5]) with one-element [1] constants. It is the erf chain match_erf_gelu knows, so it runs as one
// Gelu; the quantized form (Q/DQ before and a Q after) agrees with the unfused simulation within one
// step.
TEST(PaddlePatterns, Paddle2OnnxGeluRunsAsOneGelu) {
  Builder b(13);
  const std::string x = b.qdq(b.input({2, 7, 24}), 0.04f, 0);
  auto one_element = [&](float v) { return b.constant(Tensor::from_vector<float>({1}, {v})); };
  const std::string erf = b.node("Erf", {b.node("Div", {x, one_element(1.4142135623730951f)})});
  const std::string inner = b.node("Mul", {x, b.node("Add", {erf, one_element(1.f)})});
  const std::string gelu = b.node("Mul", {inner, one_element(0.5f)});
  const std::string s = b.constant(Tensor::scalar<float>(0.02f)), z = b.constant(Tensor::scalar<int8_t>(-40));
  const ir::Graph g = b.finish(b.node("QuantizeLinear", {gelu, s, z}));
  std::string out;
  EXPECT_EQ(ir::match_erf_gelu(g, x, {}, out).size(), 5u);
  EXPECT_EQ(out, gelu);

  std::mt19937 rng(11);
  const Tensor in = random_tensor({2, 7, 24}, rng, -4.f, 4.f);
  const Tensor want = runtime::Session(g, unfused()).run_single(in), got = runtime::Session(g).run_single(in);
  ASSERT_EQ(got.dtype(), DType::kInt8);
  int64_t differ = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    const int d = std::abs(int{want.data<int8_t>()[i]} - int{got.data<int8_t>()[i]});
    EXPECT_LE(d, 1) << i;
    differ += d != 0;
  }
  EXPECT_LE(differ, want.numel() / 100);
}
