// analyze on a model whose output follows a selection by its data (a detector after NMS): layers
// are ranked by the values the selection chose from, and the target search's model keeps the
// selection.
#include <gtest/gtest.h>

#include <random>

#include <nlohmann/json.hpp>

#include "analysis/analysis_test_util.h"
#include "selection_model.h"
#include "slimquant/core/npy.h"

using namespace slimquant;

TEST(SelectionAnalysis, LayersAreRankedByTheValuesTheSelectionChoseFrom) {
  test::TempDir tmp("selection_analysis");
  const test::SelectionModel m = test::selection_model(0.5f);
  ir::save_onnx(m.graph, tmp.path("model.onnx"));
  std::filesystem::create_directories(tmp.path("data"));
  std::mt19937 rng(17);
  write_npy(tmp.path("data/x.npy"), test::random_tensor({12, 8}, rng));  // 12 samples of [8]
  // Batches of 4 for a model of batch 1 whose boxes differ in number from sample to sample.
  const std::string common = tmp.path("model.onnx") + " npy:" + tmp.path("data") +
                             " --algo abs_max --batch-size 4 --eval-batch-size 4 --metric sqnr --num-histogram-plots 0";
  const auto r = test::run_cli_single_threaded("analyze " + common + " --json --save-dir " + tmp.path("out") +
                                               " --target-metric 60");
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sqnr compares the 1 values they come from"), std::string::npos) << r.output;
  const nlohmann::json report = nlohmann::json::parse(test::file_bytes(tmp.path("out/analysis.json")));
  ASSERT_EQ(report["layers"].size(), 2u) << report.dump();
  // The features' Gemm moves what is measured; the box head after the selection cannot.
  for (const auto& layer : report["layers"]) {
    if (layer["name"] == "box_head") EXPECT_EQ(layer["metric"].get<double>(), 200.0) << layer.dump();
    else EXPECT_LT(layer["metric"].get<double>(), 60.0) << layer.dump();
  }
  // The target's model is the whole model: its boxes, of every size, are still the output.
  const ir::Graph target = ir::load_onnx(tmp.path("out/target_model.onnx"));
  ASSERT_EQ(target.outputs.size(), 1u);
  EXPECT_EQ(target.outputs[0].name, m.graph.outputs[0].name);
}

// quantize's evaluation against FP32 (--metric sqnr) and eval --reference compare the same values:
// the boxes that two models keep cannot be compared element by element.
TEST(SelectionAnalysis, QuantizeEvaluatesAgainstFp32AtTheValuesChosenFrom) {
  test::TempDir tmp("selection_quantize");
  ir::save_onnx(test::selection_model(0.5f).graph, tmp.path("model.onnx"));
  std::filesystem::create_directories(tmp.path("data"));
  std::mt19937 rng(19);
  write_npy(tmp.path("data/x.npy"), test::random_tensor({8, 8}, rng));
  const auto r = test::run_cli_single_threaded("quantize " + tmp.path("model.onnx") + " npy:" + tmp.path("data") +
                                               " --algo abs_max --metric sqnr --json -o " + tmp.path("q.onnx"));
  ASSERT_EQ(r.exit_code, 0) << r.output;
  EXPECT_NE(r.output.find("sqnr compares the 1 values they come from"), std::string::npos) << r.output;
  const double sqnr = test::last_json_line(r.output)["int8_sqnr"].get<double>();
  EXPECT_GT(sqnr, 20.0) << r.output;
  EXPECT_LT(sqnr, 100.0) << r.output;
  // eval against the FP32 file measures the same, the QDQ file keeping the values' names.
  const auto e = test::run_cli_single_threaded("eval " + tmp.path("q.onnx") + " npy:" + tmp.path("data") +
                                               " --metric sqnr --json --reference " + tmp.path("model.onnx"));
  ASSERT_EQ(e.exit_code, 0) << e.output;
  EXPECT_NE(e.output.find("sqnr compares the 1 values they come from"), std::string::npos) << e.output;
  EXPECT_NEAR(test::last_json_line(e.output)["sqnr"].get<double>(), sqnr, 0.01) << e.output;
}
