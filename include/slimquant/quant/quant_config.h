#pragma once
// QuantConfig: which nodes are quantized and with which observers. Rules, highest priority first:
// per layer (exact node name), per name (glob on node names, e.g. "/layer1/*"), per op type, then
// the global default. Skips (op type, node name/glob, tensors) override all rules.
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/ir/graph.h"
#include "slimquant/quant/observer.h"
#include "slimquant/quant/op_spec.h"

namespace slimquant::quant {

// The runtime the exported QDQ model is shaped for (`deploy_backend`, PaddleSlim's name; the forms
// and the measurements are in docs/int8_execution.md):
// - kSlimquant: what runs fastest in our runtime (per-tensor s8 / u8-with-zero-point-0 activations,
//   Q/DQ on the inputs of the quantized ops); loads in ONNX Runtime too.
// - kOnnxRuntime: the form ONNX Runtime's CPU provider fuses into QLinearConv / QLinearMatMul /
//   QLinearAdd / QLinearGlobalAveragePool ...: asymmetric u8 activations, s8 per-channel weights,
//   int32 biases, Relu/Clip folded into the QuantizeLinear, Add / Mul / pooling / Concat /
//   data movement quantized.
// - kTensorRT: NVIDIA's explicit-quantization rules: symmetric s8 activations (zero point 0),
//   symmetric per-channel s8 weights, Q/DQ only on the inputs of weighted ops, pooling and the
//   residual input of an Add that follows a weighted op.
enum class DeployBackend { kSlimquant, kOnnxRuntime, kTensorRT };
DeployBackend parse_deploy_backend(const std::string& name);  // throws kInvalidArgument naming the choices
const char* deploy_backend_name(DeployBackend backend);

// What is quantized (`--mode`, YAML `mode`):
// - kStatic: weights and activations; activation ranges fixed by calibration.
// - kWeightOnly: weights only, on their per-channel grid of weight_bits behind a DequantizeLinear;
//   activations stay float and no data is needed (PaddleSlim's quant_post_dynamic). The file is
//   about a quarter of the float one; runtimes dequantize the weights once when they load it.
// - kDynamic: weights per channel, activations quantized per inference from their own min/max
//   (ONNX Runtime's quantize_dynamic form: DynamicQuantizeLinear -> MatMulInteger / ConvInteger
//   -> Cast -> Mul (-> Add)); no data needed (PTQ::convert_dynamic).
enum class QuantMode { kStatic, kWeightOnly, kDynamic };
// static, weight-only (or weight_only), dynamic; anything else is kInvalidArgument naming the choices.
QuantMode parse_quant_mode(const std::string& name);
const char* quant_mode_name(QuantMode mode);
// Only kStatic calibrates activations (reads data).
inline bool needs_calibration(QuantMode mode) { return mode == QuantMode::kStatic; }

// How weight-only mode rounds the weights (`--weight-rounding`, YAML `weight_rounding`): kRtn to
// the nearest grid point; kGptq (Frantar et al. 2022) column by column, each column's rounding
// error spread over the columns not yet rounded through the inverse Hessian of the layer's
// calibration inputs (H = 2 X^T X), so the layer's output error is what is minimised. GPTQ needs
// calibration data; without it RTN is used and said so.
enum class WeightRounding { kRtn, kGptq };
WeightRounding parse_weight_rounding(const std::string& name);  // rtn | gptq, else kInvalidArgument
const char* weight_rounding_name(WeightRounding rounding);

// How the runtime multiplies 4-bit weights (`--int4-activations`, YAML `int4_activations`): kFloat
// multiplies the float activations by the exact weights; kInt8 first rounds each group of 32
// activations to int8 on its own scale and multiplies in integers (ONNX Runtime's MatMulNBits does
// this at its default accuracy level 4): about 1.8x faster at batch 1 on AVX2, at the cost of that
// rounding. Recorded in the export's metadata (slimquant.int4_activations), which our runtime reads;
// ONNX Runtime applies its own session setting.
enum class Int4Activations { kFloat, kInt8 };
Int4Activations parse_int4_activations(const std::string& name);  // float | int8, else kInvalidArgument
const char* int4_activations_name(Int4Activations a);

struct QuantRule {
  // Activation observer (`algo`). "auto" weighs several (observer.h); PostTrainingQuantization then
  // chooses one per model (algo_choice.h), other flows use the first candidate, emd.
  std::string activation = "auto";
  std::string weight = "channel_wise_abs_max";     // weight observer (`weight_quantize_type`)
  bool quantize = true;                            // false: leave the matching nodes in float
  // QAT quanters (train::make_quanter names: pact, lsq_plus, moving_abs_max, abs_max); empty = the
  // QAT flow's default (--act-quanter / --weight-quanter).
  std::string activation_quanter = {};
  std::string weight_quanter = {};
};

class QuantConfig {
 public:
  explicit QuantConfig(QuantRule global = {}) : global_(std::move(global)) {}

  QuantConfig& add_type_config(const std::vector<std::string>& op_types, QuantRule rule);
  QuantConfig& add_name_config(const std::vector<std::string>& name_patterns, QuantRule rule);
  QuantConfig& add_layer_config(const std::vector<std::string>& layer_names, QuantRule rule);
  // Registers how a (custom) op type is quantized, making it quantizable.
  QuantConfig& add_qat_layer_mapping(const std::string& op_type, OpQuantSpec spec);

  // Op types quantized (source names like conv2d/mul are accepted and mapped to ONNX types).
  std::vector<std::string> quantizable_op_type = {"Conv", "ConvTranspose", "MatMul", "Gemm"};
  // Also quantize every other op with a spec (pooling, Add, Concat, Softmax, Reshape, ...).
  bool is_full_quantize = false;
  // Stay in float: every node reading or writing one of these tensors, and the node (layer) of
  // each name that is a node name, as analysis.txt lists layers (seed 000 passes those here).
  std::vector<std::string> skip_tensor_list;
  // Op types, node names, or globs on node names (`skip_quant`) that stay in float.
  std::vector<std::string> skip_quant;
  // Per-node modes (`--node-mode PATTERN=MODE`, YAML `node_modes: {PATTERN: MODE}`): the layers whose
  // op type, node name or glob on node names matches PATTERN take MODE instead of `mode` (the last
  // matching entry wins), as skip_quant makes them float. Static and weight-only layers mix in one
  // model (static QDQ around some layers, a weight-only DequantizeLinear on the others' weights,
  // dynamic ones in ONNX Runtime's quantize_dynamic form; PTQ::convert_layers). Static layers need
  // calibration.
  std::vector<std::pair<std::string, QuantMode>> node_modes;
  // The mode of `node`'s layer: its last matching node_modes entry, else `mode`.
  QuantMode mode_for(const ir::Node& node) const;
  // Whether calibration data is read: `mode` or a node_modes entry is static.
  bool calibrates() const;
  // Activations: asymmetric u8 instead of symmetric s8 / u8-with-zero-point-0.
  bool asymmetric_activations = false;
  // The runtime the export is shaped for (see DeployBackend).
  DeployBackend deploy_backend = DeployBackend::kSlimquant;
  QuantMode mode = QuantMode::kStatic;
  // Weight bits (`weight_bits`), 2..8; 0 = the default, 8: the exported file does not depend on
  // the CPU that made it (on CPUs without VNNI our runtime still executes 8-bit weights exactly,
  // docs/int8_execution.md). The value used is recorded in the model's metadata
  // (slimquant.weight_bits).
  int weight_bits = 0;
  int effective_weight_bits() const;
  // Weight-only mode with weight_bits 4 (`block_size`, 32 | 64 | 128; 0 = 32 there): MatMul / Gemm
  // weights stored as ONNX INT4 with one scale per block of block_size values along the reduction
  // (input-feature) axis, read by an opset-21 blocked DequantizeLinear (docs/quantization.md,
  // "4-bit weights"). Other bits and modes refuse a block size.
  int block_size = 0;
  WeightRounding weight_rounding = WeightRounding::kRtn;
  Int4Activations int4_activations = Int4Activations::kFloat;  // 4-bit weight-only only
  // PaddleSlim's `bias_correction`: after rounding, each weight channel's dequantized values are
  // shifted and scaled so that their mean and standard deviation equal the float channel's, then
  // rounded again on the same grid (removes the systematic part of the rounding error; data-free).
  bool bias_correction = false;
  // Convolution inputs quantized per channel from the start (PTQ::set_channel_wise_conv_inputs);
  // otherwise quantize's precision recovery turns them on only for models whose output drifts.
  // Set it for `analyze` to rank layers as such a model is exported.
  bool channel_wise_conv_inputs = false;
  ObserverOptions observer_options;  // weight_bits there is set from the above per weight

  QuantRule& global() { return global_; }
  const QuantRule& global() const { return global_; }
  // The spec when this node is quantized under this config, nullptr otherwise (not a quantizable
  // type, skipped, or its rule says quantize=false).
  const OpQuantSpec* spec_for(const ir::Node& node) const;
  const QuantRule& rule_for(const ir::Node& node) const;
  // Whether nodes of `op_type` are quantizable under quantizable_op_type / is_full_quantize (rules
  // and skips aside).
  bool quantizes_op_type(const std::string& op_type) const;
  bool is_skipped(const ir::Node& node) const;
  // Throws kInvalidArgument naming an entry of quantizable_op_type that is neither a known op
  // type (ONNX or source-document name) nor registered with add_qat_layer_mapping.
  void validate() const;
  // Skip entries (skip_quant patterns, skip_tensor_list tensors or layers) and node_modes patterns that match nothing in `graph`,
  // one message each: a typo there would otherwise silently quantize what the user meant to skip.
  std::vector<std::string> unmatched_skips(const ir::Graph& graph) const;
  // A stable text of everything that affects the result (for checkpoints and caches).
  std::string fingerprint() const;

 private:
  QuantRule global_;
  std::vector<std::pair<std::vector<std::string>, QuantRule>> type_rules_, name_rules_, layer_rules_;
  std::map<std::string, OpQuantSpec> custom_specs_;
};

// Reads the source documents' keys from YAML into `base`: algo, hist_percent, bins, deploy_backend,
// weight_quantize_type, quantizable_op_type, is_full_quantize, skip_tensor_list, skip_quant,
// activation_quantize_type (symmetric|asymmetric, or Paddle's range_abs_max|moving_average_abs_max|abs_max:
// fixed symmetric scales from `algo`), activation_bits (8), type_config / name_config / layer_config
// (maps of key -> {algo, weight_quantize_type, quantize}), bias_correction, channel_wise_conv_inputs, mode
// (static | weight-only | dynamic), node_modes (map of pattern -> mode), round_type (round; adaround
// is refused as not implemented). Unknown keys are an error naming the key
// (typos must not silently change nothing); keys for the calibration flow (batch_size, batch_nums,
// is_use_cache_file, cache_dir, model_dir, ...) are returned in `extra`.
QuantConfig load_quant_config_yaml(const std::string& path, QuantConfig base = QuantConfig(),
                                   std::map<std::string, std::string>* extra = nullptr);

// activation_quantize_type: true for asymmetric; Paddle's range_abs_max, moving_average_abs_max and
// abs_max (fixed scales from algo, as Paddle's QDQ export has them) and symmetric give false.
// kInvalidArgument listing the values otherwise.
bool parse_activation_quantize_type(const std::string& type);

// The flow keys' values (`extra` holds them as text), checked like the command-line flags:
// kInvalidArgument naming the key on bad text.
size_t parse_config_size(const std::string& value, const std::string& key);  // a non-negative integer
double parse_config_double(const std::string& value, const std::string& key);  // a finite number
bool parse_config_bool(const std::string& value, const std::string& key);  // true/True/1/yes, false/False/0/no

}  // namespace slimquant::quant
