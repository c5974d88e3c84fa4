// The fixture models (PyTorch exports trained on Fashion-MNIST) against PyTorch's own numbers:
// logits on a few inputs, and predictions/top-1 on the whole test set.
#include <gtest/gtest.h>

#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "slimquant/analysis/evaluate.h"
#include "slimquant/core/npy.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/ir/passes.h"
#include "slimquant/runtime/optimize.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

namespace {

nlohmann::json fixtures_json() {
  std::ifstream in(test::source_path("tests/fixtures/models/fixtures.json"));
  return nlohmann::json::parse(in);
}

std::vector<std::string> fixture_names() {
  std::vector<std::string> names;
  const nlohmann::json all = fixtures_json();
  for (const auto& [name, info] : all.items()) names.push_back(name);
  return names;
}

class FixtureModel : public ::testing::TestWithParam<std::string> {};

TEST_P(FixtureModel, LogitsMatchPyTorch) {
  const std::string name = GetParam();
  const std::string base = test::source_path("tests/fixtures/models/" + name);
  runtime::Session session(ir::load_onnx(base + ".onnx"));
  Tensor input = read_npy(base + ".input.npy");
  Tensor want = read_npy(base + ".logits.npy");
  Tensor got = session.run_single(input);
  ASSERT_EQ(got.shape(), want.shape());
  float max_abs = 0, max_diff = 0;
  for (int64_t i = 0; i < want.numel(); ++i) {
    max_abs = std::max(max_abs, std::abs(want.data<float>()[i]));
    max_diff = std::max(max_diff, std::abs(want.data<float>()[i] - got.data<float>()[i]));
  }
  EXPECT_LE(max_diff, 1e-4f * max_abs) << name << ": max |diff| " << max_diff << ", max |output| " << max_abs;
  // Batch 1 through the same session (a second compiled plan) gives the same numbers.
  Tensor one(DType::kFloat32, {1, input.dim(1), input.dim(2), input.dim(3)});
  std::memcpy(one.raw(), input.raw(), one.nbytes());
  Tensor got1 = session.run_single(one);
  for (int64_t j = 0; j < got1.numel(); ++j) EXPECT_NEAR(got1.data<float>()[j], got.data<float>()[j], 1e-4f * max_abs);
  EXPECT_EQ(session.cached_plan_count(), 2u);
}

// The first 1,000 test images: every prediction equals PyTorch's, so top-1 does too (the 10k-image
// top-1 of fixtures.json is what the README's main job prints).
TEST_P(FixtureModel, TestSetPredictionsEqualPyTorch) {
  const std::string name = GetParam();
  const std::string base = test::source_path("tests/fixtures/models/" + name);
  runtime::Session session(ir::load_onnx(base + ".onnx"));
  constexpr size_t kImages = 1000;
  data::DataOptions options;
  options.spec = "fashion-mnist:test";
  options.limit = kImages;
  auto dataset = data::open_dataset(options);
  ASSERT_EQ(dataset->size(), kImages);
  Tensor torch_pred = read_npy(base + ".predictions.npy");
  ASSERT_EQ(torch_pred.numel(), 10000);
  data::BatchLoader loader(*dataset, 100);
  size_t correct = 0, torch_correct = 0, disagreements = 0;
  for (const auto& batch : loader) {
    Tensor out = session.run_single(batch.inputs);
    const int64_t c = out.dim(1);
    for (size_t i = 0; i < batch.size(); ++i) {
      const float* row = out.data<float>() + i * c;
      const int64_t pred = std::max_element(row, row + c) - row;
      const int64_t torch = torch_pred.data<int64_t>()[batch.first_index + i];
      correct += pred == batch.labels[i];
      torch_correct += torch == batch.labels[i];
      disagreements += pred != torch;
    }
  }
  EXPECT_EQ(disagreements, 0u) << name << ": predictions differing from PyTorch's";
  EXPECT_EQ(correct, torch_correct) << name;
  // The saved predictions are the model's: their top-1 on these images is near the whole set's.
  EXPECT_NEAR(static_cast<double>(torch_correct) / kImages, fixtures_json()[name]["top1"].get<double>(), 0.03) << name;
}

INSTANTIATE_TEST_SUITE_P(Fixtures, FixtureModel, ::testing::ValuesIn(fixture_names()));

TEST(Export, SavedModelPassesCheckerAndReloadsWithIdenticalOutputs) {
  test::TempDir tmp("export");
  ir::Graph g = ir::load_onnx(test::fixture_model("resnet_small"));
  Tensor input = read_npy(test::source_path("tests/fixtures/models/resnet_small.input.npy"));
  Tensor before = runtime::Session(g).run_single(input);
  ir::save_onnx(g, tmp.path("saved.onnx"));
  ir::Graph again = ir::load_onnx(tmp.path("saved.onnx"));
  EXPECT_NO_THROW(ir::check_onnx(again));
  EXPECT_EQ(again.nodes.size(), g.nodes.size());
  Tensor after = runtime::Session(again).run_single(input);
  ASSERT_EQ(before.nbytes(), after.nbytes());
  EXPECT_EQ(std::memcmp(before.raw(), after.raw(), before.nbytes()), 0);
}

TEST(Passes, RealExportFoldsBatchNormAndShapeChains) {
  ir::Graph g = ir::load_onnx(test::fixture_model("resnet_small"));
  int bn = 0;
  for (const auto& n : g.nodes) bn += n.op_type == "BatchNormalization";
  ASSERT_GT(bn, 0);
  runtime::Session session(g);
  for (const auto& n : session.graph().nodes) {
    EXPECT_NE(n.op_type, "BatchNormalization");
    EXPECT_NE(n.op_type, "Identity");
    EXPECT_NE(n.op_type, "Constant");
  }
  // With the batch dimension bound, the Shape->Gather->Unsqueeze->Concat chain feeding Reshape folds.
  ir::Graph bound = session.graph();
  ir::bind_input_shapes(bound, {{"input", {4, 1, 28, 28}}});
  runtime::fold_constants(bound);
  for (const auto& n : bound.nodes) {
    EXPECT_NE(n.op_type, "Shape");
    EXPECT_NE(n.op_type, "Gather");
    EXPECT_NE(n.op_type, "Concat");
  }
}

}  // namespace

namespace {
TEST(Import, ExternalDataGivesTheSameOutputs) {
  Tensor input = read_npy(test::source_path("tests/fixtures/models/resnet_small.input.npy"));
  ir::Graph external = ir::load_onnx(test::source_path("tests/fixtures/models/external/resnet_small_ext.onnx"));
  Tensor a = runtime::Session(external).run_single(input);
  Tensor b = runtime::Session(ir::load_onnx(test::fixture_model("resnet_small"))).run_single(input);
  ASSERT_EQ(a.nbytes(), b.nbytes());
  EXPECT_EQ(std::memcmp(a.raw(), b.raw(), a.nbytes()), 0);
}
}  // namespace
