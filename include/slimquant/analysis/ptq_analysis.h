#pragma once
// Layer sensitivity analysis.
//
// sweep_layers() is the engine shared by the PTQ analysis (quantize one layer at a time, seed 000)
// and the QAT analysis (de-quantize one layer at a time, seed 001). Every variant differs from a
// base graph in one place. Per batch, the base graph runs once and keeps the values each variant's
// changed part reads (the "boundary": values computed identically in both graphs); each variant's
// Session is then fed those values and executes only the nodes downstream of its change. Batch outer
// loop, variants inner: memory stays bounded by one batch's activations, and the metric states are
// checkpointed after every batch.
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "slimquant/analysis/metric.h"
#include "slimquant/analysis/user_metric.h"
#include "slimquant/data/dataset.h"
#include "slimquant/ir/graph.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/runtime/session.h"

namespace slimquant::analysis {

struct LayerVariant {
  std::string layer;    // node name
  std::string op_type;
  ir::Graph graph;      // the base graph with this one layer changed
};

struct SweepOptions {
  size_t batch_size = 64;
  std::string checkpoint_path;  // "" = no checkpoint
  nlohmann::json fingerprint;   // what the checkpoint must match
  bool resume = true;           // continue from a matching checkpoint (a foreign one is always refused)
  std::string progress_label = "analyze";
  int num_threads = 0;
};

struct SweepResult {
  double base_metric = 0;             // the base graph's metric
  std::vector<double> layer_metric;   // one per variant, in the variants' order
  size_t samples = 0;
  double seconds = 0;                 // this run only (a resumed run counts from its restart)
  size_t batches = 0, batches_resumed = 0;
  // Layers' models run in part before their last input arrived, to let go of the inputs they held
  // (a value the base run computes late: see src/analysis/layer_stages.h).
  size_t early_stages = 0;
};

// Evaluates `base` and every variant on `data` with `metric` (its empty clones). Fidelity metrics
// compare against `reference` (the FP32 model); nullptr = the base graph's own outputs (PTQ, where
// the base is the FP32 model). Throws kInvalidArgument when the metric needs labels the data lacks.
SweepResult sweep_layers(const ir::Graph& base, const std::vector<LayerVariant>& variants, const data::Dataset& data,
                         const Metric& metric, const ir::Graph* reference, const SweepOptions& options = {});

// The values `variant` must be fed so that only its changed part runs: values both graphs compute
// identically (same nodes on the same inputs, transitively) that the variant's other nodes read.
// Constants are never part of it. Both graphs must be optimised the same way.
std::vector<std::string> boundary_values(const ir::Graph& base, const ir::Graph& variant);

// One layer's result.
struct LayerSensitivity {
  std::string name, op_type;
  double metric = 0;  // metric of the model with only this layer changed
  // PTQ: loss against FP32 (positive = worse). QAT: gain over the quantized model's metric when
  // this layer is de-quantized (positive = this layer's quantization costs that much).
  double delta = 0;
  size_t index = 0;  // position in the model's layer list
};

struct SensitivityReport {
  std::string kind;       // "ptq" or "qat"
  std::string metric;
  bool higher_is_better = true;
  double baseline = 0;    // PTQ: FP32 metric; QAT: the quantized model's metric (qat_metric)
  std::vector<LayerSensitivity> ranked;  // most damaging first
  size_t samples = 0;
  double seconds = 0;
  size_t batches_resumed = 0;
  nlohmann::json extra;    // anything the caller adds (model, data, config)
  nlohmann::json timings;  // measured times the caller adds (calibration_seconds, ...)
  // analysis.json: everything but measured times, so the same command writes the same bytes.
  nlohmann::json to_json() const;
  // analysis_timing.json: "seconds" and the caller's timings.
  nlohmann::json timing_json() const;
  // analysis.txt: a header line ("# ptq analysis, metric top1 (higher is better), fp32 0.9...")
  // naming the metric, then one line per layer in rank order: name, op type, metric (tab separated).
  std::string to_text() const;
};

// Ranks the sweep's results: most damaging first, ties in model order.
SensitivityReport rank_layers(const std::string& kind, const std::vector<LayerVariant>& variants, const SweepResult& sweep,
                              const Metric& metric, double baseline);

// analysis.txt, analysis.json and analysis_timing.json into save_dir (created if missing), atomically.
void write_report(const SensitivityReport& report, const std::string& save_dir);

struct PtqAnalysisOptions {
  size_t batch_size = 64;
  std::string save_dir = "analysis_results";
  std::string checkpoint_name = "analysis_checkpoint.json";  // "" = no checkpoint
  int num_threads = 0;
  // Extra fingerprint entries (e.g. the calibration data and its batching), so a checkpoint is
  // only reused for the same calibration.
  nlohmann::json fingerprint_extra = nlohmann::json::object();
};

// The PTQ analysis (seed 000): `ptq` already calibrated; every layer quantized alone with the
// calibrated scales (no re-calibration), evaluated on `data`, ranked by the loss against FP32.
// Writes analysis.txt / analysis.json and keeps the checkpoint in save_dir (a rerun with the same
// inputs resumes, or just rewrites the outputs when the checkpoint is complete).
SensitivityReport analyze_ptq(const quant::PTQ& ptq, const data::Dataset& data, const Metric& metric,
                              const PtqAnalysisOptions& options = {});

// Same with a user evaluation function (`eval_function` in the source: any double(Session&)). No
// prefix reuse is possible through an opaque function, so each layer's model is evaluated whole;
// the checkpoint records finished layers.
SensitivityReport analyze_ptq(const quant::PTQ& ptq, const std::function<double(runtime::Session&)>& eval_function,
                              bool higher_is_better, const PtqAnalysisOptions& options = {});

// Same with a UserMetric (user_metric.h: e.g. --eval-command), given each candidate as an ONNX
// graph: the FP32 model, then the QDQ model with only that layer quantized. The checkpoint records
// finished layers; a failing evaluation keeps them and propagates its exception.
SensitivityReport analyze_ptq(const quant::PTQ& ptq, const UserMetric& metric, const PtqAnalysisOptions& options = {});

// The variant graphs the PTQ analysis evaluates (one per layer, weights' DequantizeLinear folded
// into float constants for speed: the values are the ones the QDQ graph computes).
std::vector<LayerVariant> ptq_variants(const quant::PTQ& ptq);

// Fingerprint of a calibrated PTQ: model bytes, config, and every activation scale.
nlohmann::json ptq_fingerprint(const quant::PTQ& ptq);

// Prepares a graph for the sweep: optimised, constant weight DequantizeLinear folded.
void prepare_for_sweep(ir::Graph& g);

}  // namespace slimquant::analysis
