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
  ASSERT_EQ(choice.sqnr_db.size(), quant::auto_algo_candidates().size());
  // The winner is the first candidate within the margin of the best, and every SQNR is a real one.
  double best = -1e9;
  for (const auto& [algo, db] : choice.sqnr_db) {
    EXPECT_GT(db, 15.0) << algo;
    EXPECT_LT(db, 100.0) << algo;
    best = std::max(best, db);
  }
  std::string expected;
  double leader = -1e9;
  for (const auto& [algo, db] : choice.sqnr_db)
    if (expected.empty() || db > leader + quant::kAlgoChoiceMarginDb) expected = algo, leader = db;
  EXPECT_EQ(choice.chosen, expected);
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

TEST(AlgoChoice, WithNoSpareDataItComparesOnCalibrationSamplesAndSaysSo) {
  data::DataOptions d;
  d.spec = "fashion-mnist:train";
  d.limit = 20;
  auto ds = data::open_dataset(d);
  const Tensor images = data::BatchLoader(*ds, 20).batch(0).inputs;
  int64_t next = 0;
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = test::fixture_model("resnet_small");
  o.sample_generator = [&]() -> std::optional<std::map<std::string, Tensor>> {
    if (next == images.dim(0)) return std::nullopt;
    return std::map<std::string, Tensor>{{"", runtime::feed_rows({{"x", images}}, next++, 1).at("x")}};
  };
  o.batch_size = 10;  // every sample calibrates
  o.fallback_sqnr_db = 0;
  quant::PostTrainingQuantization ptq(o);
  ptq.quantize();
  const quant::ActivationAlgoChoice& choice = ptq.algo_choice();
  ASSERT_FALSE(choice.chosen.empty());
  EXPECT_FALSE(choice.held_back);
  EXPECT_EQ(choice.samples, quant::algo_choice_samples(20, 5));
  EXPECT_NE(choice.describe().find("calibration sample"), std::string::npos);
}

}  // namespace
