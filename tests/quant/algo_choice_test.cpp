// algo "auto": one calibration observes with every candidate, and the candidate whose quantized
// model stays closest to FP32 on samples the calibration did not see is kept (algo_choice.h).
#include <gtest/gtest.h>

#include <random>
#include <sstream>

#include "quant/int8_test_util.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/algo_choice.h"
#include "slimquant/quant/observer.h"
#include "slimquant/quant/post_training_quantization.h"

using namespace slimquant;

namespace {

std::vector<Tensor> activation_batches(bool non_negative) {
  std::mt19937 rng(11);
  std::vector<Tensor> out;
  for (float spread : {0.5f, 2.0f, 0.1f, 7.0f}) {
    std::normal_distribution<float> d(0.2f * spread, spread);
    std::vector<float> v(3 * 4 * 25);
    for (size_t i = 0; i < v.size(); ++i) {
      const float x = i % 7 == 0 ? 0.0f : d(rng);
      v[i] = non_negative ? std::abs(x) : x;
    }
    out.push_back(Tensor::from_vector<float>({3, 4, 5, 5}, v));
  }
  return out;
}

TEST(AutoObserver, EachCandidateAnswersExactlyAsItsOwnObserver) {
  for (bool non_negative : {false, true}) {
    const std::vector<Tensor> batches = activation_batches(non_negative);
    auto automatic = quant::make_activation_observer("auto");
    for (const Tensor& b : batches) automatic->observe(b);
    ASSERT_EQ(quant::auto_algo_candidates().front(), "emd");
    for (const std::string& algo : quant::auto_algo_candidates()) {
      SCOPED_TRACE(algo + (non_negative ? ", non-negative" : ", signed"));
      auto alone = quant::make_activation_observer(algo);
      for (const Tensor& b : batches) alone->observe(b);
      ASSERT_TRUE(quant::select_auto_candidate(*automatic, algo));
      std::vector<quant::QuantScheme> schemes = {quant::QuantScheme::kSymmetric, quant::QuantScheme::kAsymmetric};
      if (non_negative) schemes.push_back(quant::QuantScheme::kUnsignedZeroPoint0);
      for (quant::QuantScheme scheme : schemes) {
        const QuantParam a = automatic->params(scheme), b = alone->params(scheme);
        EXPECT_EQ(a.scale, b.scale) << quant::scheme_name(scheme);
        EXPECT_EQ(a.zero_point, b.zero_point) << quant::scheme_name(scheme);
      }
      EXPECT_EQ(automatic->range().lo, alone->range().lo);
      EXPECT_EQ(automatic->range().hi, alone->range().hi);
      EXPECT_EQ(automatic->observed_count(), alone->observed_count());
    }
  }
}

TEST(AutoObserver, StartsAsEmdAndRefusesOtherAlgorithms) {
  const std::vector<Tensor> batches = activation_batches(false);
  auto automatic = quant::make_activation_observer("auto"), emd = quant::make_activation_observer("emd");
  for (const Tensor& b : batches) automatic->observe(b), emd->observe(b);
  EXPECT_EQ(automatic->params(quant::QuantScheme::kSymmetric).scale, emd->params(quant::QuantScheme::kSymmetric).scale);
  try {
    quant::select_auto_candidate(*automatic, "min_max");
    FAIL() << "min_max is not a candidate";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("min_max"), std::string::npos);
  }
  EXPECT_FALSE(quant::select_auto_candidate(*emd, "KL")) << "an explicit observer is not redirected";
  // A restored state answers like the observer that saved it, for every candidate.
  std::stringstream state(std::ios::in | std::ios::out | std::ios::binary);
  automatic->save_state(state);
  auto restored = quant::make_activation_observer("auto");
  restored->load_state(state);
  for (const std::string& algo : quant::auto_algo_candidates()) {
    quant::select_auto_candidate(*automatic, algo);
    quant::select_auto_candidate(*restored, algo);
    EXPECT_EQ(restored->params(quant::QuantScheme::kAsymmetric).scale, automatic->params(quant::QuantScheme::kAsymmetric).scale)
        << algo;
  }
}

TEST(AlgoChoice, SampleCountIsBoundedByTheCalibration) {
  EXPECT_EQ(quant::algo_choice_samples(6, 5), 1u);    // a large network calibrated on 6 images
  EXPECT_EQ(quant::algo_choice_samples(64, 5), 12u);  // all candidates together: at most the calibration
  EXPECT_EQ(quant::algo_choice_samples(10000, 5), 16u);
  EXPECT_EQ(quant::algo_choice_samples(0, 5), 1u);
}

ir::Graph without_metadata(ir::Graph g) {
  g.metadata.clear();
  return g;
}

TEST(AlgoChoice, TheDefaultKeepsTheCandidateClosestToFp32OnHeldBackSamples) {
  data::DataOptions d;
  d.spec = "fashion-mnist:train";
  d.limit = 96;
  auto ds = data::open_dataset(d);
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = test::fixture_model("vit_small");
  o.dataset = ds.get();
  o.batch_size = 16;
  o.batch_nums = 4;  // 64 calibrated, 32 left over
  o.fallback_sqnr_db = 0;
  ASSERT_EQ(o.algo, "auto") << "the product default";
  quant::PostTrainingQuantization automatic(o);
  const ir::Graph chosen_graph = automatic.quantize();
  const quant::ActivationAlgoChoice& choice = automatic.algo_choice();
  ASSERT_FALSE(choice.chosen.empty());
  EXPECT_TRUE(choice.held_back);
  EXPECT_EQ(choice.samples, quant::algo_choice_samples(64, 5));
  ASSERT_GE(choice.scores.size(), quant::auto_algo_candidates().size());
  // The winner: a later candidate only with more equal decisions, or as many and more SQNR by the
  // margin; every SQNR is a real one (the fixtures' logits have no Softmax: SQNR alone).
  size_t expected = 0;
  for (size_t i = 0; i < choice.scores.size(); ++i) {
    const auto& c = choice.scores[i];
    EXPECT_GT(c.sqnr_db, 15.0) << c.algo;
    EXPECT_LT(c.sqnr_db, 100.0) << c.algo;
    EXPECT_EQ(c.agreement, -1.0) << c.algo;
    if (c.sqnr_db > choice.scores[expected].sqnr_db + quant::kAlgoChoiceMarginDb) expected = i;
  }
  EXPECT_EQ(choice.chosen, choice.scores[expected].algo);
  EXPECT_FALSE(choice.channel_wise_conv_inputs) << "without a recovery target, per-tensor inputs only";
  EXPECT_EQ(chosen_graph.metadata.at("slimquant.activation_algo"), choice.chosen);
  EXPECT_NE(choice.describe().find("held-back"), std::string::npos);

  // The export is exactly the explicit algorithm's, and the choice is the same on a second run.
  o.algo = choice.chosen;
  quant::PostTrainingQuantization explicit_algo(o);
  EXPECT_EQ(ir::serialize_onnx(without_metadata(explicit_algo.quantize())), ir::serialize_onnx(without_metadata(chosen_graph)));
  EXPECT_TRUE(explicit_algo.algo_choice().chosen.empty());
  EXPECT_EQ(explicit_algo.quantized_graph().metadata.count("slimquant.activation_algo"), 0u);
  o.algo = "auto";
  quant::PostTrainingQuantization again(o);
  EXPECT_EQ(ir::serialize_onnx(again.quantize()), ir::serialize_onnx(chosen_graph));
}

TEST(AlgoChoice, DataUsedWholeIsComparedOnItsLastBatchBeforeThatIsObserved) {
  data::DataOptions d;
  d.spec = "fashion-mnist:train";
  d.limit = 20;
  auto ds = data::open_dataset(d);
  const Tensor images = data::BatchLoader(*ds, 20).batch(0).inputs;
  auto generator = [&images](int64_t next = 0) {
    return [&images, next]() mutable -> std::optional<std::map<std::string, Tensor>> {
      if (next == images.dim(0)) return std::nullopt;
      return std::map<std::string, Tensor>{{"", runtime::feed_rows({{"x", images}}, next++, 1).at("x")}};
    };
  };
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = test::fixture_model("resnet_small");
  o.sample_generator = generator();
  o.batch_size = 10;  // every sample calibrates, in two batches
  o.fallback_sqnr_db = 0;
  quant::PostTrainingQuantization ptq(o);
  const ir::Graph chosen_graph = ptq.quantize();
  const quant::ActivationAlgoChoice& choice = ptq.algo_choice();
  ASSERT_FALSE(choice.chosen.empty());
  EXPECT_TRUE(choice.held_back) << "the second batch is compared on before the observers see it";
  EXPECT_EQ(choice.samples, quant::algo_choice_samples(20, 5));
  EXPECT_NE(choice.describe().find("held-back"), std::string::npos);
  EXPECT_EQ(ptq.report().batches, 2u);
  EXPECT_EQ(ptq.report().samples, 20u);
  // Every sample calibrated all the same: the export is the explicit algorithm's.
  o.algo = choice.chosen;
  o.sample_generator = generator();
  quant::PostTrainingQuantization explicit_algo(o);
  EXPECT_EQ(ir::serialize_onnx(without_metadata(explicit_algo.quantize())), ir::serialize_onnx(without_metadata(chosen_graph)));

  // One batch only: nothing can be held back, the comparison is on calibration samples and says so.
  o.algo = "auto";
  o.sample_generator = generator();
  o.batch_size = 20;
  quant::PostTrainingQuantization single(o);
  single.quantize();
  EXPECT_FALSE(single.algo_choice().held_back);
  EXPECT_EQ(single.algo_choice().samples, quant::algo_choice_samples(20, 5));
  EXPECT_NE(single.algo_choice().describe().find("calibration sample"), std::string::npos);
}

}  // namespace

namespace {

TEST(AlgoChoice, ClassScoresAreJudgedByDecisionsAndADriftingModelAlsoWithPerChannelInputs) {
  // The ViT fixture with a Softmax on its logits: its outputs are class decisions.
  ir::Graph g = ir::load_onnx(test::fixture_model("vit_small"));
  ir::Node softmax;
  softmax.op_type = "Softmax";
  softmax.name = "probabilities";
  softmax.inputs = {g.outputs[0].name};
  softmax.outputs = {"probabilities"};
  softmax.attrs["axis"] = ir::AttributeValue(int64_t{-1});
  g.nodes.push_back(softmax);
  g.outputs[0].name = "probabilities";
  test::TempDir tmp("algo_choice_softmax");
  ir::save_onnx(g, tmp.path("vit_softmax.onnx"));

  data::DataOptions d;
  d.spec = "fashion-mnist:train";
  d.limit = 48;
  auto ds = data::open_dataset(d);
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = tmp.path("vit_softmax.onnx");
  o.dataset = ds.get();
  o.batch_size = 16;
  o.batch_nums = 2;
  o.fallback_sqnr_db = 150;  // out of reach: the candidates are measured with per-channel inputs too
  quant::PostTrainingQuantization ptq(o);
  ptq.quantize();
  const quant::ActivationAlgoChoice& choice = ptq.algo_choice();
  const size_t n = quant::auto_algo_candidates().size();
  ASSERT_EQ(choice.scores.size(), 2 * n);
  size_t expected = 0;
  for (size_t i = 0; i < choice.scores.size(); ++i) {
    const auto& c = choice.scores[i];
    EXPECT_EQ(c.channel_wise_conv_inputs, i >= n) << c.algo;
    EXPECT_GE(c.agreement, 0.8) << c.algo << ": share of the held-back samples' decisions";
    EXPECT_LE(c.agreement, 1.0) << c.algo;
    const auto& lead = choice.scores[expected];
    if (c.agreement > lead.agreement || (c.agreement == lead.agreement && c.sqnr_db > lead.sqnr_db + quant::kAlgoChoiceMarginDb))
      expected = i;
  }
  EXPECT_EQ(choice.chosen, choice.scores[expected].algo);
  EXPECT_EQ(choice.channel_wise_conv_inputs, choice.scores[expected].channel_wise_conv_inputs);
  EXPECT_EQ(ptq.ptq().channel_wise_conv_inputs(), choice.channel_wise_conv_inputs) << "the PTQ is left as chosen";
  EXPECT_NE(choice.describe().find("class decisions"), std::string::npos) << choice.describe();
}

}  // namespace
