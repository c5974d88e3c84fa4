// Weight-only quantization (QuantMode::kWeightOnly, PaddleSlim's quant_post_dynamic): each weight
// on its per-channel int8 grid behind a DequantizeLinear, activations float, no data.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>

#include "quant/int8_test_util.h"
#include "slimquant/core/quant_param.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/post_training_quantization.h"
#include "slimquant/quant/precision_fallback.h"

using namespace slimquant;

namespace {

quant::PostTrainingQuantizationOptions weight_only_options(const std::string& model) {
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = test::fixture_model(model);
  o.mode = "weight-only";
  return o;
}

TEST(WeightOnly, WeightsOnTheirChannelGridsActivationsFloatWithoutData) {
  quant::PostTrainingQuantization ptq(weight_only_options("resnet_small"));
  const ir::Graph& g = ptq.quantize();
  EXPECT_EQ(ptq.report().batches, 0u);
  EXPECT_EQ(g.metadata.at("slimquant.mode"), "weight-only");
  size_t weighted = 0;
  for (const auto& l : ptq.ptq().layers()) weighted += l.weight.empty() ? 0 : 1;
  ASSERT_GT(weighted, 5u);
  size_t dequantized_weights = 0;
  for (const auto& n : g.nodes) {
    EXPECT_NE(n.op_type, "QuantizeLinear") << "activations stay float";
    if (n.op_type != "DequantizeLinear") continue;
    const Tensor* codes = g.initializer(n.inputs[0]);
    ASSERT_NE(codes, nullptr) << n.inputs[0];
    EXPECT_EQ(codes->dtype(), DType::kInt8);
    ++dequantized_weights;
  }
  EXPECT_EQ(dequantized_weights, weighted);
  // Closed form: every weight dequantizes to within half a step of its float value, per channel.
  const ir::Graph& f = ptq.ptq().float_graph();  // BatchNorm folded: the weights that were quantized
  for (const auto& l : ptq.ptq().layers()) {
    if (l.weight.empty()) continue;
    const QuantParam p = ptq.ptq().weight_params(l);
    const Tensor& w = f.initializers.at(l.weight);
    const int64_t channels = static_cast<int64_t>(p.scale.size());
    int64_t inner = 1;
    for (size_t d = static_cast<size_t>(l.weight_axis) + 1; d < w.rank(); ++d) inner *= w.dim(d);
    float worst = 0;
    for (int64_t i = 0; i < w.numel(); ++i) {
      const size_t c = static_cast<size_t>((i / inner) % channels);
      const float q = quant_math::fake_quantize(w.data<float>()[i], p.scale[c], 0, -127, 127);
      worst = std::max(worst, std::abs(q - w.data<float>()[i]) / p.scale[c]);
    }
    EXPECT_LE(worst, 0.5f + 1e-4f) << l.name;
  }
  // The model computes what the float one does, within the weights' rounding.
  data::DataOptions d;
  d.spec = "fashion-mnist:test";
  d.limit = 64;
  auto ds = data::open_dataset(d);
  const Tensor images = data::BatchLoader(*ds, 64).batch(0).inputs;
  const std::map<std::string, Tensor> feeds = {{"input", images}};
  const auto reference = runtime::Session(f).run(feeds);
  const auto weights_only = runtime::Session(g).run(feeds);
  EXPECT_GT(quant::output_sqnr_db(reference, weights_only), 30.0);
  const Tensor& a = reference.at("logits");
  const Tensor& b = weights_only.at("logits");
  int agree = 0;
  for (int64_t r = 0; r < a.dim(0); ++r) {
    const float* x = a.data<float>() + r * a.dim(1);
    const float* y = b.data<float>() + r * b.dim(1);
    agree += std::max_element(x, x + a.dim(1)) - x == std::max_element(y, y + b.dim(1)) - y;
  }
  EXPECT_GE(agree, 63);
  // The file holds int8 weights: about a quarter of the float one.
  test::TempDir tmp("weight_only");
  ptq.save_quantized_model(tmp.path("w.onnx"));
  EXPECT_LT(std::filesystem::file_size(tmp.path("w.onnx")), 0.35 * std::filesystem::file_size(test::fixture_model("resnet_small")));
}

TEST(WeightOnly, CalibrationDataIsNotUsedAndSaysSo) {
  data::DataOptions d;
  d.spec = "fashion-mnist:train";
  d.limit = 32;
  auto ds = data::open_dataset(d);
  quant::PostTrainingQuantizationOptions o = weight_only_options("vit_small");
  o.dataset = ds.get();
  quant::PostTrainingQuantization ptq(o);
  const ir::Graph& g = ptq.quantize();
  EXPECT_EQ(ptq.report().batches, 0u);
  ASSERT_FALSE(ptq.warnings().empty());
  EXPECT_NE(ptq.warnings().back().find("not used"), std::string::npos);
  size_t matmul_weights = 0;
  for (const auto& n : g.nodes)
    if ((n.op_type == "MatMul" || n.op_type == "Gemm") && g.producer(n.inputs[1]) >= 0 &&
        g.nodes[static_cast<size_t>(g.producer(n.inputs[1]))].op_type == "DequantizeLinear")
      ++matmul_weights;
  EXPECT_GT(matmul_weights, 0u) << "a transformer's projections are weight-only quantized too";
}

TEST(WeightOnly, ModeNamesYamlAndFingerprint) {
  EXPECT_EQ(quant::parse_quant_mode("static"), quant::QuantMode::kStatic);
  EXPECT_EQ(quant::parse_quant_mode("weight-only"), quant::QuantMode::kWeightOnly);
  EXPECT_EQ(quant::parse_quant_mode("weight_only"), quant::QuantMode::kWeightOnly);
  EXPECT_EQ(quant::parse_quant_mode("dynamic"), quant::QuantMode::kDynamic);
  EXPECT_THROW(quant::parse_quant_mode("int4"), Error);
  test::TempDir tmp("weight_only_yaml");
  {
    std::ofstream(tmp.path("c.yaml")) << "mode: weight-only\nweight_bits: 6\n";
  }
  const quant::QuantConfig c = quant::load_quant_config_yaml(tmp.path("c.yaml"));
  EXPECT_EQ(c.mode, quant::QuantMode::kWeightOnly);
  quant::QuantConfig static_config = c;
  static_config.mode = quant::QuantMode::kStatic;
  EXPECT_NE(c.fingerprint(), static_config.fingerprint());
  EXPECT_EQ(static_config.fingerprint().find("mode"), std::string::npos) << "static keeps the earlier fingerprints";
  // 6-bit weights: codes within +-31.
  quant::PostTrainingQuantizationOptions o = weight_only_options("resnet_small");
  o.config = c;
  quant::PostTrainingQuantization ptq(o);
  const ir::Graph& g = ptq.quantize();
  int64_t largest = 0;
  for (const auto& [name, t] : g.initializers)
    if (t.dtype() == DType::kInt8)
      for (int64_t v : t.to_int64_vector()) largest = std::max<int64_t>(largest, std::abs(v));
  EXPECT_EQ(largest, 31);
}

}  // namespace
