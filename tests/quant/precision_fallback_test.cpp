// Precision fallback: measured output drift, the layers left in float and the budget.
#include <gtest/gtest.h>

#include <cmath>

#include "quant/int8_test_util.h"
#include "slimquant/quant/precision_fallback.h"

using namespace slimquant;

namespace {

TEST(PrecisionFallback, OutputSqnrIsSignalOverNoiseOverSharedFloatOutputs) {
  const std::map<std::string, Tensor> ref = {{"a", Tensor::from_vector<float>({4}, {1, 2, 3, 4})},
                                             {"i", Tensor::from_vector<int64_t>({1}, {7})}};
  const std::map<std::string, Tensor> q = {{"a", Tensor::from_vector<float>({4}, {1, 2, 3, 5})},
                                           {"i", Tensor::from_vector<int64_t>({1}, {9})}};
  EXPECT_NEAR(quant::output_sqnr_db(ref, q), 10 * std::log10(30.0), 1e-9);  // integer outputs ignored
  EXPECT_EQ(quant::output_sqnr_db(ref, ref), 200.0);
}

struct Calibrated {
  std::unique_ptr<quant::PTQ> ptq;
  std::map<std::string, Tensor> samples;
};

Calibrated calibrate(const std::string& model, int weight_bits,
                     quant::DeployBackend backend = quant::DeployBackend::kSlimquant) {
  quant::QuantConfig config;
  config.weight_bits = weight_bits;
  config.deploy_backend = backend;
  Calibrated c{std::make_unique<quant::PTQ>(config), {}};
  c.ptq->quantize(ir::load_onnx(test::fixture_model(model)));
  data::DataOptions o;
  o.spec = "fashion-mnist:train";
  o.limit = 64;
  auto ds = data::open_dataset(o);
  data::BatchLoader loader(*ds, 32);
  for (const auto& b : loader) c.ptq->sample(b.inputs);
  c.samples = {{"input", loader.load_range(0, 8).inputs}};
  return c;
}

// A model that quantizes well is left alone after one evaluation.
TEST(PrecisionFallback, AWellQuantizedModelKeepsEveryLayer) {
  const Calibrated c = calibrate("resnet_small", 8);
  const quant::PrecisionFallbackResult r = quant::choose_precision_fallback(*c.ptq, c.samples);
  EXPECT_FALSE(r.triggered);
  EXPECT_TRUE(r.float_layers.empty());
  EXPECT_GT(r.sqnr_db_before, 25.0);
  EXPECT_EQ(r.evaluations, 1u);
}

// 2-bit weights ruin the model: the fallback keeps the most damaging layers in float, within the
// budget, and the model it chooses measures what it reports.
TEST(PrecisionFallback, ADamagedModelGetsItsWorstLayersBackInFloatWithinTheBudget) {
  const Calibrated c = calibrate("resnet_small", 2);
  quant::PrecisionFallbackOptions options;
  options.target_sqnr_db = 30.0;
  options.max_float_fraction = 0.25;
  const quant::PrecisionFallbackResult r = quant::choose_precision_fallback(*c.ptq, c.samples, options);
  ASSERT_TRUE(r.triggered);
  ASSERT_FALSE(r.float_layers.empty());
  EXPECT_LE(r.float_layers.size(), static_cast<size_t>(std::ceil(0.25 * c.ptq->layers().size())));
  EXPECT_GT(r.sqnr_db_after, r.sqnr_db_before + 1.0);
  const std::set<std::string> quantized = r.quantized_layers(*c.ptq);
  EXPECT_EQ(quantized.size() + r.float_layers.size(), c.ptq->layers().size());
  // Re-measure the chosen model: the reported SQNR is its SQNR.
  runtime::Session fp32(c.ptq->float_graph());
  runtime::Session chosen(c.ptq->convert(quantized));
  EXPECT_NEAR(quant::output_sqnr_db(fp32.run(c.samples), chosen.run(c.samples)), r.sqnr_db_after, 1e-6);

  options.target_sqnr_db = 0;  // disabled
  EXPECT_FALSE(quant::choose_precision_fallback(*c.ptq, c.samples, options).triggered);
}

// Under a work bound too small for one evaluation per layer (a large network calibrated on a few
// images), layers are ranked by the noise each adds in the quantized model, tried in doubling groups,
// on fewer samples: the work stays within the bound and the recovery still pays.
TEST(PrecisionFallback, UnderAWorkBoundLayersAreRankedByTheirLocalNoise) {
  const Calibrated c = calibrate("resnet_small", 4);
  quant::PrecisionFallbackOptions options;
  options.target_sqnr_db = 30.0;
  options.max_float_fraction = 0.25;
  const quant::PrecisionFallbackResult exact = quant::choose_precision_fallback(*c.ptq, c.samples, options);
  EXPECT_EQ(exact.ranking, "output");
  EXPECT_EQ(exact.samples, 8u);
  EXPECT_GT(exact.evaluations, c.ptq->layers().size());

  options.max_sample_runs = 40;
  const quant::PrecisionFallbackResult r = quant::choose_precision_fallback(*c.ptq, c.samples, options);
  ASSERT_TRUE(r.triggered);
  EXPECT_EQ(r.ranking, "added noise");
  const size_t budget = static_cast<size_t>(std::ceil(0.25 * c.ptq->layers().size()));
  size_t groups = 1;  // 1, 2, 4, ... and the whole budget
  for (size_t k = 2; k < budget; k *= 2) ++groups;
  if (budget > 1) ++groups;
  // before, channel-wise inputs (the fixture's convolutions have them), the groups; each on r.samples.
  EXPECT_LE(r.evaluations, 2 + groups);
  // + the reference pass and the ranking's pass of the quantized model.
  EXPECT_LE((r.evaluations + 2) * r.samples, options.max_sample_runs);
  EXPECT_GE(r.samples, 1u);
  EXPECT_LT(r.samples, 8u);
  ASSERT_FALSE(r.float_layers.empty());
  EXPECT_LE(r.float_layers.size(), budget);
  // Measured (4-bit weights): 19.7 -> 22.3 dB with 5 float layers, where the exact ranking's 4 give
  // 19.6 -> 24.1 dB at several times the cost.
  EXPECT_GT(r.sqnr_db_after, r.sqnr_db_before + 1.0);
  EXPECT_GT(r.sqnr_db_after - r.sqnr_db_before, 0.4 * (exact.sqnr_db_after - exact.sqnr_db_before))
      << "exact: " << exact.sqnr_db_before << " -> " << exact.sqnr_db_after;
  // The reported SQNR is that of the chosen model on the samples it used.
  const auto used = runtime::feed_rows(c.samples, 0, static_cast<int64_t>(r.samples));
  runtime::Session fp32(c.ptq->float_graph());
  runtime::Session chosen(c.ptq->convert(r.quantized_layers(*c.ptq)));
  // Within float32 rounding of the outputs (3e-6 dB apart with oneDNN's AVX2 kernels).
  EXPECT_NEAR(quant::output_sqnr_db(fp32.run(used), chosen.run(used)), r.sqnr_db_after, 1e-4);
}

// The ONNX Runtime form folds Relu / Clip into the QuantizeLinear after them, so their outputs, which
// the float graph has, are gone from the quantized one: the noise ranking measures the values the
// quantized model has instead of asking for a value nothing computes.
TEST(PrecisionFallback, NoiseRankingOfTheOnnxRuntimeFormWithFoldedClips) {
  const Calibrated c = calibrate("mobilenetv2_small", 4, quant::DeployBackend::kOnnxRuntime);
  quant::PrecisionFallbackOptions options;
  options.target_sqnr_db = 60.0;
  options.max_float_fraction = 0.25;
  options.max_sample_runs = 40;
  const quant::PrecisionFallbackResult r = quant::choose_precision_fallback(*c.ptq, c.samples, options);
  ASSERT_TRUE(r.triggered);
  EXPECT_EQ(r.ranking, "added noise");
  EXPECT_GE(r.sqnr_db_after, r.sqnr_db_before);  // layers are kept in float only where they help
  EXPECT_LE(r.float_layers.size(), static_cast<size_t>(std::ceil(0.25 * c.ptq->layers().size())));
}

// Class scores are judged by the logits before their Softmax, also behind the Reshape an opset
// upgrade writes and the Cast of a float16 model's output; other outputs by themselves.
TEST(PrecisionFallback, TheLogitsBeforeASoftmaxAreMeasuredThroughReshapeAndCast) {
  ir::Graph g;
  g.opset = 13;
  g.inputs.push_back({"x", DType::kFloat32, std::nullopt});
  auto add = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
    ir::Node n;
    n.op_type = op;
    n.name = out;
    n.inputs = std::move(in);
    n.outputs = {out};
    g.nodes.push_back(n);
  };
  add("Relu", {"x"}, "logits");
  add("Softmax", {"logits"}, "p");
  add("Reshape", {"p", "shape"}, "p2");
  add("Cast", {"p2"}, "scores");
  add("Sigmoid", {"logits"}, "mask");
  g.outputs = {{"scores", DType::kFloat32, std::nullopt}, {"mask", DType::kFloat32, std::nullopt}};
  const ir::Node* softmax = quant::softmax_writing(g, "scores");
  ASSERT_NE(softmax, nullptr);
  EXPECT_EQ(softmax->outputs[0], "p");
  EXPECT_EQ(quant::softmax_writing(g, "mask"), nullptr);
  EXPECT_EQ(quant::drift_measured_values(g), (std::vector<std::string>{"logits", "mask"}));
}

}  // namespace
