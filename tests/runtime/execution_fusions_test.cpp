// The execution fusions as one rule list (runtime/fusions) and the typed contracts their fused nodes
// carry to the kernels (runtime/fused_ops).
#include <gtest/gtest.h>

#include <algorithm>
#include <array>
#include <random>

#include "graph_builder.h"
#include "runtime/fused_ops/fused_activation.h"
#include "runtime/fused_ops/residual_conv.h"
#include "runtime/fused_ops/transposed_views.h"
#include "runtime/fusions/execution_fusions.h"
#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "slimquant/ir/passes.h"
#include "slimquant/runtime/kernel.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;
namespace fo = runtime::fused_ops;

namespace {

std::vector<ir::Dim> dims_of(const Shape& s) {
  std::vector<ir::Dim> d;
  for (int64_t v : s) d.push_back({v, ""});
  return d;
}

// Relu(Add(Conv(x), r)) with known shapes, and Conv(x) -> Relu: the residual and activation fusions.
test::GraphBuilder residual_graph(std::mt19937& rng) {
  test::GraphBuilder b;
  const Shape shape{1, 4, 5, 5};
  b.g.inputs.push_back({"x", DType::kFloat32, dims_of(shape)});
  b.g.inputs.push_back({"r", DType::kFloat32, dims_of(shape)});
  const std::string w = b.constant(test::random_tensor({4, 4, 3, 3}, rng));
  const std::string bias = b.constant(test::random_tensor({4}, rng));
  const std::map<std::string, ir::AttributeValue> pads{{"pads", std::vector<int64_t>{1, 1, 1, 1}}};
  const std::string c = b.node("Conv", {"x", w, bias}, pads);
  const std::string sum = b.node("Add", {c, "r"});
  const std::string y = b.node("Relu", {sum});
  const std::string c2 = b.node("Conv", {y, w, bias}, pads);
  const std::string z = b.node("Relu", {c2});
  for (const std::string& v : {c, sum, y, c2, z}) b.g.value_info[v] = {v, DType::kFloat32, dims_of(shape)};
  b.g.outputs.push_back({z, DType::kFloat32, dims_of(shape)});
  return b;
}

}  // namespace

TEST(ExecutionFusions, OneListCountsEachRuleAndWritesTypedContracts) {
  std::mt19937 rng(5);
  test::GraphBuilder b = residual_graph(rng);
  const ir::Graph original = b.g;
  const ir::RuleCounts counts = runtime::apply_execution_fusions(b.g, {});
  EXPECT_EQ(ir::count_of(counts, "fuse_residual_add"), 1);
  EXPECT_EQ(ir::count_of(counts, "fuse_activation"), 1);  // the second Conv's Relu
  EXPECT_EQ(ir::total(counts), 2);
  ASSERT_EQ(b.g.nodes.size(), 2u);
  EXPECT_NO_THROW(b.g.validate());
  const ir::Node& residual = b.g.nodes[0];
  ASSERT_TRUE(fo::has_residual_addend(residual));
  EXPECT_EQ(residual.inputs[fo::kConvAddend], "r");
  EXPECT_EQ(fo::SumActivation::parse(residual).kind, fo::Activation::kRelu);
  EXPECT_TRUE(fo::FusedActivation::parse(residual).empty());
  EXPECT_EQ(fo::FusedActivation::parse(b.g.nodes[1]).kind, fo::Activation::kRelu);
  EXPECT_TRUE(ir::has_execution_attrs(b.g.nodes[1]));

  // A kept Conv output stops the residual fusion; the session computes the same either way.
  test::GraphBuilder kept = residual_graph(rng);
  const std::string conv_out = kept.g.nodes[0].outputs[0];
  EXPECT_EQ(ir::count_of(runtime::apply_execution_fusions(kept.g, {conv_out}), "fuse_residual_add"), 0);
  std::map<std::string, Tensor> feeds{{"x", test::random_tensor({1, 4, 5, 5}, rng)},
                                      {"r", test::random_tensor({1, 4, 5, 5}, rng)}};
  runtime::SessionOptions plain;
  plain.fuse_activations = false;
  runtime::Session fused(original), reference(original, plain);
  const Tensor got = fused.run(feeds).begin()->second, want = reference.run(feeds).begin()->second;
  ASSERT_EQ(got.numel(), want.numel());
  for (int64_t i = 0; i < got.numel(); ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-4f) << i;
}

// A Transpose read only by MatMuls folds into them (Fold::kTransposedInput), and one after a MatMul
// into it (Fold::kTransposedOutput); the MatMul reads its inputs / writes its result through the
// permutation's strides, or through a transposed copy in scratch where the primitive cannot take
// them (no contiguous matrix dim; rows not one stride apart against a 2-D B). Either way it
// computes what the Transposes and the MatMul compute apart.
TEST(ExecutionFusions, TransposesFoldIntoMatMulInputsAndOutput) {
  struct Case {
    const char* name;
    Shape a, b;                                     // stored shapes
    std::vector<int64_t> a_perm, b_perm, out_perm;  // empty: no Transpose
    bool const_b = false, scale = false;            // scale: a scalar Mul (kScale) before the output Transpose
  };
  const Case cases[] = {
      // attention: the heads' split (A) and K^T (B), strides read directly
      {"heads_qk", {2, 5, 3, 4}, {2, 5, 3, 4}, {0, 2, 1, 3}, {0, 2, 3, 1}, {}, false, true},
      {"heads_av", {2, 3, 5, 5}, {2, 5, 3, 4}, {}, {0, 2, 1, 3}, {0, 2, 1, 3}},
      // 2-D constant B: A's rows are one stride apart (a size-1 dim moves) or not (copied)
      {"rows_one_stride", {2, 3, 1, 8}, {8, 6}, {0, 2, 1, 3}, {}, {}, true},
      {"rows_apart", {4, 3, 8}, {8, 6}, {1, 0, 2}, {}, {1, 0, 2}, true},
      // no contiguous matrix dim: copied
      {"no_unit_stride", {8, 3, 5}, {5, 8, 2}, {2, 1, 0}, {}, {}},
      // a transposed 2-D B against a batched A (broadcast); the output's last dim moves first
      {"b_transposed_broadcast", {2, 3, 7}, {6, 7}, {}, {1, 0}, {2, 0, 1}},
  };
  for (const Case& c : cases) {
    std::mt19937 rng(17);
    test::GraphBuilder b;
    b.g.inputs.push_back({"a", DType::kFloat32, dims_of(c.a)});
    std::string bv = "b";
    if (c.const_b) bv = b.constant(test::random_tensor(c.b, rng));
    else b.g.inputs.push_back({"b", DType::kFloat32, dims_of(c.b)});
    const std::string a_in = c.a_perm.empty() ? "a" : b.node("Transpose", {"a"}, {{"perm", c.a_perm}});
    const std::string b_in = c.b_perm.empty() ? bv : b.node("Transpose", {bv}, {{"perm", c.b_perm}});
    std::string y = b.node("MatMul", {a_in, b_in});
    if (c.scale) y = b.node("Mul", {y, b.constant(Tensor::scalar(0.25f))});
    if (!c.out_perm.empty()) y = b.node("Transpose", {y}, {{"perm", c.out_perm}});
    b.g.outputs.push_back({y, DType::kFloat32, {}});
    const ir::Graph original = b.g;
    ir::Graph fused_graph = original;
    const ir::RuleCounts counts = runtime::apply_execution_fusions(fused_graph, {});
    EXPECT_EQ(ir::count_of(counts, "fold_transposed_input"),
              static_cast<int>(!c.a_perm.empty()) + static_cast<int>(!c.b_perm.empty()))
        << c.name;
    EXPECT_EQ(ir::count_of(counts, "fold_transposed_output"), c.out_perm.empty() ? 0 : 1) << c.name;
    EXPECT_EQ(fused_graph.nodes.size(), 1u) << c.name;
    std::map<std::string, Tensor> feeds{{"a", test::random_tensor(c.a, rng)}};
    if (!c.const_b) feeds["b"] = test::random_tensor(c.b, rng);
    runtime::SessionOptions plain;
    plain.fuse_activations = false;
    runtime::Session fused(original), reference(original, plain);
    const Tensor got = fused.run(feeds).at(y), want = reference.run(feeds).at(y);
    ASSERT_EQ(got.shape(), want.shape()) << c.name;
    for (int64_t i = 0; i < got.numel(); ++i)
      EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 1e-5f) << c.name << " " << i;
  }
}

// PyTorch's packed attention projection: MatMul(x, W [8, 12]) + bias, cut into q / k / v by Slices
// of the last axis. Each Slice becomes a MatMul on its columns (each then takes its part of the
// bias); the outputs are the unsplit graph's. Slices of another axis, a reader that is not a
// Slice, or parts overlapping to more columns than W has leave the product whole.
TEST(ExecutionFusions, PackedProjectionCutBySlicesBecomesOneMatMulPerPart) {
  struct Case {
    const char* name;
    std::vector<std::array<int64_t, 3>> slices;  // start, end, axis
    bool shape_reader = false;
    int parts = 0;  // MatMuls after the fusions; 0: not split
  };
  const Case cases[] = {
      {"qkv", {{0, 4, -1}, {4, 8, -1}, {8, 12, -1}}, false, 3},
      {"named_last_axis_negative_bounds", {{-4, 100, 2}, {0, 4, -1}}, false, 2},
      {"other_axis", {{0, 2, 1}, {2, 5, 1}}, false, 0},
      {"shape_also_read", {{0, 6, -1}, {6, 12, -1}}, true, 0},
      {"overlapping", {{0, 8, -1}, {4, 12, -1}}, false, 0},
  };
  for (const Case& c : cases) {
    std::mt19937 rng(23);
    test::GraphBuilder b;
    const Shape x_shape{2, 5, 8};
    b.g.inputs.push_back({"x", DType::kFloat32, dims_of(x_shape)});
    const std::string w = b.constant(test::random_tensor({8, 12}, rng));
    const std::string product = b.node("MatMul", {"x", w});
    b.g.value_info[product] = {product, DType::kFloat32, dims_of({2, 5, 12})};
    const std::string biased = b.node("Add", {b.constant(test::random_tensor({12}, rng)), product});
    auto ints = [&](int64_t v) { return b.constant(Tensor::from_vector<int64_t>({1}, {v})); };
    for (const auto& [start, end, axis] : c.slices) {
      const std::string part = b.node("Slice", {biased, ints(start), ints(end), ints(axis)});
      b.g.outputs.push_back({b.node("Relu", {part}), DType::kFloat32, {}});
    }
    if (c.shape_reader) b.g.outputs.push_back({b.node("Shape", {biased}), DType::kInt64, {}});
    const ir::Graph original = b.g;
    ir::Graph fused_graph = original;
    const ir::RuleCounts counts = runtime::apply_execution_fusions(fused_graph, {});
    EXPECT_EQ(ir::count_of(counts, "split_matmul_by_column_slices"), c.parts ? 1 : 0) << c.name;
    auto count = [&](const char* op) {
      return std::count_if(fused_graph.nodes.begin(), fused_graph.nodes.end(),
                           [&](const ir::Node& n) { return n.op_type == op; });
    };
    EXPECT_EQ(count("MatMul"), c.parts ? c.parts : 1) << c.name;
    EXPECT_EQ(count("Slice"), c.parts ? 0 : static_cast<int64_t>(c.slices.size())) << c.name;
    const std::map<std::string, Tensor> feeds{{"x", test::random_tensor(x_shape, rng)}};
    runtime::SessionOptions plain;
    plain.fuse_activations = false;
    runtime::Session fused(original), reference(original, plain);
    const auto got = fused.run(feeds), want = reference.run(feeds);
    for (const auto& o : original.outputs) {
      const Tensor &g = got.at(o.name), &r = want.at(o.name);
      ASSERT_EQ(g.shape(), r.shape()) << c.name << " " << o.name;
      if (g.dtype() != DType::kFloat32) continue;
      for (int64_t i = 0; i < g.numel(); ++i)
        EXPECT_NEAR(g.data<float>()[i], r.data<float>()[i], 1e-5f) << c.name << " " << o.name << " " << i;
    }
  }
}

// What kernels declare they fold (KernelFolds), which the generic fold rules read alone.
TEST(ExecutionFusions, KernelsDeclareTheFoldsTheyAccept) {
  using runtime::Fold;
  const runtime::KernelRegistry& r = runtime::KernelRegistry::instance();
  auto activation = [](fo::Activation a) { return 1u << static_cast<unsigned>(a); };
  EXPECT_TRUE(r.folds("Conv").activations & activation(fo::Activation::kHardSwish));
  EXPECT_FALSE(r.folds("Conv").activations & activation(fo::Activation::kGelu));
  EXPECT_TRUE(r.folds("Conv").declares(Fold::kPostAffine));
  EXPECT_FALSE(r.folds("Gemm").declares(Fold::kPostAffine));
  EXPECT_TRUE(r.folds("Conv").declares(Fold::kPostClamp));
  EXPECT_FALSE(r.folds("Gemm").declares(Fold::kPostClamp));
  EXPECT_EQ(r.folds("MatMul").activations, activation(fo::Activation::kScale));
  EXPECT_TRUE(r.folds("Add").declares(Fold::kScaledInput));
  EXPECT_FALSE(r.folds("Mul").declares(Fold::kScaledInput));
  EXPECT_TRUE(r.folds("Concat").declares(Fold::kChannelQuantize));
  EXPECT_FALSE(r.folds("Concat").declares(Fold::kTensorQuantize));
  EXPECT_EQ(r.folds("MatMul").transposed_inputs, 0b11u);
  EXPECT_TRUE(r.folds("MatMul").declares(Fold::kTransposedOutput));
  EXPECT_FALSE(r.folds("Gemm").declares(Fold::kTransposedInput));  // transA / transB are its own
  for (Fold f : {Fold::kDequantizedInput, Fold::kScaledInput, Fold::kUpsampledInput, Fold::kTransposedInput, Fold::kActivation,
                 Fold::kPostAffine, Fold::kPostClamp, Fold::kTensorQuantize, Fold::kChannelQuantize, Fold::kTransposedOutput})
    EXPECT_FALSE(r.folds("Relu").declares(f));

  // Per node: a QConv whose output is already 8-bit takes no QuantizeLinear.
  ir::Node qconv;
  qconv.op_type = "QConv";
  qconv.domain = "com.slimquant";
  EXPECT_TRUE(r.folds("QConv", "com.slimquant").accepts(qconv, Fold::kTensorQuantize));
  qconv.attrs["y_type"] = int64_t{2};
  EXPECT_FALSE(r.folds("QConv", "com.slimquant").accepts(qconv, Fold::kTensorQuantize));
  // An Add reads codes at its operands, not at a scaled operand's factor, and not under an upsampling.
  ir::Node add;
  add.op_type = "Add";
  add.inputs = {"a", "b"};
  const runtime::KernelFolds& folds = r.folds("Add");
  EXPECT_TRUE(folds.accepts_at(add, Fold::kDequantizedInput, 0));
  EXPECT_TRUE(folds.accepts_at(add, Fold::kDequantizedInput, 1));
  add.attrs[runtime::ew::kNearestUpsampledInput] = int64_t{0};
  EXPECT_FALSE(folds.accepts_at(add, Fold::kDequantizedInput, 0));
  EXPECT_TRUE(folds.accepts_at(add, Fold::kDequantizedInput, 1));
  EXPECT_FALSE(folds.accepts_at(add, Fold::kScaledInput, 0));
  EXPECT_TRUE(folds.accepts_at(add, Fold::kScaledInput, 1));
  EXPECT_FALSE(folds.accepts(add, Fold::kUpsampledInput));  // one per node
  add.inputs.push_back("factor");
  add.attrs[runtime::ew::kScaledInput] = int64_t{1};
  EXPECT_FALSE(folds.accepts_at(add, Fold::kDequantizedInput, 2));
  EXPECT_TRUE(folds.accepts_at(add, Fold::kDequantizedInput, 1));  // codes under the scaling
}

TEST(FusedOps, ContractsRoundTripThroughNodeAttributes) {
  ir::Node n;
  n.op_type = "Conv";
  fo::FusedActivation a{fo::Activation::kHardSwish, 0.f, 0.f, 0.5f, 0.07f};
  a.write(n);
  const fo::FusedActivation back = fo::FusedActivation::parse(n);
  EXPECT_EQ(back.kind, fo::Activation::kHardSwish);
  EXPECT_FLOAT_EQ(back.post_scale, 0.5f);
  EXPECT_FLOAT_EQ(back.post_shift, 0.07f);
  EXPECT_FALSE(back.has_post_clamp());
  a.post_min = -0.4f;
  a.write(n);
  EXPECT_FLOAT_EQ(fo::FusedActivation::parse(n).post_min, -0.4f);
  EXPECT_EQ(fo::FusedActivation::parse(n).post_max, INFINITY);
  fo::FusedActivation{}.write(n);  // empty: the attributes go
  EXPECT_TRUE(n.attrs.empty());
  fo::SumActivation{fo::Activation::kClip, -1.f, 6.f}.write(n);
  const fo::SumActivation sum = fo::SumActivation::parse(n);
  EXPECT_EQ(sum.kind, fo::Activation::kClip);
  EXPECT_FLOAT_EQ(sum.lo, -1.f);
  EXPECT_FLOAT_EQ(sum.hi, 6.f);
  EXPECT_TRUE(ir::has_execution_attrs(n));
}

// Every attribute an execution fusion writes is named in the execution-only family, so model
// passes (has_execution_attrs) never rewrite a node a fold has claimed.
TEST(FusedOps, EveryFoldAttributeIsExecutionOnly) {
  for (const char* name :
       {runtime::kFoldedQuantizeScale, runtime::kFoldedQuantizeZeroPoint, runtime::kFoldedQuantizeType, runtime::kFoldedQuantizeChannelScale,
        runtime::kFoldedQuantizeChannelZeroPoint, runtime::kFoldedQuantizeAxis, runtime::kFoldedDequantizeInputs,
        runtime::kFoldedDequantizeScales, runtime::kFoldedDequantizeZeroPoints, runtime::ew::kNearestUpsampledInput,
        runtime::ew::kNearestUpsampleFactors, runtime::ew::kScaledInput}) {
    ir::Node n;
    n.op_type = "Add";
    n.attrs[name] = int64_t{1};
    EXPECT_TRUE(ir::has_execution_attrs(n)) << name;
  }
  ir::Node transposed;
  transposed.op_type = "MatMul";
  transposed.attrs[fo::transposed_input_attr(1)] = std::vector<int64_t>{1, 0};
  EXPECT_TRUE(ir::has_execution_attrs(transposed));
  EXPECT_FALSE(fo::transposed_output_perm(transposed));
  ir::Node transposed_out;
  transposed_out.attrs[fo::kTransposedOutput] = std::vector<int64_t>{0, 2, 1};
  EXPECT_TRUE(ir::has_execution_attrs(transposed_out));
  EXPECT_EQ(fo::transposed_output_perm(transposed_out), (std::vector<int64_t>{0, 2, 1}));
  EXPECT_EQ(fo::transposed_input_perm(transposed, 1), (std::vector<int64_t>{1, 0}));
  EXPECT_FALSE(fo::transposed_input_perm(transposed, 0));
  ir::Node n;
  n.op_type = "Add";
  runtime::FoldedQuantize q;
  q.dtype = DType::kUInt8;
  q.scale = {0.5f};
  q.zero_point = {3};
  runtime::write_folded_quantize(n, q);
  EXPECT_TRUE(ir::has_execution_attrs(n));
}

TEST(ModelPasses, NameNodesNamesUnnamedNodesAfterTheirOutput) {
  test::GraphBuilder b;
  b.g.inputs.push_back({"x", DType::kFloat32, {}});
  const std::string a = b.node("Relu", {"x"});
  b.node("Relu", {a});
  b.g.nodes[1].name.clear();
  ir::name_nodes(b.g);
  EXPECT_EQ(b.g.nodes[0].name, "Relu0");
  EXPECT_EQ(b.g.nodes[1].name, b.g.nodes[1].outputs[0] + "_1");  // unique among the graph's values
}
