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

namespace {

// Stacks single samples (each input without a batch dimension, or with a batch dimension of 1)
// into one batch per input; `ranks` holds each input's rank in the model (0 = unknown).
std::map<std::string, Tensor> stack_samples(const std::vector<std::map<std::string, Tensor>>& samples,
                                            const std::map<std::string, size_t>& ranks) {
  std::map<std::string, Tensor> batch;
  const auto& first = samples.front();
  for (const auto& [name, t0] : first) {
    auto rank_it = ranks.find(name);
    SQ_CHECK(rank_it != ranks.end(), ErrorKind::kInvalidArgument,
             "sample_generator gave '" + name + "', which is not an input of the model");
    const bool has_batch_dim = rank_it->second != 0 && t0.rank() == rank_it->second;
    SQ_CHECK(!has_batch_dim || t0.dim(0) == 1, ErrorKind::kInvalidArgument,
             "sample_generator must give one sample per call; input '" + name + "' has batch dimension " +
                 std::to_string(t0.dim(0)));
    Shape sample_shape = t0.shape();
    if (has_batch_dim) sample_shape.erase(sample_shape.begin());
    Shape shape = sample_shape;
    shape.insert(shape.begin(), static_cast<int64_t>(samples.size()));
    Tensor out(t0.dtype(), shape);
    auto* dst = static_cast<std::byte*>(out.raw());
    for (size_t i = 0; i < samples.size(); ++i) {
      auto it = samples[i].find(name);
      SQ_CHECK(it != samples[i].end(), ErrorKind::kInvalidArgument,
               "sample_generator: sample lacks input '" + name + "' that the first sample had");
      const Tensor& t = it->second;
      SQ_CHECK(t.dtype() == t0.dtype() && t.numel() == t0.numel(), ErrorKind::kInvalidArgument,
               "sample_generator: samples of input '" + name + "' differ in dtype or shape (" + shape_str(t.shape()) +
                   " vs " + shape_str(t0.shape()) + ")");
      std::memcpy(dst + i * t0.nbytes(), t.raw(), t0.nbytes());
    }
    batch[name] = std::move(out);
  }
  return batch;
}

// Gives the entry named "" (a bare array from a generator) the name of the model's only input.
std::map<std::string, Tensor> name_inputs(std::map<std::string, Tensor> feeds, const std::vector<ir::ValueInfo>& inputs,
                                          const char* source) {
  auto unnamed = feeds.find("");
  if (unnamed == feeds.end()) return feeds;
  SQ_CHECK(inputs.size() == 1 && feeds.size() == 1, ErrorKind::kInvalidArgument,
           std::string(source) + " gave an unnamed array, but the model has " + std::to_string(inputs.size()) +
               " inputs: give a dict of input name -> array");
  Tensor t = std::move(unnamed->second);
  feeds.clear();
  feeds[inputs[0].name] = std::move(t);
  return feeds;
}

// Samples in a batch: the rows (axis 0) of its first tensor.
size_t rows_of(const std::map<std::string, Tensor>& feeds) {
  return feeds.empty() || feeds.begin()->second.rank() == 0 ? 0 : static_cast<size_t>(feeds.begin()->second.dim(0));
}

// The first `count` rows (along axis 0) of every tensor of a batch.
std::map<std::string, Tensor> leading_rows(const std::map<std::string, Tensor>& batch, size_t count) {
  int64_t rows = static_cast<int64_t>(count);
  for (const auto& [name, t] : batch) {
    SQ_CHECK(t.rank() >= 1, ErrorKind::kInvalidArgument,
             "batch_generator: input '" + name + "' has no batch dimension (a scalar)");
    rows = std::min(rows, t.dim(0));
  }
  return runtime::feed_rows(batch, 0, rows);
}

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
  c.validate();
  return c;
}

std::string PostTrainingQuantization::data_identity() const {
  std::string id = "batch_size=" + std::to_string(options_.batch_size);
  if (options_.dataset) {
    id += ";data=" + options_.dataset->name() + ";n=" + std::to_string(options_.dataset->size());
    for (const auto& side : options_.dataset->side_inputs()) id += ";side=" + side.name;
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
  const bool uncalibrated = !needs_calibration(config.mode);  // weight-only and dynamic read no data
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
  std::map<std::string, Tensor> first_rows;  // the first calibration samples (kFirstRows)
  size_t calibrated_samples = 0;               // resumed ones included
  const size_t algo_candidates = ptq_->selectable_activation_algos().size();
  const bool keep_first_rows = o.fallback_sqnr_db > 0 || algo_candidates > 0;
  // Samples that the calibration did not see, for algo "auto" (the data beyond batch_nums).
  std::map<std::string, Tensor> held_back;
  auto choice_rows = [&] { return algo_choice_samples(calibrated_samples, algo_candidates); };

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
  const std::string& checkpoint = checkpoint_;
  if (!checkpoint.empty()) {
    // Distributed: rank 0 alone keeps the cache (it holds the first batches, the others are merged
    // after them), and the others skip what it resumed.
    if (distributed::is_root() && ptq_->load_calibration_state(checkpoint, data_identity()))
      report_.resumed_batches = ptq_->samples_seen();
    report_.resumed_batches = std::stoul(distributed::broadcast(std::to_string(report_.resumed_batches)));
  }

  const auto start = std::chrono::steady_clock::now();
  auto last_save = start;
  auto after_batch = [&](size_t done, size_t total) {
    // A rank's own share is not a prefix of the batches: a sharded calibration is cached only once
    // merged (nothing to save here), and resumes from a one-process cache.
    if (checkpoint.empty() || done == total || distributed::size() > 1) return;
    // At most about once a second: the state is small, but a model with hundreds of observed
    // tensors and tiny batches should not spend its time writing.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_save < std::chrono::seconds(1)) return;
    ptq_->save_calibration_state(checkpoint, data_identity());
    last_save = now;
  };

  if (o.dataset) {
    std::vector<std::string> model_inputs;
    for (const auto& in : float_graph_.inputs) model_inputs.push_back(in.name);
    const std::string main_input = data::main_input_name(model_inputs, *o.dataset);
    data::BatchLoader loader(*o.dataset, o.batch_size);
    const size_t available = loader.num_batches();
    SQ_CHECK(available > 0, ErrorKind::kInvalidData, "calibration data set '" + o.dataset->name() + "' is empty");
    size_t total = o.batch_nums.value_or(available);
    if (total > available) {
      warnings_.push_back("batch_nums is " + std::to_string(total) + " but '" + o.dataset->name() + "' holds only " +
                          std::to_string(available) + " batches of " + std::to_string(o.batch_size) +
                          ": calibrating on all of them");
      total = available;
    }
    SQ_CHECK(report_.resumed_batches <= total, ErrorKind::kInvalidData,
             "calibration cache '" + checkpoint + "' holds more batches than this run asks for");
    // Distributed: each rank samples one contiguous block of the remaining batches, and the
    // observers are merged in rank order, which is batch order (the result is the one-process one).
    const distributed::Range mine = distributed::block_of(total - report_.resumed_batches);
    Progress progress("calibrate", report_.resumed_batches + mine.end - mine.begin, "batches");
    progress.advance(report_.resumed_batches);
    if (keep_first_rows)
      first_rows = loader.load_range(0, std::min<size_t>(kFirstRows, o.dataset->size())).feeds(main_input);
    for (size_t i = report_.resumed_batches + mine.begin; i < report_.resumed_batches + mine.end; ++i) {
      data::Batch b = loader.batch(i);
      ptq_->sample(b.feeds(main_input));
      report_.samples += b.size();
      progress.advance();
      after_batch(i + 1, total);
    }
    progress.finish();
    ptq_->merge_calibration_across_ranks();
    report_.samples = static_cast<size_t>(distributed::all_reduce_sum(static_cast<int64_t>(report_.samples)));
    calibrated_samples = std::min(total * o.batch_size, o.dataset->size());
    if (algo_candidates > 0 && o.dataset->size() > calibrated_samples)
      held_back = loader.load_range(calibrated_samples, std::min(choice_rows(), o.dataset->size() - calibrated_samples))
                      .feeds(main_input);
  } else if (o.batch_generator) {
    // Resuming: the generator replays from the start; batches already observed are skipped.
    for (size_t i = 0; i < report_.resumed_batches; ++i) {
      auto skipped = o.batch_generator();
      SQ_CHECK(skipped.has_value(), ErrorKind::kInvalidData,
               "batch_generator ended before the " + std::to_string(report_.resumed_batches) +
                   " batches the calibration cache holds");
      std::map<std::string, Tensor> feeds = name_inputs(std::move(*skipped), float_graph_.inputs, "batch_generator");
      calibrated_samples += rows_of(feeds);
      if (i == 0 && keep_first_rows)  // the samples a fresh run compares on
        first_rows = leading_rows(feeds, kFirstRows);
    }
    const size_t total = o.batch_nums.value_or(0);  // 0: until the generator ends
    Progress progress("calibrate", total, "batches");
    progress.advance(report_.resumed_batches);
    size_t done = report_.resumed_batches;
    while (!o.batch_nums || done < *o.batch_nums) {
      auto batch = o.batch_generator();
      if (!batch) break;
      std::map<std::string, Tensor> feeds = name_inputs(std::move(*batch), float_graph_.inputs, "batch_generator");
      if (first_rows.empty() && keep_first_rows) first_rows = leading_rows(feeds, kFirstRows);
      ptq_->sample(feeds);
      report_.samples += rows_of(feeds);
      ++done;
      progress.advance();
      after_batch(done, total);
    }
    progress.finish();
    SQ_CHECK(done > 0, ErrorKind::kInvalidData, "batch_generator (data_loader) gave no calibration batches");
    calibrated_samples += report_.samples;
    if (o.batch_nums && done < *o.batch_nums)
      warnings_.push_back("batch_nums is " + std::to_string(*o.batch_nums) + " but the data_loader ended after " +
                          std::to_string(done) + " batches: calibrated on those");
    else if (algo_candidates > 0 && o.batch_nums)
      if (auto next = o.batch_generator())
        held_back = leading_rows(name_inputs(std::move(*next), float_graph_.inputs, "batch_generator"), choice_rows());
  } else {
    std::map<std::string, size_t> ranks;
    for (const auto& in : float_graph_.inputs) ranks[in.name] = in.dims ? in.dims->size() : 0;
    // Resuming: the generator replays from the start; samples already observed are skipped.
    std::vector<std::map<std::string, Tensor>> skipped_first;
    for (size_t i = 0; i < report_.resumed_batches * o.batch_size; ++i) {
      auto skipped = o.sample_generator();
      SQ_CHECK(skipped.has_value(), ErrorKind::kInvalidData,
               "sample_generator ended before the " + std::to_string(report_.resumed_batches) +
                   " batches the calibration cache holds");
      if (keep_first_rows && skipped_first.size() < std::min(kFirstRows, o.batch_size))
        skipped_first.push_back(name_inputs(std::move(*skipped), float_graph_.inputs, "sample_generator"));
    }
    if (!skipped_first.empty()) first_rows = stack_samples(skipped_first, ranks);
    const size_t total = o.batch_nums.value_or(0);  // 0: until the generator ends
    Progress progress("calibrate", total, "batches");
    progress.advance(report_.resumed_batches);
    size_t done = report_.resumed_batches;
    while (!o.batch_nums || done < *o.batch_nums) {
      std::vector<std::map<std::string, Tensor>> samples;
      while (samples.size() < o.batch_size) {
        auto s = o.sample_generator();
        if (!s) break;
        samples.push_back(name_inputs(std::move(*s), float_graph_.inputs, "sample_generator"));
      }
      if (samples.empty()) break;
      if (first_rows.empty() && keep_first_rows) {
        const std::vector<std::map<std::string, Tensor>> first(
            samples.begin(), samples.begin() + static_cast<std::ptrdiff_t>(std::min(kFirstRows, samples.size())));
        first_rows = stack_samples(first, ranks);
      }
      ptq_->sample(stack_samples(samples, ranks));
      report_.samples += samples.size();
      ++done;
      progress.advance();
      after_batch(done, total);
      if (samples.size() < o.batch_size) break;
    }
    progress.finish();
    SQ_CHECK(done > 0, ErrorKind::kInvalidData, "sample_generator gave no calibration samples");
    calibrated_samples = report_.resumed_batches * o.batch_size + report_.samples;
    if (o.batch_nums && done < *o.batch_nums) {
      warnings_.push_back("batch_nums is " + std::to_string(*o.batch_nums) + " but sample_generator ended after " +
                          std::to_string(done) + " batches: calibrated on those");
    } else if (algo_candidates > 0 && o.batch_nums) {
      std::vector<std::map<std::string, Tensor>> next;
      while (next.size() < choice_rows())
        if (auto s = o.sample_generator())
          next.push_back(name_inputs(std::move(*s), float_graph_.inputs, "sample_generator"));
        else
          break;
      if (!next.empty()) held_back = stack_samples(next, ranks);
    }
  }
  report_.batches = ptq_->samples_seen();
  ptq_->release_calibration_buffers();
  report_.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The finished calibration is kept until the model is converted.
  if (!checkpoint.empty() && distributed::size() == 1 && report_.batches > report_.resumed_batches)
    ptq_->save_calibration_state(checkpoint, data_identity());
  if (algo_candidates > 0 && !uncalibrated) {  // weight-only (GPTQ) quantizes no activation
    const bool unseen = !held_back.empty();
    AlgoChoiceOptions ao;
    ao.channel_wise_below_sqnr_db = o.fallback_sqnr_db;
    algo_choice_ = choose_activation_algo(*ptq_, unseen ? held_back : leading_rows(first_rows, choice_rows()), unseen, ao);
    quantized_metadata["slimquant.activation_algo"] = algo_choice_.chosen;
  }
  if (o.fallback_sqnr_db > 0 && !first_rows.empty() && !uncalibrated) {
    const std::map<std::string, Tensor> fallback_samples = leading_rows(first_rows, kFallbackSamples);
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
