// PTQ analysis speed and target-metric figures on the fixture models (docs/analysis.md).
//
//   build/bench/analysis_speed [--limit N] [--metric top1] [--models resnet_small,...] [--no-target] [--cpu-time]
//       [--data SPEC --calib SPEC --calib-limit N --calib-batch N --algo A --brute-layers K]
//
// For each model: calibrate once (default KL, 10 batches of 32 Fashion-MNIST training images), run
// the analysis on the first N test images, then evaluate every single-layer QDQ model whole, as peers
// do per layer (minus their re-calibration), and report  ratio = analysis time / (layers x mean time
// of one full evaluation). Then a target-metric search with the target halfway between all-INT8 and
// FP32.
// A --models entry ending in .onnx is a model file (any model: --data / --calib give its data, e.g.
// npy:DIR); --brute-layers K evaluates only K evenly spaced layers whole (a large model at high
// resolution, where one whole evaluation costs the same for every layer) and scales their mean.
#include <chrono>
#include <ctime>
#include <cstring>
#include <filesystem>
#include <iomanip>
#include <iostream>
#include <sstream>

#include "slimquant/analysis/evaluate.h"
#include "slimquant/analysis/ptq_analysis.h"
#include "slimquant/analysis/target_search.h"
#include "slimquant/core/progress.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"

using namespace slimquant;

namespace {

// Wall time, or with --cpu-time the process CPU time (all threads): on a shared, overloaded machine
// CPU time measures the work done, wall time mostly measures the neighbours.
bool g_cpu_time = false;
struct Stamp {
  std::chrono::steady_clock::time_point wall = std::chrono::steady_clock::now();
  std::clock_t cpu = std::clock();
};
double seconds_since(const Stamp& t0) {
  if (g_cpu_time) return static_cast<double>(std::clock() - t0.cpu) / CLOCKS_PER_SEC;
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0.wall).count();
}

}  // namespace

int main(int argc, char** argv) {
  size_t limit = 2000, batch = 64, calib_limit = 320, calib_batch = 32, brute_layers = 0;
  std::string metric_name = "top1", models = "resnet_small,mobilenetv2_small,vit_small";
  std::string eval_spec = "fashion-mnist:test", calib_spec = "fashion-mnist:train", algo = "KL";
  bool target = true;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--limit" && i + 1 < argc) limit = std::stoul(argv[++i]);
    else if (a == "--metric" && i + 1 < argc) metric_name = argv[++i];
    else if (a == "--models" && i + 1 < argc) models = argv[++i];
    else if (a == "--batch" && i + 1 < argc) batch = std::stoul(argv[++i]);
    else if (a == "--data" && i + 1 < argc) eval_spec = argv[++i];
    else if (a == "--calib" && i + 1 < argc) calib_spec = argv[++i];
    else if (a == "--calib-limit" && i + 1 < argc) calib_limit = std::stoul(argv[++i]);
    else if (a == "--calib-batch" && i + 1 < argc) calib_batch = std::stoul(argv[++i]);
    else if (a == "--algo" && i + 1 < argc) algo = argv[++i];
    else if (a == "--brute-layers" && i + 1 < argc) brute_layers = std::stoul(argv[++i]);
    else if (a == "--no-target") target = false;
    else if (a == "--cpu-time") g_cpu_time = true;
    else {
      std::cerr << "usage: analysis_speed [--limit N] [--metric NAME] [--models a,b|FILE.onnx] [--batch N] [--no-target]"
                   " [--cpu-time] [--data SPEC] [--calib SPEC] [--calib-limit N] [--calib-batch N] [--algo A]"
                   " [--brute-layers K]\n";
      return 2;
    }
  }
  Progress::set_enabled(false);
  const std::string root = SLIMQUANT_SOURCE_DIR;
  std::stringstream list(models);
  std::string model;
  while (std::getline(list, model, ',')) {
    quant::QuantRule rule;
    rule.activation = algo;
    quant::PTQ ptq{quant::QuantConfig(rule)};
    const bool is_file = model.ends_with(".onnx");
    ptq.quantize(ir::load_onnx(is_file ? model : root + "/tests/fixtures/models/" + model + ".onnx"));
    if (is_file) model = std::filesystem::path(model).stem().string();
    data::DataOptions co;
    co.spec = calib_spec;
    co.limit = calib_limit;
    auto calib = data::open_dataset(co);
    data::BatchLoader cl(*calib, calib_batch);
    Stamp t0;
    for (size_t i = 0; i < cl.num_batches(); ++i) ptq.sample(cl.batch(i).inputs);
    const double calib_s = seconds_since(t0);
    data::DataOptions eo_data;
    eo_data.spec = eval_spec;
    eo_data.limit = limit;
    auto data = data::open_dataset(eo_data);
    auto metric = analysis::make_metric(metric_name);
    const std::string dir = std::filesystem::temp_directory_path() / ("slimquant_bench_" + model);
    std::filesystem::remove_all(dir);
    analysis::PtqAnalysisOptions po;
    po.batch_size = batch;
    po.save_dir = dir;
    t0 = Stamp();
    auto report = analysis::analyze_ptq(ptq, *data, *metric, po);
    const double analysis_s = seconds_since(t0);

    // Peers' way (without their re-calibration): every single-layer model evaluated whole.
    runtime::Session fp32(ptq.float_graph());
    analysis::EvalOptions eo;
    eo.batch_size = batch;
    eo.reference = &fp32;
    t0 = Stamp();
    {
      auto m = metric->clone_empty();
      analysis::evaluate(fp32, *data, *m, eo);
    }
    const double fp32_eval_s = seconds_since(t0);
    double brute_s = 0, max_diff = 0;
    std::map<std::string, double> fast;
    for (const auto& l : report.ranked) fast[l.name] = l.metric;
    const size_t n = ptq.layers().size();
    const size_t step = brute_layers == 0 || brute_layers >= n ? 1 : n / brute_layers;
    size_t evaluated = 0;
    for (size_t li = 0; li < n; li += step) {
      const auto& layer = ptq.layers()[li];
      ++evaluated;
      t0 = Stamp();
      ir::Graph g = ptq.convert(std::set<std::string>{layer.name});
      analysis::prepare_for_sweep(g);
      runtime::Session s(std::move(g));
      auto m = metric->clone_empty();
      const double v = analysis::evaluate(s, *data, *m, eo).value;
      brute_s += seconds_since(t0);
      max_diff = std::max(max_diff, std::abs(v - fast.at(layer.name)));
    }
    const double one_eval = brute_s / static_cast<double>(evaluated);
    if (evaluated < n) brute_s = one_eval * static_cast<double>(n);
    std::cout << std::fixed << std::setprecision(3);
    std::cout << "## " << model << "\n"
              << "layers " << n << ", samples " << report.samples << ", calibration " << calib_s << " s\n"
              << "analysis " << analysis_s << " s; one full evaluation of a single-layer model " << one_eval
              << " s (FP32 model " << fp32_eval_s << " s); brute force all layers " << brute_s << " s"
              << (evaluated < n ? " (" + std::to_string(evaluated) + " layers evaluated, scaled)" : std::string()) << "\n"
              << "ratio analysis / (layers x one evaluation) = " << analysis_s / (static_cast<double>(n) * one_eval)
              << "  (vs FP32 evaluations: " << analysis_s / (static_cast<double>(n) * fp32_eval_s) << ")\n"
              << "max |fast - brute force| metric difference " << std::setprecision(6) << max_diff << "\n"
              << "fp32 " << metric->name() << ' ' << report.baseline << "; top 5 layers:\n";
    for (size_t i = 0; i < report.ranked.size() && i < 5; ++i)
      std::cout << "  " << i + 1 << ". " << report.ranked[i].name << " (" << report.ranked[i].op_type << ") "
                << report.ranked[i].metric << " loss " << report.ranked[i].delta << "\n";
    if (target) {
      runtime::Session int8 = quant::make_int8_session(ptq.convert());
      auto m = metric->clone_empty();
      const double all_int8 = analysis::evaluate(int8, *data, *m, eo).value;
      analysis::TargetSearchOptions to;
      to.batch_size = batch;
      to.save_dir = dir;
      to.target = metric->needs_reference() ? all_int8 + (metric->higher_is_better() ? 6.0 : -0.5 * all_int8)
                                            : (all_int8 + report.baseline) / 2;
      t0 = Stamp();
      auto r = analysis::search_target(ptq, report, *data, *metric, to);
      const auto& best = r.candidates[r.best];
      std::cout << "target " << to.target << " (all INT8 " << all_int8 << ", fp32 " << r.fp32_metric << "): "
                << (r.met ? "met" : "NOT met") << " with " << best.metric << ", skipping " << best.skipped.size()
                << " layer(s):";
      for (const auto& s : best.skipped) std::cout << ' ' << s;
      std::cout << "\n  " << r.candidates.size() << " candidates in " << std::setprecision(2) << seconds_since(t0)
                << " s; latency " << std::setprecision(3) << best.latency_ms << " ms/batch of " << batch
                << " (all INT8 " << r.candidates.front().latency_ms << ", fp32 " << r.fp32_latency_ms << "), size "
                << best.model_bytes << " bytes (all INT8 " << r.candidates.front().model_bytes << ", fp32 "
                << r.fp32_model_bytes << ")\n";
    }
    std::cout << std::endl;
    std::filesystem::remove_all(dir);
  }
  return 0;
}
