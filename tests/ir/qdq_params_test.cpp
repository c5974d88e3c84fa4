// ir::read_qdq_params: a QuantizeLinear / DequantizeLinear node's parameters from its graph, and the
// reasons (naming the node) when they cannot be read.
#include "slimquant/ir/qdq_params.h"

#include <gtest/gtest.h>

#include <cmath>
#include <optional>
#include <string>

using namespace slimquant;

namespace {

// x [1, 3, 4, 4] -> op (x, s [, z]) -> y, with the given constants.
ir::Graph qdq_graph(const std::string& op, Tensor scale, std::optional<Tensor> zero_point, DType x_type = DType::kFloat32) {
  ir::Graph g;
  g.inputs.push_back({"x", x_type, std::vector<ir::Dim>{{1, ""}, {3, ""}, {4, ""}, {4, ""}}});
  g.outputs.push_back({"y", DType::kUndefined, std::nullopt});
  g.initializers["s"] = std::move(scale);
  ir::Node n;
  n.op_type = op;
  n.name = "q0";
  n.inputs = {"x", "s"};
  if (zero_point) {
    g.initializers["z"] = std::move(*zero_point);
    n.inputs.push_back("z");
  }
  n.outputs = {"y"};
  g.nodes.push_back(n);
  return g;
}

std::string reason(const ir::Graph& g, ir::QdqInputFacts facts = {}) {
  QuantParam p;
  const auto why = ir::read_qdq_params(g, g.nodes[0], p, facts);
  return why ? *why : "";
}

}  // namespace

TEST(ReadQdqParams, PerTensorWithZeroPoint) {
  const ir::Graph g = qdq_graph("QuantizeLinear", Tensor::scalar<float>(0.5f), Tensor::scalar<int8_t>(-3));
  const QuantParam p = ir::qdq_params(g, g.nodes[0]);
  EXPECT_EQ(p.dtype, DType::kInt8);
  EXPECT_EQ(p.scale, std::vector<float>{0.5f});
  EXPECT_EQ(p.zero_point, std::vector<int32_t>{-3});
  EXPECT_TRUE(p.per_tensor());
  EXPECT_EQ(p.axis, QuantParam::kPerTensor);
}

TEST(ReadQdqParams, DefaultsWithoutZeroPoint) {
  // QuantizeLinear: uint8 (or output_dtype); DequantizeLinear: its input's type.
  ir::Graph q = qdq_graph("QuantizeLinear", Tensor::scalar<float>(0.1f), std::nullopt);
  EXPECT_EQ(ir::qdq_params(q, q.nodes[0]).dtype, DType::kUInt8);
  EXPECT_EQ(ir::qdq_params(q, q.nodes[0]).zero_point, std::vector<int32_t>{0});
  q.nodes[0].attrs["output_dtype"] = int64_t{3};
  EXPECT_EQ(ir::qdq_params(q, q.nodes[0]).dtype, DType::kInt8);
  const ir::Graph dq = qdq_graph("DequantizeLinear", Tensor::scalar<float>(0.1f), std::nullopt, DType::kInt8);
  EXPECT_EQ(ir::qdq_params(dq, dq.nodes[0]).dtype, DType::kInt8);
  // Facts from the caller win over the graph.
  QuantParam p;
  EXPECT_FALSE(ir::read_qdq_params(dq, dq.nodes[0], p, {DType::kUInt8, -1}));
  EXPECT_EQ(p.dtype, DType::kUInt8);
}

TEST(ReadQdqParams, PerChannelAxisNormalised) {
  ir::Graph g = qdq_graph("QuantizeLinear", Tensor::from_vector<float>({3}, {0.1f, 0.2f, 0.4f}),
                          Tensor::from_vector<uint8_t>({3}, {1, 2, 3}));
  QuantParam p = ir::qdq_params(g, g.nodes[0]);  // axis defaults to 1
  EXPECT_EQ(p.axis, 1);
  EXPECT_FALSE(p.per_tensor());
  EXPECT_EQ(p.scale, (std::vector<float>{0.1f, 0.2f, 0.4f}));
  EXPECT_EQ(p.zero_point, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(p.dtype, DType::kUInt8);
  g.nodes[0].attrs["axis"] = int64_t{-3};  // rank 4: axis 1
  EXPECT_EQ(ir::qdq_params(g, g.nodes[0]).axis, 1);
  // A one-element 1-D scale is per tensor whatever the axis.
  ir::Graph one = qdq_graph("QuantizeLinear", Tensor::from_vector<float>({1}, {0.1f}), std::nullopt);
  one.nodes[0].attrs["axis"] = int64_t{7};
  EXPECT_TRUE(ir::qdq_params(one, one.nodes[0]).per_tensor());
}

TEST(ReadQdqParams, ReasonsNameTheNode) {
  const std::string who = "QuantizeLinear 'q0'";
  // Scale: not a constant, not float32, rank 2, not positive / finite.
  ir::Graph g = qdq_graph("QuantizeLinear", Tensor::scalar<float>(1.f), std::nullopt);
  g.initializers.erase("s");
  EXPECT_EQ(reason(g), "the scale of " + who + " is not a float32 constant");
  g = qdq_graph("QuantizeLinear", Tensor::scalar<double>(1.0), std::nullopt);
  EXPECT_EQ(reason(g), "the scale of " + who + " is not a float32 constant");
  g = qdq_graph("QuantizeLinear", Tensor::from_vector<float>({1, 1}, {1.f}), std::nullopt);
  EXPECT_EQ(reason(g), "the scale of " + who + " has shape [1x1]");
  g = qdq_graph("QuantizeLinear", Tensor::scalar<float>(0.f), std::nullopt);
  EXPECT_EQ(reason(g), who + " has a scale that is not positive and finite");
  g = qdq_graph("QuantizeLinear", Tensor::scalar<float>(INFINITY), std::nullopt);
  EXPECT_EQ(reason(g), who + " has a scale that is not positive and finite");
  // Zero point: not a constant, wrong length.
  g = qdq_graph("QuantizeLinear", Tensor::scalar<float>(1.f), Tensor::scalar<uint8_t>(0));
  g.initializers.erase("z");
  EXPECT_EQ(reason(g), "the zero point of " + who + " is not a constant");
  g = qdq_graph("QuantizeLinear", Tensor::from_vector<float>({3}, {1.f, 1.f, 1.f}),
                Tensor::from_vector<uint8_t>({2}, {0, 0}));
  EXPECT_EQ(reason(g), "the zero point of " + who + " has 2 values for 3 scales");
  // Axis out of range, or the rank unknown.
  g = qdq_graph("QuantizeLinear", Tensor::from_vector<float>({3}, {1.f, 1.f, 1.f}), std::nullopt);
  g.nodes[0].attrs["axis"] = int64_t{4};
  EXPECT_EQ(reason(g), who + " has axis 4 for rank 4");
  g.nodes[0].attrs["axis"] = int64_t{-5};
  EXPECT_EQ(reason(g), who + " has axis -5 for rank 4");
  EXPECT_EQ(reason(g, {DType::kUndefined, 6}), "");  // the caller knows the rank better
  g.inputs[0].dims.reset();
  g.nodes[0].attrs["axis"] = int64_t{1};
  EXPECT_EQ(reason(g), "the rank of " + who + "'s input is unknown");
  // DequantizeLinear without a zero point on an input of unknown type.
  g = qdq_graph("DequantizeLinear", Tensor::scalar<float>(1.f), std::nullopt, DType::kUndefined);
  EXPECT_EQ(reason(g), "the integer type of DequantizeLinear 'q0''s input is unknown");
  // Not a Q / DQ node.
  g.nodes[0].op_type = "Relu";
  EXPECT_EQ(reason(g), "Relu 'q0' is not a QuantizeLinear or DequantizeLinear");
  // The throwing form: kInvalidModel with the same reason.
  g = qdq_graph("QuantizeLinear", Tensor::scalar<float>(-1.f), std::nullopt);
  try {
    ir::qdq_params(g, g.nodes[0]);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find(who + " has a scale that is not positive and finite"), std::string::npos);
  }
}
