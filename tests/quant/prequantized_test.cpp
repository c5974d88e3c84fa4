// Files already quantized are recognised by form, and a static QDQ file turns back into the float
// model it stands for.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>

#include "slimquant/core/npy.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/prequantized.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

namespace {

ir::Graph one_node_graph(const std::string& op, size_t inputs) {
  ir::Graph g;
  g.opset = 13;
  g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  ir::Node n;
  n.op_type = op;
  n.name = "n";
  n.inputs = std::vector<std::string>(inputs, g.inputs[0].name);
  n.outputs = {"y"};
  g.nodes.push_back(n);
  g.outputs.push_back({"y", DType::kFloat32, std::nullopt});
  return g;
}

TEST(Prequantized, EachFormIsNamedWithTheOpsThatTellIt) {
  EXPECT_EQ(quant::find_quantized_form(ir::load_onnx(test::fixture_model("resnet_small"))).form,
            quant::QuantizedForm::kNone);
  const auto ours = quant::find_quantized_form(ir::load_onnx(test::source_path("tests/fixtures/int8/resnet_small.int8.onnx")));
  EXPECT_EQ(ours.form, quant::QuantizedForm::kStaticQdq);
  EXPECT_EQ(ours.describe(), "static QDQ (31 DequantizeLinear, 14 QuantizeLinear)");
  const auto qop = quant::find_quantized_form(one_node_graph("QLinearConv", 8));
  EXPECT_EQ(qop.form, quant::QuantizedForm::kQOperator);
  EXPECT_EQ(qop.describe(), "QOperator (1 QLinearConv)");
  EXPECT_EQ(quant::find_quantized_form(one_node_graph("MatMulInteger", 2)).form, quant::QuantizedForm::kDynamic);
}

// Our own INT8 export of resnet_small, dequantized: no Q/DQ node is left, and it computes what the
// FP32 model computes within the weights' rounding (same top-1 on the fixture images).
TEST(Prequantized, StaticQdqFileDequantizesToItsFloatModel) {
  const ir::Graph qdq = ir::load_onnx(test::source_path("tests/fixtures/int8/resnet_small.int8.onnx"));
  const ir::Graph back = quant::dequantized_model(qdq);
  for (const auto& n : back.nodes) {
    EXPECT_NE(n.op_type, "QuantizeLinear") << n.describe();
    EXPECT_NE(n.op_type, "DequantizeLinear") << n.describe();
  }
  EXPECT_EQ(quant::find_quantized_form(back).form, quant::QuantizedForm::kNone);
  const Tensor input = read_npy(test::source_path("tests/fixtures/models/resnet_small.input.npy"));
  const Tensor pytorch = read_npy(test::source_path("tests/fixtures/models/resnet_small.logits.npy"));
  const Tensor got = runtime::Session(back).run({{"input", input}}).at("logits");
  const std::vector<float> a = got.to_float_vector(), b = pytorch.to_float_vector();
  float worst = 0, range = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    worst = std::max(worst, std::abs(a[i] - b[i]));
    range = std::max(range, std::abs(b[i]));
  }
  EXPECT_LT(worst, 0.1f * range) << "8-bit weights keep the logits close";
  EXPECT_GT(worst, 0.f) << "the weights are the rounded ones";
  for (int64_t r = 0; r < 8; ++r) {
    const auto row_a = a.begin() + r * 10, row_b = b.begin() + r * 10;
    EXPECT_EQ(std::max_element(row_a, row_a + 10) - row_a, std::max_element(row_b, row_b + 10) - row_b) << r;
  }
}

// x -> [producer] -> QuantizeLinear -> DequantizeLinear -> y, the activation pair of a static QDQ
// file, on an 8-bit grid of scale 0.1 with the given type and zero point.
ir::Graph activation_pair(DType code_type, int zero_point, const std::string& producer) {
  ir::Graph g;
  g.opset = 13;
  g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  std::string value = "x";
  if (!producer.empty()) {
    ir::Node p;
    p.op_type = producer;
    p.name = "p";
    p.inputs = {"x"};
    p.outputs = {"v"};
    g.nodes.push_back(p);
    value = "v";
  }
  g.initializers["s"] = Tensor::scalar(0.1f);
  g.initializers["z"] = code_type == DType::kUInt8 ? Tensor::scalar(static_cast<uint8_t>(zero_point))
                                                   : Tensor::scalar(static_cast<int8_t>(zero_point));
  ir::Node q, dq;
  q.op_type = "QuantizeLinear";
  q.name = "q";
  q.inputs = {value, "s", "z"};
  q.outputs = {"codes"};
  dq.op_type = "DequantizeLinear";
  dq.name = "dq";
  dq.inputs = {"codes", "s", "z"};
  dq.outputs = {"y_dq"};
  ir::Node out;  // a float reader of the pair
  out.op_type = "Identity";
  out.name = "out";
  out.inputs = {"y_dq"};
  out.outputs = {"y"};
  g.nodes.push_back(q);
  g.nodes.push_back(dq);
  g.nodes.push_back(out);
  g.outputs.push_back({"y", DType::kFloat32, std::nullopt});
  return g;
}

std::vector<float> run_dequantized(const ir::Graph& qdq, const std::vector<float>& x) {
  const ir::Graph back = quant::dequantized_model(qdq);
  for (const auto& n : back.nodes) EXPECT_TRUE(n.op_type != "QuantizeLinear" && n.op_type != "DequantizeLinear");
  runtime::SessionOptions o;
  o.optimize = false;  // keep Identity: the graph output is the rewired reader's
  return runtime::Session(back, o)
      .run({{"x", Tensor::from_vector<float>({static_cast<int64_t>(x.size())}, x)}})
      .at("y")
      .to_float_vector();
}

// ONNX Runtime's quantizer folds a Relu (or Clip) into the QuantizeLinear after it: a grid without
// negative values is then the model's activation, and the float model keeps it as a Clip to the
// grid. A grid with negative values only rounds: the pair goes. After an op that bounds its output
// already (our exports keep their Relu), nothing is added.
TEST(Prequantized, AGridWithoutNegativesIsKeptAsTheActivationItStandsFor) {
  const std::vector<float> x = {-1.f, 0.5f, 30.f};
  EXPECT_EQ(run_dequantized(activation_pair(DType::kUInt8, 0, ""), x), (std::vector<float>{0.f, 0.5f, 25.5f}));
  EXPECT_EQ(run_dequantized(activation_pair(DType::kInt8, 0, ""), x), x);
  EXPECT_EQ(run_dequantized(activation_pair(DType::kUInt8, 128, ""), x), x);
  const ir::Graph relu = quant::dequantized_model(activation_pair(DType::kUInt8, 0, "Relu"));
  EXPECT_EQ(std::count_if(relu.nodes.begin(), relu.nodes.end(), [](const ir::Node& n) { return n.op_type == "Clip"; }), 0);
  EXPECT_EQ(run_dequantized(activation_pair(DType::kUInt8, 0, "Relu"), x), (std::vector<float>{0.f, 0.5f, 30.f}));
}

}  // namespace
