#include "slimquant/quant/post_training_quantization.h"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <sstream>
#include <filesystem>

#include "slimquant/core/atomic_file.h"
#include "slimquant/core/distributed.h"
#include "slimquant/core/progress.h"
#include "slimquant/data/batch.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/prequantized.h"
#include "slimquant/runtime/session.h"

namespace slimquant::quant {

namespace {
// Calibration samples the precision fallback compares against FP32 (each candidate is one run).
constexpr size_t kFallbackSamples = 8;
// The first calibration rows kept for the comparisons after calibration (algo_choice_samples: 16 at most).
constexpr size_t kFirstRows = std::max<size_t>(kFallbackSamples, 16);
}  // namespace

PostTrainingQuantization::PostTrainingQuantization(PostTrainingQuantizationOptions options)
    : options_(std::move(options)) {}
PostTrainingQuantization::~PostTrainingQuantization() = default;

QuantConfig PostTrainingQuantization::make_config() const {
  if (options_.config) return *options_.config;
  QuantConfig c(QuantRule{options_.algo, options_.weight_quantize_type, true});
  c.quantizable_op_type = options_.quantizable_op_type;
  c.is_full_quantize = options_.is_full_quantize;
  c.observer_options.hist_percent = options_.hist_percent;
  c.weight_bits = options_.weight_bits;
  c.skip_tensor_list = options_.skip_tensor_list;
  c.skip_quant = options_.skip_quant;
  c.asymmetric_activations = options_.asymmetric_activations;
  c.bias_correction = options_.bias_correction;
  c.deploy_backend = parse_deploy_backend(options_.deploy_backend);
  c.mode = parse_quant_mode(options_.mode);
  c.block_size = options_.block_size;
  c.weight_rounding = parse_weight_rounding(options_.weight_rounding);
  c.int4_activations = parse_int4_activations(options_.int4_activations);
  c.validate();
  return c;
}

std::string PostTrainingQuantization::data_identity() const {
  std::string id = "batch_size=" + std::to_string(options_.batch_size);
  if (options_.dataset) {
    id += ";data=" + options_.dataset->name() + ";n=" + std::to_string(options_.dataset->size());
    // A side input's values too, not only its name: a rerun with another state or mask file must
    // not resume a calibration observed with the first one.
    const auto& sides = options_.dataset->side_inputs();
    for (size_t k = 0; k < sides.size(); ++k) {
      std::string bytes(static_cast<size_t>(shape_numel(sides[k].sample_shape)) * dtype_size(sides[k].dtype), '\0');
      size_t values = 0;
      for (size_t i = 0; i < options_.dataset->size(); ++i) {
        options_.dataset->load_side_input(k, i, bytes.data());
        values = values * 1000003u ^ std::hash<std::string>{}(bytes);
      }
      id += ";side=" + sides[k].name + ":" + std::to_string(values);
    }
  }
  else if (options_.sample_generator)
    id += ";data=sample_generator";
  else
    id += ";data=batch_generator";
  return id;
}

std::string PostTrainingQuantization::cache_path() const {
  return (std::filesystem::path(options_.cache_dir) / "calibration.cache").string();
}

std::string PostTrainingQuantization::default_calibration_checkpoint() const {
  std::filesystem::path folder;
  if (const char* chosen = std::getenv("SLIMQUANT_CALIBRATION_CACHE")) {
    if (std::string(chosen) == "0" || !*chosen) return "";
    folder = chosen;
  } else if (const char* xdg = std::getenv("XDG_CACHE_HOME"); xdg && *xdg) {
    folder = std::filesystem::path(xdg) / "slimquant" / "calibration";
  } else if (const char* home = std::getenv("HOME"); home && *home) {
    folder = std::filesystem::path(home) / ".cache" / "slimquant" / "calibration";
  } else {
    return "";
  }
  std::error_code ec;
  std::filesystem::create_directories(folder, ec);
  if (ec || !std::filesystem::is_directory(folder)) return "";  // not asked for: no checkpoint then
  // One file per model, configuration and data: jobs that differ never share one.
  std::ostringstream name;
  name << ptq_->fingerprint() << '-' << std::hex << std::hash<std::string>{}(data_identity()) << ".calibration";
  return (folder / name.str()).string();
}

const ir::Graph& PostTrainingQuantization::quantized_graph() const {
  SQ_CHECK(quantized_.has_value(), ErrorKind::kInvalidArgument, "PostTrainingQuantization: call quantize() first");
  return *quantized_;
}

const ir::Graph& PostTrainingQuantization::quantize() {
  const auto& o = options_;
  // Names are checked before the model is read: a typo should not cost a model load.
  QuantConfig config = make_config();
  const int sources = (o.dataset != nullptr) + static_cast<int>(static_cast<bool>(o.sample_generator)) +
                      static_cast<int>(static_cast<bool>(o.batch_generator));
  const bool uncalibrated = !config.calibrates();  // weight-only and dynamic read no data
  SQ_CHECK(sources == 1 || (uncalibrated && sources == 0), ErrorKind::kInvalidArgument,
           "PostTrainingQuantization: give exactly one calibration source, dataset, sample_generator or "
           "batch_generator (data_loader)");
  SQ_CHECK(o.batch_size > 0, ErrorKind::kInvalidArgument, "batch_size must be at least 1");
  SQ_CHECK(!o.batch_nums || *o.batch_nums > 0, ErrorKind::kInvalidArgument,
           "batch_nums must be at least 1 (leave it unset to use every sample)");
  make_activation_observer(config.global().activation, config.observer_options);
  make_weight_observer(config.global().weight, config.observer_options);

  float_graph_ = ir::load_model(o.model_dir, o.model_filename, o.params_filename);
  const QuantizedFormFound already = find_quantized_form(float_graph_);
  if (already.form != QuantizedForm::kNone) {
    SQ_CHECK(o.requantize, ErrorKind::kUnsupported,
             "'" + o.model_dir + "' is already quantized: " + already.describe() +
                 ". Quantize its float source, or pass requantize (CLI --requantize) to quantize it again from "
                 "its dequantized weights");
    SQ_CHECK(already.form == QuantizedForm::kStaticQdq, ErrorKind::kUnsupported,
             "'" + o.model_dir + "' is already quantized: " + already.describe() +
                 "; only static QDQ files can be requantized: quantize its float source instead");
    float_graph_ = dequantized_model(float_graph_);
  }
  ptq_ = std::make_unique<PTQ>(std::move(config));
  ptq_->quantize(float_graph_);
  warnings_ = ptq_->warnings();
  if (already.form != QuantizedForm::kNone)
    warnings_.push_back("requantizing a " + already.describe() +
                        " file: its weights were dequantized and its activation Q/DQ pairs removed first; the "
                        "first rounding stays in the weights");
  quantized_.reset();
  report_ = {};
  fallback_ = {};
  algo_choice_ = {};
  std::map<std::string, std::string> quantized_metadata;
  // GPTQ (4-bit weight-only) calibrates: it needs each layer's input statistics.
  const bool gptq = ptq_->config().mode == QuantMode::kWeightOnly && ptq_->config().weight_rounding == WeightRounding::kGptq;
  if (uncalibrated && !(gptq && sources > 0)) {  // nothing to calibrate: the weights quantize from their own values
    if (sources > 0)
      warnings_.push_back(std::string(quant_mode_name(ptq_->config().mode)) + " mode: the calibration data is not used");
    if (gptq) warnings_.push_back("weight_rounding gptq needs calibration data and none was given: rounding to nearest (rtn)");
    quantized_ = ptq_->convert();
    return *quantized_;
  }
  const size_t algo_candidates = ptq_->selectable_activation_algos().size();
  const bool keep_first_rows = o.fallback_sqnr_db > 0 || algo_candidates > 0;

  // The cache directory must be usable before any work is done.
  bool created_cache_dir = false;
  if (o.is_use_cache_file) {
    std::error_code ec;
    created_cache_dir = std::filesystem::create_directories(o.cache_dir, ec);
    SQ_CHECK(!ec && std::filesystem::is_directory(o.cache_dir), ErrorKind::kIo,
             "cache_dir '" + o.cache_dir + "' cannot be created" + (ec ? ": " + ec.message() : std::string()));
    const std::string probe = cache_path() + ".probe";
    write_file_atomic(probe, "");
    std::filesystem::remove(probe, ec);
  }
  // Without a cache_dir the calibration is still kept while the job runs, in the user's cache: a
  // job that fails after a long calibration (precision recovery, export) resumes from it.
  checkpoint_ = o.is_use_cache_file ? cache_path() : default_calibration_checkpoint();
  if (gptq) checkpoint_.clear();  // the cache holds observers, not GPTQ's X^T X: not resumable

  std::unique_ptr<CalibrationSource> source =
      o.dataset ? dataset_calibration_source(*o.dataset, o.batch_size, float_graph_.inputs)
      : o.batch_generator ? batch_generator_calibration_source(o.batch_generator, float_graph_.inputs)
                          : sample_generator_calibration_source(o.sample_generator, o.batch_size, float_graph_.inputs);
  CalibrationLoopOptions lo;
  lo.batch_nums = o.batch_nums;
  lo.checkpoint = checkpoint_;
  lo.data_identity = data_identity();
  lo.first_rows = keep_first_rows ? kFirstRows : 0;
  if (algo_candidates > 0) lo.held_back_rows = [&](size_t calibrated) { return algo_choice_samples(calibrated, algo_candidates); };
  // The first calibration samples (kFirstRows), and for algo "auto" samples the observers have not
  // seen when compared on (the data beyond batch_nums, else the last batch, observed after).
  CalibrationRun run = calibrate(*ptq_, *source, lo);
  warnings_.insert(warnings_.end(), run.warnings.begin(), run.warnings.end());
  const size_t calibrated_samples = run.calibrated_samples;
  const std::map<std::string, Tensor>& first_rows = run.first_rows;
  const std::map<std::string, Tensor>& held_back = run.held_back;
  auto choice_rows = [&] { return algo_choice_samples(calibrated_samples, algo_candidates); };
  const runtime::BatchAxes batch_axes = runtime::input_batch_axes(float_graph_.inputs);
  if (algo_candidates > 0 && !uncalibrated) {  // weight-only (GPTQ) quantizes no activation
    const bool unseen = !held_back.empty();
    AlgoChoiceOptions ao;
    ao.channel_wise_below_sqnr_db = o.fallback_sqnr_db;
    algo_choice_ = choose_activation_algo(*ptq_, unseen ? held_back : leading_rows(first_rows, choice_rows(), batch_axes), unseen, ao);
    quantized_metadata["slimquant.activation_algo"] = algo_choice_.chosen;
  }
  finish_calibration(*ptq_, run);
  if (std::string unseen = ptq_->unobserved_layers_warning(); !unseen.empty())
    warnings_.push_back(std::move(unseen));
  report_ = {run.batches, run.samples, run.resumed_batches, run.seconds};
  if (o.fallback_sqnr_db > 0 && !first_rows.empty() && !uncalibrated) {
    const std::map<std::string, Tensor> fallback_samples = leading_rows(first_rows, kFallbackSamples, batch_axes);
    PrecisionFallbackOptions fo;
    fo.target_sqnr_db = o.fallback_sqnr_db;
    fo.max_float_fraction = o.fallback_max_float_fraction;
    // Recovery costs at most about twice the calibration (a large network at high resolution
    // calibrated on a few images is not evaluated once per layer).
    fo.max_sample_runs = 2 * std::max<size_t>(calibrated_samples, 1);
    fallback_ = choose_precision_fallback(*ptq_, fallback_samples, fo);
    // Per-channel convolution inputs may have been chosen with the observer (the recovery's first
    // remedy, measured there on the model as exported).
    fallback_.channel_wise_conv_inputs = fallback_.channel_wise_conv_inputs || algo_choice_.channel_wise_conv_inputs;
  }
  quantized_ = fallback_.float_layers.empty() ? ptq_->convert() : ptq_->convert(fallback_.quantized_layers(*ptq_));
  for (const auto& [key, value] : quantized_metadata) quantized_->metadata[key] = value;
  if (!fallback_.float_layers.empty()) {
    std::string names;
    for (const auto& l : fallback_.float_layers) names += (names.empty() ? "" : ", ") + l;
    quantized_->metadata["slimquant.float_layers"] = names;
  }

  created_cache_dir_ = created_cache_dir;
  return *quantized_;
}

void PostTrainingQuantization::save_quantized_model(const std::string& path) {
  // One file per job: rank 0 writes it; the barrier lets every rank read it afterwards.
  if (distributed::is_root()) ir::save_onnx(quantized_graph(), path);
  distributed::barrier();
  // The job's result is on disk: its calibration is no longer needed.
  if (!checkpoint_.empty() && distributed::is_root()) {
    std::error_code ec;
    std::filesystem::remove(checkpoint_, ec);
    if (created_cache_dir_ && std::filesystem::is_empty(options_.cache_dir, ec))
      std::filesystem::remove(options_.cache_dir, ec);
    checkpoint_.clear();
  }
}

}  // namespace slimquant::quant
