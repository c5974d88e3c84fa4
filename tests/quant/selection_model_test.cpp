// Models that select by their data (a detector's score threshold, top-k and NMS in the graph), run
// one sample at a time: calibration in batches larger than the model takes, the drift measured
// where FP32 and INT8 are comparable, and layers after a selection that never kept anything.
#include <gtest/gtest.h>

#include <random>

#include "graph_builder.h"
#include "selection_model.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/post_training_quantization.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

namespace {

// Samples whose features cross a threshold of 0.5 a different number of times each.
quant::SampleGenerator samples(int count) {
  auto rng = std::make_shared<std::mt19937>(11);
  auto left = std::make_shared<int>(count);
  return [rng, left]() -> std::optional<quant::Feeds> {
    if ((*left)-- <= 0) return std::nullopt;
    return quant::Feeds{{"x", test::random_tensor({1, 8}, *rng)}};
  };
}

// The model of `threshold` quantized by default from `count` samples in batches of 4.
struct QuantizedSelection {
  test::SelectionModel model;
  test::TempDir dir{"selection_model"};
  std::unique_ptr<quant::PostTrainingQuantization> ptq;
  ir::Graph quantized;
};
std::unique_ptr<QuantizedSelection> quantize_selection_model(float threshold, int count) {
  auto q = std::make_unique<QuantizedSelection>();
  q->model = test::selection_model(threshold);
  ir::save_onnx(q->model.graph, q->dir.path("model.onnx"));
  quant::PostTrainingQuantizationOptions o;
  o.model_dir = q->dir.path("model.onnx");
  o.sample_generator = samples(count);
  o.batch_size = 4;
  q->ptq = std::make_unique<quant::PostTrainingQuantization>(o);
  q->quantized = q->ptq->quantize();
  return q;
}

}  // namespace

// An output after a selection is measured at the values the selection chose from: the features
// (also behind the boolean mask, a decision), not the picked boxes, the constants or what the
// input's shape alone gives.
TEST(SelectionModel, DriftIsMeasuredAtWhatTheSelectionChoseFrom) {
  const test::SelectionModel m = test::selection_model(0.5f);
  EXPECT_EQ(quant::drift_measured_values(m.graph), (std::vector<std::string>{m.features}));
}

// A segmentation exported with its ArgMax: the classes are a decision, measured at the logits (the
// softmax's input), not the integers; the float output beside them as it is.
TEST(SelectionModel, DecisionsAreMeasuredAtWhatTheyWereDecidedFrom) {
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "batch"}, {4, ""}, {8, ""}, {8, ""}}});
  std::mt19937 rng(2);
  const std::string logits = b.node("Conv", {"x", b.constant(test::random_tensor({5, 4, 1, 1}, rng))});
  const std::string probabilities = b.node("Softmax", {logits}, {{"axis", int64_t{1}}});
  const std::string classes = b.node("ArgMax", {probabilities}, {{"axis", int64_t{1}}});
  const std::string confidence = b.node("ReduceMax", {logits}, {{"axes", std::vector<int64_t>{1}}});
  b.g.outputs = {{classes, DType::kUndefined, std::nullopt}, {confidence, DType::kFloat32, std::nullopt}};
  EXPECT_EQ(quant::drift_measured_values(b.g), (std::vector<std::string>{logits, confidence}));
  EXPECT_EQ(quant::selection_inputs(b.g), (std::vector<std::string>{logits, confidence}));
}

// Calibrated in batches of 4 of a model of batch 1 whose output has a different size per sample:
// the calibration, the algorithm choice on held-back samples and the export all run, and the
// quantized model runs each sample as the float one selects, within quantization noise.
TEST(SelectionModel, QuantizesFromBatchesLargerThanTheModelTakes) {
  const auto q = quantize_selection_model(0.5f, 24);
  const test::SelectionModel& m = q->model;
  const quant::PostTrainingQuantization& ptq = *q->ptq;
  const ir::Graph& quantized = q->quantized;
  EXPECT_EQ(test::count_op(quantized, "QuantizeLinear"), 2) << "both Gemms' inputs";
  EXPECT_TRUE(ptq.ptq().unobserved_layers().empty());
  EXPECT_FALSE(ptq.algo_choice().chosen.empty());
  for (const auto& score : ptq.algo_choice().scores) EXPECT_GT(score.sqnr_db, 20.0) << score.algo;

  runtime::Session fp32(m.graph), int8(quantized);
  std::mt19937 rng(3);
  const Tensor x = test::random_tensor({3, 8}, rng);  // three samples in one call: run one at a time
  runtime::RunOptions wanted;
  wanted.outputs = {m.features};
  const Tensor want = fp32.run({{"x", x}}, wanted).at(m.features), got = int8.run({{"x", x}}, wanted).at(m.features);
  ASSERT_EQ(want.shape(), (Shape{3, 16})) << "one row per sample";
  ASSERT_EQ(got.shape(), want.shape());
  for (int64_t i = 0; i < want.numel(); ++i) EXPECT_NEAR(got.data<float>()[i], want.data<float>()[i], 0.05f) << i;
}

// Nothing crosses the threshold in any calibration sample: the box head saw no values, has no
// range, stays float and is named in a warning; the rest is quantized and the model runs.
TEST(SelectionModel, ALayerThatNeverSawValuesStaysFloatAndIsNamed) {
  const auto q = quantize_selection_model(1e9f, 12);
  const quant::PostTrainingQuantization& ptq = *q->ptq;
  const ir::Graph& quantized = q->quantized;
  EXPECT_EQ(ptq.ptq().unobserved_layers(), (std::vector<std::string>{"box_head"}));
  EXPECT_EQ(test::count_op(quantized, "QuantizeLinear"), 1) << "the first Gemm's input only";
  bool named = false;
  for (const auto& w : ptq.warnings()) named = named || w.find("1 layers stay float (box_head)") != std::string::npos;
  EXPECT_TRUE(named) << "no warning names the box head";
  runtime::Session int8(quantized);
  const std::string boxes = q->model.graph.outputs[0].name;
  EXPECT_EQ(int8.run({{"x", Tensor(DType::kFloat32, {1, 8})}}).at(boxes).shape(), (Shape{0, 4}));
}
