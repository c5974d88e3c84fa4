// The rewrite framework (ir/rewrite.h): an index kept current by edits, rules run in order with
// counts, removals and insertions applied once in topological order.
#include "slimquant/ir/rewrite.h"

#include <gtest/gtest.h>

#include "graph_builder.h"

using namespace slimquant;

namespace {

// x -> Relu -> Relu -> ... (n nodes) -> graph output.
test::GraphBuilder relu_chain(int n) {
  test::GraphBuilder b;
  b.g.inputs.push_back({"x", DType::kFloat32, {}});
  std::string v = "x";
  for (int i = 0; i < n; ++i) v = b.node("Relu", {v});
  b.g.outputs.push_back({v, DType::kFloat32, {}});
  return b;
}

// Relu(Relu(v)) -> Relu(v): the inner Relu goes, its reader reads v.
struct DoubleRelu {
  int inner = -1, outer = -1;
};
ir::Rule drop_double_relu() {
  return ir::make_rule<DoubleRelu>(
      "drop_double_relu",
      [](const ir::Rewriter& rw, int i) -> std::optional<DoubleRelu> {
        if (!ir::is_onnx_op(rw.node(i), "Relu")) return std::nullopt;
        const int outer = rw.sole_reader_op(rw.node(i).outputs[0], "Relu");
        if (outer < 0) return std::nullopt;
        return DoubleRelu{i, outer};
      },
      [](ir::Rewriter& rw, const DoubleRelu& m) {
        ir::Node outer = rw.node(m.outer);
        outer.inputs[0] = rw.node(m.inner).inputs[0];
        rw.remove(m.inner);
        rw.replace(m.outer, std::move(outer));
      });
}

}  // namespace

TEST(GraphIndex, ProducersReadersAndSoleReaderRespectKeepAndOutputs) {
  test::GraphBuilder b;
  b.g.inputs.push_back({"x", DType::kFloat32, {}});
  const std::string r = b.node("Relu", {"x"});
  const std::string a = b.node("Add", {r, r});
  const std::string s = b.node("Sigmoid", {a});
  b.g.outputs.push_back({s, DType::kFloat32, {}});
  const ir::GraphIndex ix(b.g, {a});
  EXPECT_EQ(ix.producer(r), 0);
  EXPECT_EQ(ix.producer("x"), -1);
  EXPECT_EQ(ix.readers(r), std::vector<int>{1});
  EXPECT_EQ(ix.reads(r), 2);
  EXPECT_EQ(ix.sole_reader(r), 1);
  EXPECT_EQ(ix.sole_reader(r, /*read_once=*/true), -1);  // Add reads it twice
  EXPECT_EQ(ix.sole_reader(a), -1);                      // kept
  EXPECT_EQ(ix.sole_reader(s), -1);                      // graph output
  EXPECT_EQ(ix.sole_reader_op(r, "Add"), 1);
  EXPECT_EQ(ix.sole_reader_op(r, "Mul"), -1);
}

TEST(Rewrite, RuleCountsEachMatchAndKeepsTheIndexCurrent) {
  // Eight Relus in a chain: each match removes one and rewires the next, which the sweep then
  // visits and matches again through the updated index, so one sweep collapses the chain.
  test::GraphBuilder b = relu_chain(8);
  const ir::RuleCounts counts = ir::apply_rules(b.g, {drop_double_relu()});
  ASSERT_EQ(counts.size(), 1u);
  EXPECT_EQ(counts[0].rule, "drop_double_relu");
  EXPECT_EQ(counts[0].applied, 7);
  ASSERT_EQ(b.g.nodes.size(), 1u);
  EXPECT_EQ(b.g.nodes[0].inputs[0], "x");
  EXPECT_EQ(b.g.nodes[0].outputs[0], b.g.outputs[0].name);
  EXPECT_NO_THROW(b.g.validate());
}

TEST(Rewrite, UntilStableRunsTheListAgainWhileARuleFires) {
  // Sigmoid -> Relu rewriting makes a double Relu that the earlier rule in the list then removes.
  ir::Rule sigmoid_to_relu = ir::make_rule<int>(
      "sigmoid_to_relu",
      [](const ir::Rewriter& rw, int i) -> std::optional<int> {
        return ir::is_onnx_op(rw.node(i), "Sigmoid") ? std::optional<int>(i) : std::nullopt;
      },
      [](ir::Rewriter& rw, const int& i) {
        ir::Node n = rw.node(i);
        n.op_type = "Relu";
        rw.replace(i, std::move(n));
      });
  test::GraphBuilder once;
  once.g.inputs.push_back({"x", DType::kFloat32, {}});
  once.g.outputs.push_back({once.node("Sigmoid", {once.node("Relu", {"x"})}), DType::kFloat32, {}});
  test::GraphBuilder stable = once;
  const ir::RuleCounts one_pass = ir::apply_rules(once.g, {drop_double_relu(), sigmoid_to_relu});
  EXPECT_EQ(ir::count_of(one_pass, "drop_double_relu"), 0);
  EXPECT_EQ(ir::count_of(one_pass, "sigmoid_to_relu"), 1);
  EXPECT_EQ(once.g.nodes.size(), 2u);
  const ir::RuleCounts until_stable = ir::apply_rules(stable.g, {drop_double_relu(), sigmoid_to_relu}, {}, true);
  EXPECT_EQ(ir::count_of(until_stable, "drop_double_relu"), 1);
  EXPECT_EQ(ir::total(until_stable), 2);
  ASSERT_EQ(stable.g.nodes.size(), 1u);
  EXPECT_NO_THROW(stable.g.validate());
}

TEST(Rewrite, KeptValuesAreNotFusedAway) {
  test::GraphBuilder b = relu_chain(2);
  const std::string middle = b.g.nodes[0].outputs[0];
  EXPECT_EQ(ir::total(ir::apply_rules(b.g, {drop_double_relu()}, {middle})), 0);
  EXPECT_EQ(b.g.nodes.size(), 2u);
}

TEST(Rewriter, InsertedNodesLandBeforeTheirAnchorInTopologicalOrder) {
  test::GraphBuilder b = relu_chain(2);
  ir::Rewriter rw(b.g);
  // Sigmoid(x) inserted before the second Relu, which then reads it: valid only if placed before.
  ir::Node sig;
  sig.op_type = "Sigmoid";
  sig.inputs = {"x"};
  sig.outputs = {"s"};
  const int id = rw.insert_before(1, sig);
  ir::Node second = rw.node(1);
  second.inputs = {"s"};
  rw.replace(1, second);
  EXPECT_EQ(rw.producer("s"), id);
  EXPECT_EQ(rw.readers("s"), std::vector<int>{1});
  rw.remove(0);  // the first Relu has no reader any more
  EXPECT_EQ(rw.producer(b.g.nodes[0].outputs[0]), -1);
  rw.compact();
  ASSERT_EQ(b.g.nodes.size(), 2u);
  EXPECT_EQ(b.g.nodes[0].op_type, "Sigmoid");
  EXPECT_EQ(b.g.nodes[1].inputs[0], "s");
  EXPECT_NO_THROW(b.g.validate());
  EXPECT_EQ(rw.producer("s"), 0);  // re-indexed after compaction
}

TEST(Rewriter, RenameValueUpdatesProducerAndReaders) {
  test::GraphBuilder b = relu_chain(2);
  const std::string v = b.g.nodes[0].outputs[0];
  ir::Rewriter rw(b.g);
  rw.rename_value(v, "renamed");
  EXPECT_EQ(rw.producer("renamed"), 0);
  EXPECT_EQ(rw.readers("renamed"), std::vector<int>{1});
  EXPECT_EQ(rw.producer(v), -1);
  EXPECT_TRUE(rw.readers(v).empty());
  EXPECT_EQ(b.g.nodes[1].inputs[0], "renamed");
}

TEST(Rewrite, MatchHelpersReadConstants) {
  test::GraphBuilder b;
  const std::string k = b.constant(Tensor::scalar<float>(0.5f));
  const std::string per_channel = b.constant(Tensor::from_vector<float>({1, 3, 1, 1}, {1.f, 2.f, 3.f}));
  EXPECT_EQ(ir::scalar_constant(b.g, k), 0.5f);
  EXPECT_FALSE(ir::scalar_constant(b.g, per_channel));
  EXPECT_TRUE(ir::is_scalar_close_to(b.g, k, 0.50001f, 1e-4f));
  EXPECT_FALSE(ir::is_scalar_close_to(b.g, k, 0.6f, 1e-4f));
  EXPECT_EQ(ir::per_channel_constant(b.g, per_channel, 3, 4), (std::vector<float>{1.f, 2.f, 3.f}));
  EXPECT_EQ(ir::per_channel_constant(b.g, k, 2, 4), (std::vector<float>{0.5f, 0.5f}));
  EXPECT_FALSE(ir::per_channel_constant(b.g, per_channel, 4, 4));
}

TEST(Rewrite, FinishRunsOnceAfterASweepThatFiredOnTheCompactedGraph) {
  ir::Rule rule = drop_double_relu();
  int finished = 0;
  size_t nodes_seen = 0;
  rule.finish = [&](ir::Graph& g) {
    ++finished;
    nodes_seen = g.nodes.size();  // removed nodes are gone by then
  };
  test::GraphBuilder chain = relu_chain(4);
  EXPECT_EQ(ir::total(ir::apply_rules(chain.g, {rule})), 3);
  EXPECT_EQ(finished, 1);
  EXPECT_EQ(nodes_seen, 1u);
  test::GraphBuilder single = relu_chain(1);  // nothing to match: no finish
  EXPECT_EQ(ir::total(ir::apply_rules(single.g, {rule})), 0);
  EXPECT_EQ(finished, 1);
}
