// LayerStages: which nodes of a layer's model run from the values at hand, what they leave for the
// later stages, and which held values they let go.
#include "analysis/layer_stages.h"

#include <gtest/gtest.h>

#include <set>

using namespace slimquant;

namespace {

ir::Node node(std::string op, std::vector<std::string> in, std::vector<std::string> out) {
  ir::Node n;
  n.op_type = std::move(op);
  n.name = out.at(0) + "_node";
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

std::function<bool(const std::string&)> these(std::set<std::string> values) {
  return [values](const std::string& v) { return values.count(v) != 0; };
}

// A decoder-like model: `early` feeds a chain whose result meets the late `side` at the end, and a
// node upstream of the feeds that a run fed them never computes.
ir::Graph decoder_like() {
  ir::Graph g;
  g.nodes.push_back(node("Relu", {"input"}, {"early"}));  // upstream of the feed: not run
  g.nodes.push_back(node("Relu", {"early"}, {"x"}));
  g.nodes.push_back(node("Mul", {"x", "w"}, {"y"}));
  g.nodes.push_back(node("Concat", {"y", "side", "skip"}, {"z"}));
  g.nodes.push_back(node("Relu", {"z"}, {"out"}));
  Tensor w(DType::kFloat32, Shape{1});
  g.initializers["w"] = w;
  return g;
}

TEST(LayerStages, EarlyStageKeepsOnlyWhatTheLaterNodesRead) {
  const ir::Graph g = decoder_like();
  analysis::LayerStages stages(g, {"early", "side", "skip"}, "out");
  EXPECT_FALSE(stages.next(these({})).has_value());        // nothing at hand
  EXPECT_FALSE(stages.next(these({"side"})).has_value());  // the late value alone runs nothing

  const auto at_hand = these({"early", "skip"});
  const auto early = stages.next(at_hand);
  ASSERT_TRUE(early.has_value());
  EXPECT_FALSE(early->final);
  EXPECT_EQ(early->inputs, std::vector<std::string>{"early"});   // the initializer is not fed
  EXPECT_EQ(early->outputs, std::vector<std::string>{"y"});      // x is read by no later node
  EXPECT_EQ(early->released, std::vector<std::string>{"early"});  // skip waits for the Concat
  EXPECT_FALSE(stages.started());
  stages.commit(*early);
  EXPECT_TRUE(stages.started());

  // Nothing more until the late value arrives; then the rest, to the output.
  EXPECT_FALSE(stages.next(these({"y", "skip"})).has_value());
  const auto last = stages.next(these({"y", "skip", "side"}));
  ASSERT_TRUE(last.has_value());
  EXPECT_TRUE(last->final);
  EXPECT_EQ(last->inputs, (std::vector<std::string>{"side", "skip", "y"}));
  EXPECT_EQ(last->outputs, std::vector<std::string>{"out"});
  EXPECT_EQ(last->released, (std::vector<std::string>{"side", "skip", "y"}));
  stages.commit(*last);
  EXPECT_FALSE(stages.next(these({"y", "skip", "side"})).has_value());  // every node ran

  // A new batch starts over.
  stages.reset();
  EXPECT_FALSE(stages.started());
  const auto whole = stages.next(these({"early", "side", "skip"}));
  ASSERT_TRUE(whole.has_value());
  EXPECT_TRUE(whole->final);
  EXPECT_EQ(whole->inputs, (std::vector<std::string>{"early", "side", "skip"}));
}

TEST(LayerStages, AFedOutputHasNoStage) {
  // A model whose output is itself fed runs no node: the caller returns the fed value.
  const ir::Graph g = decoder_like();
  analysis::LayerStages stages(g, {"out"}, "out");
  EXPECT_FALSE(stages.next(these({"out"})).has_value());
}

}  // namespace
