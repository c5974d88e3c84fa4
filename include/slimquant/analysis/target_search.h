#pragma once
// Target metric search (seed 000's "coming soon"): the quantized model that meets a target metric
// while leaving as few layers as possible in float. Guided by the PTQ analysis ranking: skip the
// k most damaging layers for growing k (1, 2, 4, ...), bisect to the smallest k that meets the
// target, then try to quantize again each skipped layer, least damaging first. Candidates are
// evaluated with slimquant's integer execution (the model users deploy); the best model so far is
// always saved, even when the target cannot be met.
#include <functional>
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "slimquant/analysis/metric.h"
#include "slimquant/analysis/ptq_analysis.h"
#include "slimquant/data/dataset.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::analysis {

// What the search does with a layer static INT8 hurts (`analyze --fallback-mode`):
// - kFloat: leave it float (the search as it always was).
// - kWeightOnly: first try it weight-only (its weight INT8 behind a DequantizeLinear, its
//   activations float: PTQ::convert_layers mixes both forms in one model), float only when that
//   is not enough. Layers without a constant weight, or not static in the analysis' own modes
//   (QuantConfig::mode / node_modes), go straight to float.
// - kDynamic: first try it dynamic (ONNX Runtime's quantize_dynamic form: its input quantized per
//   inference, PTQ::convert_layers mixes it with the static layers), float only when that is not
//   enough. Layers the dynamic form cannot take (PTQ::dynamic_applies), or not static in the
//   analysis' own modes, go straight to float.
enum class FallbackMode { kFloat, kWeightOnly, kDynamic };
// float | weight-only (weight_only) | dynamic, else kInvalidArgument
FallbackMode parse_fallback_mode(const std::string& name);
const char* fallback_mode_name(FallbackMode mode);

struct TargetSearchOptions {
  double target = 0;
  size_t batch_size = 64;
  std::string save_dir = "analysis_results";
  std::string model_name = "target_model.onnx";  // best model so far, in save_dir
  int latency_runs = 10;                         // timed runs of one batch per candidate (median)
  size_t max_evaluations = 64;
  int num_threads = 0;
  FallbackMode fallback = FallbackMode::kFloat;
};

struct TargetCandidate {
  std::vector<std::string> skipped;  // layers left in float, most damaging first
  // Layers in weight-only mode (FallbackMode::kWeightOnly) or dynamic mode (kDynamic), most
  // damaging first; every other layer is in its own mode (static unless the config says otherwise).
  std::vector<std::string> weight_only;
  std::vector<std::string> dynamic;
  double metric = 0;
  bool meets = false;
  double latency_ms = 0;   // one batch of batch_size, integer execution, median
  size_t model_bytes = 0;  // serialized ONNX
  std::string stage;       // "int8", "prefix", "bisect", "refine"
  // Every layer's mode in this candidate: "float", "weight-only", "dynamic" or its own mode's name ("static").
  std::map<std::string, std::string> layer_modes(const quant::PTQ& ptq) const;
};

struct TargetSearchResult {
  double target = 0;
  std::string metric;
  bool higher_is_better = true;
  double fp32_metric = 0;
  double fp32_latency_ms = 0;
  size_t fp32_model_bytes = 0;
  std::string fallback_mode = "float";        // fallback_mode_name(TargetSearchOptions::fallback)
  std::map<std::string, std::string> layer_modes;  // the best candidate's, by layer
  std::vector<TargetCandidate> candidates;  // in evaluation order
  size_t best = 0;                          // index into candidates
  bool met = false;
  std::string model_path;
  // The same choice as `quantize --skip-tensor-list` tensors (checked to select exactly these
  // layers), empty when no tensor list expresses it; `--skip-nodes` with the layer names always does.
  std::vector<std::string> skip_tensor_list;
  // target_search.json and the table hold no measured time (the same command writes the same
  // bytes); latencies go to target_search_timing.json.
  nlohmann::json to_json() const;
  nlohmann::json timing_json() const;
  std::string table() const;  // candidates as a text table
};

// The graph of a candidate: ptq's layers in their own modes, `weight_only` in weight-only mode,
// `dynamic` in dynamic mode and `skipped` float (PTQ::convert_layers).
ir::Graph candidate_graph(const quant::PTQ& ptq, const std::vector<std::string>& skipped,
                          const std::vector<std::string>& weight_only, const std::vector<std::string>& dynamic = {});

// `ptq` calibrated; `ranking` its PTQ analysis. Writes the best model (model_name), the candidates
// table (target_candidates.txt) and target_search.json into save_dir after every evaluation.
TargetSearchResult search_target(const quant::PTQ& ptq, const SensitivityReport& ranking, const data::Dataset& data,
                                 const Metric& metric, const TargetSearchOptions& options);

// Same search with a user evaluation function (the Python package's eval_function) called on each
// candidate's INT8 session (and the FP32 one); latencies are measured on `timing_feeds` when given
// (0 otherwise). An exception from eval_function ends the search; the best model so far and the
// candidates table are already saved.
TargetSearchResult search_target(const quant::PTQ& ptq, const SensitivityReport& ranking,
                                 const std::function<double(runtime::Session&)>& eval_function, bool higher_is_better,
                                 const TargetSearchOptions& options,
                                 const std::map<std::string, Tensor>* timing_feeds = nullptr);

// Same with a UserMetric (user_metric.h: e.g. --eval-command): the FP32 model and each candidate QDQ
// model are given to it whole; latencies are not measured (0).
TargetSearchResult search_target(const quant::PTQ& ptq, const SensitivityReport& ranking, const UserMetric& metric,
                                 const TargetSearchOptions& options);

// Tensors whose `skip_tensor_list` entry makes `config` skip exactly `layers` of ptq (one tensor per
// layer, read or written by no other layer), or empty when some layer has none.
std::vector<std::string> equivalent_skip_tensors(const quant::PTQ& ptq, const std::vector<std::string>& layers);

}  // namespace slimquant::analysis
