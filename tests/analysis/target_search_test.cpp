// Target metric search: reaches a target between the all-INT8 and the FP32 metric by leaving few
// layers in float, saves the best model (also when the target is out of reach), and the chosen
// skip list rebuilds the same model through QuantConfig.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

#include "analysis/analysis_test_util.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/analysis/target_search.h"
#include "slimquant/quant/lowering.h"

using namespace slimquant;

namespace {

double int8_metric(const ir::Graph& qdq, const ir::Graph& fp32_graph, const data::Dataset& data, const std::string& name) {
  runtime::Session fp32(fp32_graph);
  runtime::Session int8 = quant::make_int8_session(qdq);
  auto m = analysis::make_metric(name);
  analysis::EvalOptions eo;
  eo.reference = &fp32;
  return analysis::evaluate(int8, data, *m, eo).value;
}

TEST(TargetSearch, ReachesATargetBetweenInt8AndFp32) {
  test::SingleThread single_thread;
  auto ptq = test::calibrated_ptq("resnet_small", "abs_max");
  auto data = data::open_dataset(test::fmnist("test", 256));
  test::TempDir tmp("target");
  auto metric = analysis::make_metric("sqnr");
  analysis::PtqAnalysisOptions po;
  po.save_dir = tmp.path();
  auto report = analysis::analyze_ptq(*ptq, *data, *metric, po);
  const double all_int8 = int8_metric(ptq->convert(), ptq->float_graph(), *data, "sqnr");
  analysis::TargetSearchOptions to;
  to.target = all_int8 + 6.0;  // 4x less noise power than all-INT8, far below FP32 (identical = 200 dB)
  to.save_dir = tmp.path();
  to.latency_runs = 2;
  auto r = analysis::search_target(*ptq, report, *data, *metric, to);
  ASSERT_FALSE(r.candidates.empty());
  EXPECT_NEAR(r.candidates.front().metric, all_int8, 1e-9);
  EXPECT_TRUE(r.candidates.front().skipped.empty());
  EXPECT_TRUE(r.met);
  const auto& best = r.candidates[r.best];
  EXPECT_GE(best.metric, to.target);
  EXPECT_GE(best.skipped.size(), 1u);
  EXPECT_LT(best.skipped.size(), report.ranked.size());
  // Minimal in the refine sense: quantizing any one of the skipped layers again misses the target.
  for (size_t i = 0; i < best.skipped.size(); ++i) {
    std::set<std::string> keep;
    for (const auto& l : ptq->layers()) keep.insert(l.name);
    for (size_t j = 0; j < best.skipped.size(); ++j)
      if (j != i) keep.erase(best.skipped[j]);
    EXPECT_LT(int8_metric(ptq->convert(keep), ptq->float_graph(), *data, "sqnr"), to.target) << best.skipped[i];
  }
  // The saved model is the chosen one.
  ASSERT_TRUE(std::filesystem::exists(r.model_path));
  EXPECT_NEAR(int8_metric(ir::load_onnx(r.model_path), ptq->float_graph(), *data, "sqnr"), best.metric, 1e-9);
  EXPECT_GT(best.model_bytes, r.candidates.front().model_bytes);  // float layers are bigger
  EXPECT_GT(best.latency_ms, 0.0);
  // Candidates table: two header lines and one line per candidate.
  std::ifstream table(tmp.path("target_candidates.txt"));
  size_t lines = 0;
  for (std::string line; std::getline(table, line);) ++lines;
  EXPECT_EQ(lines, r.candidates.size() + 2);
  // The same layers skipped through QuantConfig give the very same model.
  quant::QuantConfig cfg = ptq->config();
  cfg.skip_quant = best.skipped;
  quant::PTQ again(cfg);
  again.quantize(ir::load_onnx(test::fixture_model("resnet_small")));
  auto calib = data::open_dataset(test::fmnist("train", 128));
  data::BatchLoader loader(*calib, 32);
  for (size_t i = 0; i < loader.num_batches(); ++i) again.sample(loader.batch(i).inputs);
  EXPECT_EQ(ir::serialize_onnx(again.convert()), ir::serialize_onnx(ir::load_onnx(r.model_path)));
  if (!r.skip_tensor_list.empty()) {
    quant::QuantConfig by_tensor = ptq->config();
    by_tensor.skip_tensor_list = r.skip_tensor_list;
    quant::PTQ t(by_tensor);
    t.quantize(ir::load_onnx(test::fixture_model("resnet_small")));
    EXPECT_EQ(t.layers().size(), ptq->layers().size() - best.skipped.size());
  }

  // The eval_function form (the Python package's) computing the same metric makes the same search.
  runtime::Session fp32(ptq->float_graph());
  auto eval_function = [&](runtime::Session& s) {
    auto m = analysis::make_metric("sqnr");
    analysis::EvalOptions eo;
    eo.reference = &fp32;
    return analysis::evaluate(s, *data, *m, eo).value;
  };
  to.save_dir = tmp.path("eval_function");
  auto by_function = analysis::search_target(*ptq, report, eval_function, true, to);
  ASSERT_EQ(by_function.candidates.size(), r.candidates.size());
  for (size_t i = 0; i < r.candidates.size(); ++i) {
    EXPECT_EQ(by_function.candidates[i].skipped, r.candidates[i].skipped);
    EXPECT_EQ(by_function.candidates[i].metric, r.candidates[i].metric);
    EXPECT_EQ(by_function.candidates[i].latency_ms, 0.0) << "no timing batch given";
  }
  EXPECT_EQ(by_function.best, r.best);
  EXPECT_EQ(by_function.metric, "eval_function");
  EXPECT_TRUE(std::filesystem::exists(by_function.model_path));
}

TEST(TargetSearch, UnreachableTargetStillSavesTheBestModel) {
  test::SingleThread single_thread;
  auto ptq = test::calibrated_ptq("resnet_small", "abs_max");
  auto data = data::open_dataset(test::fmnist("test", 128));
  test::TempDir tmp("target_miss");
  auto metric = analysis::make_metric("top1_agreement");
  analysis::PtqAnalysisOptions po;
  po.save_dir = tmp.path();
  auto report = analysis::analyze_ptq(*ptq, *data, *metric, po);
  analysis::TargetSearchOptions to;
  to.target = 1.5;  // agreement cannot exceed 1
  to.save_dir = tmp.path();
  to.latency_runs = 1;
  auto r = analysis::search_target(*ptq, report, *data, *metric, to);
  EXPECT_FALSE(r.met);
  ASSERT_TRUE(std::filesystem::exists(r.model_path));
  double best = 0;
  for (const auto& c : r.candidates) best = std::max(best, c.metric);
  EXPECT_EQ(r.candidates[r.best].metric, best);
  // All layers skipped was tried: the FP32-equivalent model agrees with itself.
  EXPECT_EQ(r.candidates.back().skipped.size(), report.ranked.size());
  EXPECT_EQ(r.candidates.back().metric, 1.0);
}

}  // namespace
