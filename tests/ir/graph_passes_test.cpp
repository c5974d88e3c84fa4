#include <gtest/gtest.h>

#include "slimquant/ir/graph.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/ir/passes.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;

namespace {
ir::Node make_node(std::string op, std::vector<std::string> in, std::vector<std::string> out, std::string name = "") {
  ir::Node n;
  n.op_type = std::move(op);
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  n.name = name.empty() ? n.outputs[0] + "_node" : name;
  return n;
}
}  // namespace

TEST(Graph, TopologicalSortOrdersProducersFirst) {
  ir::Graph g;
  g.inputs.push_back({"x", DType::kFloat32, {}});
  g.outputs.push_back({"z", DType::kFloat32, {}});
  g.nodes.push_back(make_node("Relu", {"y"}, {"z"}));
  g.nodes.push_back(make_node("Relu", {"x"}, {"y"}));
  g.topological_sort();
  EXPECT_EQ(g.nodes[0].outputs[0], "y");
  EXPECT_EQ(g.nodes[1].outputs[0], "z");
  EXPECT_NO_THROW(g.validate());
}

// Shape computations move to right after what they read; every other node keeps its order. An
// exporter's Resize to the input's size at the end of a network reads such a chain.
TEST(Graph, ShapeComputationsMoveUpToWhatTheyRead) {
  ir::Graph g;
  g.inputs.push_back({"x", DType::kFloat32, {}});
  g.initializers["index"] = Tensor::scalar<int64_t>(2);
  g.nodes.push_back(make_node("Relu", {"x"}, {"a"}));
  g.nodes.push_back(make_node("Relu", {"a"}, {"b"}));
  g.nodes.push_back(make_node("Relu", {"b"}, {"c"}));
  g.nodes.push_back(make_node("Shape", {"x"}, {"x_shape"}));               // reads the input: first
  g.nodes.push_back(make_node("Gather", {"x_shape", "index"}, {"x_h"}));  // then right after it
  g.nodes.push_back(make_node("Cast", {"x_h"}, {"x_h_float"}));
  g.nodes.push_back(make_node("Shape", {"b"}, {"b_shape"}));               // after b
  g.nodes.push_back(make_node("ConstantOfShape", {"b_shape"}, {"zeros"}));  // a full-size tensor: stays
  g.nodes.push_back(make_node("Add", {"c", "zeros"}, {"d"}));               // data: stays
  g.nodes.push_back(make_node("Concat", {"d", "x_h_float"}, {"y"}));
  g.outputs.push_back({"y", DType::kFloat32, {}});
  EXPECT_GT(ir::hoist_shape_computations(g), 0);
  std::vector<std::string> order;
  for (const auto& n : g.nodes) order.push_back(n.outputs[0]);
  EXPECT_EQ(order, (std::vector<std::string>{"x_shape", "x_h", "x_h_float", "a", "b", "b_shape", "c", "zeros", "d",
                                             "y"}));
  EXPECT_NO_THROW(g.validate());
  EXPECT_EQ(ir::hoist_shape_computations(g), 0);  // already in place
}

// A flagged node runs as soon as its inputs exist; the others keep their order.
TEST(Graph, ScheduleEarlyRunsFlaggedNodesAsSoonAsTheirInputsExist) {
  ir::Graph g;
  g.inputs.push_back({"x", DType::kFloat32, {}});
  g.nodes.push_back(make_node("Relu", {"x"}, {"a"}));
  g.nodes.push_back(make_node("Relu", {"a"}, {"b"}));
  g.nodes.push_back(make_node("Relu", {"b"}, {"c"}));
  g.nodes.push_back(make_node("Neg", {"a"}, {"side"}));      // flagged: right after a
  g.nodes.push_back(make_node("Add", {"c", "side"}, {"y"}));
  g.outputs.push_back({"y", DType::kFloat32, {}});
  EXPECT_EQ(ir::schedule_early(g, {false, false, false, true, false}), 3);  // b, c and side moved
  std::vector<std::string> order;
  for (const auto& n : g.nodes) order.push_back(n.outputs[0]);
  EXPECT_EQ(order, (std::vector<std::string>{"a", "side", "b", "c", "y"}));
  EXPECT_THROW(ir::schedule_early(g, {true}), Error);  // one flag per node
}

TEST(Graph, ValidateNamesUndefinedValue) {
  ir::Graph g;
  g.inputs.push_back({"x", DType::kFloat32, {}});
  g.outputs.push_back({"z", DType::kFloat32, {}});
  g.nodes.push_back(make_node("Add", {"x", "ghost"}, {"z"}, "adder"));
  try {
    g.validate();
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("'ghost'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("adder"), std::string::npos) << e.what();
  }
}

TEST(Passes, RemoveIdentityKeepsOutputName) {
  ir::Graph g;
  g.inputs.push_back({"x", DType::kFloat32, {}});
  g.outputs.push_back({"out", DType::kFloat32, {}});
  g.nodes.push_back(make_node("Relu", {"x"}, {"r"}));
  g.nodes.push_back(make_node("Identity", {"r"}, {"i"}));
  g.nodes.push_back(make_node("Dropout", {"i"}, {"out"}));
  EXPECT_EQ(ir::remove_identity_ops(g), 2);
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op_type, "Relu");
  EXPECT_EQ(g.nodes[0].outputs[0], "out");
}

TEST(Passes, FoldBatchNormIntoConvMatchesClosedForm) {
  ir::Graph g;
  g.inputs.push_back({"x", DType::kFloat32, {}});
  g.outputs.push_back({"y", DType::kFloat32, {}});
  g.initializers["w"] = Tensor::from_vector<float>({2, 1, 1, 1}, {2.f, 3.f});
  g.initializers["b"] = Tensor::from_vector<float>({2}, {1.f, -1.f});
  g.initializers["gamma"] = Tensor::from_vector<float>({2}, {1.f, 2.f});
  g.initializers["beta"] = Tensor::from_vector<float>({2}, {0.5f, 0.f});
  g.initializers["mean"] = Tensor::from_vector<float>({2}, {1.f, 2.f});
  g.initializers["var"] = Tensor::from_vector<float>({2}, {4.f, 1.f});
  g.nodes.push_back(make_node("Conv", {"x", "w", "b"}, {"c"}));
  auto bn = make_node("BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"y"});
  bn.attrs["epsilon"] = 0.f;
  g.nodes.push_back(bn);
  EXPECT_EQ(ir::fold_batchnorm_into_conv(g), 1);
  ASSERT_EQ(g.nodes.size(), 1u);
  const auto& conv = g.nodes[0];
  EXPECT_EQ(conv.outputs[0], "y");
  auto w = g.initializer(conv.inputs[1])->to_float_vector();
  auto b = g.initializer(conv.inputs[2])->to_float_vector();
  // channel 0: k = 1/2 -> w 1, b (1-1)/2+0.5; channel 1: k = 2 -> w 6, b (-1-2)*2+0
  EXPECT_FLOAT_EQ(w[0], 1.f);
  EXPECT_FLOAT_EQ(w[1], 6.f);
  EXPECT_FLOAT_EQ(b[0], 0.5f);
  EXPECT_FLOAT_EQ(b[1], -6.f);
  EXPECT_FALSE(g.is_initializer("gamma"));
  // Read by this Conv alone, the folded tensors keep the originals' names.
  EXPECT_EQ(conv.inputs[1], "w");
  EXPECT_EQ(conv.inputs[2], "b");
}

// A weight another node also reads stays as it is; the folded copy gets a fresh name. A Conv
// without a bias gets one named after the Conv.
TEST(Passes, FoldBatchNormKeepsSharedWeightsAndNamesNewBiases) {
  ir::Graph g;
  g.inputs.push_back({"x", DType::kFloat32, {}});
  g.outputs.push_back({"y", DType::kFloat32, {}});
  g.outputs.push_back({"z", DType::kFloat32, {}});
  g.initializers["w"] = Tensor::from_vector<float>({2, 1, 1, 1}, {2.f, 3.f});
  g.initializers["gamma"] = Tensor::from_vector<float>({2}, {1.f, 2.f});
  g.initializers["beta"] = Tensor::from_vector<float>({2}, {0.5f, 0.f});
  g.initializers["mean"] = Tensor::from_vector<float>({2}, {1.f, 2.f});
  g.initializers["var"] = Tensor::from_vector<float>({2}, {4.f, 1.f});
  g.nodes.push_back(make_node("Conv", {"x", "w"}, {"c"}, "conv"));
  g.nodes.push_back(make_node("BatchNormalization", {"c", "gamma", "beta", "mean", "var"}, {"y"}));
  g.nodes.push_back(make_node("Conv", {"x", "w"}, {"z"}));
  EXPECT_EQ(ir::fold_batchnorm_into_conv(g), 1);
  const ir::Node& conv = g.nodes[0];
  ASSERT_EQ(conv.outputs[0], "y");
  EXPECT_EQ(conv.inputs[1], "w_bnfolded");
  EXPECT_EQ(conv.inputs[2], "conv.bias");
  EXPECT_EQ(g.initializer("w")->to_float_vector(), (std::vector<float>{2.f, 3.f}));
  EXPECT_EQ(g.nodes[1].inputs[1], "w");
}

TEST(Graph, UniqueValueNameAvoidsNamesReservedAsValueInfo) {
  ir::Graph g;
  g.inputs.push_back({"x", DType::kFloat32, {}});
  g.value_info["x_q"] = {"x_q", DType::kUndefined, std::nullopt};
  EXPECT_EQ(g.unique_value_name("x"), "x_1");
  EXPECT_EQ(g.unique_value_name("x_q"), "x_q_1");
  EXPECT_EQ(g.unique_value_name("x_dq"), "x_dq");
}

TEST(OnnxIo, TruncatedFileIsInvalidModel) {
  try {
    ir::parse_onnx(std::string("\x08\x07\x12\x05hello\x3a\xff\xff", 12), ".", "'bad.onnx'");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("bad.onnx"), std::string::npos);
  }
}

TEST(OnnxIo, MissingFileIsIoError) {
  try {
    ir::load_onnx("/nonexistent/model.onnx");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
  }
}

// Opset 11 Softmax (axis 1 flattens [N, 3, 4] to [N, 12] rows) of an intermediate value converts
// to opset 13: the converter needs the input's rank, which shape inference supplies.
TEST(OnnxIo, ConvertOpsetInfersShapesForSoftmaxAndKeepsItsMeaning) {
  ir::Graph g;
  g.opset = 11;
  g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "n"}, {3, ""}, {4, ""}}});
  g.outputs.push_back({"y", DType::kFloat32, std::nullopt});
  g.nodes.push_back(make_node("Relu", {"x"}, {"r"}));  // an intermediate: no shape in the model
  ir::Node n = make_node("Softmax", {"r"}, {"y"});
  n.attrs["axis"] = int64_t{1};
  g.nodes.push_back(n);
  Tensor x(DType::kFloat32, {2, 3, 4});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.1f * static_cast<float>(i % 7) - 0.3f;
  const Tensor before = runtime::Session(g).run_single(x);
  ir::Graph converted = g;
  ASSERT_NO_THROW(ir::convert_opset(converted, 13));
  EXPECT_EQ(converted.opset, 13);
  const Tensor after = runtime::Session(converted).run_single(x);
  ASSERT_EQ(before.shape(), after.shape());
  for (int64_t i = 0; i < before.numel(); ++i) EXPECT_NEAR(before.data<float>()[i], after.data<float>()[i], 1e-6f) << i;
  // Rows of 12 sum to 1 (the opset-11 meaning), not columns of 3.
  float row = 0;
  for (int64_t i = 0; i < 12; ++i) row += after.data<float>()[i];
  EXPECT_NEAR(row, 1.0f, 1e-5f);
}

// When even the rank is unknown (as for attention scores after a Reshape to a computed shape), the
// old meaning is spelled out as Flatten -> Softmax -> Reshape(Shape(x)) before the conversion.
TEST(OnnxIo, ConvertOpsetSpellsOutCoercedSoftmaxOfUnknownRank) {
  ir::Graph g;
  g.opset = 12;
  g.inputs.push_back({"x", DType::kFloat32, std::nullopt});  // rank unknown
  g.outputs.push_back({"y", DType::kFloat32, std::nullopt});
  g.nodes.push_back(make_node("Relu", {"x"}, {"r"}));
  ir::Node n = make_node("Softmax", {"r"}, {"y"});
  n.attrs["axis"] = int64_t{1};
  g.nodes.push_back(n);
  Tensor x(DType::kFloat32, {2, 3, 4});
  for (int64_t i = 0; i < x.numel(); ++i) x.data<float>()[i] = 0.1f * static_cast<float>(i % 5);
  const Tensor before = runtime::Session(g).run_single(x);
  ir::Graph converted = g;
  ASSERT_NO_THROW(ir::convert_opset(converted, 13));
  EXPECT_EQ(converted.opset, 13);
  const Tensor after = runtime::Session(converted).run_single(x);
  ASSERT_EQ(after.shape(), (Shape{2, 3, 4}));
  for (int64_t i = 0; i < before.numel(); ++i) EXPECT_NEAR(before.data<float>()[i], after.data<float>()[i], 1e-6f) << i;
}

// The clean-up passes are one rule each: apply_rules counts every rewrite under its pass's name.
TEST(Passes, CleanupRulesCountEachPassByName) {
  ir::Graph g;
  g.inputs.push_back({"x", DType::kFloat32, {}});
  g.outputs.push_back({"out", DType::kFloat32, {}});
  ir::Node one = make_node("Constant", {}, {"one"});
  one.attrs["value"] = Tensor::scalar<float>(1.f);
  g.nodes.push_back(one);
  g.nodes.push_back(make_node("Mul", {"x", "one"}, {"m"}));  // x * 1: an Identity, then gone
  g.nodes.push_back(make_node("Identity", {"m"}, {"i"}));
  g.nodes.push_back(make_node("Relu", {"i"}, {"out"}));
  const ir::RuleCounts counts = ir::apply_rules(g, ir::cleanup_rules());
  EXPECT_EQ(ir::count_of(counts, "constants_to_initializers"), 1);
  EXPECT_EQ(ir::count_of(counts, "neutral_elementwise_to_identity"), 1);
  EXPECT_EQ(ir::count_of(counts, "remove_identity_ops"), 2);
  ASSERT_EQ(g.nodes.size(), 1u);
  EXPECT_EQ(g.nodes[0].op_type, "Relu");
  EXPECT_EQ(g.nodes[0].inputs[0], "x");
  EXPECT_EQ(g.nodes[0].outputs[0], "out");
}
