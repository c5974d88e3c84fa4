// Loop, Scan and sequence values: the exporter's models (tests/fixtures/make_control_flow_models.py)
// against PyTorch's / NumPy's outputs, through export and reload; sequences as graph inputs and
// outputs; the errors a broken body or a bad position gets.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>

#include "slimquant/core/npy.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/session.h"
#include "control_flow_fixtures.h"
#include "test_util.h"

using namespace slimquant;
using test::control_flow_fixture;
using test::max_abs_difference;
using test::graph_node;

namespace {

// Loop over M iterations carrying `acc` (acc += x * i, x read from the outer graph) and stacking
// each acc as a scan output. The body can be given an extra output to make it malformed.
ir::Graph loop_graph(bool extra_body_output = false) {
  auto body = std::make_shared<ir::Graph>();
  body->opset = 16;
  body->inputs = {{"i", DType::kInt64, std::vector<ir::Dim>{}}, {"cond_in", DType::kBool, std::vector<ir::Dim>{}},
                  {"acc_in", DType::kFloat32, std::nullopt}};
  body->nodes.push_back(graph_node("Cast", {"i"}, {"i_f"}));
  body->nodes.back().attrs["to"] = int64_t{1};
  body->nodes.push_back(graph_node("Mul", {"x", "i_f"}, {"xi"}));
  body->nodes.push_back(graph_node("Add", {"acc_in", "xi"}, {"acc_out"}));
  body->nodes.push_back(graph_node("Identity", {"cond_in"}, {"cond_out"}));
  body->nodes.push_back(graph_node("Identity", {"acc_out"}, {"acc_scan"}));
  body->outputs = {{"cond_out", DType::kBool, std::nullopt}, {"acc_out", DType::kFloat32, std::nullopt},
                   {"acc_scan", DType::kFloat32, std::nullopt}};
  if (extra_body_output) body->outputs.push_back({"xi", DType::kFloat32, std::nullopt});

  ir::Graph g;
  g.opset = 16;
  g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{2, ""}}}, {"m", DType::kInt64, std::vector<ir::Dim>{}}};
  g.initializers["cond"] = Tensor::scalar<bool>(true);
  g.initializers["acc0"] = Tensor::from_vector<float>({2}, {10.f, 20.f});
  ir::Node loop = graph_node("Loop", {"m", "cond", "acc0", "x"}, {"acc", "stacked"});
  loop.name = "accumulate";
  loop.captured = {"x"};
  loop.attrs["body"] = std::shared_ptr<const ir::Graph>(body);
  g.nodes.push_back(loop);
  g.outputs = {{"acc", DType::kFloat32, std::nullopt}, {"stacked", DType::kFloat32, std::nullopt}};
  return g;
}

}  // namespace

TEST(LoopScan, ScriptedForLoopAppendingToAListMatchesPyTorch) {
  test::TempDir tmp("loop_for");
  const ir::Graph g = ir::load_onnx(control_flow_fixture("loop_for_append.onnx"));
  ir::save_onnx(g, tmp.path("again.onnx"));  // the sequence types are written back
  const Tensor x = read_npy(control_flow_fixture("loop_for_append.input.npy"));
  const Tensor expected = read_npy(control_flow_fixture("loop_for_append.expected.npy"));
  for (const ir::Graph& model : {g, ir::load_onnx(tmp.path("again.onnx"))}) {
    runtime::Session s(model);
    EXPECT_LT(max_abs_difference(s.run({{"x", x}}).at("y"), expected), 1e-5f);
    // Another length: the loop runs its body once per row.
    const Tensor three = Tensor::from_vector<float>({3, 3}, std::vector<float>(x.data<float>(), x.data<float>() + 9));
    EXPECT_EQ(s.run({{"x", three}}).at("y").shape(), (Shape{3, 4}));
  }
}

TEST(LoopScan, ScriptedWhileLoopStopsOnItsCondition) {
  const ir::Graph g = ir::load_onnx(control_flow_fixture("loop_while.onnx"));
  runtime::Session s(g);
  const Tensor x = read_npy(control_flow_fixture("loop_while.input.npy"));
  EXPECT_EQ(max_abs_difference(s.run({{"x", x}}).at("y"), read_npy(control_flow_fixture("loop_while.expected.npy"))), 0.f);
  // Already within [-1, 1]: the body never runs.
  const Tensor small = Tensor::from_vector<float>({1, 3}, {0.5f, -0.25f, 1.f});
  EXPECT_EQ(s.run({{"x", small}}).at("y").to_float_vector(), (std::vector<float>{0.5f, -0.25f, 1.f}));
}

TEST(LoopScan, ScanWithReversedInputsAndOutputsMatchesNumPy) {
  test::TempDir tmp("scan");
  const ir::Graph g = ir::load_onnx(control_flow_fixture("scan.onnx"));
  ir::save_onnx(g, tmp.path("again.onnx"));
  const Tensor x = read_npy(control_flow_fixture("scan.input.npy"));
  for (const ir::Graph& model : {g, ir::load_onnx(tmp.path("again.onnx"))}) {
    runtime::Session s(model);
    EXPECT_LT(max_abs_difference(s.run({{"x", x}}).at("y"), read_npy(control_flow_fixture("scan.expected.npy"))), 1e-5f);
  }
}

TEST(LoopScan, LoopCarriesValuesStacksScanOutputsAndReadsOuterValues) {
  runtime::Session s(loop_graph());
  auto out = s.run({{"x", Tensor::from_vector<float>({2}, {1.f, 2.f})}, {"m", Tensor::scalar<int64_t>(3)}});
  // acc: 10 + 0 + 1 + 2 = 13, 20 + 0 + 2 + 4 = 26; stacked: every iteration's acc.
  EXPECT_EQ(out.at("acc").to_float_vector(), (std::vector<float>{13, 26}));
  EXPECT_EQ(out.at("stacked").shape(), (Shape{3, 2}));
  EXPECT_EQ(out.at("stacked").to_float_vector(), (std::vector<float>{10, 20, 11, 22, 13, 26}));
  // No iteration: the initial values, and an empty scan output.
  out = s.run({{"x", Tensor::from_vector<float>({2}, {1.f, 2.f})}, {"m", Tensor::scalar<int64_t>(0)}});
  EXPECT_EQ(out.at("acc").to_float_vector(), (std::vector<float>{10, 20}));
  EXPECT_EQ(out.at("stacked").numel(), 0);
}

TEST(LoopScan, LoopBodyWithTheWrongNumberOfOutputsIsNamed) {
  try {
    runtime::Session s(loop_graph(/*extra_body_output=*/true));
    s.run({{"x", Tensor::from_vector<float>({2}, {1.f, 2.f})}, {"m", Tensor::scalar<int64_t>(3)}});
    FAIL() << "a Loop whose body has too many outputs ran";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("Loop 'accumulate'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("its body has 4 outputs"), std::string::npos) << msg;
  }
}

// A sequence built from a tensor, read by position, measured and joined again; the sequence itself
// is a graph output (a Tensor::sequence) and can be fed back as an input.
TEST(LoopScan, SequencesAreGraphOutputsAndInputs) {
  ir::Graph g;
  g.opset = 16;
  g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{3, ""}, {2, ""}}}, {"at", DType::kInt64, std::vector<ir::Dim>{}}};
  g.nodes.push_back(graph_node("SplitToSequence", {"x"}, {"rows"}));
  g.nodes.back().attrs["keepdims"] = int64_t{0};
  g.nodes.push_back(graph_node("SequenceAt", {"rows", "at"}, {"row"}));
  g.nodes.back().name = "pick";
  g.nodes.push_back(graph_node("SequenceErase", {"rows"}, {"first_rows"}));
  g.nodes.push_back(graph_node("SequenceLength", {"first_rows"}, {"count"}));
  g.nodes.push_back(graph_node("ConcatFromSequence", {"first_rows"}, {"stacked"}));
  g.nodes.back().attrs["axis"] = int64_t{-1};
  g.nodes.back().attrs["new_axis"] = int64_t{1};
  g.outputs = {{"rows", DType::kFloat32, std::nullopt}, {"row", DType::kFloat32, std::nullopt},
               {"count", DType::kInt64, std::nullopt}, {"stacked", DType::kFloat32, std::nullopt}};
  g.sequence_values = {"rows"};
  runtime::Session s(g);
  const Tensor x = Tensor::from_vector<float>({3, 2}, {1, 2, 3, 4, 5, 6});
  auto out = s.run({{"x", x}, {"at", Tensor::scalar<int64_t>(-1)}});
  ASSERT_TRUE(out.at("rows").is_sequence());
  ASSERT_EQ(out.at("rows").elements().size(), 3u);
  EXPECT_EQ(out.at("rows").elements()[1].to_float_vector(), (std::vector<float>{3, 4}));
  EXPECT_EQ(out.at("row").to_float_vector(), (std::vector<float>{5, 6}));
  EXPECT_EQ(out.at("count").to_int64_vector(), (std::vector<int64_t>{2}));
  EXPECT_EQ(out.at("stacked").shape(), (Shape{2, 2}));
  EXPECT_EQ(out.at("stacked").to_float_vector(), (std::vector<float>{1, 3, 2, 4}));

  // The sequence back in: its length.
  ir::Graph h;
  h.opset = 16;
  h.inputs = {{"s", DType::kFloat32, std::nullopt}};
  h.sequence_values = {"s"};
  h.nodes.push_back(graph_node("SequenceLength", {"s"}, {"n"}));
  h.outputs = {{"n", DType::kInt64, std::nullopt}};
  runtime::Session length(h);
  EXPECT_EQ(length.run({{"s", out.at("rows")}}).at("n").to_int64_vector(), (std::vector<int64_t>{3}));
  try {
    length.run({{"s", x}});
    FAIL() << "a tensor was fed for a sequence";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("is a sequence of tensors"), std::string::npos) << e.what();
  }
}

TEST(LoopScan, SequenceAtOutOfRangeIsNamed) {
  ir::Graph g;
  g.opset = 16;
  g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{3, ""}, {2, ""}}}};
  g.initializers["seven"] = Tensor::scalar<int64_t>(7);
  g.nodes.push_back(graph_node("SplitToSequence", {"x"}, {"rows"}));
  g.nodes.push_back(graph_node("SequenceAt", {"rows", "seven"}, {"row"}));
  g.nodes.back().name = "pick";
  g.outputs = {{"row", DType::kFloat32, std::nullopt}};
  runtime::Session s(g);
  try {
    s.run({{"x", Tensor(DType::kFloat32, {3, 2})}});
    FAIL() << "SequenceAt read past the end";
  } catch (const Error& e) {
    const std::string msg = e.what();
    EXPECT_NE(msg.find("SequenceAt 'pick'"), std::string::npos) << msg;
    EXPECT_NE(msg.find("position 7 is out of range for a sequence of 3 elements"), std::string::npos) << msg;
  }
}

// SequenceEmpty, SequenceInsert at a position (front, negative, back), SequenceConstruct and the
// Optional ops on a sequence: the element order and the optional's presence.
TEST(LoopScan, SequenceInsertConstructAndOptionalSequences) {
  ir::Graph g;
  g.opset = 16;
  g.inputs = {{"a", DType::kFloat32, std::vector<ir::Dim>{{1, ""}}}, {"b", DType::kFloat32, std::vector<ir::Dim>{{1, ""}}}};
  g.initializers["front"] = Tensor::scalar<int64_t>(0);
  g.initializers["before_last"] = Tensor::scalar<int32_t>(-1);
  g.nodes.push_back(graph_node("SequenceEmpty", {}, {"empty"}));
  g.nodes.push_back(graph_node("SequenceInsert", {"empty", "a"}, {"s1"}));            // [a]
  g.nodes.push_back(graph_node("SequenceInsert", {"s1", "b", "front"}, {"s2"}));      // [b, a]
  g.nodes.push_back(graph_node("SequenceInsert", {"s2", "b", "before_last"}, {"s3"}));  // [b, b, a]
  g.nodes.push_back(graph_node("SequenceConstruct", {"a", "b"}, {"pair"}));           // [a, b]
  g.nodes.push_back(graph_node("ConcatFromSequence", {"s3"}, {"joined"}));
  g.nodes.back().attrs["axis"] = int64_t{0};
  g.nodes.push_back(graph_node("Optional", {"pair"}, {"maybe_pair"}));
  g.nodes.push_back(graph_node("OptionalHasElement", {"maybe_pair"}, {"has_pair"}));
  g.nodes.push_back(graph_node("OptionalGetElement", {"maybe_pair"}, {"pair_again"}));
  g.nodes.push_back(graph_node("SequenceLength", {"pair_again"}, {"pair_length"}));
  g.outputs = {{"joined", DType::kFloat32, std::nullopt}, {"has_pair", DType::kBool, std::nullopt},
               {"pair_length", DType::kInt64, std::nullopt}};
  runtime::Session s(g);
  const auto out = s.run({{"a", Tensor::from_vector<float>({1}, {1.f})}, {"b", Tensor::from_vector<float>({1}, {2.f})}});
  EXPECT_EQ(out.at("joined").to_float_vector(), (std::vector<float>{2, 2, 1}));
  EXPECT_EQ(out.at("has_pair").to_int64_vector(), (std::vector<int64_t>{1}));
  EXPECT_EQ(out.at("pair_length").to_int64_vector(), (std::vector<int64_t>{2}));
}

// Without a condition input the specification ignores the body's condition output; ONNX Runtime
// stops on it, and so do we (the body says stop after its first iteration: one of three).
TEST(LoopScan, BodyConditionEndsALoopWithoutAConditionInputAsInOnnxRuntime) {
  auto body = std::make_shared<ir::Graph>();
  body->opset = 16;
  body->inputs = {{"i", DType::kInt64, std::nullopt}, {"cond_in", DType::kBool, std::nullopt},
                  {"a_in", DType::kFloat32, std::nullopt}};
  body->nodes.push_back(graph_node("Not", {"cond_in"}, {"cond_out"}));
  body->nodes.push_back(graph_node("Add", {"a_in", "x"}, {"a_out"}));
  body->outputs = {{"cond_out", DType::kBool, std::nullopt}, {"a_out", DType::kFloat32, std::nullopt}};
  ir::Graph g;
  g.opset = 16;
  g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{3, ""}}}};
  g.initializers["m"] = Tensor::scalar<int64_t>(3);
  ir::Node loop = graph_node("Loop", {"m", "", "x", "x"}, {"y"});
  loop.captured = {"x"};
  loop.attrs["body"] = std::shared_ptr<const ir::Graph>(body);
  g.nodes.push_back(loop);
  g.outputs = {{"y", DType::kFloat32, std::nullopt}};
  runtime::Session s(g);
  EXPECT_EQ(s.run({{"x", Tensor::from_vector<float>({3}, {1, 2, 3})}}).at("y").to_float_vector(), (std::vector<float>{2, 4, 6}));
}

// SplitToSequence by a piece length (the last piece shorter) and by a list of lengths, joined again
// by ConcatFromSequence along the split axis: the input comes back.
TEST(LoopScan, SplitToSequenceByLengthsAndConcatFromSequenceRoundTrip) {
  for (const Tensor& split : {Tensor::scalar<int64_t>(2), Tensor::from_vector<int64_t>({3}, {1, 0, 4})}) {
    ir::Graph g;
    g.opset = 16;
    g.inputs = {{"x", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, {5, ""}}}};
    g.initializers["split"] = split;
    g.nodes.push_back(graph_node("SplitToSequence", {"x", "split"}, {"pieces"}));
    g.nodes.back().attrs["axis"] = int64_t{1};
    g.nodes.push_back(graph_node("SequenceLength", {"pieces"}, {"count"}));
    g.nodes.push_back(graph_node("ConcatFromSequence", {"pieces"}, {"joined"}));
    g.nodes.back().attrs["axis"] = int64_t{-1};
    g.outputs = {{"count", DType::kInt64, std::nullopt}, {"joined", DType::kFloat32, std::nullopt}};
    runtime::Session s(g);
    const Tensor x = Tensor::from_vector<float>({2, 5}, {0, 1, 2, 3, 4, 5, 6, 7, 8, 9});
    const auto out = s.run({{"x", x}});
    EXPECT_EQ(out.at("count").to_int64_vector(), (std::vector<int64_t>{3}));
    EXPECT_EQ(out.at("joined").shape(), x.shape());
    EXPECT_EQ(out.at("joined").to_float_vector(), x.to_float_vector());
  }
}
