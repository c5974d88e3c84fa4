// analyze / analyze-qat: per-layer quantization sensitivity (seeds 000 and 001) from the command line.
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <span>
#include <sstream>

#include "cli/common.h"
#include "slimquant/analysis/analysis_plots.h"
#include "slimquant/analysis/checkpoint.h"
#include "slimquant/analysis/ptq_analysis.h"
#include "slimquant/analysis/qat_analysis.h"
#include "slimquant/analysis/statistics.h"
#include "slimquant/analysis/target_search.h"
#include "slimquant/core/distributed.h"
#include "slimquant/core/progress.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/algo_choice.h"
#include "slimquant/quant/calibration.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::cli {
namespace {

// A shell word, quoted only when it needs to be.
std::string shell_word(const std::string& s) {
  if (!s.empty() && s.find_first_not_of("abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_-./:,=+@%") ==
                        std::string::npos)
    return s;
  std::string out = "'";
  for (char c : s) out += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return out + "'";
}

size_t parse_size(const std::string& v, const std::string& key) { return parse_config_size(v, key); }
double parse_double(const std::string& v, const std::string& key) { return parse_config_double(v, key); }
bool parse_bool(const std::string& v, const std::string& key) { return parse_config_bool(v, key); }

// A string key of the YAML file; the sources' configs write None for "not set".
std::string yaml_string(const std::map<std::string, std::string>& extra, const std::string& key) {
  auto it = extra.find(key);
  if (it == extra.end() || it->second == "None" || it->second == "null" || it->second == "~") return "";
  return it->second;
}

// A metric value for the console: 4 decimals, or 3 significant digits for the small values that
// fidelity metrics take (a cosine distance of 1e-5 must not print as 0.0000).
std::string format_metric(double v) {
  std::ostringstream os;
  if (v != 0 && std::abs(v) < 0.01) os << std::scientific << std::setprecision(2) << v;
  else os << std::fixed << std::setprecision(4) << v;
  return os.str();
}

// "cosine" is a distance (1 - cosine similarity); say so where it is printed.
std::string metric_label(const std::string& metric) { return metric == "cosine" ? "cosine distance" : metric; }

void print_ranking(const analysis::SensitivityReport& r, size_t top) {
  const char* what = r.kind == "qat" ? "gain" : "loss";
  for (size_t i = 0; i < r.ranked.size() && i < top; ++i) {
    const auto& l = r.ranked[i];
    std::cout << "  " << std::setw(2) << i + 1 << ". " << l.name << " (" << l.op_type << ")  " << metric_label(r.metric)
              << ' ' << format_metric(l.metric) << "  " << what << ' ' << format_metric(l.delta) << '\n';
  }
}

// Checks early that save_dir can be created and written, before any time is spent.
void check_save_dir(const std::string& dir) {
  namespace fs = std::filesystem;
  std::error_code ec;
  fs::create_directories(dir, ec);
  SQ_CHECK(fs::is_directory(dir), ErrorKind::kIo,
           "cannot create --save-dir '" + dir + "'" + (ec ? ": " + ec.message() : std::string()));
  const fs::path probe = fs::path(dir) / ".slimquant_write_test";
  {
    std::ofstream f(probe);
    SQ_CHECK(f.good(), ErrorKind::kIo, "--save-dir '" + dir + "' is not writable");
  }
  fs::remove(probe, ec);
}

}  // namespace

Action register_analyze(CLI::App& app) {
  auto* cmd = app.add_subcommand("analyze", "PTQ sensitivity analysis: quantize one layer at a time and rank the layers");
  struct Args {
    std::string model, data, eval_data, config_path, metric, keys, save_dir, checkpoint_name, model_filename, params_filename;
    DataFlags flags;
    PtqFlags ptq;
    EvalCommandFlags eval_command;
    size_t eval_batch_size = 64;
    long num_plots = 10;
    double target = 0;
    std::string fallback_mode = "float";
    bool has_target = false, statistics = false, json = false;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("MODEL", a->model, "FP32 ONNX model (.onnx file or directory; or model_dir in --config)");
  add_data_flags(cmd, a->flags, a->data);
  auto* metric_flag = cmd->add_option("--metric", a->metric, std::string(kMetricHelp) + "; default top1");
  add_eval_command_flags(cmd, a->eval_command, metric_flag);
  add_keys_flag(cmd, a->keys);
  cmd->add_option("--eval-dataset", a->eval_data, "data set the layers are evaluated on (default: DATA)");
  cmd->add_option("--eval-batch-size", a->eval_batch_size, "evaluation batch size")->capture_default_str()->check(positive_integer());
  cmd->add_option("--save-dir", a->save_dir, "output directory (default analysis_results)");
  cmd->add_option("--checkpoint-name", a->checkpoint_name, "checkpoint file in save_dir (default analysis_checkpoint.json)");
  auto* plots_flag = cmd->add_option("--num-histogram-plots", a->num_plots, "best/worst layers plotted per PDF (0 = none)")
                        ->capture_default_str()
                        ->check(non_negative_integer());
  cmd->add_option("--config", a->config_path, "YAML: model_dir, model_filename, params_filename, save_dir, "
                                              "checkpoint_name, num_histogram_plots, target_metric, fallback_mode, "
                                              "ptq_config: {...}");
  auto* target = cmd->add_option("--target-metric", a->target, "find the model with fewest float layers meeting this metric")
                     ->check(number_range(-1e300, 1e300));
  auto* fallback_flag = cmd->add_option("--fallback-mode", a->fallback_mode,
                  "--target-metric: a layer static INT8 hurts is left float, or first tried weight-only (its weight "
                  "INT8, activations float) or dynamic (its input quantized per inference) in a model mixing the forms")
      ->capture_default_str()
      ->check(CLI::IsMember({"float", "weight-only", "dynamic"}));
  cmd->add_flag("--statistics", a->statistics, "also per-layer FP32 vs quantized statistics and SQNR (CSV + JSON)");
  cmd->add_option("--model-filename", a->model_filename, "model file inside a MODEL directory");
  cmd->add_option("--params-filename", a->params_filename, "external-data file inside a MODEL directory");
  add_ptq_flags(cmd, a->ptq);
  cmd->add_option("--threads", a->threads, "threads (0 = all cores)")->check(non_negative_integer());
  cmd->add_flag("--json", a->json, "print a JSON object as the last line");
  return [=] {
    a->has_target = target->count() > 0;
    quant::QuantConfig config;
    std::map<std::string, std::string> extra;
    if (!a->config_path.empty()) config = quant::load_quant_config_yaml(a->config_path, config, &extra);
    auto from = [&](const std::string& key, const std::string& flag) { return !flag.empty() ? flag : yaml_string(extra, key); };
    std::string model = a->model, data_spec = a->data;
    if (!yaml_string(extra, "model_dir").empty()) {
      // With model_dir in the config a single positional argument is the data.
      if (!model.empty() && data_spec.empty() && a->flags.dataset.empty()) data_spec = model, model.clear();
      if (model.empty()) model = extra["model_dir"];
    }
    SQ_CHECK(!model.empty(), ErrorKind::kInvalidArgument, "analyze needs a MODEL (or model_dir in --config)");
    const std::string save_dir = from("save_dir", a->save_dir).empty() ? "analysis_results" : from("save_dir", a->save_dir);
    const std::string checkpoint_name = from("checkpoint_name", a->checkpoint_name).empty()
                                            ? "analysis_checkpoint.json"
                                            : from("checkpoint_name", a->checkpoint_name);
    // The flag, else the config's key, else the flag's default.
    const size_t num_plots = plots_flag->count() == 0 && !yaml_string(extra, "num_histogram_plots").empty()
                                 ? parse_size(extra["num_histogram_plots"], "num_histogram_plots")
                                 : static_cast<size_t>(a->num_plots);
    const std::string metric_name = from("metric", a->metric).empty() ? "top1" : from("metric", a->metric);
    const bool has_target = a->has_target || !yaml_string(extra, "target_metric").empty();
    const double target_value = a->has_target ? a->target : has_target ? parse_double(extra["target_metric"], "target_metric") : 0;
    // The flag, else the config's fallback_mode, else float (checked before any work).
    const analysis::FallbackMode fallback = analysis::parse_fallback_mode(
        fallback_flag->count() == 0 && !yaml_string(extra, "fallback_mode").empty() ? extra["fallback_mode"]
                                                                                   : a->fallback_mode);
    const auto [batch_size, batch_nums] = calibration_batches(a->ptq, *cmd, extra);
    apply_ptq_flags(a->ptq, config);  // flags given explicitly override the config file
    SQ_CHECK(batch_size > 0 && a->eval_batch_size > 0, ErrorKind::kInvalidArgument, "batch sizes must be at least 1");
    // The user's evaluation program, or a built-in metric; unknown names fail before any work.
    std::optional<analysis::UserMetric> user_metric;
    std::unique_ptr<analysis::Metric> metric;
    if (a->eval_command.given()) user_metric = analysis::command_metric(a->eval_command.options());
    else metric = make_cli_metric(metric_name, a->keys);
    const std::string metric_shown = user_metric ? user_metric->name : metric_label(metric->name());
    // One process per save_dir: two analyses writing one checkpoint and report would mix or lose results.
    // Distributed: rank 0 alone writes there.
    std::optional<analysis::DirectoryLock> save_dir_lock;
    if (distributed::is_root()) check_save_dir(save_dir), save_dir_lock.emplace(save_dir, "--save-dir");

    DataFlags flags = a->flags;
    if (!data_spec.empty()) flags.dataset = data_spec;
    if (flags.dataset.empty() && extra.count("data")) flags.dataset = extra["data"];
    if (flags.limit == 0 && extra.count("limit")) flags.limit = parse_size(extra["limit"], "limit");
    resolve_model_file(model, from("model_filename", a->model_filename));  // a clear error for devices, FIFOs, ambiguous folders
    ir::Graph graph = ir::load_model(model, from("model_filename", a->model_filename), from("params_filename", a->params_filename));
    auto calib = data::open_dataset(flags.options("analyze: the calibration", &graph));
    std::unique_ptr<data::Dataset> eval_owned;
    if (!a->eval_data.empty()) {
      DataFlags eval_flags = flags;
      eval_flags.dataset = a->eval_data;
      eval_owned = data::open_dataset(eval_flags.options("analyze: --eval-dataset", &graph));
    }
    const data::Dataset& eval_set = eval_owned ? *eval_owned : *calib;
    if (metric) check_metric_labels(*metric, eval_set);

    quant::PTQ ptq(config);
    ptq.quantize(graph);
    // algo auto: layers are ranked under the observer quantize would choose, compared on samples
    // the observers have not seen (after the calibrated ones, else the last batch, observed after).
    const size_t candidates = ptq.selectable_activation_algos().size();
    quant::CalibrationLoopOptions lo;
    if (batch_nums > 0) lo.batch_nums = batch_nums;
    if (candidates > 0) {
      lo.first_rows = quant::algo_choice_samples(calib->size(), candidates);
      lo.held_back_rows = [candidates](size_t calibrated) { return quant::algo_choice_samples(calibrated, candidates); };
    }
    // Distributed: every rank calibrates on its block of batches, then the observers are merged.
    const auto source = quant::dataset_calibration_source(*calib, batch_size, graph.inputs);
    quant::CalibrationRun calibration = quant::calibrate(ptq, *source, lo);
    if (distributed::is_root())
      for (const auto& w : calibration.warnings) std::cerr << "warning: " << w << "\n";
    quant::ActivationAlgoChoice algo_choice;
    if (candidates > 0) {
      const bool unseen = !calibration.held_back.empty();
      const size_t rows = quant::algo_choice_samples(calibration.calibrated_samples, candidates);
      const runtime::BatchAxes batch_axes = runtime::input_batch_axes(graph.inputs);
      algo_choice = quant::choose_activation_algo(
          ptq, unseen ? calibration.held_back : quant::leading_rows(calibration.first_rows, rows, batch_axes), unseen);
      if (distributed::is_root())
        std::cout << "activation observer: auto chose " << algo_choice.describe() << "; --algo NAME fixes one" << std::endl;
    }
    quant::finish_calibration(ptq, calibration);
    const size_t batches = calibration.batches;
    const double calib_seconds = calibration.seconds;

    analysis::PtqAnalysisOptions po;
    po.batch_size = a->eval_batch_size;
    po.save_dir = save_dir;
    po.checkpoint_name = checkpoint_name;
    po.num_threads = a->threads;
    po.fingerprint_extra = {{"calibration", calib->name() + " x" + std::to_string(calib->size())},
                            {"calibration_batches", std::to_string(batches) + "x" + std::to_string(batch_size)}};
    if (!algo_choice.chosen.empty()) po.fingerprint_extra["activation_algo"] = algo_choice.chosen;
    if (user_metric) po.fingerprint_extra["eval_command"] = {{"command", a->eval_command.command}, {"key", a->eval_command.key}};
    auto t0 = std::chrono::steady_clock::now();
    analysis::SensitivityReport report = user_metric ? analysis::analyze_ptq(ptq, *user_metric, po)
                                                     : analysis::analyze_ptq(ptq, eval_set, *metric, po);
    const double analysis_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    report.timings["calibration_seconds"] = calib_seconds;
    report.timings["analysis_seconds"] = analysis_seconds;
    report.extra["model"] = model;
    if (!algo_choice.chosen.empty()) report.extra["activation_algo"] = algo_choice.chosen;
    if (user_metric) {
      report.extra["eval_command"] = a->eval_command.command;
      report.extra["calibration"] = calib->name();
    }
    analysis::write_report(report, save_dir);
    if (user_metric)
      std::cout << "analyzed " << report.ranked.size() << " layers with --eval-command in " << std::fixed
                << std::setprecision(2) << analysis_seconds << " s"
                << (report.batches_resumed ? " (resumed after " + std::to_string(report.batches_resumed) + " layers)" : "");
    else
      std::cout << "analyzed " << report.ranked.size() << " layers on " << report.samples << " samples of "
                << eval_set.name() << " in " << std::fixed << std::setprecision(2) << analysis_seconds << " s"
                << (report.batches_resumed ? " (resumed after " + std::to_string(report.batches_resumed) + " batches)" : "");
    std::cout << "; fp32 " << metric_shown << " " << format_metric(report.baseline) << "\n";
    std::cout.unsetf(std::ios::floatfield);
    if (const auto m = report.extra.find("outputs_measured_at"); m != report.extra.end())
      print_measured_values_note(metric_shown, m->size());
    std::cout << "most damaging layers:\n";
    print_ranking(report, 5);
    std::cout << "ranking -> " << (std::filesystem::path(save_dir) / "analysis.txt").string() << std::endl;
    nlohmann::json j = report.to_json();
    j.update(report.timing_json());
    j.erase("layers");
    j["top"] = nlohmann::json::array();
    for (size_t i = 0; i < report.ranked.size() && i < 5; ++i) j["top"].push_back(report.ranked[i].name);
    j["save_dir"] = save_dir;

    if (num_plots > 0 && distributed::is_root()) {
      data::BatchLoader plot_loader(*calib, batch_size);
      const std::string main_input = data::main_input_name(graph_input_names(graph), *calib);
      auto calibration_batches = [&](const auto& visit) {
        for (size_t b = 0; b < std::min(batches, plot_loader.num_batches()); ++b) visit(plot_loader.batch(b).feeds(main_input));
      };
      auto pdfs = analysis::write_analysis_histograms(ptq, report, calibration_batches, num_plots, save_dir);
      std::cout << "histograms -> " << pdfs.size() << " PDFs in " << save_dir << std::endl;
      j["pdfs"] = pdfs;
    }
    if (a->statistics && distributed::is_root()) {
      analysis::StatisticsOptions so;
      so.batch_size = a->eval_batch_size;
      analysis::run_layer_statistics(ptq, eval_set, save_dir, so);
      std::cout << "statistics -> " << (std::filesystem::path(save_dir) / "statistics.csv").string() << std::endl;
      j["statistics"] = (std::filesystem::path(save_dir) / "statistics.json").string();
    }
    if (has_target) {
      analysis::TargetSearchOptions to;
      to.target = target_value;
      to.batch_size = a->eval_batch_size;
      to.save_dir = save_dir;
      to.num_threads = a->threads;
      to.fallback = fallback;
      auto r = user_metric ? analysis::search_target(ptq, report, *user_metric, to)
                           : analysis::search_target(ptq, report, eval_set, *metric, to);
      const auto& best = r.candidates[r.best];
      std::cout << (r.met ? "target met" : "target NOT met (best model saved anyway)") << ": " << r.metric << ' '
                << best.metric << " (target " << target_value << ", fp32 " << r.fp32_metric << ", all INT8 "
                << r.candidates.front().metric << ") with " << best.skipped.size() << " of " << report.ranked.size()
                << " layers in float, "
                << (to.fallback == analysis::FallbackMode::kWeightOnly
                        ? std::to_string(best.weight_only.size()) + " weight-only, "
                        : std::string())
                << (to.fallback == analysis::FallbackMode::kDynamic ? std::to_string(best.dynamic.size()) + " dynamic, "
                                                                    : std::string())
                << r.candidates.size() << " candidates -> " << r.model_path << "\n"
                << "candidates -> " << (std::filesystem::path(save_dir) / "target_candidates.txt").string() << "\n";
      // The quantize command that rebuilds the chosen model: same model, calibration and config.
      std::ostringstream base;
      base << "slimquant quantize " << shell_word(model) << ' ' << shell_word(calib->name());
      if (!a->model_filename.empty() || !a->params_filename.empty())
        std::cout << "note: pass the model file itself to quantize (model_filename/params_filename)\n";
      if (flags.limit) base << " --limit " << flags.limit;
      if (!flags.mean.empty()) base << " --mean " << shell_word(flags.mean);
      if (!flags.stddev.empty()) base << " --std " << shell_word(flags.stddev);
      if (!flags.resize.empty()) base << " --resize " << shell_word(flags.resize);
      if (flags.channel_order != "rgb") base << " --channel-order " << flags.channel_order;
      if (flags.channels) base << " --channels " << flags.channels;
      for (const auto& side : flags.side_inputs) base << " --side-input " << shell_word(side);
      if (!a->config_path.empty()) base << " --config " << shell_word(a->config_path);
      base << " --batch-size " << batch_size << " --batch-nums " << batch_nums;
      if (!a->ptq.algo.empty()) base << " --algo " << shell_word(a->ptq.algo);
      if (a->ptq.hist_percent > 0) base << " --hist-percent " << a->ptq.hist_percent;
      if (!a->ptq.weight_type.empty()) base << " --weight-quantize-type " << shell_word(a->ptq.weight_type);
      if (a->ptq.weight_bits > 0) base << " --weight-bits " << a->ptq.weight_bits;
      if (!a->ptq.op_types.empty()) base << " --quantizable-op-type " << shell_word(a->ptq.op_types);
      if (a->ptq.full) base << " --is-full-quantize";
      for (const auto& p : a->ptq.skip_nodes) base << " --skip-nodes " << shell_word(p);
      for (const auto& p : a->ptq.node_modes) base << " --node-mode " << shell_word(p);
      for (const auto& l : best.weight_only) base << " --node-mode " << shell_word(l + "=weight-only");
      for (const auto& l : best.dynamic) base << " --node-mode " << shell_word(l + "=dynamic");
      base << " -o " << shell_word((std::filesystem::path(save_dir) / "target_model_requantized.onnx").string());
      std::string user_tensors = a->ptq.skip_tensors;
      std::ostringstream by_nodes, by_tensors;
      by_nodes << base.str();
      if (!user_tensors.empty()) by_nodes << " --skip-tensor-list " << shell_word(user_tensors);
      for (const auto& l : best.skipped) by_nodes << " --skip-nodes " << shell_word(l);
      std::cout << "reproduce with:\n  " << by_nodes.str() << "\n";
      j["target"] = r.to_json();
      j["target"].update(r.timing_json());
      j["target"]["command"] = by_nodes.str();
      if (!best.skipped.empty() && !r.skip_tensor_list.empty()) {
        std::string tensors = user_tensors;
        for (const auto& t : r.skip_tensor_list) tensors += (tensors.empty() ? "" : ",") + t;
        by_tensors << base.str() << " --skip-tensor-list " << shell_word(tensors);
        std::cout << "or:\n  " << by_tensors.str() << "\n";
        j["target"]["command_skip_tensor_list"] = by_tensors.str();
      }
      std::cout << std::flush;
    }
    if (a->json) print_json(j);
    return 0;
  };
}

Action register_analyze_qat(CLI::App& app) {
  auto* cmd = app.add_subcommand("analyze-qat", "QAT analysis: de-quantize one layer at a time of a QDQ model and rank the layers");
  struct Args {
    std::string quant_model, float_model, data, config_path, metric, keys, save_dir, checkpoint_name, op_types, model_filename,
        params_filename;
    DataFlags flags;
    EvalCommandFlags eval_command;
    size_t batch_size = 64;
    double qat_metric = 0;
    bool resume = false, json = false;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--quant-model", a->quant_model, "quantized QDQ ONNX model (quant_model_dir)");
  cmd->add_option("--float-model", a->float_model, "its float ONNX model (float_model_dir)");
  add_data_flags(cmd, a->flags, a->data);
  auto* qat_metric = cmd->add_option("--qat-metric", a->qat_metric, "the quantized model's metric (computed when not given)")
                         ->check(number_range(-1e300, 1e300));
  cmd->add_flag("--resume", a->resume, "continue from the checkpoint in save_dir");
  auto* metric_flag = cmd->add_option("--metric", a->metric, std::string(kMetricHelp) + "; default top1");
  add_eval_command_flags(cmd, a->eval_command, metric_flag);
  add_keys_flag(cmd, a->keys);
  cmd->add_option("--save-dir", a->save_dir, "output directory (default analysis_results)");
  cmd->add_option("--checkpoint-name", a->checkpoint_name, "checkpoint file in save_dir (default analysis_checkpoint.json)");
  cmd->add_option("--quantizable-op-type", a->op_types, "op types analysed (default Conv,MatMul,Gemm)");
  cmd->add_option("--config", a->config_path, "YAML: quant_model_dir, float_model_dir, model_filename, params_filename, "
                                              "quantizable_op_type, qat_metric, save_dir, resume");
  cmd->add_option("--model-filename", a->model_filename, "model file inside model directories");
  cmd->add_option("--params-filename", a->params_filename, "external-data file inside model directories");
  cmd->add_option("--batch-size", a->batch_size, "evaluation batch size")->capture_default_str()->check(positive_integer());
  cmd->add_option("--threads", a->threads, "threads (0 = all cores)")->check(non_negative_integer());
  cmd->add_flag("--json", a->json, "print a JSON object as the last line");
  return [=] {
    quant::QuantConfig config;
    std::map<std::string, std::string> extra;
    if (!a->config_path.empty()) config = quant::load_quant_config_yaml(a->config_path, config, &extra);
    auto from = [&](const std::string& key, const std::string& flag) { return !flag.empty() ? flag : yaml_string(extra, key); };
    const std::string quant_path = from("quant_model_dir", a->quant_model), float_path = from("float_model_dir", a->float_model);
    SQ_CHECK(!quant_path.empty(), ErrorKind::kInvalidArgument, "analyze-qat needs --quant-model (or quant_model_dir in --config)");
    SQ_CHECK(!float_path.empty(), ErrorKind::kInvalidArgument, "analyze-qat needs --float-model (or float_model_dir in --config)");
    analysis::QatAnalysisOptions o;
    o.save_dir = from("save_dir", a->save_dir).empty() ? "analysis_results" : from("save_dir", a->save_dir);
    o.checkpoint_name = from("checkpoint_name", a->checkpoint_name).empty() ? "analysis_checkpoint.json"
                                                                            : from("checkpoint_name", a->checkpoint_name);
    o.resume = a->resume || (extra.count("resume") && parse_bool(extra["resume"], "resume"));
    if (qat_metric->count()) o.qat_metric = a->qat_metric;
    else if (!yaml_string(extra, "qat_metric").empty())
      o.qat_metric = parse_double(extra["qat_metric"], "qat_metric");
    o.quantizable_op_type = !a->op_types.empty() ? split_list(a->op_types) : config.quantizable_op_type;
    o.batch_size = a->batch_size;
    o.num_threads = a->threads;
    SQ_CHECK(o.batch_size > 0, ErrorKind::kInvalidArgument, "--batch-size must be at least 1");
    const std::string metric_name = from("metric", a->metric).empty() ? "top1" : from("metric", a->metric);
    std::optional<analysis::UserMetric> user_metric;
    std::unique_ptr<analysis::Metric> metric;
    if (a->eval_command.given()) {
      user_metric = analysis::command_metric(a->eval_command.options());
      o.fingerprint_extra["eval_command"] = {{"command", a->eval_command.command}, {"key", a->eval_command.key}};
    } else {
      metric = make_cli_metric(metric_name, a->keys);
    }
    std::optional<analysis::DirectoryLock> save_dir_lock;
    if (distributed::is_root()) check_save_dir(o.save_dir), save_dir_lock.emplace(o.save_dir, "--save-dir");
    if (!o.resume && !o.checkpoint_name.empty() &&
        std::filesystem::exists(std::filesystem::path(o.save_dir) / o.checkpoint_name))
      std::cerr << "note: starting over without --resume: checkpoint '"
                << (std::filesystem::path(o.save_dir) / o.checkpoint_name).string() << "' is replaced" << std::endl;
    DataFlags flags = a->flags;
    if (!a->data.empty()) flags.dataset = a->data;
    if (flags.dataset.empty() && extra.count("data")) flags.dataset = extra["data"];
    if (flags.limit == 0 && extra.count("limit")) flags.limit = parse_size(extra["limit"], "limit");
    const std::string mf = from("model_filename", a->model_filename), pf = from("params_filename", a->params_filename);
    resolve_model_file(quant_path, std::filesystem::is_directory(quant_path) ? mf : "");
    resolve_model_file(float_path, std::filesystem::is_directory(float_path) ? mf : "");
    ir::Graph quant = ir::load_model(quant_path, std::filesystem::is_directory(quant_path) ? mf : "", std::filesystem::is_directory(quant_path) ? pf : "");
    ir::Graph flt = ir::load_model(float_path, std::filesystem::is_directory(float_path) ? mf : "", std::filesystem::is_directory(float_path) ? pf : "");
    analysis::SensitivityReport report;
    if (user_metric) {
      // The user's program reads its own data: DATA is not used.
      SQ_CHECK(flags.dataset.empty(), ErrorKind::kInvalidArgument,
               "analyze-qat: --eval-command evaluates the models itself; DATA is not used with it");
      report = analysis::analyze_qat(quant, flt, *user_metric, o);
      std::cout << "analyzed " << report.ranked.size() << " quantized layers with --eval-command in " << std::fixed
                << std::setprecision(2) << report.seconds << " s"
                << (report.batches_resumed ? " (resumed after " + std::to_string(report.batches_resumed) + " layers)" : "");
    } else {
      auto data = data::open_dataset(flags.options("analyze-qat: the evaluation", &flt));
      check_metric_labels(*metric, *data);
      report = analysis::analyze_qat(quant, flt, *data, *metric, o);
      std::cout << "analyzed " << report.ranked.size() << " quantized layers on " << report.samples << " samples of "
                << data->name() << " in " << std::fixed << std::setprecision(2) << report.seconds << " s"
                << (report.batches_resumed ? " (resumed after " + std::to_string(report.batches_resumed) + " batches)" : "");
    }
    std::cout << "; qat " << (user_metric ? user_metric->name : metric_label(metric->name())) << " "
              << format_metric(report.baseline)
              << (o.qat_metric ? " (given)" : " (computed)") << "\n";
    std::cout.unsetf(std::ios::floatfield);
    std::cout << "layers whose quantization costs most:\n";
    print_ranking(report, 5);
    std::cout << "ranking -> " << (std::filesystem::path(o.save_dir) / "analysis.txt").string() << std::endl;
    if (a->json) {
      nlohmann::json j = report.to_json();
      j.update(report.timing_json());
      j.erase("layers");
      j.erase("restored_weights");
      j["top"] = nlohmann::json::array();
      for (size_t i = 0; i < report.ranked.size() && i < 5; ++i) j["top"].push_back(report.ranked[i].name);
      j["save_dir"] = o.save_dir;
      print_json(j);
    }
    return 0;
  };
}

}  // namespace slimquant::cli
