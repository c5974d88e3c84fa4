// Files already quantized are recognised by form, a static QDQ file turns back into the float model
// it stands for, and ONNX Runtime's quantized LSTM runs as the LSTM on its dequantized weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <random>

#include "slimquant/core/npy.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/prequantized.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/runtime/session.h"
#include "e2e/onnx_runtime_peer.h"
#include "graph_builder.h"
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

// ONNX Runtime's quantize_dynamic writes an LSTM as com.microsoft DynamicQuantizeLSTM: W and R as
// codes transposed to [dirs, in, 4 * hidden], a scale and zero point per direction or per gate
// row. It runs as the LSTM on (code - zero point) * scale, computed here directly in LSTM's own
// layout: bit for bit, bidirectional, for both forms of scale (ORT wants the same form for W and
// R and one zero point value throughout). ONNX Runtime (which also quantizes X and H per step)
// agrees within that rounding; the file is recognised as dynamic, and our own quantizer leaves a
// float LSTM float, saying so.
TEST(Prequantized, OnnxRuntimesDynamicQuantizeLstmRunsAsTheLstmOnItsDequantizedWeights) {
  constexpr int64_t kSeq = 5, kBatch = 2, kIn = 6, kHidden = 4, kDirs = 2, kRows = 4 * kHidden;
  std::mt19937 rng(7);
  test::TempDir tmp("dq_lstm");
  const Tensor bias = test::random_tensor({kDirs, 2 * kRows}, rng, -0.3f, 0.3f);
  const Tensor x = test::random_tensor({kSeq, kBatch, kIn}, rng);
  for (const bool per_row : {true, false}) {
    SCOPED_TRACE(per_row ? "scales per gate row" : "scales per direction");
    const Shape param_shape = per_row ? Shape{kDirs, kRows} : Shape{kDirs};
    // Codes in DynamicQuantizeLSTM's layout [dirs, k, rows] and the floats they stand for in LSTM's [dirs, rows, k].
    auto codes_and_floats = [&](int64_t k, const Tensor& scale, uint8_t zero_point) {
      Tensor codes(DType::kUInt8, {kDirs, k, kRows});
      Tensor floats(DType::kFloat32, {kDirs, kRows, k});
      std::uniform_int_distribution<int> code(0, 255);
      for (int64_t d = 0; d < kDirs; ++d)
        for (int64_t i = 0; i < k; ++i)
          for (int64_t row = 0; row < kRows; ++row) {
            const int c = code(rng);
            codes.data<uint8_t>()[(d * k + i) * kRows + row] = static_cast<uint8_t>(c);
            floats.data<float>()[(d * kRows + row) * k + i] =
                static_cast<float>(c - zero_point) * scale.data<float>()[per_row ? d * kRows + row : d];
          }
      return std::pair(codes, floats);
    };
    const Tensor w_scale = test::random_tensor(param_shape, rng, 0.002f, 0.004f);
    const Tensor r_scale = test::random_tensor(param_shape, rng, 0.002f, 0.004f);
    Tensor w_zero(DType::kUInt8, param_shape), r_zero(DType::kUInt8, param_shape);
    std::fill_n(w_zero.data<uint8_t>(), w_zero.numel(), uint8_t{128});
    std::fill_n(r_zero.data<uint8_t>(), r_zero.numel(), uint8_t{120});
    const auto [w_codes, w_float] = codes_and_floats(kIn, w_scale, 128);
    const auto [r_codes, r_float] = codes_and_floats(kHidden, r_scale, 120);

    auto lstm_graph = [&](bool quantized) {
      test::GraphBuilder b;
      b.g.opset = 14;
      b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{kSeq, ""}, {kBatch, ""}, {kIn, ""}}});
      ir::Node n;
      n.name = "lstm";
      n.attrs["hidden_size"] = kHidden;
      n.attrs["direction"] = std::string("bidirectional");
      n.outputs = {"y", "logits"};  // Y_h, named as the ORT helper reads it
      if (quantized) {
        n.domain = "com.microsoft";
        n.op_type = "DynamicQuantizeLSTM";
        n.inputs = {"x", b.constant(w_codes), b.constant(r_codes), b.constant(bias), "", "", "", "",
                    b.constant(w_scale), b.constant(w_zero), b.constant(r_scale), b.constant(r_zero)};
        b.g.extra_opsets["com.microsoft"] = 1;
      } else {
        n.op_type = "LSTM";
        n.inputs = {"x", b.constant(w_float), b.constant(r_float), b.constant(bias)};
      }
      b.g.nodes.push_back(n);
      b.g.outputs.push_back({"logits", DType::kFloat32, std::vector<ir::Dim>{{kDirs, ""}, {kBatch, ""}, {kHidden, ""}}});
      return b.g;
    };
    const ir::Graph quantized = lstm_graph(true);
    const auto form = quant::find_quantized_form(quantized);
    EXPECT_EQ(form.form, quant::QuantizedForm::kDynamic);
    EXPECT_EQ(form.describe(), "dynamic (1 DynamicQuantizeLSTM)");

    const Tensor ours = runtime::Session(quantized).run({{"x", x}}).at("logits");
    const Tensor reference = runtime::Session(lstm_graph(false)).run({{"x", x}}).at("logits");
    ASSERT_EQ(ours.shape(), reference.shape());
    EXPECT_EQ(ours.to_float_vector(), reference.to_float_vector());
    if (per_row) {  // our own quantizers leave recurrent layers float, and say so
      quant::PTQ ptq{quant::QuantConfig{}};
      ptq.quantize(lstm_graph(false));
      const auto& warnings = ptq.warnings();
      EXPECT_NE(std::find(warnings.begin(), warnings.end(),
                          "1 recurrent layers stay float (LSTM 'lstm'): ONNX has no integer LSTM, GRU or RNN that "
                          "runs everywhere"),
                warnings.end())
          << testing::PrintToString(warnings);
    }

    if (!test::have_onnx_runtime()) continue;
    const std::string dir = tmp.path(per_row ? "per_row" : "per_direction");
    std::filesystem::create_directories(dir);
    const std::string model = dir + "/dq_lstm.onnx", input = dir + "/x.npy";
    ir::save_onnx(quantized, model);
    write_npy(input, x);
    float range = 0;
    for (float v : ours.to_float_vector()) range = std::max(range, std::abs(v));
    for (const char* package : {"onnxruntime-node", "onnxruntime-node-latest"}) {
      const Tensor ort = test::onnx_runtime_logits(package, model, input, dir + "/ort_" + package);
      ASSERT_EQ(ort.numel(), ours.numel()) << package;
      float worst = 0;
      for (int64_t i = 0; i < ours.numel(); ++i)
        worst = std::max(worst, std::abs(ort.data<float>()[i] - ours.data<float>()[i]));
      std::cout << package << (per_row ? ", per row" : ", per direction") << ": worst |ours - ORT| " << worst
                << " of range " << range << std::endl;
      EXPECT_LT(worst, 0.02f * range) << package;  // measured 0.2-0.3%
    }
  }
}

}  // namespace
