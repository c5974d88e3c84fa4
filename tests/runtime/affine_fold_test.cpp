// Folding constant Mul / Add / Sub / Div after a Conv into its weights and bias (runtime::optimize_graph),
// and a scalar Mul / Add after a fused activation into the Conv's post-ops: the optimised and fused
// session gives the unoptimised graph's outputs up to float rounding.
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

struct AffineGraph : test::GraphBuilder {
  std::mt19937 rng{3};
  AffineGraph() {
    g.opset = 13;
    g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{1, ""}, {4, ""}, {7, ""}, {6, ""}}});
  }
  // A 3x3 Conv with padding 1 (4 -> 5 channels), with or without a bias.
  std::string conv(const std::string& x, bool bias) {
    std::vector<std::string> in = {x, constant(random_tensor({5, 4, 3, 3}, rng))};
    if (bias) in.push_back(constant(random_tensor({5}, rng)));
    return node("Conv", in, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  }
  ir::Graph finish(const std::string& y) {
    g.outputs.push_back({y, DType::kFloat32, std::nullopt});
    g.validate();
    return g;
  }
};

// Output of the graph as written (no optimisation, no fusion) and as the default session runs it.
void expect_same_outputs(const ir::Graph& g) {
  runtime::SessionOptions plain;
  plain.optimize = false;
  plain.fuse_activations = false;
  std::mt19937 rng(9);
  const Tensor x = random_tensor({1, 4, 7, 6}, rng, -2.f, 2.f);
  const Tensor want = runtime::Session(g, plain).run_single(x), got = runtime::Session(g).run_single(x);
  ASSERT_EQ(want.shape(), got.shape());
  for (int64_t i = 0; i < want.numel(); ++i)
    EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f * (1.f + std::fabs(want.data<float>()[i]))) << i;
}


}  // namespace

TEST(FoldAffineIntoConv, ScalarAndPerChannelMulAddWithAndWithoutBiasFoldExactly) {
  struct Case {
    const char* name;
    bool bias;
    Shape mul_shape, add_shape;  // {} with numel 0 below: no such node; Shape{} is a scalar
    bool mul, add;
  };
  const std::vector<Case> cases = {
      {"scalar mul then add, bias", true, {1}, {1}, true, true},
      {"scalar mul then add, no bias", false, {}, {}, true, true},
      {"per-channel [1,C,1,1] mul then [C,1,1] add", true, {1, 5, 1, 1}, {5, 1, 1}, true, true},
      {"per-channel mul only, no bias", false, {5, 1, 1}, {}, true, false},
      {"scalar add only, no bias", false, {}, {1, 1, 1, 1}, false, true},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.name);
    AffineGraph b;
    std::string y = b.conv("x", c.bias);
    if (c.mul) {
      // Negative factors included: they flip whole output channels.
      Tensor k = random_tensor(c.mul_shape, b.rng, -2.f, 2.f);
      k.data<float>()[0] = -1.5f;
      y = b.node("Mul", {b.constant(k), y});  // constant first, as paddle2onnx writes it
    }
    if (c.add) y = b.node("Add", {y, b.constant(random_tensor(c.add_shape, b.rng))});
    const ir::Graph g = b.finish(y);
    ir::Graph folded = g;
    EXPECT_EQ(ir::fold_affine_into_conv(folded), int{c.mul} + int{c.add});
    EXPECT_EQ(folded.nodes.size(), 1u);
    EXPECT_EQ(folded.nodes[0].outputs[0], y);
    expect_same_outputs(g);
  }
}

TEST(FoldAffineIntoConv, SubAndDivByConstantsFold) {
  AffineGraph b;
  std::string y = b.conv("x", true);
  y = b.node("Div", {y, b.constant(Tensor::from_vector<float>({5, 1, 1}, {2.f, -4.f, 0.5f, 8.f, -0.25f}))});
  y = b.node("Sub", {y, b.constant(Tensor::from_vector<float>({1}, {0.75f}))});
  const ir::Graph g = b.finish(y);
  ir::Graph folded = g;
  EXPECT_EQ(ir::fold_affine_into_conv(folded), 2);
  EXPECT_EQ(folded.nodes.size(), 1u);
  expect_same_outputs(g);
}

TEST(FoldAffineIntoConv, LeavesWhatIsNotAPerChannelConstantOrIsReadElsewhere) {
  // A constant that varies over space, c - conv (a negated Conv: not this fold), division by a zero,
  // and a Conv output another node also reads.
  AffineGraph b;
  const std::string c1 = b.conv("x", true);
  const std::string spatial = b.node("Mul", {c1, b.constant(random_tensor({1, 5, 7, 6}, b.rng))});
  const std::string c2 = b.conv("x", true);
  const std::string reversed = b.node("Sub", {b.constant(Tensor::from_vector<float>({1}, {1.f})), c2});
  const std::string c3 = b.conv("x", false);
  const std::string by_zero = b.node("Div", {c3, b.constant(Tensor::from_vector<float>({1}, {0.f}))});
  const std::string c4 = b.conv("x", true);
  const std::string scaled = b.node("Mul", {c4, b.constant(Tensor::from_vector<float>({1}, {2.f}))});
  const std::string shared = b.node("Add", {scaled, c4});
  const std::string s1 = b.node("Add", {spatial, reversed});
  const std::string s2 = b.node("Add", {by_zero, shared});
  ir::Graph g = b.finish(b.node("Add", {s1, s2}));
  EXPECT_EQ(ir::fold_affine_into_conv(g), 0);
}

// PPLCNetV3's block as paddle2onnx writes it: Conv -> Mul -> Add -> hard-swish (Add 3, Clip 0..6,
// Mul, Div 6) -> Mul -> Add. The first pair folds into the Conv, the hard-swish merges and fuses
// into it, and the second pair becomes its post affine map: one node left.
TEST(FoldAffineIntoConv, PpLcNetV3BlockRunsAsOneConvWithPostOps) {
  for (float post_scale : {0.42f, -0.9f}) {
    AffineGraph b;
    auto scalar = [&](float v) { return b.constant(Tensor::from_vector<float>({1}, {v})); };
    std::string y = b.conv("x", true);
    y = b.node("Mul", {scalar(2.1f), y});
    y = b.node("Add", {y, scalar(-0.4f)});
    const std::string clip = b.node("Clip", {b.node("Add", {y, b.constant(Tensor::scalar<float>(3.f))}),
                                             b.constant(Tensor::scalar<float>(0.f)), b.constant(Tensor::scalar<float>(6.f))});
    y = b.node("Div", {b.node("Mul", {y, clip}), b.constant(Tensor::scalar<float>(6.f))});
    y = b.node("Mul", {scalar(post_scale), y});
    y = b.node("Add", {y, scalar(0.07f)});
    const ir::Graph g = b.finish(y);
    expect_same_outputs(g);

    // The same passes the session runs on it, in order.
    ir::Graph fused = g;
    runtime::optimize_graph(fused);
    EXPECT_EQ(count_op(fused, "Conv"), 1);
    EXPECT_EQ(fused.nodes.size(), 7u);  // Conv, then hard-swish's Add Clip Mul Div, then Mul Add
    ir::merge_hardswish(fused, [](const std::string&, const std::string&) { return true; });
    runtime::fuse_activations(fused);
    ASSERT_EQ(fused.nodes.size(), 1u);
    EXPECT_EQ(runtime::fused_ops::FusedActivation::parse(fused.nodes[0]).kind, runtime::fused_ops::Activation::kHardSwish);
    EXPECT_FLOAT_EQ(runtime::fused_ops::FusedActivation::parse(fused.nodes[0]).post_scale, post_scale);
    EXPECT_FLOAT_EQ(runtime::fused_ops::FusedActivation::parse(fused.nodes[0]).post_shift, 0.07f);
    EXPECT_EQ(fused.nodes[0].outputs[0], y);
  }
}

// DBNet's head as paddle2onnx writes it: ConvTranspose (no bias) -> Add(per-channel bias) ->
// BatchNormalization -> Relu. The Add and the BatchNorm fold into the ConvTranspose (the BatchNorm
// only once the Add has folded), with groups (weights [C, M/group, k, k]) and without.
TEST(FoldAffineIntoConv, ConvTransposeBiasAddAndBatchNormFold) {
  for (const int64_t group : {1, 2}) {
    SCOPED_TRACE("group " + std::to_string(group));
    AffineGraph b;
    const int64_t m = 6;  // output channels
    std::string y = b.node("ConvTranspose", {"x", b.constant(random_tensor({4, m / group, 2, 2}, b.rng))},
                           {{"strides", std::vector<int64_t>{2, 2}}, {"group", int64_t{group}}});
    y = b.node("Add", {y, b.constant(random_tensor({1, m, 1, 1}, b.rng))});
    Tensor var = random_tensor({m}, b.rng, 0.2f, 2.f);
    y = b.node("BatchNormalization", {y, b.constant(random_tensor({m}, b.rng, -2.f, 2.f)),
                                      b.constant(random_tensor({m}, b.rng)), b.constant(random_tensor({m}, b.rng)),
                                      b.constant(var)});
    y = b.node("Relu", {y});
    const ir::Graph g = b.finish(y);
    ir::Graph optimized = g;
    runtime::optimize_graph(optimized);
    EXPECT_EQ(count_op(optimized, "Add"), 0);
    EXPECT_EQ(count_op(optimized, "BatchNormalization"), 0);
    EXPECT_EQ(count_op(optimized, "ConvTranspose"), 1);
    expect_same_outputs(g);
  }
}

// TensorFlow exports clamp after an activation with a scalar maximum (openWakeWord's speech
// embedding: maximum(leaky_relu(x, 0.2), -0.4) after each convolution): a Max / Min with a scalar
// after the activation becomes the Conv's clamp post-op, and bounds compose; alone after a Conv, a
// Max is a Clip with one bound. A Min below the clamp's lower bound (a constant result) stays an op.
TEST(FoldAffineIntoConv, ScalarMaxAndMinAfterAnActivationBecomeTheConvsClamp) {
  auto fused_of = [](const ir::Graph& g) {
    ir::Graph fused = g;
    runtime::optimize_graph(fused);
    ir::bind_input_shapes(fused, {{"x", Shape{1, 4, 7, 6}}});  // as a session's plan does: the Max's [1,1,1,1] broadcasts nothing
    runtime::fuse_activations(fused);
    return fused;
  };
  namespace fo = runtime::fused_ops;
  {
    AffineGraph b;
    std::string y = b.node("LeakyRelu", {b.conv("x", true)}, {{"alpha", 0.2f}});
    y = b.node("Max", {y, b.constant(Tensor::from_vector<float>({1, 1, 1, 1}, {-0.4f}))});
    y = b.node("Min", {b.constant(Tensor::scalar<float>(1.5f)), y});
    const ir::Graph g = b.finish(y);
    expect_same_outputs(g);
    const ir::Graph fused = fused_of(g);
    ASSERT_EQ(fused.nodes.size(), 1u);
    const fo::FusedActivation a = fo::FusedActivation::parse(fused.nodes[0]);
    EXPECT_EQ(a.kind, fo::Activation::kLeakyRelu);
    EXPECT_FLOAT_EQ(a.post_min, -0.4f);
    EXPECT_FLOAT_EQ(a.post_max, 1.5f);
  }
  {
    AffineGraph b;
    const ir::Graph g = b.finish(b.node("Max", {b.conv("x", false), b.constant(Tensor::scalar<float>(0.25f))}));
    expect_same_outputs(g);
    const ir::Graph fused = fused_of(g);
    ASSERT_EQ(fused.nodes.size(), 1u);
    const fo::FusedActivation a = fo::FusedActivation::parse(fused.nodes[0]);
    EXPECT_EQ(a.kind, fo::Activation::kClip);
    EXPECT_FLOAT_EQ(a.alpha, 0.25f);
    EXPECT_EQ(a.beta, INFINITY);
  }
  {
    AffineGraph b;
    std::string y = b.node("Max", {b.node("Relu", {b.conv("x", true)}), b.constant(Tensor::scalar<float>(0.5f))});
    y = b.node("Min", {y, b.constant(Tensor::scalar<float>(0.1f))});  // below 0.5: always 0.1
    const ir::Graph g = b.finish(y);
    expect_same_outputs(g);
    EXPECT_EQ(count_op(fused_of(g), "Min"), 1);
  }
}
