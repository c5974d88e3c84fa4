// deploy_backend: the form of the exported QDQ graph for each runtime, checked structurally (the
// rules each runtime fuses by), and the accuracy guarantee kept whatever the form.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>
#include <set>

#include "quant/int8_test_util.h"
#include "quant/qdq_export.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/quant_config.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;

namespace {

quant::QuantConfig config_for(quant::DeployBackend backend) {
  quant::QuantConfig c;
  c.deploy_backend = backend;
  return c;
}

bool is_q(const ir::Node& n) { return n.op_type == "QuantizeLinear"; }
bool is_dq(const ir::Node& n) { return n.op_type == "DequantizeLinear"; }
bool weighted(const ir::Node& n) {
  return n.op_type == "Conv" || n.op_type == "ConvTranspose" || n.op_type == "Gemm" || n.op_type == "MatMul";
}
// The node producing v is a DequantizeLinear.
bool dequantized(const ir::Graph& g, const std::string& v) {
  const int p = g.producer(v);
  return p >= 0 && is_dq(g.nodes[static_cast<size_t>(p)]);
}

double top1(const ir::Graph& qdq, size_t limit) {
  data::DataOptions o;
  o.spec = "fashion-mnist:test";
  o.limit = limit;
  auto test_set = data::open_dataset(o);
  runtime::Session session(qdq);
  return analysis::evaluate(session, *test_set, *analysis::make_metric("top1")).value;
}

TEST(DeployBackend, NamesParseAndBadNamesAreRefusedNamingTheChoices) {
  EXPECT_EQ(quant::parse_deploy_backend("onnxruntime"), quant::DeployBackend::kOnnxRuntime);
  EXPECT_EQ(quant::parse_deploy_backend("tensorrt"), quant::DeployBackend::kTensorRT);
  EXPECT_EQ(quant::parse_deploy_backend("slimquant"), quant::DeployBackend::kSlimquant);
  try {
    quant::parse_deploy_backend("openvino");
    ADD_FAILURE() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("slimquant, onnxruntime or tensorrt"), std::string::npos) << e.what();
  }
  test::TempDir tmp("deploy_yaml");
  std::ofstream(tmp.path("c.yaml")) << "deploy_backend: tensorrt\n";
  EXPECT_EQ(quant::load_quant_config_yaml(tmp.path("c.yaml")).deploy_backend, quant::DeployBackend::kTensorRT);
  EXPECT_NE(quant::QuantConfig(config_for(quant::DeployBackend::kTensorRT)).fingerprint(),
            quant::QuantConfig().fingerprint());
}

// ONNX Runtime's form: asymmetric u8 activations with stated zero points, int8 weights with stated
// zero points, int32 biases, no Relu left where a QuantizeLinear can clip instead, residual Adds and
// pooling between Q/DQ pairs (QLinearAdd, QLinearGlobalAveragePool).
TEST(DeployBackend, OnnxRuntimeFormOnResnet) {
  const ir::Graph g = test::calibrated_qdq("resnet_small", 320, config_for(quant::DeployBackend::kOnnxRuntime));
  EXPECT_EQ(g.metadata.at("slimquant.deploy_backend"), "onnxruntime");
  int relus = 0, adds = 0, int32_biases = 0, convs = 0;
  for (const auto& n : g.nodes) {
    if (n.op_type == "Relu") ++relus;
    if (is_q(n)) {
      ASSERT_EQ(n.inputs.size(), 3u) << n.describe();
      EXPECT_EQ(g.initializer(n.inputs[2])->dtype(), DType::kUInt8) << n.describe();
    }
    if (is_dq(n) && g.initializer(n.inputs[0]) && g.initializer(n.inputs[0])->dtype() == DType::kInt8) {
      ASSERT_EQ(n.inputs.size(), 3u) << n.describe();  // weight zero points stated
      EXPECT_EQ(g.initializer(n.inputs[2])->numel(), g.initializer(n.inputs[1])->numel()) << n.describe();
    }
    if (n.op_type == "Conv") {
      ++convs;
      EXPECT_TRUE(dequantized(g, n.inputs[0]) && dequantized(g, n.inputs[1])) << n.describe();
      if (n.inputs.size() > 2 && dequantized(g, n.inputs[2])) {
        const ir::Node& bias_dq = g.nodes[static_cast<size_t>(g.producer(n.inputs[2]))];
        EXPECT_EQ(g.initializer(bias_dq.inputs[0])->dtype(), DType::kInt32);
        ++int32_biases;
      }
    }
    if (n.op_type == "Add" || n.op_type == "GlobalAveragePool") {
      adds += n.op_type == "Add";
      for (const auto& in : n.inputs) EXPECT_TRUE(dequantized(g, in)) << n.describe() << " input " << in;
      for (int c : g.consumers(n.outputs[0])) {
        const ir::Node& reader = g.nodes[static_cast<size_t>(c)];
        if (reader.op_type != "Shape") {
          EXPECT_TRUE(is_q(reader)) << n.describe() << " feeds " << reader.describe();
        }
      }
    }
  }
  EXPECT_EQ(relus, 0);  // every Relu folded into the QuantizeLinear that follows it
  EXPECT_GT(adds, 0);
  EXPECT_EQ(int32_biases, convs);
  // The accuracy guarantee holds in this form too (FP32 0.9145 on these 2000 images).
  EXPECT_GT(top1(g, 2000), 0.905);
}

// Quantized Softmax outputs use ORT's fixed grid (1/256, u8, zero point 0): its fused
// QLinearSoftmax returns zeros for smaller calibrated scales.
TEST(DeployBackend, SoftmaxOutputsGetTheFixedProbabilityGrid) {
  const ir::Graph g = test::calibrated_qdq("vit_small", 64, config_for(quant::DeployBackend::kOnnxRuntime));
  int softmax_outputs = 0;
  for (const auto& n : g.nodes) {
    if (n.op_type != "Softmax") continue;
    for (int c : g.consumers(n.outputs[0])) {
      const ir::Node& q = g.nodes[static_cast<size_t>(c)];
      if (!is_q(q)) continue;
      ++softmax_outputs;
      EXPECT_EQ(g.initializer(q.inputs[1])->data<float>()[0], 1.f / 256.f) << q.describe();
      EXPECT_EQ(g.initializer(q.inputs[2])->dtype(), DType::kUInt8) << q.describe();
      EXPECT_EQ(g.initializer(q.inputs[2])->data<uint8_t>()[0], 0) << q.describe();
    }
  }
  EXPECT_GT(softmax_outputs, 0);
}

// Folding a Relu / Clip into the QuantizeLinear changes no value, and is refused where the grid
// does not clip at the activation's bounds.
TEST(DeployBackend, FoldingAnActivationIntoQuantizeIsExactAndOnlyWhereTheGridClips) {
  auto build = [](const std::string& act, uint8_t zero_point, float scale) {
    ir::Graph g;
    g.opset = 13;
    g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{1, ""}, {64, ""}}});
    g.outputs.push_back({"y", DType::kFloat32, std::nullopt});
    g.initializers["one"] = Tensor::scalar<float>(1.f);
    g.initializers["lo"] = Tensor::scalar<float>(0.f);
    g.initializers["hi"] = Tensor::scalar<float>(6.f);
    g.initializers["s"] = Tensor::scalar<float>(scale);
    g.initializers["z"] = Tensor::scalar<uint8_t>(zero_point);
    auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
      ir::Node n;
      n.op_type = op;
      n.inputs = std::move(in);
      n.outputs = {out};
      n.name = out + "_node";
      g.nodes.push_back(n);
    };
    node("Mul", {"x", "one"}, "m");
    if (act == "Relu") node("Relu", {"m"}, "r");
    else node("Clip", {"m", "lo", "hi"}, "r");
    node("QuantizeLinear", {"r", "s", "z"}, "q");
    node("DequantizeLinear", {"q", "s", "z"}, "y");
    return g;
  };
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> dist(-9.f, 9.f);
  std::vector<float> xs(64);
  for (float& v : xs) v = dist(rng);
  xs[0] = 6.f, xs[1] = 0.f, xs[2] = -0.f, xs[3] = 6.01f;
  const Tensor x = Tensor::from_vector<float>({1, 64}, xs);
  struct Case {
    std::string act;
    uint8_t zp;
    float scale;
    bool folds;
  };
  for (const Case& c : {Case{"Relu", 0, 0.03f, true}, Case{"Relu", 3, 0.03f, false}, Case{"Clip", 0, 6.f / 255, true},
                        Case{"Clip", 0, 7.f / 255, false}, Case{"Clip", 10, 6.f / 255, false}}) {
    const ir::Graph original = build(c.act, c.zp, c.scale);
    ir::Graph folded = original;
    EXPECT_EQ(quant::fold_activations_into_quantize(folded), c.folds ? 1 : 0) << c.act << " zp " << int(c.zp);
    runtime::Session a(original), b(folded);
    const auto ya = a.run({{"x", x}}).at("y").to_float_vector();
    const auto yb = b.run({{"x", x}}).at("y").to_float_vector();
    EXPECT_EQ(ya, yb) << c.act;
  }
}

// NVIDIA's explicit-quantization placement: symmetric int8 everywhere; Q/DQ on both inputs of every
// weighted op; an Add fed directly by a weighted op reads that output unquantized (TensorRT fuses
// the Add into it) and its other, residual input through Q/DQ; Q/DQ feed only ops TensorRT fuses
// with them; no requantization chains.
void expect_tensorrt_rules(const ir::Graph& g) {
  const std::set<std::string> fusable = {"Conv", "ConvTranspose", "Gemm", "MatMul", "Add",
                                         "MaxPool", "AveragePool", "GlobalAveragePool"};
  int weighted_ops = 0, residual_adds = 0;
  for (const auto& n : g.nodes) {
    if (is_q(n) || is_dq(n)) {
      const Tensor* scale = g.initializer(n.inputs[1]);
      ASSERT_TRUE(scale);
      for (float s : scale->to_float_vector()) EXPECT_GT(s, 0.f) << n.describe();
      ASSERT_EQ(n.inputs.size(), 3u) << n.describe() << ": zero point not stated";
      const Tensor* zp = g.initializer(n.inputs[2]);
      ASSERT_TRUE(zp) << n.describe();
      if (is_dq(n) && g.initializer(n.inputs[0]) && g.initializer(n.inputs[0])->dtype() == DType::kInt32) continue;
      EXPECT_EQ(zp->dtype(), DType::kInt8) << n.describe();
      for (int64_t v : zp->to_int64_vector()) EXPECT_EQ(v, 0) << n.describe();
    }
    if (is_q(n)) {
      for (int c : g.consumers(n.outputs[0])) EXPECT_TRUE(is_dq(g.nodes[static_cast<size_t>(c)])) << n.describe();
    }
    if (is_dq(n)) {
      EXPECT_FALSE(dequantized(g, n.inputs[0]));
      for (int c : g.consumers(n.outputs[0])) {
        const ir::Node& reader = g.nodes[static_cast<size_t>(c)];
        EXPECT_TRUE(fusable.count(reader.op_type)) << n.describe() << " feeds " << reader.describe();
        EXPECT_FALSE(is_q(reader)) << n.describe() << " is requantized";
      }
    }
    if (weighted(n) && g.initializer(n.inputs[1]) == nullptr && dequantized(g, n.inputs[1])) {
      ++weighted_ops;
      EXPECT_TRUE(dequantized(g, n.inputs[0])) << n.describe();
      const ir::Node& wdq = g.nodes[static_cast<size_t>(g.producer(n.inputs[1]))];
      const Tensor* w = g.initializer(wdq.inputs[0]);
      ASSERT_TRUE(w && w->dtype() == DType::kInt8) << n.describe();
      int64_t lowest = 0;
      for (int64_t v : w->to_int64_vector()) lowest = std::min(lowest, v);
      EXPECT_GE(lowest, -127) << n.describe() << ": weights not symmetric";
      if (n.op_type == "Conv") {
        EXPECT_EQ(g.initializer(wdq.inputs[1])->numel(), w->dim(0)) << "per channel";
      }
    }
    if (n.op_type == "Add") {
      for (size_t i = 0; i < n.inputs.size(); ++i) {
        const int p = g.producer(n.inputs[i]);
        if (p < 0 || !weighted(g.nodes[static_cast<size_t>(p)])) continue;
        ++residual_adds;
        EXPECT_TRUE(dequantized(g, n.inputs[1 - i])) << n.describe() << ": residual input not quantized";
        break;
      }
    }
  }
  EXPECT_GT(weighted_ops, 0);
  if (residual_adds == 0) ADD_FAILURE() << "no Add fused into a weighted op";
}

TEST(DeployBackend, TensorRtFormFollowsExplicitQuantizationRules) {
  for (const char* model : {"resnet_small", "mobilenetv2_small"}) {
    SCOPED_TRACE(model);
    const ir::Graph g = test::calibrated_qdq(model, 320, config_for(quant::DeployBackend::kTensorRT));
    EXPECT_EQ(g.metadata.at("slimquant.deploy_backend"), "tensorrt");
    expect_tensorrt_rules(g);
    if (std::string(model) == "resnet_small") {
      EXPECT_GT(top1(g, 2000), 0.905);
    }
  }
}

// The default form keeps running fastest here: its integer execution lowers every weighted op.
TEST(DeployBackend, EveryBackendsExportLowersEveryConvInOurRuntime) {
  for (auto backend : {quant::DeployBackend::kSlimquant, quant::DeployBackend::kOnnxRuntime,
                       quant::DeployBackend::kTensorRT}) {
    SCOPED_TRACE(quant::deploy_backend_name(backend));
    const ir::Graph g = test::calibrated_qdq("resnet_small", 64, config_for(backend));
    int convs = 0;
    for (const auto& n : g.nodes) convs += n.op_type == "Conv";
    quant::LoweringReport report;
    quant::lower_to_int8(g, {}, &report);
    EXPECT_EQ(report.conv, convs);
  }
}

}  // namespace
