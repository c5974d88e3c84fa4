// PTQ analysis: the fast sweep (prefix reuse) gives the same numbers as evaluating every
// single-layer-quantized model whole; checkpoints refuse foreign analyses; metric states resume.
#include <gtest/gtest.h>
#include <sys/wait.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <set>

#include "slimquant/analysis/checkpoint.h"
#include "slimquant/analysis/evaluate.h"
#include "slimquant/analysis/ptq_analysis.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "analysis/analysis_test_util.h"
#include "graph_builder.h"

using namespace slimquant;

namespace {

using test::fmnist;

std::unique_ptr<quant::PTQ> calibrated(const std::string& model, const std::string& algo = "KL") {
  return test::calibrated_ptq(model, algo);
}

// Brute force: every single-layer QDQ model evaluated whole, as peers do (minus re-calibration).
std::vector<double> brute_force(const quant::PTQ& ptq, const data::Dataset& data, const std::string& metric_name,
                                size_t batch_size) {
  runtime::Session fp32(ptq.float_graph());
  std::vector<double> out;
  for (const auto& layer : ptq.layers()) {
    runtime::Session s(ptq.convert(std::set<std::string>{layer.name}));
    auto m = analysis::make_metric(metric_name);
    analysis::EvalOptions eo;
    eo.batch_size = batch_size;
    eo.reference = &fp32;
    out.push_back(analysis::evaluate(s, data, *m, eo).value);
  }
  return out;
}

TEST(PtqAnalysis, MatchesBruteForcePerLayerEvaluation) {
  test::SingleThread single_thread;
  auto ptq = calibrated("resnet_small");
  auto data = data::open_dataset(fmnist("test", 128));
  test::TempDir tmp("ptq_bf");
  for (const std::string name : {"sqnr", "top1"}) {
    auto metric = analysis::make_metric(name);
    analysis::PtqAnalysisOptions o;
    o.batch_size = 64;
    o.save_dir = tmp.path(name);
    auto report = analysis::analyze_ptq(*ptq, *data, *metric, o);
    const auto expected = brute_force(*ptq, *data, name, 64);
    ASSERT_EQ(report.ranked.size(), expected.size());
    ASSERT_GE(expected.size(), 5u);
    for (const auto& l : report.ranked) {
      // SQNR near 60 dB resolves float rounding: the whole-model run fuses the residual Add into
      // its conv, the prefix-reuse run starts at fed values where no fusion applies.
      const double tol = name == "sqnr" ? 1e-3 * std::abs(expected[l.index]) : 0.0;
      EXPECT_NEAR(l.metric, expected[l.index], tol) << name << " layer " << l.name;
    }
    // Rank order: the brute-force numbers sorted the same way (most damaging first).
    for (size_t i = 1; i < report.ranked.size(); ++i) {
      const double prev = expected[report.ranked[i - 1].index], cur = expected[report.ranked[i].index];
      const double slack = name == "sqnr" ? 1e-4 * std::abs(cur) : 0.0;
      EXPECT_LE(prev, cur + slack) << "rank " << i;  // higher is better for both: worst (lowest) first
    }
    // analysis.txt: a header naming the metric, then one line per layer in rank order.
    std::ifstream txt(tmp.path(name + "/analysis.txt"));
    std::string line;
    ASSERT_TRUE(std::getline(txt, line));
    EXPECT_EQ(line.rfind("# ptq analysis, metric " + report.metric + " (", 0), 0u) << line;
    size_t lines = 0;
    while (std::getline(txt, line)) {
      ASSERT_LT(lines, report.ranked.size());
      EXPECT_EQ(line.substr(0, line.find('\t')), report.ranked[lines].name);
      ++lines;
    }
    EXPECT_EQ(lines, report.ranked.size());
    EXPECT_TRUE(std::filesystem::exists(tmp.path(name + "/analysis.json")));
  }
}

TEST(PtqAnalysis, VariantsRunOnlyDownstreamOfTheLayer) {
  test::SingleThread single_thread;
  auto ptq = calibrated("resnet_small", "abs_max");
  auto variants = analysis::ptq_variants(*ptq);
  ir::Graph base = ptq->float_graph();
  analysis::prepare_for_sweep(base);
  const std::string input = base.inputs.at(0).name;
  size_t fed_from_input = 0;
  for (const auto& v : variants) {
    auto boundary = analysis::boundary_values(base, v.graph);
    ASSERT_FALSE(boundary.empty()) << v.layer;
    fed_from_input += std::count(boundary.begin(), boundary.end(), input);
    // Every fed value exists in the base graph (computed there) and is not a constant.
    for (const auto& b : boundary) EXPECT_FALSE(base.is_initializer(b)) << b;
  }
  // Only the first layer reads the model input; all others start from intermediate values.
  EXPECT_EQ(fed_from_input, 1u);
}

// Networks where a layer's model reads a value the base run computes long after the layer's input.
// A side branch placed last (a U-Net's side outputs): the base run computes it as early as it can,
// so the chain's layers do not wait. Two long branches joined at the end: one branch's layers must wait for the
// other's result, so their models run in stages (LayerStages) while the base run goes on. Each
// layer's metric equals its model evaluated whole either way.
TEST(SweepLayers, LayersWaitingForALateValueMatchTheirWholeModels) {
  test::SingleThread single_thread;
  auto data = data::open_dataset(fmnist("test", 32));
  for (const bool two_branches : {false, true}) {
    SCOPED_TRACE(two_branches ? "two long branches" : "side branch placed last");
    std::mt19937 rng(11);
    test::GraphBuilder b;
    b.g.opset = 13;
    b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "n"}, {1, ""}, {28, ""}, {28, ""}}});
    const std::map<std::string, ir::AttributeValue> same{{"pads", std::vector<int64_t>{1, 1, 1, 1}}};
    auto chain = [&](int convs) {
      std::string v = b.node("Conv", {"x", b.constant(test::random_tensor({4, 1, 3, 3}, rng)),
                                      b.constant(test::random_tensor({4}, rng))}, same);
      for (int i = 1; i < convs; ++i) {
        v = b.node("Relu", {v});
        v = b.node("Conv", {v, b.constant(test::random_tensor({4, 4, 3, 3}, rng, -0.3f, 0.3f)),
                            b.constant(test::random_tensor({4}, rng))}, same);
      }
      return v;
    };
    const std::string main = chain(10);
    const std::string other =
        two_branches ? chain(10) : b.node("Conv", {"x", b.constant(test::random_tensor({4, 1, 1, 1}, rng))});
    b.g.outputs.push_back({b.node("Add", {main, other}), DType::kFloat32, {}});
    // Each variant scales one convolution's weights, as quantizing it would change them.
    std::vector<analysis::LayerVariant> variants;
    for (const ir::Node& n : b.g.nodes) {
      if (n.op_type != "Conv") continue;
      analysis::LayerVariant lv{n.name, n.op_type, b.g};
      Tensor w = lv.graph.initializers.at(n.inputs[1]).clone();  // graphs share tensor storage
      for (float& e : w.values<float>()) e *= 1.05f;
      lv.graph.initializers[n.inputs[1]] = w;
      variants.push_back(std::move(lv));
    }
    auto metric = analysis::make_metric("sqnr");
    analysis::SweepOptions so;
    so.batch_size = 16;
    const analysis::SweepResult sweep = analysis::sweep_layers(b.g, variants, *data, *metric, nullptr, so);
    // Side branch: only the side layer's own model waits (for the chain's end), once per batch.
    // Two branches: the first branch's layers wait for the second branch.
    if (two_branches) EXPECT_GE(sweep.early_stages, 10u);
    else EXPECT_EQ(sweep.early_stages, 2u);
    runtime::Session base(b.g);
    ASSERT_EQ(sweep.layer_metric.size(), variants.size());
    for (size_t i = 0; i < variants.size(); ++i) {
      runtime::Session whole(variants[i].graph);
      auto m = analysis::make_metric("sqnr");
      analysis::EvalOptions eo;
      eo.batch_size = 16;
      eo.reference = &base;
      const double expected = analysis::evaluate(whole, *data, *m, eo).value;
      EXPECT_NEAR(sweep.layer_metric[i], expected, 1e-3 * std::abs(expected)) << variants[i].layer;
    }
  }
}

TEST(PtqAnalysis, ForeignCheckpointIsRefused) {
  test::SingleThread single_thread;
  auto data = data::open_dataset(fmnist("test", 128));
  test::TempDir tmp("ptq_foreign");
  auto metric = analysis::make_metric("cosine");
  analysis::PtqAnalysisOptions o;
  o.save_dir = tmp.path();
  analysis::analyze_ptq(*calibrated("resnet_small", "abs_max"), *data, *metric, o);
  ASSERT_TRUE(std::filesystem::exists(tmp.path("analysis_checkpoint.json")));
  try {
    analysis::analyze_ptq(*calibrated("resnet_small", "min_max"), *data, *metric, o);
    FAIL() << "a checkpoint of another config was accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("belongs to a different analysis"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("config"), std::string::npos) << e.what();
  }
  // Another model is refused too.
  try {
    analysis::analyze_ptq(*calibrated("mobilenetv2_small", "abs_max"), *data, *metric, o);
    FAIL() << "a checkpoint of another model was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model"), std::string::npos) << e.what();
  }
}

TEST(PtqAnalysis, CompleteCheckpointIsNotRecomputed) {
  test::SingleThread single_thread;
  auto ptq = calibrated("resnet_small", "abs_max");
  auto data = data::open_dataset(fmnist("test", 128));
  test::TempDir tmp("ptq_done");
  auto metric = analysis::make_metric("top1_agreement");
  analysis::PtqAnalysisOptions o;
  o.save_dir = tmp.path();
  o.batch_size = 32;
  auto first = analysis::analyze_ptq(*ptq, *data, *metric, o);
  auto second = analysis::analyze_ptq(*ptq, *data, *metric, o);
  EXPECT_EQ(second.batches_resumed, 4u);
  EXPECT_EQ(first.to_text(), second.to_text());
}

// Seed 000: "pass the layers analysis.txt ranks worst to skip_tensor_list". Those are node names;
// exactly those layers stay in float, nothing else changes, and no entry warns as unmatched.
TEST(PtqAnalysis, SkipTensorListTakesTheLayerNamesTheAnalysisRanks) {
  test::SingleThread single_thread;
  auto ptq = calibrated("resnet_small", "abs_max");
  auto data = data::open_dataset(fmnist("test", 64));
  test::TempDir tmp("ptq_skip_names");
  auto metric = analysis::make_metric("top1_agreement");
  analysis::PtqAnalysisOptions o;
  o.save_dir = tmp.path();
  o.batch_size = 32;
  const auto report = analysis::analyze_ptq(*ptq, *data, *metric, o);
  ASSERT_GE(report.ranked.size(), 5u);
  std::set<std::string> worst;
  for (size_t i = 0; i < 3; ++i) worst.insert(report.ranked[i].name);

  quant::QuantConfig cfg = ptq->config();
  cfg.skip_tensor_list.assign(worst.begin(), worst.end());
  quant::PTQ skipping(cfg);
  skipping.quantize(ir::load_onnx(test::fixture_model("resnet_small")));
  EXPECT_TRUE(skipping.warnings().empty()) << skipping.warnings().front();
  std::vector<std::string> expected, got;
  for (const auto& l : ptq->layers())
    if (!worst.count(l.name)) expected.push_back(l.name);
  for (const auto& l : skipping.layers()) got.push_back(l.name);
  EXPECT_EQ(got, expected);
  EXPECT_EQ(got.size(), report.ranked.size() - 3);
}

TEST(MetricState, SaveLoadContinuesExactly) {
  test::SingleThread single_thread;
  auto data = data::open_dataset(fmnist("test", 96));
  runtime::Session s(ir::load_onnx(test::fixture_model("resnet_small")));
  data::BatchLoader loader(*data, 32);
  std::vector<data::Batch> batches;
  std::vector<Tensor> outs;
  for (size_t i = 0; i < 3; ++i) {
    batches.push_back(loader.batch(i));
    outs.push_back(s.run_single(batches.back().inputs));
  }
  for (const std::string name : {"top1", "top5", "cosine", "sqnr", "top1_agreement"}) {
    auto whole = analysis::make_metric(name), first = analysis::make_metric(name);
    // Reference: the outputs scaled, so fidelity metrics see a non-trivial difference.
    auto ref = [&](size_t i) {
      Tensor r = outs[i].clone();
      for (int64_t k = 0; k < r.numel(); ++k) r.data<float>()[k] *= 1.0f + 0.01f * static_cast<float>(k % 7);
      return r;
    };
    for (size_t i = 0; i < 3; ++i) whole->update(outs[i], batches[i].labels, ref(i));
    first->update(outs[0], batches[0].labels, ref(0));
    auto resumed = analysis::make_metric(name);
    resumed->load_state(nlohmann::json::parse(first->state().dump()));  // through text, as on disk
    for (size_t i = 1; i < 3; ++i) resumed->update(outs[i], batches[i].labels, ref(i));
    EXPECT_EQ(resumed->value(), whole->value()) << name;
    EXPECT_EQ(resumed->samples(), 96u) << name;
  }
}

TEST(Checkpoint, AtomicWriteAndUnwritableDirectory) {
  test::SingleThread single_thread;
  test::TempDir tmp("ckpt");
  analysis::Checkpoint c(tmp.path("c.json"), {{"model", "abc"}});
  EXPECT_TRUE(c.load().is_null());
  c.save({{"batches_done", 3}});
  EXPECT_EQ(c.load()["batches_done"], 3);
  for (const auto& e : std::filesystem::directory_iterator(tmp.path()))
    EXPECT_EQ(e.path().filename(), "c.json");  // no temporary file left behind
  try {
    analysis::write_file_atomic(tmp.path("missing/x.json"), "{}");
    FAIL();
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kIo);
  }
}

// A second analysis into a save_dir from the same process: once the first has finished, it runs,
// even when a child forked during the first (a data loader's worker) still holds a copy of the
// lock's descriptor; while the first still runs, the refusal says it is this process.
TEST(DirectoryLock, ReleasedForTheSameProcessEvenWithAForkedChildAlive) {
  test::TempDir tmp("lock_fork");
  int to_child[2];
  ASSERT_EQ(::pipe(to_child), 0);
  pid_t child = -1;
  {
    analysis::DirectoryLock first(tmp.path(), "save_dir");
    child = ::fork();
    ASSERT_GE(child, 0);
    if (child == 0) {  // inherits the lock's descriptor; waits until the parent closes the pipe
      ::close(to_child[1]);
      char byte;
      while (::read(to_child[0], &byte, 1) > 0) {
      }
      ::_exit(0);
    }
    ::close(to_child[0]);
    try {
      analysis::DirectoryLock nested(tmp.path(), "save_dir");
      ADD_FAILURE() << "a save_dir in use was locked twice";
    } catch (const Error& e) {
      EXPECT_EQ(e.kind(), ErrorKind::kIo);
      EXPECT_NE(std::string(e.what()).find("in use by this process (pid " + std::to_string(::getpid()) + ")"),
                std::string::npos)
          << e.what();
    }
  }
  // The child is still alive with its copy of the descriptor.
  ASSERT_EQ(::waitpid(child, nullptr, WNOHANG), 0);
  EXPECT_NO_THROW(analysis::DirectoryLock(tmp.path(), "save_dir"));
  ::close(to_child[1]);
  ::waitpid(child, nullptr, 0);
}

// A finished save_dir analysed again: the same evaluation rewrites the outputs after checking one
// model (one call), another evaluation (here the same metric on other data) is refused naming the
// save_dir and how to start over, and the stored results stay.
TEST(PtqAnalysis, FinishedSaveDirWithAnotherEvalFunctionIsRefused) {
  test::SingleThread single_thread;
  auto ptq = calibrated("resnet_small", "abs_max");
  test::TempDir tmp("ptq_fn_other");
  auto agreement_on = [&](size_t images, int& calls) {
    return [&calls, images, data = std::shared_ptr<data::Dataset>(data::open_dataset(fmnist("test", images)))](
               runtime::Session& s) {
      ++calls;
      auto m = analysis::make_metric("top1");
      return analysis::evaluate(s, *data, *m, {}).value;
    };
  };
  analysis::PtqAnalysisOptions o;
  o.save_dir = tmp.path();
  int first_calls = 0, again_calls = 0, other_calls = 0;
  const auto first = analysis::analyze_ptq(*ptq, agreement_on(64, first_calls), true, o);
  EXPECT_EQ(static_cast<size_t>(first_calls), ptq->layers().size() + 1);
  const auto again = analysis::analyze_ptq(*ptq, agreement_on(64, again_calls), true, o);
  EXPECT_EQ(again_calls, 1);
  EXPECT_EQ(again.to_text(), first.to_text());
  const std::string report = test::file_bytes(tmp.path("analysis.json"));
  try {
    analysis::analyze_ptq(*ptq, agreement_on(50, other_calls), true, o);
    FAIL() << "another evaluation reused the finished checkpoint";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    const std::string what = e.what();
    EXPECT_NE(what.find("save_dir '" + tmp.path() + "'"), std::string::npos) << what;
    EXPECT_NE(what.find("to start over"), std::string::npos) << what;
  }
  EXPECT_EQ(other_calls, 1);
  EXPECT_EQ(test::file_bytes(tmp.path("analysis.json")), report);
}

TEST(PtqAnalysis, EvalFunctionPathRanksLikeTheMetric) {
  test::SingleThread single_thread;
  auto ptq = calibrated("resnet_small", "abs_max");
  auto data = data::open_dataset(fmnist("test", 128));
  test::TempDir tmp("ptq_fn");
  runtime::Session fp32(ptq->float_graph());
  auto fn = [&](runtime::Session& s) {
    auto m = analysis::make_metric("sqnr");
    analysis::EvalOptions eo;
    eo.reference = &fp32;
    return analysis::evaluate(s, *data, *m, eo).value;
  };
  analysis::PtqAnalysisOptions o;
  o.save_dir = tmp.path("fn");
  auto by_fn = analysis::analyze_ptq(*ptq, fn, true, o);
  o.save_dir = tmp.path("metric");
  auto metric = analysis::make_metric("sqnr");
  auto by_metric = analysis::analyze_ptq(*ptq, *data, *metric, o);
  ASSERT_EQ(by_fn.ranked.size(), by_metric.ranked.size());
  std::map<std::string, double> expected;
  for (const auto& l : by_metric.ranked) expected[l.name] = l.metric;
  // The callable path evaluates whole models (conv+Add fused), the metric path runs from fed
  // values (unfused): float rounding apart, the same numbers.
  for (const auto& l : by_fn.ranked) EXPECT_NEAR(l.metric, expected.at(l.name), 1e-3 * std::abs(expected.at(l.name))) << l.name;
  EXPECT_NEAR(by_fn.baseline, 200.0, 1e-9);  // FP32 against itself: identical outputs
}

}  // namespace
