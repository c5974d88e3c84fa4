#pragma once
// Pieces every subcommand shares: the data flags, model loading, JSON output, exit codes.
#include <CLI/CLI.hpp>
#include <nlohmann/json.hpp>

#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "slimquant/analysis/metric.h"
#include "slimquant/analysis/user_metric.h"
#include "slimquant/data/dataset.h"
#include "slimquant/ir/graph.h"
#include "slimquant/quant/quant_config.h"
#include "slimquant/runtime/session.h"

namespace slimquant::cli {

// Raw text of the data flags; turned into data::DataOptions after parsing.
struct DataFlags {
  std::string dataset;  // empty: the command's default
  std::string mean, stddev, resize, channel_order = "rgb";
  size_t limit = 0;
  int channels = 0;
  std::vector<std::string> side_inputs;  // NAME=FILE.npy
  // `model` supplies the side inputs' ranks (without it, side arrays must be [N, ...] or [1, ...]).
  // Throws kInvalidArgument when no data set is given, naming `needed_by` (e.g. "quantize: the
  // calibration"): there is no default data set.
  data::DataOptions options(const std::string& needed_by, const ir::Graph* model = nullptr) const;
};

// --dataset, --mean, --std, --resize, --channel-order, --limit, --channels, --side-input; also accepts the data
// set as a positional DATA argument (same syntax as --dataset).
void add_data_flags(CLI::App* app, DataFlags& flags, std::string& positional);

// The PTQ settings `quantize`, `analyze` and `qat` share (seed parameter names as flags). Empty or
// zero: not given, the config file's (or quant::QuantConfig's default) value stays.
struct PtqFlags {
  std::string algo, weight_type, op_types, skip_tensors, deploy_backend, activation_quantize_type;
  std::vector<std::string> skip_nodes;
  std::vector<std::string> node_modes;  // --node-mode PATTERN=MODE (calibration set only)
  size_t batch_size = 32, batch_nums = 10;
  bool full = false;
  float hist_percent = 0;
  int weight_bits = 0;
};
// Which of the PTQ flags a command takes.
enum class PtqFlagSet {
  kCalibration,  // all (quantize, analyze)
  kQat,          // what QAT's initial calibration and layer selection use: --algo, --weight-bits,
                 // --quantizable-op-type, --skip-tensor-list, --skip-nodes
};
// --algo, --hist-percent, --batch-size, --batch-nums, --weight-quantize-type, --weight-bits, --deploy-backend,
// --activation-quantize-type, --quantizable-op-type, --is-full-quantize, --skip-tensor-list, --skip-nodes,
// --node-mode.
void add_ptq_flags(CLI::App* app, PtqFlags& flags, PtqFlagSet set = PtqFlagSet::kCalibration);
// The flags given override `config` (the YAML's settings); checks the observer names, weight_bits
// and op types before any work.
void apply_ptq_flags(const PtqFlags& flags, quant::QuantConfig& config);
// Calibration batch size and count: the flag when given on `cmd`, else the config file's
// batch_size / batch_nums (its flow keys, `config_extra`), else the flag's default.
struct CalibrationBatches {
  size_t batch_size, batch_nums;
};
CalibrationBatches calibration_batches(const PtqFlags& flags, const CLI::App& cmd,
                                       const std::map<std::string, std::string>& config_extra);

// Flags bound to the fields of a staged copy of a library options struct, so that the help text
// shows the struct's own defaults (CLI11's default capture) and no default is restated here.
// apply() copies into the real options only the flags given on the command line: a config file's
// settings stay where no flag overrides them. `field` names the field, e.g.
// [](train::QATOptions& o) -> auto& { return o.epochs; }.
template <class Options>
class OptionsFlags {
 public:
  template <class Field>
  CLI::Option* add_option(CLI::App* app, const std::string& name, Field field, const std::string& help) {
    CLI::Option* option = app->add_option(name, field(staged_), help)->capture_default_str();
    appliers_.push_back([option, field](Options& given, Options& to) {
      using T = std::decay_t<decltype(field(given))>;
      if constexpr (std::is_same_v<T, std::string>)
        if (field(given).empty()) return;  // an empty text is no setting
      if (option->count() > 0) field(to) = field(given);
    });
    return option;
  }
  template <class Field>
  CLI::Option* add_flag(CLI::App* app, const std::string& name, Field field, const std::string& help) {
    CLI::Option* option = app->add_flag(name, field(staged_), help);
    appliers_.push_back([option, field](Options&, Options& to) {
      if (option->count() > 0) field(to) = true;
    });
    return option;
  }
  void apply(Options& to) {
    for (const auto& apply_flag : appliers_) apply_flag(staged_, to);
  }

 private:
  Options staged_;  // CLI11 parses into its fields
  std::vector<std::function<void(Options&, Options&)>> appliers_;
};

ir::Graph load_model_arg(const std::string& path);
std::vector<std::string> graph_input_names(const ir::Graph& g);

// The last line a command prints with --json.
void print_json(const nlohmann::json& j);
// The line saying that `metric` compares a model chosen or decided by its data (quant::selection_inputs)
// at the `values` its outputs come from.
void print_measured_values_note(const std::string& metric, size_t values);

// Process exit codes by error kind (documented in README).
int exit_code_for(ErrorKind kind);
// The exit code for any exception that reaches main, after printing "error: ..." on stderr: our
// Error by kind, and every other type mapped to one of README's codes (never 1 or a library's own).
int report_exception(std::exception_ptr e);

// Flag validators, so a negative count never wraps to 2^64-1 and nonsense fails at parse time
// (exit 2) with a message naming the flag.
const CLI::Validator& positive_integer();      // 1, 2, ...
const CLI::Validator& non_negative_integer();  // 0, 1, ...
const CLI::Validator& positive_number();       // > 0, finite
const CLI::Validator& non_negative_number();   // >= 0, finite
CLI::Validator integer_range(long long lo, long long hi);
CLI::Validator number_range(double lo, double hi);

// The file or directory a data set spec reads (images:LIST -> LIST, npy:DIR -> DIR), "" for
// built-in data sets: outputs are checked against it.
std::string data_spec_path(const std::string& spec);

// Config-file (YAML) values, checked like the flags (quant_config.h).
using quant::parse_config_bool;
using quant::parse_config_double;
using quant::parse_config_size;

// The model file a MODEL argument names: an .onnx file, or a directory holding exactly one .onnx
// file (or `model_filename`). Throws kIo when it does not exist, kUnsupported (exit 4) with the
// paddle2onnx command for a Paddle model (.pdmodel, .pdiparams, __model__, or a folder holding one
// and no .onnx), kInvalidArgument naming what was expected otherwise. Commands resolve it first so
// outputs can be checked against it.
std::string resolve_model_file(const std::string& model, const std::string& model_filename = "");

// "a,b,,c" -> {a, b, c}: comma-separated flag values (op types, tensor names).
std::vector<std::string> split_list(const std::string& text);

// Latency of session.run(feeds): `warmup` untimed runs, then the median and minimum of `runs`.
struct Timing {
  double median_ms = 0, min_ms = 0;
};
Timing time_runs(runtime::Session& session, const std::map<std::string, Tensor>& feeds, int runs, int warmup = 3);

// --metric's help text, listing every metric and what it needs.
extern const char* const kMetricHelp;
// --keys FILE: the key file recognition metrics (ctc_exact, ctc_char) decode with.
void add_keys_flag(CLI::App* app, std::string& keys);
// The metric --metric names, with --keys; fails (exit 5, or 7 for an unreadable key file) before any work.
std::unique_ptr<analysis::Metric> make_cli_metric(const std::string& name, const std::string& keys_file);
// kInvalidArgument naming the metric, the data set and what is missing when `data` lacks the labels
// `metric` reads (class labels or text labels).
void check_metric_labels(const analysis::Metric& metric, const data::Dataset& data);

// --eval-command CMD, --eval-key NAME, --metric-direction higher|lower: the user's own evaluation
// program instead of a built-in --metric (analysis::command_metric).
struct EvalCommandFlags {
  std::string command, key = "metric", direction = "higher";
  CLI::Option* option = nullptr;  // --eval-command, once added
  bool given() const { return !command.empty(); }
  analysis::CommandMetricOptions options() const;
};
// Adds the three flags; --eval-key and --metric-direction need --eval-command, which excludes `metric_flag`.
void add_eval_command_flags(CLI::App* app, EvalCommandFlags& flags, CLI::Option* metric_flag);

// Subcommand registration; each returns the action to run after parsing.
using Action = std::function<int()>;
Action register_info(CLI::App& app);
Action register_run(CLI::App& app);
Action register_eval(CLI::App& app);
Action register_bench(CLI::App& app);
Action register_quantize(CLI::App& app);
Action register_qat(CLI::App& app);
Action register_analyze(CLI::App& app);
Action register_analyze_qat(CLI::App& app);

}  // namespace slimquant::cli
