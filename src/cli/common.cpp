#include "cli/common.h"

#include <yaml-cpp/exceptions.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <chrono>
#include <iostream>
#include <new>
#include <optional>
#include <stdexcept>
#include <sstream>
#include <vector>

#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/session.h"

namespace slimquant::cli {

data::DataOptions DataFlags::options(const std::string& needed_by, const ir::Graph* model) const {
  // No silent default data set: a model calibrated or scored on data it was never meant for
  // (Fashion-MNIST) gives numbers that look valid and mean nothing.
  SQ_CHECK(!dataset.empty(), ErrorKind::kInvalidArgument,
           needed_by + " needs DATA: fashion-mnist[:train|:test], images:LIST_FILE or npy:DIR, as the DATA argument "
                       "or with --dataset");
  data::DataOptions o;
  o.spec = dataset;
  if (!mean.empty()) o.mean = data::parse_float_list(mean, "--mean");
  if (!stddev.empty()) o.stddev = data::parse_float_list(stddev, "--std");
  if (!resize.empty()) o.resize = data::parse_image_size(resize, "--resize");
  o.channel_order = data::parse_channel_order(channel_order, "--channel-order");
  o.limit = limit;
  o.channels = channels;
  const ir::Dim batch = model ? runtime::batch_dimension(model->inputs) : ir::Dim{};
  for (const auto& text : side_inputs) {
    data::SideInputSpec side = data::parse_side_input(text, "--side-input");
    if (model)
      for (const auto& in : model->inputs)
        if (in.name == side.name && in.dims) {
          side.model_rank = in.dims->size();
          side.model_scalar = in.dims->empty();
          // The batch axis the sessions split and join this input on (runtime::input_batch_axes).
          if (const std::optional<size_t> axis = runtime::declared_batch_axis(in, batch))
            side.model_batch_axis = *axis;
          else if (!in.dims->empty() && in.dims->front().known())
            side.model_first_dim = in.dims->front().value;
        }
    o.side_inputs.push_back(std::move(side));
  }
  // The samples feed the one input no side input names: a text model's token ids go in as its
  // integer type.
  if (model) {
    std::vector<const ir::ValueInfo*> fed_by_samples;
    for (const auto& in : model->inputs)
      if (!model->is_initializer(in.name) &&
          std::none_of(o.side_inputs.begin(), o.side_inputs.end(), [&](const auto& s) { return s.name == in.name; }))
        fed_by_samples.push_back(&in);
    const DType t = fed_by_samples.size() == 1 ? fed_by_samples[0]->dtype : DType::kFloat32;
    if (t == DType::kInt64 || t == DType::kInt32 || t == DType::kInt16 || t == DType::kInt8 || t == DType::kUInt8)
      o.sample_dtype = t;
  }
  return o;
}

// A default for the help text, as short as the number allows (0.99999, not 0.999990).
static std::string shortest_text(float value) {
  std::ostringstream os;
  os << value;
  return os.str();
}

void add_ptq_flags(CLI::App* app, PtqFlags& f, PtqFlagSet set) {
  const bool calibration = set == PtqFlagSet::kCalibration;
  app->add_option("--algo", f.algo, "activation observer: auto (each of emd, KL, mse, hist and avg calibrated, and the one whose INT8 "
                  "model stays closest to FP32 on samples held back from calibration kept; QAT: emd), emd, mse, KL, "
                  "hist, abs_max (direct), min_max, avg")
      ->default_str(quant::QuantRule().activation);
  if (calibration) {
    app->add_option("--hist-percent", f.hist_percent, "percentile for algo hist")
        ->default_str(shortest_text(quant::ObserverOptions().hist_percent))
        ->check(number_range(0.0, 1.0));
    app->add_option("--batch-size", f.batch_size, "calibration batch size")->capture_default_str()->check(positive_integer());
    app->add_option("--batch-nums", f.batch_nums, "calibration batches (0 = the whole data set)")
        ->capture_default_str()
        ->check(non_negative_integer());
    app->add_option("--weight-quantize-type", f.weight_type, "abs_max, mse (per tensor), channel_wise_abs_max, mse_channel_wise")
        ->default_str(quant::QuantRule().weight);
  }
  app->add_option("--weight-bits", f.weight_bits, "weight bits, 2..8")
      ->default_str(std::to_string(quant::QuantConfig().effective_weight_bits()))
      ->check(non_negative_integer());  // 2..8 is checked with the config (exit 5)
  if (calibration)
    app->add_option("--deploy-backend", f.deploy_backend,
                    "runtime the QDQ model is shaped for: slimquant (fastest here, loads in ONNX Runtime), "
                    "onnxruntime (the form its CPU provider fuses: QLinearConv, QLinearAdd, ...), tensorrt (symmetric "
                    "int8, NVIDIA's Q/DQ placement)")
        ->default_str(quant::deploy_backend_name(quant::QuantConfig().deploy_backend))
        ->check(CLI::IsMember({"slimquant", "onnxruntime", "tensorrt"}));
  if (calibration)
    app->add_option("--activation-quantize-type", f.activation_quantize_type,
                    "symmetric (default; Paddle's range_abs_max, moving_average_abs_max, abs_max mean the same: fixed "
                    "scales from --algo) or asymmetric (u8 with a zero point)")
        ->check(CLI::IsMember({"symmetric", "asymmetric", "range_abs_max", "moving_average_abs_max", "abs_max"}));
  app->add_option("--quantizable-op-type", f.op_types, "op types to quantize (a,b,...)")
      ->default_str(CLI::detail::join(quant::QuantConfig().quantizable_op_type, ","));
  if (calibration)
    app->add_flag("--is-full-quantize", f.full, "also quantize pooling, Add, Concat, Softmax, Reshape, ...");
  app->add_option("--skip-tensor-list", f.skip_tensors,
                  "layers (node names, as analysis.txt lists them) or tensors whose readers/writers stay float (a,b,...)");
  app->add_option("--skip-nodes", f.skip_nodes, "op types, node names or globs that stay float (repeatable)");
  if (calibration)
    app->add_option("--node-mode", f.node_modes,
                    "PATTERN=MODE: the layers of these op types, node names or globs take MODE (static, weight-only, "
                    "dynamic) instead of --mode; static and weight-only mix in one model (repeatable, the last match wins)");
}

void apply_ptq_flags(const PtqFlags& f, quant::QuantConfig& config) {
  if (!f.algo.empty()) config.global().activation = f.algo;
  if (!f.weight_type.empty()) config.global().weight = f.weight_type;
  if (f.hist_percent > 0) config.observer_options.hist_percent = f.hist_percent;
  if (f.weight_bits > 0) config.weight_bits = f.weight_bits;
  if (!f.deploy_backend.empty()) config.deploy_backend = quant::parse_deploy_backend(f.deploy_backend);
  if (!f.activation_quantize_type.empty())
    config.asymmetric_activations = quant::parse_activation_quantize_type(f.activation_quantize_type);
  if (!f.op_types.empty()) config.quantizable_op_type = split_list(f.op_types);
  if (f.full) config.is_full_quantize = true;
  for (const auto& t : split_list(f.skip_tensors)) config.skip_tensor_list.push_back(t);
  for (const auto& p : f.skip_nodes) config.skip_quant.push_back(p);
  for (const auto& entry : f.node_modes) {
    const auto eq = entry.rfind('=');
    SQ_CHECK(eq != std::string::npos && eq > 0, ErrorKind::kInvalidArgument,
             "--node-mode takes PATTERN=MODE (e.g. MatMul=weight-only), got '" + entry + "'");
    config.node_modes.emplace_back(entry.substr(0, eq), quant::parse_quant_mode(entry.substr(eq + 1)));
  }
  quant::make_activation_observer(config.global().activation);  // early, clear errors for bad names
  quant::make_weight_observer(config.global().weight, config.observer_options);
  config.validate();
}

CalibrationBatches calibration_batches(const PtqFlags& flags, const CLI::App& cmd,
                                       const std::map<std::string, std::string>& config_extra) {
  CalibrationBatches b{flags.batch_size, flags.batch_nums};
  if (const auto it = config_extra.find("batch_size"); it != config_extra.end() && cmd.count("--batch-size") == 0)
    b.batch_size = parse_config_size(it->second, "batch_size");
  if (const auto it = config_extra.find("batch_nums"); it != config_extra.end() && cmd.count("--batch-nums") == 0)
    b.batch_nums = parse_config_size(it->second, "batch_nums");
  return b;
}

const char* const kMetricHelp =
    "top1, top5 (class labels); ctc_exact, ctc_char (text recognition: text labels and --keys); cosine, sqnr, "
    "top1_agreement, mask_iou (against the FP32 model; mask_iou: detection maps, IoU of prob > 0.3)";

void add_keys_flag(CLI::App* app, std::string& keys) {
  app->add_option("--keys", keys, "key file of a text recognition model (one character per line, e.g. ppocr_keys_v1.txt) "
                                  "for --metric ctc_exact / ctc_char");
}

std::unique_ptr<analysis::Metric> make_cli_metric(const std::string& name, const std::string& keys_file) {
  analysis::MetricOptions options;
  options.keys_file = keys_file;
  auto metric = analysis::make_metric(name, options);
  SQ_CHECK(keys_file.empty() || metric->needs_text_labels(), ErrorKind::kInvalidArgument,
           "--keys is only used by the text recognition metrics ctc_exact and ctc_char, not by '" + name + "'");
  return metric;
}

void check_metric_labels(const analysis::Metric& metric, const data::Dataset& data) {
  SQ_CHECK(!metric.needs_labels() || data.has_labels(), ErrorKind::kInvalidArgument,
           "metric '" + metric.name() + "' needs labels, but data set '" + data.name() +
               "' has none (use --metric cosine, sqnr or top1_agreement)");
  SQ_CHECK(!metric.needs_text_labels() || data.has_text_labels(), ErrorKind::kInvalidArgument,
           "metric '" + metric.name() + "' needs text labels, but data set '" + data.name() +
               "' has none (npy:DIR reads them from labels.txt, one UTF-8 line per sample)");
}

void add_eval_command_flags(CLI::App* app, EvalCommandFlags& flags, CLI::Option* metric_flag) {
  flags.option = app->add_option("--eval-command", flags.command,
                                 "rank by your own evaluation: a shell command run on each candidate model, {model} "
                                 "replaced by its .onnx path; its last output line is the metric, a number or a JSON "
                                 "object (see --eval-key)");
  if (metric_flag) flags.option->excludes(metric_flag);
  app->add_option("--eval-key", flags.key, "field of --eval-command's JSON output holding the metric")
      ->capture_default_str()
      ->needs(flags.option);
  app->add_option("--metric-direction", flags.direction, "whether --eval-command's metric is better higher or lower")
      ->capture_default_str()
      ->check(CLI::IsMember({"higher", "lower"}))
      ->needs(flags.option);
}

analysis::CommandMetricOptions EvalCommandFlags::options() const {
  analysis::CommandMetricOptions o;
  o.command = command;
  o.key = key;
  o.higher_is_better = direction != "lower";
  return o;
}

void add_data_flags(CLI::App* app, DataFlags& flags, std::string& positional) {
  app->add_option("DATA", positional,
                  "data set: fashion-mnist[:train|:test], images:LIST_FILE, npy:DIR (same as --dataset)");
  app->add_option("--dataset", flags.dataset, "data set: fashion-mnist[:train|:test], images:LIST_FILE, npy:DIR");
  app->add_option("--mean", flags.mean, "per-channel mean, applied after scaling pixels to [0,1] (a or a,b,c)");
  app->add_option("--std", flags.stddev, "per-channel standard deviation (a or a,b,c)");
  app->add_option("--resize", flags.resize, "resize images to HxW");
  app->add_option("--channel-order", flags.channel_order, "rgb or bgr")->capture_default_str();
  app->add_option("--channels", flags.channels, "decode images with 1 or 3 channels (0 = as stored)")
      ->check(CLI::IsMember({0, 1, 3}));
  app->add_option("--limit", flags.limit, "use only the first N samples (0 = all)")->check(non_negative_integer());
  app->add_option("--side-input", flags.side_inputs,
                  "NAME=FILE.npy: a further model input fed with the samples, one row per sample or one for all "
                  "(multi-input models; repeatable)");
}

ir::Graph load_model_arg(const std::string& path) { return ir::load_model(resolve_model_file(path)); }

std::vector<std::string> graph_input_names(const ir::Graph& g) {
  std::vector<std::string> names;
  for (const auto& in : g.inputs) names.push_back(in.name);
  return names;
}

void print_json(const nlohmann::json& j) { std::cout << j.dump() << std::endl; }

void print_measured_values_note(const std::string& metric, size_t values) {
  std::cout << "the model's outputs are chosen or decided by its data (NMS, top-k, ArgMax): " << metric << " compares the "
            << values << " values they come from (docs/quantization.md, detectors)" << std::endl;
}

Timing time_runs(runtime::Session& session, const std::map<std::string, Tensor>& feeds, int runs, int warmup) {
  SQ_CHECK(runs > 0, ErrorKind::kInvalidArgument, "the number of timed runs must be at least 1");
  // Every output is computed; a batch run in parts is not joined (a detector's boxes cannot be).
  runtime::RunOptions timed;
  timed.outputs_needed = false;
  // Past the warm-up, untimed runs go on while the session still times its part sizes for this
  // batch (at most two rounds of PartChoice).
  for (int i = 0; i < warmup || (session.choosing_part_size() && i < warmup + 4 * runtime::PartChoice::kChoosingRuns); ++i)
    session.run(feeds, timed);
  std::vector<double> ms;
  for (int i = 0; i < runs; ++i) {
    const auto t0 = std::chrono::steady_clock::now();
    session.run(feeds, timed);
    ms.push_back(std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count());
  }
  std::sort(ms.begin(), ms.end());
  const size_t n = ms.size();
  return {n % 2 ? ms[n / 2] : (ms[n / 2 - 1] + ms[n / 2]) / 2, ms.front()};
}

std::vector<std::string> split_list(const std::string& text) {
  std::vector<std::string> out;
  std::stringstream ss(text);
  std::string item;
  while (std::getline(ss, item, ','))
    if (!item.empty()) out.push_back(item);
  return out;
}

int exit_code_for(ErrorKind kind) {
  switch (kind) {
    case ErrorKind::kInvalidModel: return 3;
    case ErrorKind::kUnsupported: return 4;
    case ErrorKind::kInvalidArgument: return 5;
    case ErrorKind::kInvalidData: return 6;
    case ErrorKind::kIo: return 7;
    case ErrorKind::kInternal: return 70;
  }
  return 70;
}

int report_exception(std::exception_ptr e) {
  auto report = [](const std::string& message, int code) {
    std::cerr << "error: " << message << std::endl;
    return code;
  };
  try {
    std::rethrow_exception(e);
  } catch (const Error& x) {
    return report(x.what(), exit_code_for(x.kind()));
  } catch (const std::filesystem::filesystem_error& x) {
    return report(x.what(), exit_code_for(ErrorKind::kIo));
  } catch (const nlohmann::json::exception& x) {
    // A JSON file (checkpoint, index) whose content does not have the expected form.
    return report(std::string("invalid JSON data: ") + x.what(), exit_code_for(ErrorKind::kInvalidData));
  } catch (const YAML::Exception& x) {
    return report(std::string("invalid YAML config: ") + x.what(), exit_code_for(ErrorKind::kInvalidArgument));
  } catch (const std::bad_alloc&) {
    return report("out of memory (the model, data or a flag asks for more memory than this machine has)",
                  exit_code_for(ErrorKind::kInternal));
  } catch (const std::length_error& x) {
    return report(std::string("out of memory: a size is too large (") + x.what() + ")",
                  exit_code_for(ErrorKind::kInternal));
  } catch (const std::invalid_argument& x) {  // std::stoll & co. on text that is not a number
    return report(std::string("invalid number: ") + x.what(), exit_code_for(ErrorKind::kInvalidArgument));
  } catch (const std::out_of_range& x) {
    return report(std::string("value out of range: ") + x.what(), exit_code_for(ErrorKind::kInvalidArgument));
  } catch (const std::exception& x) {
    return report(std::string("internal error: ") + x.what(), exit_code_for(ErrorKind::kInternal));
  } catch (...) {
    return report("internal error: unknown exception", exit_code_for(ErrorKind::kInternal));
  }
}

namespace {

// Integer text: optional sign, digits, nothing else.
bool parse_integer(const std::string& text, long long& value) {
  if (text.empty()) return false;
  errno = 0;
  char* end = nullptr;
  value = std::strtoll(text.c_str(), &end, 10);
  return errno == 0 && end == text.c_str() + text.size();
}

bool parse_number(const std::string& text, double& value) {
  if (text.empty()) return false;
  char* end = nullptr;
  value = std::strtod(text.c_str(), &end);
  return end == text.c_str() + text.size() && std::isfinite(value);
}

CLI::Validator integer_at_least(long long lo, const std::string& what) {
  return CLI::Validator(
      [lo, what](std::string& text) -> std::string {
        long long v = 0;
        if (!parse_integer(text, v) || v < lo) return "must be " + what + ", got '" + text + "'";
        return {};
      },
      what);
}

CLI::Validator number_above(double lo, bool inclusive, const std::string& what) {
  return CLI::Validator(
      [lo, inclusive, what](std::string& text) -> std::string {
        double v = 0;
        if (!parse_number(text, v) || (inclusive ? v < lo : v <= lo)) return "must be " + what + ", got '" + text + "'";
        return {};
      },
      what);
}

}  // namespace

const CLI::Validator& positive_integer() {
  static const CLI::Validator v = integer_at_least(1, "a positive integer");
  return v;
}
const CLI::Validator& non_negative_integer() {
  static const CLI::Validator v = integer_at_least(0, "a non-negative integer");
  return v;
}
const CLI::Validator& positive_number() {
  static const CLI::Validator v = number_above(0, false, "a positive number");
  return v;
}
const CLI::Validator& non_negative_number() {
  static const CLI::Validator v = number_above(0, true, "a non-negative number");
  return v;
}

CLI::Validator integer_range(long long lo, long long hi) {
  const std::string what = "an integer from " + std::to_string(lo) + " to " + std::to_string(hi);
  return CLI::Validator(
      [lo, hi, what](std::string& text) -> std::string {
        long long v = 0;
        if (!parse_integer(text, v) || v < lo || v > hi) return "must be " + what + ", got '" + text + "'";
        return {};
      },
      what);
}

CLI::Validator number_range(double lo, double hi) {
  std::ostringstream os;
  os << "a number from " << lo << " to " << hi;
  const std::string what = os.str();
  return CLI::Validator(
      [lo, hi, what](std::string& text) -> std::string {
        double v = 0;
        if (!parse_number(text, v) || v < lo || v > hi) return "must be " + what + ", got '" + text + "'";
        return {};
      },
      what);
}

std::string data_spec_path(const std::string& spec) {
  const size_t colon = spec.find(':');
  if (colon == std::string::npos) return "";
  const std::string kind = spec.substr(0, colon);
  return kind == "images" || kind == "npy" ? spec.substr(colon + 1) : "";
}

namespace {

// The file names of a Paddle inference model: program (.pdmodel, or __model__ in the older
// format) and parameters (.pdiparams; .pdparams from training).
bool is_paddle_model_name(const std::filesystem::path& file) {
  const std::string ext = file.extension().string();
  return ext == ".pdmodel" || ext == ".pdiparams" || ext == ".pdparams" || file.filename() == "__model__";
}

// slimquant reads ONNX; a Paddle model otherwise fails deep in the protobuf parser with no hint.
// The message gives the paddle2onnx command for this very model.
[[noreturn]] void refuse_paddle_model(const std::filesystem::path& file) {
  const std::filesystem::path dir = file.has_parent_path() ? file.parent_path() : std::filesystem::path(".");
  std::string command = "paddle2onnx --model_dir " + dir.string();
  if (file.filename() != "__model__") {  // the older format keeps one file per parameter: no names to give
    const std::string stem = file.stem().string();
    command += " --model_filename " + stem + ".pdmodel --params_filename " + stem + ".pdiparams";
  }
  command += " --save_file model.onnx";
  fail(ErrorKind::kUnsupported, "'" + file.string() + "' is a PaddlePaddle model; slimquant reads ONNX models. Convert "
                                "it first with paddle2onnx (pip install paddle2onnx): " + command +
                                ", then give model.onnx");
}

}  // namespace

std::string resolve_model_file(const std::string& model, const std::string& model_filename) {
  namespace fs = std::filesystem;
  std::error_code ec;
  const fs::file_status st = fs::status(model, ec);
  SQ_CHECK(st.type() != fs::file_type::not_found, ErrorKind::kIo, "model '" + model + "' does not exist");
  if (st.type() == fs::file_type::regular) {
    if (is_paddle_model_name(model)) refuse_paddle_model(model);
    return model;
  }
  SQ_CHECK(st.type() == fs::file_type::directory, ErrorKind::kInvalidArgument,
           "model '" + model + "' is not a regular file: give an .onnx file, or a directory holding one");
  if (!model_filename.empty()) {
    const fs::path file = fs::path(model) / model_filename;
    if (is_paddle_model_name(file)) refuse_paddle_model(file);
    SQ_CHECK(fs::is_regular_file(file, ec), ErrorKind::kIo,
             "model directory '" + model + "' has no model file '" + model_filename + "'");
    return file.string();
  }
  std::vector<std::string> candidates;
  std::vector<fs::path> paddle_programs;
  for (const auto& e : fs::directory_iterator(model, ec)) {
    if (!e.is_regular_file(ec)) continue;
    if (e.path().extension() == ".onnx") candidates.push_back(e.path().string());
    if (e.path().extension() == ".pdmodel" || e.path().filename() == "__model__") paddle_programs.push_back(e.path());
  }
  std::sort(candidates.begin(), candidates.end());
  std::sort(paddle_programs.begin(), paddle_programs.end());
  if (candidates.size() == 1) return candidates[0];
  if (candidates.empty() && !paddle_programs.empty()) refuse_paddle_model(paddle_programs.front());
  std::string listed;
  for (size_t i = 0; i < candidates.size() && i < 5; ++i) listed += (i ? ", " : " (") + fs::path(candidates[i]).filename().string();
  if (!listed.empty()) listed += candidates.size() > 5 ? ", ...)" : ")";
  fail(ErrorKind::kInvalidArgument, "model directory '" + model + "' holds " + std::to_string(candidates.size()) +
                                        " .onnx files" + listed +
                                        ": a MODEL directory must hold exactly one; otherwise give the .onnx file itself");
}

}  // namespace slimquant::cli
