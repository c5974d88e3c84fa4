// Layers inside If branches (Silero VAD runs its whole network in an If on the sample rate): each
// branch is quantized on what it read whenever calibration took it, a branch never taken stays
// float and is named, names stay apart from the outer graph's, and the weights the branches read
// from outside go once nothing reads them as float.
#include <gtest/gtest.h>

#include <random>

#include "branching_model.h"
#include "graph_builder.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/runtime/session.h"
#include "test_util.h"

using namespace slimquant;

namespace {

std::map<std::string, Tensor> feeds(int64_t rate, uint32_t seed, int64_t rows = 4) {
  std::mt19937 rng(seed);
  return {{"x", test::random_tensor({rows, 8}, rng)}, {"rate", Tensor::scalar<int64_t>(rate)}};
}

quant::QuantConfig config(quant::QuantMode mode) {
  quant::QuantConfig c;
  c.mode = mode;
  if (mode == quant::QuantMode::kStatic) c.global().activation = "abs_max";
  c.quantizable_op_type = {"MatMul"};
  return c;
}

const ir::Graph& branch_of(const ir::Graph& g, const std::string& attr) {
  for (const auto& n : g.nodes)
    if (n.op_type == "If") return *n.attr_graph(attr);
  throw std::runtime_error("no If");
}

size_t count_ops(const ir::Graph& g, const std::string& op) {
  size_t k = 0;
  for (const auto& n : g.nodes) k += n.op_type == op;
  return k;
}

float max_abs_diff(const Tensor& a, const Tensor& b) {
  float d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::fabs(a.data<float>()[i] - b.data<float>()[i]));
  return d;
}

}  // namespace

TEST(BranchPtq, TheBranchCalibrationTookIsQuantizedTheOtherStaysFloatAndIsNamed) {
  test::TempDir dir("branch_ptq");
  const ir::Graph model = test::branching_model(dir.path("model.onnx"));
  quant::PTQ ptq(config(quant::QuantMode::kStatic));
  ptq.quantize(model);
  // The outer MatMul and the If; all_layers(): the outer MatMul and the branches' three MatMuls,
  // those of the branches under names apart from the outer node's.
  ASSERT_EQ(ptq.layers().size(), 2u);
  EXPECT_EQ(ptq.layers()[1].op_type, "If");
  std::set<std::string> names;
  for (const quant::Layer* l : ptq.all_layers()) names.insert(l->name);
  EXPECT_EQ(names.size(), 4u);
  EXPECT_TRUE(names.count("MatMul0"));
  EXPECT_TRUE(names.count("If_rate/then_branch/MatMul0")) << *names.rbegin();

  for (uint32_t s = 0; s < 4; ++s) ptq.sample(feeds(16000, s, 64));
  const std::vector<std::string> unobserved = ptq.unobserved_layers();
  ASSERT_EQ(unobserved.size(), 1u);
  EXPECT_EQ(unobserved[0], "If_rate/else_branch/MatMul0");
  EXPECT_NE(ptq.unobserved_layers_warning().find("If 'If_rate' else_branch, 1 layers"), std::string::npos)
      << ptq.unobserved_layers_warning();

  const ir::Graph q = ptq.convert();
  EXPECT_EQ(count_ops(branch_of(q, "then_branch"), "QuantizeLinear"), 2u);  // x (read outside too), the Relu
  EXPECT_EQ(count_ops(branch_of(q, "else_branch"), "QuantizeLinear"), 0u);
  // No name a branch defines shadows an outer one: x's scale is x_s outside and another inside.
  ir::Graph outer_only = q;
  for (auto& n : outer_only.nodes)
    if (n.op_type == "If") n.attrs.clear();
  const std::set<std::string> outer_names = ir::defined_names(outer_only);
  for (const auto& name : ir::defined_names(branch_of(q, "then_branch"))) EXPECT_FALSE(outer_names.count(name)) << name;
  EXPECT_TRUE(q.is_initializer("W_shared"));  // the float branch still reads it

  // Saved and loaded, it runs: near FP32 through the quantized branch, FP32 exactly through the other.
  ir::save_onnx(q, dir.path("q.onnx"));
  runtime::Session float_model(model), quantized(ir::load_onnx(dir.path("q.onnx")));
  const Tensor ref = float_model.run(feeds(16000, 9)).at("y"), got = quantized.run(feeds(16000, 9)).at("y");
  float range = 0;
  for (int64_t i = 0; i < ref.numel(); ++i) range = std::max(range, std::fabs(ref.data<float>()[i]));
  EXPECT_GT(max_abs_diff(ref, got), 0.f);  // quantized, not the float branch
  EXPECT_LT(max_abs_diff(ref, got), 0.05f * range);
  EXPECT_EQ(max_abs_diff(float_model.run(feeds(8000, 9)).at("y"), quantized.run(feeds(8000, 9)).at("y")), 0.f);
  // As converted, before any file: the same values (the If's captured values are the converted graph's own).
  EXPECT_EQ(max_abs_diff(runtime::Session(q).run(feeds(16000, 9)).at("y"), got), 0.f);
}

// The layers inside a branch convert one by one (the precision recovery leaves them float one at a
// time), and the calibration cache keeps the branches' observers.
TEST(BranchPtq, BranchLayersConvertOneByOneAndTheirCalibrationIsCached) {
  test::TempDir dir("branch_ptq");
  const ir::Graph model = test::branching_model(dir.path("model.onnx"));
  quant::PTQ ptq(config(quant::QuantMode::kStatic));
  ptq.quantize(model);
  for (uint32_t s = 0; s < 2; ++s) ptq.sample(feeds(16000, s));
  const std::string inner = "If_rate/then_branch/MatMul0";
  const ir::Graph one = ptq.convert(std::set<std::string>{inner});
  EXPECT_EQ(count_ops(one, "QuantizeLinear"), 0u);  // the outer MatMul stays float
  EXPECT_EQ(count_ops(branch_of(one, "then_branch"), "QuantizeLinear"), 1u);
  quant::PrecisionFallbackResult fallback;
  fallback.float_layers = {inner};
  EXPECT_EQ(fallback.quantized_layers(ptq).size(), 3u);

  ptq.save_calibration_state(dir.path("cache"));
  quant::PTQ resumed(config(quant::QuantMode::kStatic));
  resumed.quantize(model);
  ASSERT_TRUE(resumed.load_calibration_state(dir.path("cache")));
  EXPECT_EQ(ir::serialize_onnx(resumed.convert()), ir::serialize_onnx(ptq.convert()));
}

// Dynamic mode needs no data: both branches are quantized, and the outer float weight they both
// read goes from the file (and from the If's captured values).
TEST(BranchPtq, DynamicModeQuantizesEveryBranchAndDropsTheFloatWeightTheyShared) {
  test::TempDir dir("branch_ptq");
  const ir::Graph model = test::branching_model(dir.path("model.onnx"));
  quant::PTQ ptq(config(quant::QuantMode::kDynamic));
  ptq.quantize(model);
  const ir::Graph q = ptq.convert();
  EXPECT_EQ(count_ops(branch_of(q, "then_branch"), "MatMulInteger"), 2u);
  EXPECT_EQ(count_ops(branch_of(q, "else_branch"), "MatMulInteger"), 1u);
  EXPECT_FALSE(q.is_initializer("W_shared"));
  for (const auto& n : q.nodes) {
    if (n.op_type != "If") continue;
    EXPECT_EQ(std::count(n.captured.begin(), n.captured.end(), "W_shared"), 0);
  }
  ir::save_onnx(q, dir.path("q.onnx"));
  runtime::Session float_model(model), quantized(ir::load_onnx(dir.path("q.onnx")));
  for (int64_t rate : {16000, 8000}) {
    const Tensor ref = float_model.run(feeds(rate, 3)).at("y"), got = quantized.run(feeds(rate, 3)).at("y");
    float range = 0;
    for (int64_t i = 0; i < ref.numel(); ++i) range = std::max(range, std::fabs(ref.data<float>()[i]));
    EXPECT_LT(max_abs_diff(ref, got), 0.05f * range) << rate;
  }
}
