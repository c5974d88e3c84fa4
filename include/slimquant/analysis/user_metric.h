#pragma once
// A user's own evaluation of whole candidate models (the source documents' `eval_function`), for
// metrics slimquant does not compute itself: detection mAP, OCR accuracy with the user's decoder,
// anything an external program measures. The analyses and the target search take it in place of a
// built-in Metric; each candidate model is evaluated whole (no prefix reuse through an opaque
// function), and the checkpoints record every finished model.
#include <functional>
#include <string>

#include "slimquant/ir/graph.h"

namespace slimquant::analysis {

// Receives a candidate as a standard ONNX graph (QDQ where layers are quantized, loadable by any
// ONNX runtime once saved) and returns its metric.
using ModelEvalFunction = std::function<double(const ir::Graph& model)>;

struct UserMetric {
  std::string name = "eval_function";  // printed and written to the reports
  ModelEvalFunction evaluate;
  bool higher_is_better = true;
};

// --eval-command: a program run on each candidate model.
struct CommandMetricOptions {
  // Shell command line; every "{model}" is replaced by the candidate's .onnx path (shell-quoted).
  std::string command;
  // The last non-empty line of the command's standard output is a number, or a JSON object whose
  // `key` field (a number) is the metric.
  std::string key = "metric";
  bool higher_is_better = true;
  // Where candidates are written (a fresh directory inside it, removed afterwards); "" = the system's
  // temporary directory.
  std::string temp_dir;
};

// A UserMetric running `options.command`. Throws kInvalidArgument before any run when the command has
// no "{model}". Evaluations throw kInvalidArgument naming the command, its exit status and its last
// output line when it fails (non-zero exit, killed, no number on the last line, no `key` field).
UserMetric command_metric(const CommandMetricOptions& options);

// Runs `options.command` on the model file at `model_path` (the file is not copied) and returns its metric;
// throws like command_metric's evaluations.
double run_metric_command(const CommandMetricOptions& options, const std::string& model_path);

// The metric in a command's standard output (its last non-empty line, see CommandMetricOptions).
// Throws kInvalidArgument naming `command` when there is none.
double parse_metric_output(const std::string& output, const std::string& key, const std::string& command);

// `text` with every "{model}" replaced by `path` quoted for /bin/sh.
std::string substitute_model_path(const std::string& text, const std::string& path);

}  // namespace slimquant::analysis
