// Models that select by their data (a detector's score threshold, top-k and NMS in the graph), run
// one sample at a time: calibration in batches larger than the model takes, the drift measured
// where FP32 and INT8 are comparable, and layers after a selection that never kept anything.
#include <gtest/gtest.h>

#include <random>

#include "graph_builder.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/post_training_quantization.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

namespace {

struct SelectionModel {
  ir::Graph graph;
  std::string features, mask;  // the dense values the selection reads
};

// x [1, 8] (a fixed batch of one) -> Gemm -> Relu = features [1, 16]; the features above
// `threshold` are picked (Greater -> NonZero -> Gather), each is scaled by the image size (a value
// of the input's shape only) and a second Gemm maps each picked value to 4 numbers: "boxes" [k, 4],
// k depending on the sample. A threshold above every feature leaves the second Gemm nothing.
SelectionModel selection_model(float threshold) {
  test::GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{1, ""}, {8, ""}}});
  std::mt19937 rng(5);
  const std::string w1 = b.constant(test::random_tensor({8, 16}, rng)), b1 = b.constant(test::random_tensor({16}, rng));
  const std::string features = b.node("Relu", {b.node("Gemm", {"x", w1, b1})});
  const std::string mask = b.node("Greater", {features, b.constant(Tensor::from_vector<float>({}, {threshold}))});
  const std::string positions = b.node("NonZero", {mask});  // [2, k]: rows, columns
  const std::string columns =
      b.node("Gather", {positions, b.constant(Tensor::from_vector<int64_t>({}, {1}))}, {{"axis", int64_t{0}}});
  const std::string picked = b.node("Gather", {features, columns}, {{"axis", int64_t{1}}});  // [1, k]
  const std::string size = b.node("Cast", {b.node("Shape", {"x"})}, {{"to", int64_t{1}}});   // [1, 8] as floats
  const std::string scale = b.node("ReduceMax", {size}, {{"keepdims", int64_t{0}}});
  const std::string scaled = b.node("Mul", {picked, scale});
  const std::string rows = b.node("Reshape", {scaled, b.constant(Tensor::from_vector<int64_t>({2}, {-1, 1}))});
  const std::string boxes = b.node("Gemm", {rows, b.constant(test::random_tensor({1, 4}, rng))});
  b.g.nodes.back().name = "box_head";
  b.g.outputs.push_back({boxes, DType::kFloat32, std::nullopt});
  return {b.g, features, mask};
}

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
  SelectionModel model;
  test::TempDir dir{"selection_model"};
  std::unique_ptr<quant::PostTrainingQuantization> ptq;
  ir::Graph quantized;
};
std::unique_ptr<QuantizedSelection> quantize_selection_model(float threshold, int count) {
  auto q = std::make_unique<QuantizedSelection>();
  q->model = selection_model(threshold);
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
// (and the mask, which the SQNR skips as not float), not the picked boxes, the constants or what
// the input's shape alone gives.
TEST(SelectionModel, DriftIsMeasuredAtWhatTheSelectionChoseFrom) {
  const SelectionModel m = selection_model(0.5f);
  EXPECT_EQ(quant::drift_measured_values(m.graph), (std::vector<std::string>{m.features, m.mask}));
}

// Calibrated in batches of 4 of a model of batch 1 whose output has a different size per sample:
// the calibration, the algorithm choice on held-back samples and the export all run, and the
// quantized model runs each sample as the float one selects, within quantization noise.
TEST(SelectionModel, QuantizesFromBatchesLargerThanTheModelTakes) {
  const auto q = quantize_selection_model(0.5f, 24);
  const SelectionModel& m = q->model;
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
  EXPECT_EQ(int8.run({{"x", Tensor(DType::kFloat32, {1, 8})}}).at(q->model.graph.outputs[0].name).shape(), (Shape{0, 4}));
}
