#pragma once
// QAT analysis (seed 001, metric_error_analyse): for every quantized layer of a QDQ model, remove
// that layer's quantization (the activation Q/DQ pair(s) feeding it, its weight DequantizeLinear,
// with the float weights restored from the float model), evaluate, and rank by the gain. Works on
// slimquant PTQ/QAT output and ONNX Runtime-style QDQ (int8 weights + DequantizeLinear, or float
// weights with QuantizeLinear -> DequantizeLinear, int32 biases).
#include <functional>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "slimquant/analysis/ptq_analysis.h"

namespace slimquant::analysis {

// A quantized layer as found in a QDQ graph.
struct QatLayer {
  std::string name, op_type;
  std::vector<std::string> activations;  // float tensors its activation Q/DQ pairs quantize
  // Where each restored constant input came from: "name:<float initializer>", "position:<op> #<k>
  // input <i>", or "dequantized (no float match)" when the float model has nothing that fits.
  std::vector<std::string> restored;
};

// Nodes of `quantizable_op_type` (ONNX or source names) that are quantized layers as the INT8
// lowering defines them (quant::match_quantized_layer: they read a DequantizeLinear output).
// Unnamed nodes are named after their first output (as the PTQ does).
std::vector<QatLayer> find_quantized_layers(const ir::Graph& quant, const std::vector<std::string>& quantizable_op_type);

// The quantized graph with `layers` de-quantized: their inputs read the float tensors ahead of the
// activation Q/DQ pairs (pairs other readers still use stay), and their constant inputs behind a
// DequantizeLinear are replaced by the float model's tensors, matched by initializer name (the
// quantized initializer's name or the Q input's name, with usual suffixes such as _quantized
// stripped), else by graph position (the k-th node of that op type, same input). `float_graph` must
// be optimised like the quantized model was built from (BatchNorm folded): analyze_qat does that.
// `info` receives one entry per de-quantized layer. Throws kInvalidArgument for an unknown layer.
ir::Graph dequantize_layers(const ir::Graph& quant, const ir::Graph& float_graph, const std::set<std::string>& layers,
                            std::vector<QatLayer>* info = nullptr);

struct QatAnalysisOptions {
  size_t batch_size = 64;
  std::string save_dir = "analysis_results";
  std::string checkpoint_name = "analysis_checkpoint.json";  // "" = no checkpoint
  bool resume = false;                     // seed 001: continue from the checkpoint only when asked
  std::optional<double> qat_metric;        // the quantized model's metric; computed when not given
  std::vector<std::string> quantizable_op_type = {"Conv", "ConvTranspose", "MatMul", "Gemm"};
  int num_threads = 0;
  // Extra checkpoint fingerprint entries (e.g. the evaluation command), so a checkpoint is only
  // reused for the same evaluation.
  nlohmann::json fingerprint_extra = nlohmann::json::object();
};

// Runs the analysis (reusing the quantized model's values upstream of each layer, see
// sweep_layers), writes analysis.txt / analysis.json into save_dir and returns the report. Fidelity
// metrics compare against the float model.
SensitivityReport analyze_qat(const ir::Graph& quant, const ir::Graph& float_model, const data::Dataset& data,
                              const Metric& metric, const QatAnalysisOptions& options = {});

// Same with a user evaluation function (seed 001's `eval_function`: any double(Session&)), called
// once for the quantized model (unless options.qat_metric is given) and once per layer on the
// whole de-quantized model. The checkpoint records finished layers after each one, so an exception
// thrown by eval_function leaves every finished layer saved (options.resume continues from them).
SensitivityReport analyze_qat(const ir::Graph& quant, const ir::Graph& float_model,
                              const std::function<double(runtime::Session&)>& eval_function, bool higher_is_better,
                              const QatAnalysisOptions& options = {});

// Same with a UserMetric (user_metric.h: e.g. --eval-command), given each candidate as an ONNX graph:
// the quantized model (only when qat_metric is not given), then the quantized model with that one layer
// de-quantized. The checkpoint records finished layers; a failing evaluation keeps them.
SensitivityReport analyze_qat(const ir::Graph& quant, const ir::Graph& float_model, const UserMetric& metric,
                              const QatAnalysisOptions& options = {});

}  // namespace slimquant::analysis
