// Channel-wise convolution inputs (PTQ::set_channel_wise_conv_inputs): per-channel activation scales
// folded into the weights, exact in the integer kernels.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <random>

#include "graph_builder.h"
#include "test_util.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/quant/quant_config.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/runtime/session.h"

using namespace slimquant;

namespace {

// x [8, 4, 6, 6] with channel ranges 1 : 0.01 : 0.1 : 5 -> Conv 3x3 -> Relu -> depthwise Conv 3x3
// -> Conv 1x1 -> y. The first weight scales each input channel by 1 / its range, so every channel
// matters equally to y, while one scale for x leaves channels 1 and 2 a few grid steps.
struct Model {
  ir::Graph g;
  Tensor x;
};

Model uneven_channels_model() {
  std::mt19937 rng(7);
  test::GraphBuilder b;
  b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{8, ""}, {4, ""}, {6, ""}, {6, ""}}});
  const float range[4] = {1.f, 0.01f, 0.1f, 5.f};
  Tensor w1_values = test::random_tensor({3, 4, 3, 3}, rng);
  for (int64_t i = 0; i < w1_values.numel(); ++i) w1_values.data<float>()[i] /= range[(i / 9) % 4];
  const std::string w1 = b.constant(w1_values), b1 = b.constant(test::random_tensor({3}, rng));
  const std::string c1 = b.node("Conv", {"x", w1, b1}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}});
  const std::string r = b.node("Relu", {c1});
  const std::string w2 = b.constant(test::random_tensor({3, 1, 3, 3}, rng));
  const std::string c2 = b.node("Conv", {r, w2}, {{"pads", std::vector<int64_t>{1, 1, 1, 1}}, {"group", int64_t{3}}});
  const std::string w3 = b.constant(test::random_tensor({2, 3, 1, 1}, rng));
  const std::string y = b.node("Conv", {c2, w3});
  b.g.outputs.push_back({y, DType::kFloat32, std::nullopt});
  Model m{b.g, test::random_tensor({8, 4, 6, 6}, rng)};
  float* p = m.x.data<float>();
  for (int64_t i = 0; i < m.x.numel(); ++i) p[i] *= range[(i / 36) % 4];
  return m;
}

std::map<std::string, Tensor> run(const ir::Graph& g, const Tensor& x) { return runtime::Session(g).run({{"x", x}}); }

TEST(ChannelWiseInputs, ScalesAreChannelMaximaFoldedIntoTheWeightsAndBeatOneScale) {
  const Model m = uneven_channels_model();
  quant::PTQ ptq(quant::QuantConfig(quant::QuantRule{"abs_max", "channel_wise_abs_max", true}));
  ptq.quantize(m.g);
  ptq.sample({{"x", m.x}});
  ASSERT_EQ(ptq.channel_abs_max().count("x"), 1u);
  const std::vector<float>& abs_max = ptq.channel_abs_max().at("x");
  ASSERT_EQ(abs_max.size(), 4u);
  for (int64_t c = 0; c < 4; ++c) {
    float expect = 0;
    for (int64_t n = 0; n < 8; ++n)
      for (int64_t i = 0; i < 36; ++i) expect = std::max(expect, std::fabs(m.x.data<float>()[(n * 4 + c) * 36 + i]));
    EXPECT_EQ(abs_max[static_cast<size_t>(c)], expect);
  }

  const auto reference = run(m.g, m.x);
  const ir::Graph per_tensor = ptq.convert();
  ptq.set_channel_wise_conv_inputs(true);
  const ir::Graph channel_wise = ptq.convert();
  EXPECT_EQ(channel_wise.metadata.at("slimquant.channel_wise_inputs"), "3");

  // x: QuantizeLinear(x, max_c / 127, axis 1) -> DequantizeLinear(1) -> the first Conv.
  const ir::Node* q = nullptr;
  for (const auto& n : channel_wise.nodes)
    if (n.op_type == "QuantizeLinear" && n.input(0) == "x") q = &n;
  ASSERT_NE(q, nullptr);
  EXPECT_EQ(q->attr_int("axis", 0), 1);
  const auto scales = channel_wise.initializer(q->input(1))->to_float_vector();
  ASSERT_EQ(scales.size(), 4u);
  for (size_t c = 0; c < 4; ++c) EXPECT_FLOAT_EQ(scales[c], abs_max[c] / 127.f);
  const ir::Node& dq = channel_wise.nodes[static_cast<size_t>(channel_wise.consumers(q->outputs[0]).at(0))];
  EXPECT_EQ(dq.op_type, "DequantizeLinear");
  EXPECT_EQ(channel_wise.initializer(dq.input(1))->to_float_vector(), std::vector<float>{1.f});

  const double sqnr_per_tensor = quant::output_sqnr_db(reference, run(per_tensor, m.x));
  const double sqnr_channel_wise = quant::output_sqnr_db(reference, run(channel_wise, m.x));
  EXPECT_GT(sqnr_channel_wise, sqnr_per_tensor + 6.0) << sqnr_per_tensor << " dB with one scale per tensor";

  // Integer execution: all three convolutions lowered, equal to the simulation within float rounding.
  quant::LoweringReport report;
  const ir::Graph lowered = quant::lower_to_int8(channel_wise, {}, &report);
  EXPECT_EQ(report.conv, 3);
  // The per-channel QuantizeLinear after the first two convolutions folded into them: only x's
  // is left, and those QConvs write the integers of the next one's channel-wise input.
  int quantize = 0, per_channel_outputs = 0;
  for (const auto& n : lowered.nodes) {
    quantize += n.op_type == "QuantizeLinear";
    if (n.op_type == "QConv" && n.has_attr("y_channel_scale")) {
      ++per_channel_outputs;
      EXPECT_EQ(n.attr_floats("y_channel_scale").size(), 3u);
      EXPECT_NE(n.attr_int("y_type", 1), 1);
    }
  }
  EXPECT_EQ(quantize, 1);
  EXPECT_EQ(per_channel_outputs, 2);
  const auto simulated_outputs = run(channel_wise, m.x);
  const auto integer_outputs = runtime::Session(lowered).run({{"x", m.x}});
  const Tensor& simulated = simulated_outputs.begin()->second;
  const Tensor& integer = integer_outputs.begin()->second;
  ASSERT_EQ(simulated.shape(), integer.shape());
  float peak = 0, worst = 0;
  for (int64_t i = 0; i < simulated.numel(); ++i) {
    peak = std::max(peak, std::fabs(simulated.data<float>()[i]));
    worst = std::max(worst, std::fabs(simulated.data<float>()[i] - integer.data<float>()[i]));
  }
  EXPECT_LT(worst, 1e-3f * peak);
}

// The YAML key turns them on from the start (analyze then ranks the model as it will be exported).
TEST(ChannelWiseInputs, ConfigKeyEnablesThemForEveryConvert) {
  test::TempDir tmp("channel_wise_yaml");
  std::ofstream(tmp.path("cw.yaml")) << "channel_wise_conv_inputs: true\n";
  const quant::QuantConfig config = quant::load_quant_config_yaml(tmp.path("cw.yaml"));
  EXPECT_TRUE(config.channel_wise_conv_inputs);
  EXPECT_NE(config.fingerprint(), quant::QuantConfig().fingerprint());
  const Model m = uneven_channels_model();
  quant::PTQ ptq(config);
  ptq.quantize(m.g);
  ptq.sample({{"x", m.x}});
  EXPECT_TRUE(ptq.channel_wise_conv_inputs());
  EXPECT_EQ(ptq.convert().metadata.at("slimquant.channel_wise_inputs"), "3");
  EXPECT_EQ(ptq.convert(std::set<std::string>{ptq.layers().at(0).name}).metadata.at("slimquant.channel_wise_inputs"), "1");
}

// Calibration caches keep the channel maxima (an interrupted calibration resumes to the same model).
TEST(ChannelWiseInputs, CalibrationCacheRoundTripsTheChannelMaxima) {
  const Model m = uneven_channels_model();
  quant::PTQ a{quant::QuantConfig()}, b{quant::QuantConfig()};
  a.quantize(m.g);
  b.quantize(m.g);
  a.sample({{"x", m.x}});
  const std::string path = ::testing::TempDir() + "channel_wise_cache.bin";
  a.save_calibration_state(path);
  ASSERT_TRUE(b.load_calibration_state(path));
  EXPECT_EQ(a.channel_abs_max(), b.channel_abs_max());
  a.set_channel_wise_conv_inputs(true);
  b.set_channel_wise_conv_inputs(true);
  EXPECT_EQ(ir::serialize_onnx(a.convert()), ir::serialize_onnx(b.convert()));
}

// The precision recovery turns channel-wise inputs on only when the output drifts, and keeps it
// only when it helps.
TEST(ChannelWiseInputs, PrecisionRecoveryUsesThemOnlyBelowTheTarget) {
  const Model m = uneven_channels_model();
  quant::PTQ ptq(quant::QuantConfig(quant::QuantRule{"abs_max", "channel_wise_abs_max", true}));
  ptq.quantize(m.g);
  ptq.sample({{"x", m.x}});
  quant::PrecisionFallbackOptions easy;
  easy.target_sqnr_db = 1.0;
  EXPECT_FALSE(quant::choose_precision_fallback(ptq, {{"x", m.x}}, easy).channel_wise_conv_inputs);
  EXPECT_FALSE(ptq.channel_wise_conv_inputs());
  quant::PrecisionFallbackOptions strict;
  strict.target_sqnr_db = 150.0;  // unreachable: every remedy is tried
  const quant::PrecisionFallbackResult r = quant::choose_precision_fallback(ptq, {{"x", m.x}}, strict);
  EXPECT_TRUE(r.channel_wise_conv_inputs);
  EXPECT_TRUE(ptq.channel_wise_conv_inputs());
  EXPECT_GT(r.sqnr_db_before, r.sqnr_db_per_tensor);
}

}  // namespace
