#pragma once
// The source documents' one-call post-training quantization (seed 002's PostTrainingQuantization):
// load the FP32 model, calibrate on batch_size x batch_nums samples, convert to a QDQ model, save.
// Built on PTQ (quantize / sample / convert); use PTQ directly for full control.
//
//   PostTrainingQuantizationOptions o;
//   o.model_dir = "model.onnx";  o.dataset = calib.get();  o.batch_nums = 10;  o.algo = "KL";
//   PostTrainingQuantization ptq(o);
//   ptq.quantize();
//   ptq.save_quantized_model("model.int8.onnx");
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/data/dataset.h"
#include "slimquant/quant/algo_choice.h"
#include "slimquant/quant/calibration.h"
#include "slimquant/quant/precision_fallback.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::quant {

// SampleGenerator and BatchGenerator: calibration.h.
struct PostTrainingQuantizationOptions {
  // The FP32 model: a directory holding it (model_filename names the file when not model.onnx),
  // or the .onnx file itself; params_filename names an external-data file (checked to exist).
  std::string model_dir, model_filename, params_filename;
  // Calibration data: a Dataset (single-input models), sample_generator or batch_generator.
  // Exactly one.
  const data::Dataset* dataset = nullptr;
  SampleGenerator sample_generator;
  BatchGenerator batch_generator;
  size_t batch_size = 10;
  std::optional<size_t> batch_nums;  // unset: every sample the data has
  // The activation observer; "auto" (the product default, docs/quantization.md; the source's is KL)
  // calibrates with each of auto_algo_candidates() and keeps the one whose quantized model stays
  // closest to FP32 on samples held back from calibration (algo_choice.h).
  std::string algo = "auto";
  std::string weight_quantize_type = "channel_wise_abs_max";
  int weight_bits = 0;  // 0 = the default, 8 (QuantConfig::weight_bits)
  std::string deploy_backend = "slimquant";  // slimquant, onnxruntime or tensorrt (QuantConfig::deploy_backend)
  std::vector<std::string> quantizable_op_type = {"Conv", "ConvTranspose", "MatMul", "Gemm"};  // or conv2d, mul, ...
  bool is_full_quantize = false;
  float hist_percent = 0.99999f;
  std::vector<std::string> skip_tensor_list;
  std::vector<std::string> skip_quant;  // op types, node names or globs
  bool asymmetric_activations = false;
  bool bias_correction = false;  // QuantConfig::bias_correction
  // static or weight-only (QuantConfig::mode). weight-only needs no calibration source: the
  // weights are quantized from their own values and activations stay float.
  std::string mode = "static";
  // Weight-only mode, weight_bits 4: blocks of MatMul / Gemm weights (QuantConfig::block_size; 0 =
  // 32) and their rounding, rtn or gptq (QuantConfig::weight_rounding; gptq calibrates from the
  // data source given, and falls back to rtn with a note without one).
  int block_size = 0;
  std::string weight_rounding = "rtn";
  std::string int4_activations = "float";  // float or int8 (QuantConfig::int4_activations)
  // A model that is already quantized (prequantized.h) is refused with kUnsupported naming its
  // form, unless this is set: then a static QDQ file is dequantized and quantized again.
  bool requantize = false;
  // Keep the calibration state on disk in cache_dir (written as batches complete, deleted when
  // the model is saved): an interrupted calibration resumes where it stopped. Without it the state
  // is kept in the user's cache instead (calibration_checkpoint()). Observers never
  // hold samples, so memory does not grow with the data either way.
  bool is_use_cache_file = false;
  std::string cache_dir = "./temp_post_training";
  // Precision fallback (precision_fallback.h): when the quantized model's output SQNR against
  // FP32 on the first calibration samples is below fallback_sqnr_db, the layers whose quantization
  // costs the most stay in float, at most fallback_max_float_fraction of them. 0 disables.
  double fallback_sqnr_db = 20.0;
  double fallback_max_float_fraction = 0.1;
  // When set, used as is (per layer/name/type rules) instead of the fields algo ...
  // asymmetric_activations above.
  std::optional<QuantConfig> config;
};

struct CalibrationReport {
  size_t batches = 0;          // batches observed in total
  size_t samples = 0;          // samples observed in this run
  size_t resumed_batches = 0;  // batches taken from the cache instead of being run again
  double seconds = 0;          // wall time of this run's calibration
};

class PostTrainingQuantization {
 public:
  explicit PostTrainingQuantization(PostTrainingQuantizationOptions options);
  ~PostTrainingQuantization();

  // Loads, calibrates (showing progress on a terminal) and converts; returns the QDQ graph.
  // Errors: kInvalidData for empty data or NaN/Inf (naming batch and tensor), kIo for an
  // unwritable cache_dir, kInvalidArgument for unknown algo / op type names.
  const ir::Graph& quantize();
  // Writes the QDQ model (atomically; checked by onnx::checker). quantize() must have run.
  // Distributed (docs/scale-out.md): quantize() shards the data set's calibration batches over the
  // ranks; save_quantized_model() is collective: rank 0 writes, every rank returns once it has.
  // The calibration kept while the job ran (calibration_checkpoint()) is deleted once written.
  void save_quantized_model(const std::string& path);
  // Where quantize() keeps the calibration until save_quantized_model: cache_path() with
  // is_use_cache_file, else a file in the user's cache (see default_calibration_checkpoint), so
  // that the same job run again after a failure resumes from it; "" when none.
  const std::string& calibration_checkpoint() const { return checkpoint_; }

  const ir::Graph& float_graph() const { return float_graph_; }
  const ir::Graph& quantized_graph() const;
  const PTQ& ptq() const { return *ptq_; }
  const CalibrationReport& report() const { return report_; }
  // The activation observer "auto" chose, with what it measured (chosen empty for an explicit algo).
  const ActivationAlgoChoice& algo_choice() const { return algo_choice_; }
  // What the precision fallback measured and chose (float_layers empty when not needed).
  const PrecisionFallbackResult& fallback() const { return fallback_; }
  // Non-fatal problems (skip entries matching nothing, batch_nums beyond the data).
  const std::vector<std::string>& warnings() const { return warnings_; }
  // Where the calibration cache lives while quantize() runs.
  std::string cache_path() const;

 private:
  QuantConfig make_config() const;
  std::string data_identity() const;  // what a resumed calibration must see again
  // Without is_use_cache_file: where the calibration is kept while quantize() runs
  // (SLIMQUANT_CALIBRATION_CACHE, a folder or 0 for none; default $XDG_CACHE_HOME or
  // ~/.cache/slimquant/calibration), or "" when there is no usable folder.
  std::string default_calibration_checkpoint() const;

  PostTrainingQuantizationOptions options_;
  ir::Graph float_graph_;
  std::unique_ptr<PTQ> ptq_;
  std::optional<ir::Graph> quantized_;
  CalibrationReport report_;
  std::string checkpoint_;
  bool created_cache_dir_ = false;
  PrecisionFallbackResult fallback_;
  ActivationAlgoChoice algo_choice_;
  std::vector<std::string> warnings_;
};

}  // namespace slimquant::quant
