// If: branches that read outer values (captured), through the graph passes, export and reload.
#include <gtest/gtest.h>

#include <memory>

#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

namespace {

ir::Node make_node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out) {
  ir::Node n;
  n.op_type = op;
  n.name = out[0] + "_node";
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

ir::ValueInfo float_value(const std::string& name) {
  return {name, DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {3, ""}}};
}

// y = sum(x) > 0 ? relu(x) + 1 : -relu(x), with relu(x) passed through an Identity (which the
// session's passes remove, renaming the value the branches read) and a second output that is an
// outer value itself in the else branch.
ir::Graph if_graph() {
  ir::Graph g;
  g.opset = 13;
  g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {3, ""}}});
  g.initializers["zero"] = Tensor::scalar<float>(0.f);
  g.nodes.push_back(make_node("Relu", {"x"}, {"a"}));
  g.nodes.push_back(make_node("Identity", {"a"}, {"a_id"}));
  g.nodes.push_back(make_node("ReduceSum", {"x"}, {"s"}));
  g.nodes.back().attrs["keepdims"] = int64_t{0};
  g.nodes.push_back(make_node("Greater", {"s", "zero"}, {"cond"}));

  auto then_branch = std::make_shared<ir::Graph>();
  then_branch->opset = 13;
  then_branch->initializers["one"] = Tensor::scalar<float>(1.f);
  then_branch->nodes.push_back(make_node("Add", {"a_id", "one"}, {"then_y"}));
  then_branch->nodes.push_back(make_node("Mul", {"a_id", "one"}, {"then_z"}));
  then_branch->outputs = {float_value("then_y"), float_value("then_z")};
  auto else_branch = std::make_shared<ir::Graph>();
  else_branch->opset = 13;
  else_branch->nodes.push_back(make_node("Neg", {"a_id"}, {"else_y"}));
  else_branch->outputs = {float_value("else_y"), float_value("a_id")};

  ir::Node n = make_node("If", {"cond", "a_id"}, {"y", "z"});
  n.captured = {"a_id"};
  n.attrs["then_branch"] = std::shared_ptr<const ir::Graph>(then_branch);
  n.attrs["else_branch"] = std::shared_ptr<const ir::Graph>(else_branch);
  g.nodes.push_back(n);
  g.outputs = {float_value("y"), float_value("z")};
  g.validate();
  return g;
}

void expect_branches(runtime::Session& s) {
  const Tensor pos = Tensor::from_vector<float>({2, 3}, {1, -2, 3, 4, 5, -6});
  auto out = s.run({{"x", pos}});
  const std::vector<float> relu = {1, 0, 3, 4, 5, 0};
  for (size_t i = 0; i < relu.size(); ++i) {
    EXPECT_FLOAT_EQ(out.at("y").data<float>()[i], relu[i] + 1.f);
    EXPECT_FLOAT_EQ(out.at("z").data<float>()[i], relu[i]);
  }
  const Tensor neg = Tensor::from_vector<float>({2, 3}, {-1, 2, -3, -4, -5, 6});
  out = s.run({{"x", neg}});
  const std::vector<float> relu_neg = {0, 2, 0, 0, 0, 6};
  for (size_t i = 0; i < relu_neg.size(); ++i) {
    EXPECT_FLOAT_EQ(out.at("y").data<float>()[i], -relu_neg[i]);
    EXPECT_FLOAT_EQ(out.at("z").data<float>()[i], relu_neg[i]);
  }
}

}  // namespace

TEST(ControlFlow, IfRunsTheChosenBranchOnCapturedOuterValues) {
  runtime::Session s(if_graph());
  expect_branches(s);
}

TEST(ControlFlow, IfSurvivesExportAndReloadAfterPassesRenamedItsCapturedValue) {
  runtime::Session optimized(if_graph());  // Identity removed: the If now reads 'a' for 'a_id'
  const ir::Graph& g = optimized.graph();
  const auto it = std::find_if(g.nodes.begin(), g.nodes.end(), [](const ir::Node& n) { return n.op_type == "If"; });
  ASSERT_NE(it, g.nodes.end());
  EXPECT_EQ(it->inputs.back(), "a");
  EXPECT_EQ(it->captured, std::vector<std::string>{"a_id"});
  try {
    ir::check_onnx(g);
  } catch (const Error& e) {
    FAIL() << e.what();
  }
  ir::Graph reloaded = ir::parse_onnx(ir::serialize_onnx(g), "", "the exported model");
  const auto r = std::find_if(reloaded.nodes.begin(), reloaded.nodes.end(),
                              [](const ir::Node& n) { return n.op_type == "If"; });
  ASSERT_NE(r, reloaded.nodes.end());
  EXPECT_EQ(r->captured, std::vector<std::string>{"a"});  // the branches were renamed on export
  EXPECT_EQ(r->declared_inputs(), 1u);
  runtime::Session s(std::move(reloaded));
  expect_branches(s);
}

TEST(ControlFlow, UnsupportedOpInABranchNamesTheIfAndTheOp) {
  ir::Graph g = if_graph();
  ir::Graph branch = *g.nodes.back().attr_graph("else_branch");
  branch.nodes[0].op_type = "NoSuchOp";
  g.nodes.back().attrs["else_branch"] = std::shared_ptr<const ir::Graph>(std::make_shared<ir::Graph>(branch));
  try {
    runtime::Session s(g);  // checked up front, like the ops of the main graph
    FAIL() << "an unsupported op inside a branch was accepted";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("If 'y_node'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("NoSuchOp"), std::string::npos) << msg;
  }
}

// A TorchScript export whose If branches return Optional[Tensor] (one of them empty), read back by
// OptionalHasElement and OptionalGetElement: y = 2x + 1 when sum(x) > 0, else x - 1. It runs both
// ways, and survives export (the optional types are written back) and reload.
TEST(ControlFlow, OptionalValuesFromIfBranchesRunBothWays) {
  test::TempDir tmp("optional_if");
  const ir::Graph g = ir::load_onnx(test::source_path("tests/fixtures/models/control_flow/optional_if.onnx"));
  ir::save_onnx(g, tmp.path("again.onnx"));
  for (const ir::Graph& model : {g, ir::load_onnx(tmp.path("again.onnx"))}) {
    runtime::Session s(model);
    const Tensor positive = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
    const Tensor negative = Tensor::from_vector<float>({2, 3}, {-1, -2, -3, -4, -5, 6});
    EXPECT_EQ(s.run({{"x", positive}}).at("y").to_float_vector(), (std::vector<float>{3, 5, 7, 9, 11, 13}));
    EXPECT_EQ(s.run({{"x", negative}}).at("y").to_float_vector(), (std::vector<float>{-2, -3, -4, -5, -6, 5}));
  }
}

// Reading an empty optional is the model's error, named as such.
TEST(ControlFlow, OptionalGetElementOfAnEmptyOptionalIsNamed) {
  ir::Graph g;
  g.opset = 16;
  g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {3, ""}}});
  g.nodes.push_back(make_node("Optional", {}, {"none"}));
  g.nodes.push_back(make_node("OptionalHasElement", {"none"}, {"has"}));
  g.nodes.push_back(make_node("OptionalGetElement", {"none"}, {"y"}));
  g.outputs.push_back({"has", DType::kBool, std::nullopt});
  runtime::Session has(g);
  EXPECT_EQ(has.run({{"x", Tensor(DType::kFloat32, {2, 3})}}).at("has").to_int64_vector(), (std::vector<int64_t>{0}));
  g.outputs = {{"y", DType::kFloat32, std::nullopt}};
  try {
    runtime::Session get(g);
    get.run({{"x", Tensor(DType::kFloat32, {2, 3})}});
    FAIL() << "an empty optional was read";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("the optional value is empty"), std::string::npos) << e.what();
  }
}
