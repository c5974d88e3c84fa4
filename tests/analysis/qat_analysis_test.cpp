// QAT analysis: de-quantizing layers of slimquant PTQ output and of ONNX Runtime-style QDQ restores
// the float model; the sweep's per-layer numbers equal whole-model evaluations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <functional>
#include <stdexcept>

#include "analysis/analysis_test_util.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/analysis/qat_analysis.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/runtime/optimize.h"

using namespace slimquant;

namespace {

float max_abs_diff(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  float d = 0;
  for (int64_t i = 0; i < a.numel(); ++i) d = std::max(d, std::abs(a.data<float>()[i] - b.data<float>()[i]));
  return d;
}

// ONNX Runtime-style weights: float initializers with QuantizeLinear -> DequantizeLinear, under
// exporter names that match nothing in the float model (onnx::W_k), so restoring must go by position.
ir::Graph ort_style(const ir::Graph& q) {
  ir::Graph g = q;
  std::vector<ir::Node> added;
  std::map<std::string, std::string> renamed;  // DQ outputs get exporter names too
  int k = 0;
  for (auto& n : g.nodes) {
    if (n.op_type != "DequantizeLinear") continue;
    const Tensor* w8 = g.initializer(n.inputs[0]);
    if (!w8 || w8->dtype() != DType::kInt8 || w8->rank() < 2) continue;
    const Tensor& scale = *g.initializer(n.inputs[1]);
    const int64_t axis = n.attr_int("axis", 1);
    int64_t inner = 1;
    for (size_t d = static_cast<size_t>(axis) + 1; d < w8->rank(); ++d) inner *= w8->dim(d);
    Tensor w(DType::kFloat32, w8->shape());
    for (int64_t i = 0; i < w.numel(); ++i) {
      const int64_t c = scale.numel() == 1 ? 0 : (i / inner) % scale.numel();
      w.data<float>()[i] = static_cast<float>(w8->data<int8_t>()[i]) * scale.data<float>()[c];
    }
    const std::string name = "onnx::W_" + std::to_string(k++);
    g.initializers[name] = w;
    ir::Node qn;
    qn.op_type = "QuantizeLinear";
    qn.name = name + "_QuantizeLinear";
    if (n.inputs.size() < 3) {  // ORT states the int8 zero points (without them Q outputs uint8)
      const std::string zp = g.unique_value_name(name + "_zero_point");
      g.initializers[zp] = Tensor(DType::kInt8, scale.shape());
      n.inputs.push_back(zp);
    }
    qn.inputs = {name, n.inputs[1], n.inputs[2]};
    qn.outputs = {name + "_q"};
    qn.attrs = n.attrs;
    n.inputs[0] = qn.outputs[0];
    renamed[n.outputs[0]] = name + "_dq";
    n.outputs[0] = name + "_dq";
    added.push_back(qn);
  }
  for (auto& n : g.nodes)
    for (auto& in : n.inputs)
      if (renamed.count(in)) in = renamed[in];
  for (auto& n : added) g.nodes.push_back(n);
  g.topological_sort();
  g.remove_unused_initializers();
  return g;
}

void expect_restores_float(const ir::Graph& quant_model, const std::string& expected_source) {
  ir::Graph f = ir::load_onnx(test::fixture_model("resnet_small"));
  ir::Graph fopt = f;
  runtime::optimize_graph(fopt);
  auto layers = analysis::find_quantized_layers(quant_model, {"conv2d", "mul"});  // source names work too
  ASSERT_GE(layers.size(), 5u);
  auto data = data::open_dataset(test::fmnist("test", 64));
  const Tensor x = data::BatchLoader(*data, 64).batch(0).inputs;
  runtime::Session fp32(f);
  const Tensor expected = fp32.run_single(x);
  ir::Graph g = quant_model;
  float first_diff = 0;
  for (size_t i = 0; i < layers.size(); ++i) {
    std::vector<analysis::QatLayer> info;
    g = analysis::dequantize_layers(g, fopt, {layers[i].name}, &info);
    ASSERT_EQ(info.size(), 1u);
    ASSERT_FALSE(info[0].restored.empty()) << layers[i].name;
    for (const auto& src : info[0].restored) EXPECT_EQ(src.rfind(expected_source, 0), 0u) << layers[i].name << ": " << src;
    if (i == 0) first_diff = max_abs_diff(runtime::Session(g).run_single(x), expected);
  }
  EXPECT_FALSE(quant::has_qdq_nodes(g));
  const float diff = max_abs_diff(runtime::Session(g).run_single(x), expected);
  EXPECT_LE(diff, 1e-4f);
  EXPECT_GT(first_diff, diff);  // while other layers are still quantized the outputs differ
}

TEST(QatAnalysis, DequantizingEveryLayerOfSlimquantPtqRestoresFloat) {
  test::SingleThread single_thread;
  auto ptq = test::calibrated_ptq("resnet_small");
  expect_restores_float(ptq->convert(), "name:");
}

TEST(QatAnalysis, DequantizingEveryLayerOfOrtStyleQdqRestoresFloat) {
  test::SingleThread single_thread;
  auto ptq = test::calibrated_ptq("resnet_small");
  expect_restores_float(ort_style(ptq->convert()), "position:");
}

TEST(QatAnalysis, GainsMatchWholeModelEvaluation) {
  test::SingleThread single_thread;
  auto ptq = test::calibrated_ptq("resnet_small", "abs_max");
  const ir::Graph q = ptq->convert();
  const ir::Graph f = ir::load_onnx(test::fixture_model("resnet_small"));
  auto data = data::open_dataset(test::fmnist("test", 128));
  test::TempDir tmp("qat");
  auto metric = analysis::make_metric("cosine");
  analysis::QatAnalysisOptions o;
  o.save_dir = tmp.path();
  o.batch_size = 64;
  auto report = analysis::analyze_qat(q, f, *data, *metric, o);
  ir::Graph fopt = f;
  runtime::optimize_graph(fopt);
  runtime::Session fp32(f);
  analysis::EvalOptions eo;
  eo.batch_size = 64;
  eo.reference = &fp32;
  runtime::Session qs(q);
  auto mq = metric->clone_empty();
  const double qat = analysis::evaluate(qs, *data, *mq, eo).value;
  EXPECT_NEAR(report.baseline, qat, 1e-3 * qat);
  ASSERT_EQ(report.ranked.size(), ptq->layers().size());
  for (const auto& l : report.ranked) {
    runtime::Session s(analysis::dequantize_layers(q, fopt, {l.name}));
    auto m = metric->clone_empty();
    const double whole = analysis::evaluate(s, *data, *m, eo).value;
    // Cosine errors near 3e-5 resolve float rounding: the whole model runs conv+Add fused, the
    // analysis runs from fed values unfused; 0.5% is rounding, a wrong layer is orders more.
    EXPECT_NEAR(l.metric, whole, 5e-3 * whole + 1e-9) << l.name;
    EXPECT_NEAR(l.delta, report.baseline - l.metric, 1e-12);  // cosine: lower is better, gain = drop in error
  }
  // Given qat_metric: gains are measured against it.
  o.qat_metric = 0.5;
  o.save_dir = tmp.path("given");
  auto given = analysis::analyze_qat(q, f, *data, *metric, o);
  EXPECT_EQ(given.baseline, 0.5);
  for (const auto& l : given.ranked) EXPECT_NEAR(l.delta, 0.5 - l.metric, 1e-12);
}

TEST(QatAnalysis, EvalFunctionPathMatchesTheMetricAndResumesAfterAnException) {
  test::SingleThread single_thread;
  auto ptq = test::calibrated_ptq("resnet_small", "abs_max");
  const ir::Graph q = ptq->convert();
  const ir::Graph f = ir::load_onnx(test::fixture_model("resnet_small"));
  auto data = data::open_dataset(test::fmnist("test", 128));
  test::TempDir tmp("qat_fn");
  auto metric = analysis::make_metric("top1");
  analysis::QatAnalysisOptions o;
  o.save_dir = tmp.path("metric");
  o.batch_size = 64;
  auto by_metric = analysis::analyze_qat(q, f, *data, *metric, o);

  size_t calls = 0, fail_at = 0;
  auto fn = [&](runtime::Session& s) {
    if (++calls == fail_at) throw std::runtime_error("eval_function failed");
    auto m = analysis::make_metric("top1");
    analysis::EvalOptions eo;
    eo.batch_size = 64;
    return analysis::evaluate(s, *data, *m, eo).value;
  };
  o.save_dir = tmp.path("fn");
  fail_at = 4;  // the quantized model and two layers done
  EXPECT_THROW(analysis::analyze_qat(q, f, fn, true, o), std::runtime_error);
  ASSERT_TRUE(std::filesystem::exists(tmp.path("fn/analysis_checkpoint.json")));
  calls = 0;
  fail_at = 0;
  o.resume = true;
  auto by_fn = analysis::analyze_qat(q, f, fn, true, o);
  EXPECT_EQ(calls, ptq->layers().size() - 2) << "only the unfinished layers are evaluated again";
  EXPECT_EQ(by_fn.baseline, by_metric.baseline);
  ASSERT_EQ(by_fn.ranked.size(), by_metric.ranked.size());
  // top-1 of whole models and of the sweep's fed values agree (float rounding never flips 128 argmaxes here).
  for (size_t i = 0; i < by_fn.ranked.size(); ++i) {
    EXPECT_EQ(by_fn.ranked[i].name, by_metric.ranked[i].name);
    EXPECT_EQ(by_fn.ranked[i].metric, by_metric.ranked[i].metric);
  }
  // Without resume the run starts over.
  calls = 0;
  o.resume = false;
  analysis::analyze_qat(q, f, fn, true, o);
  EXPECT_EQ(calls, ptq->layers().size() + 1);
}

TEST(QatAnalysis, FloatModelAsQuantModelIsRejected) {
  test::SingleThread single_thread;
  const ir::Graph f = ir::load_onnx(test::fixture_model("resnet_small"));
  auto data = data::open_dataset(test::fmnist("test", 32));
  test::TempDir tmp("qat_float");
  auto metric = analysis::make_metric("top1");
  analysis::QatAnalysisOptions o;
  o.save_dir = tmp.path();
  try {
    analysis::analyze_qat(f, f, *data, *metric, o);
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("no quantized layer"), std::string::npos) << e.what();
  }
}

// A wrong --float-model is refused, naming the first mismatch, instead of lending its weights by
// position: another architecture, and the right one with one weight of another shape (found by
// name for slimquant's QDQ, by position for ONNX Runtime-style names).
TEST(QatAnalysis, WrongFloatModelIsRefusedNamingTheMismatch) {
  test::SingleThread single_thread;
  auto ptq = test::calibrated_ptq("resnet_small");
  const ir::Graph q = ptq->convert();
  auto data = data::open_dataset(test::fmnist("test", 32));
  test::TempDir tmp("qat_wrong_float");
  auto metric = analysis::make_metric("cosine");
  analysis::QatAnalysisOptions o;
  o.save_dir = tmp.path();
  auto expect_refused = [](const std::function<void()>& f, const std::string& words) {
    try {
      f();
      FAIL() << "the wrong float model was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument) << e.what();
      EXPECT_NE(std::string(e.what()).find("does not match the quantized model"), std::string::npos) << e.what();
      EXPECT_NE(std::string(e.what()).find(words), std::string::npos) << e.what();
    }
  };
  const ir::Graph other = ir::load_onnx(test::fixture_model("mobilenetv2_small"));
  expect_refused([&] { analysis::analyze_qat(q, other, *data, *metric, o); }, "");

  ir::Graph f = ir::load_onnx(test::fixture_model("resnet_small"));
  runtime::optimize_graph(f);
  const auto conv = std::find_if(f.nodes.begin(), f.nodes.end(), [](const ir::Node& n) { return n.op_type == "Conv"; });
  ASSERT_NE(conv, f.nodes.end());
  const std::string weight = conv->inputs.at(1);
  Shape shape = f.initializer(weight)->shape();
  shape[0] += 1;
  f.initializers[weight] = Tensor(DType::kFloat32, shape);
  std::set<std::string> all;
  for (const auto& l : analysis::find_quantized_layers(q, {"conv2d", "mul"})) all.insert(l.name);
  expect_refused([&] { analysis::dequantize_layers(q, f, all); }, "the float model's '" + weight + "' is float32" + shape_str(shape));
  const ir::Graph ort = ort_style(q);
  std::set<std::string> all_ort;
  for (const auto& l : analysis::find_quantized_layers(ort, {"conv2d", "mul"})) all_ort.insert(l.name);
  expect_refused([&] { analysis::dequantize_layers(ort, f, all_ort); }, "input '" + weight + "' is float32" + shape_str(shape));
}

}  // namespace
