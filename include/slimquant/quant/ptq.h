#pragma once
// Post-training quantization: quantize() decides what is observed, sample() feeds calibration
// batches through the float model (Session hooks), convert() freezes the observers' scales into a
// standard ONNX QDQ graph. Scales are kept after convert(), so convert() can be called again for
// any subset of layers (the PTQ analysis quantizes one layer at a time without re-calibrating).
#include <functional>
#include <iosfwd>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "slimquant/ir/graph.h"
#include "slimquant/quant/quant_config.h"
#include "slimquant/runtime/session.h"

namespace slimquant::quant {

// One quantizable node with its weight and input activations.
struct Layer {
  std::string name;     // node name (unique; unnamed nodes get their first output's name)
  std::string op_type;
  std::vector<std::string> activations;  // input tensors quantized per tensor
  std::string weight;                    // constant weight quantized per channel ("" = none)
  int64_t weight_axis = 0;
  std::string weight_observer;           // weight_quantize_type chosen for this layer
  QuantMode mode = QuantMode::kStatic;   // QuantConfig::mode_for its node
};

// Per layer (names from PTQ::layers()), the form PTQ::convert_layers() writes it in; a layer absent
// stays float (as a skipped one does).
using LayerModes = std::map<std::string, QuantMode>;

class PTQ {
 public:
  explicit PTQ(QuantConfig config);
  ~PTQ();

  // Prepares the float model (BatchNorm folded, constants folded, opset >= 13 for per-channel
  // Q/DQ) and attaches observers to every tensor a quantized layer reads.
  void quantize(const ir::Graph& float_graph);
  // One calibration batch (graph inputs by name).
  void sample(const std::map<std::string, Tensor>& feeds);
  void sample(const Tensor& batch);  // single-input models
  size_t samples_seen() const { return batches_; }  // calibration batches fed so far
  // Frees the calibration session's buffers and plans once no more batches come (the precision
  // recovery that follows then holds its own sessions, not these too); sample() still works after.
  void release_calibration_buffers();

  // A hash of everything the calibration result depends on: the prepared model, the QuantConfig
  // and the observers attached. Set by quantize().
  const std::string& fingerprint() const { return fingerprint_; }
  // Calibration cache (is_use_cache_file): every observer's accumulated state and the number of
  // batches fed, written atomically. load returns false when `path` does not exist, and throws
  // kInvalidData when it was written for another model or configuration, naming both.
  // `data_identity` describes the calibration data and batching (a resumed run must see the
  // same batches); it is part of the check.
  void save_calibration_state(const std::string& path, const std::string& data_identity = "") const;
  bool load_calibration_state(const std::string& path, const std::string& data_identity = "");
  // Sharded calibration (docs/scale-out.md): each rank of a distributed run sampled its own block of
  // batches, rank r's block right after rank r-1's (distributed::block_of). Merges every rank's
  // observers in rank order (Observer::merge_state), so that every rank ends with exactly the
  // observers, scales and samples_seen() of one process that sampled all the batches in order.
  // Collective: every rank calls it. Nothing to do in a one-process run.
  void merge_calibration_across_ranks();

  // Problems that do not stop quantization but that a user wants to hear about (e.g. a skip
  // pattern that matches no node). Filled by quantize().
  const std::vector<std::string>& warnings() const { return warnings_; }
  // The QDQ graph: every layer quantized, or only `only_layers` (names from layers()), each in its
  // own mode (Layer::mode: QuantConfig::mode, or its node_modes entry): convert_layers(layer_modes(only_layers)).
  // All layers under QuantMode::kWeightOnly: convert_weights_only(); under kDynamic, convert_dynamic().
  ir::Graph convert(const std::optional<std::set<std::string>>& only_layers = std::nullopt) const;
  // Every layer (or only `only_layers`) with its Layer::mode; `only_layers` may name layers inside
  // If branches (all_layers()) one by one.
  LayerModes layer_modes(const std::optional<std::set<std::string>>& only_layers = std::nullopt) const;
  // The graph with each layer of `modes` in its mode, the others float. One mode for all: the same
  // bytes as that mode's convert (an empty map: QuantConfig::mode's). Modes mixed: the static
  // convert of the static layers, then the weight-only layers' weights rewritten exactly as
  // convert_weights_only() writes them, then the dynamic layers rewritten as convert_dynamic()
  // writes them (metadata slimquant.mode "mixed", slimquant.weight_only_layers and
  // slimquant.dynamic_layers their counts). Names are those of all_layers() or layers() (an If:
  // all of its branches' layers); unknown names are kInvalidArgument; a dynamic layer
  // dynamic_applies() refuses stays float.
  ir::Graph convert_layers(const LayerModes& modes) const;
  // The weight-only graph (QuantMode::kWeightOnly): each chosen layer's weight on its per-channel
  // grid behind a DequantizeLinear, every activation float. Needs no calibration.
  ir::Graph convert_weights_only(const std::optional<std::set<std::string>>& only_layers = std::nullopt) const;
  // The dynamic graph (QuantMode::kDynamic, ONNX Runtime's quantize_dynamic form): each chosen
  // MatMul / Gemm / Conv reads DynamicQuantizeLinear's u8 codes of its input and its per-channel
  // int8 weight through MatMulInteger / ConvInteger, then Cast, Mul by the scales, Add the bias.
  // Needs no calibration (ptq_dynamic.cpp).
  ir::Graph convert_dynamic(const std::optional<std::set<std::string>>& only_layers = std::nullopt) const;
  // Whether the dynamic form can take `layer`: a MatMul (2-D weight), Gemm (transA = 0, constant C)
  // or Conv (constant bias) whose weight is constant and whose input is not.
  bool dynamic_applies(const Layer& layer) const;

  // The layers, each an op of the model's own graph. An If whose branches hold quantizable layers is
  // one layer here (op_type "If", no activations or weight): each branch is quantized by a PTQ of
  // its own (the body as a graph of its own, the outer values it reads as inputs), which sample()
  // feeds with what the branch read whenever the If took it. Converting the If converts its
  // branches' layers (in their own modes when the If's is static, all in the If's mode otherwise);
  // leaving it out leaves them float. A branch calibration never took keeps its static layers
  // float (unobserved_layers() names them).
  const std::vector<Layer>& layers() const { return layers_; }
  // Every quantizable layer, those inside If branches (recursively) in place of their If.
  std::vector<const Layer*> all_layers() const;
  // Each of all_layers() with the mode convert() gives it (a branch's layers take their If's mode
  // when that is not static): what convert() writes, named layer by layer.
  LayerModes leaf_layer_modes() const;
  const ir::Graph& float_graph() const { return float_graph_; }
  const QuantConfig& config() const { return config_; }
  // Activation tensors observed, their observers and the parameters convert() uses.
  std::vector<std::string> observed_tensors() const;
  // Layers whose inputs held no values in any calibration batch fed so far (a detector's box head
  // when the selection before it kept nothing on every sample): they have no range and stay float
  // in convert(); empty before the first batch.
  std::vector<std::string> unobserved_layers() const;
  // The warning that names them ("2 layers stay float (a, b): ..."), or "" when there are none.
  std::string unobserved_layers_warning() const;
  const Observer& activation_observer(const std::string& tensor) const;
  QuantParam activation_params(const std::string& tensor) const;
  // Per-channel parameters and observer of a layer's weight (layer must have one); `weight`
  // replaces the model's weight tensor when given (same shape).
  QuantParam weight_params(const Layer& layer, const Tensor* weight = nullptr) const;
  std::unique_ptr<Observer> weight_observer(const Layer& layer, const Tensor* weight = nullptr) const;

  // Channel-wise convolution inputs. A convolution's input quantized with one scale per channel
  // (s_c = the channel's calibrated max |x| / qmax) multiplies out exactly: W'[o, c] = W[o, c] s_c
  // is quantized per output channel, and the input goes through QuantizeLinear(x, s_c, axis 1) ->
  // DequantizeLinear(1): the convolution reads the integers, still an int8 x int8 kernel. On
  // models whose channels differ widely in range (PP-OCRv4 rec: one channel at 8.97 where the
  // median is 0.68) this gains 5-20 dB per tensor over one scale. Off by default: convert()
  // writes it when enabled (the precision recovery of PostTrainingQuantization turns it on for
  // models whose output drifts; docs/quantization.md). Only for the slimquant deploy backend and
  // activations with zero point 0.
  void set_channel_wise_conv_inputs(bool enabled);
  bool channel_wise_conv_inputs() const { return channel_wise_conv_inputs_; }
  // Observers of algo "auto" weigh several algorithms at once (observer.h). selectable_activation_algos()
  // lists them (empty when no tensor has such an observer); select_activation_algo() makes every
  // such observer report one of them, and convert() then writes that algorithm's scales.
  std::vector<std::string> selectable_activation_algos() const;
  void select_activation_algo(const std::string& algo);
  const std::string& selected_activation_algo() const { return selected_activation_algo_; }
  // Per channel (axis 1) max |x| of every convolution input seen in calibration.
  const std::map<std::string, std::vector<float>>& channel_abs_max() const { return channel_abs_max_; }

 private:
  // The activation grid the deploy backend (and asymmetric_activations) asks for, given the
  // observer's own choice.
  QuantScheme activation_scheme(QuantScheme observer_default) const;
  // The static QDQ graph of `only_layers` (all layers' modes taken as static).
  ir::Graph convert_static(const std::optional<std::set<std::string>>& only_layers) const;
  // `base` with the weights of `only_layers` (those with a weight) rewritten as weight-only mode
  // writes them (convert_weights_only() on the float graph; PTQ::convert_layers on a static one).
  ir::Graph write_weights_only(const ir::Graph& base, const std::optional<std::set<std::string>>& only_layers) const;
  // `src` with the nodes of `only_layers` that dynamic_applies() rewritten in the dynamic form
  // (convert_dynamic() on the float graph; PTQ::convert_layers on a static or mixed one).
  ir::Graph write_dynamic(const ir::Graph& src, const std::optional<std::set<std::string>>& only_layers) const;
  // A dynamic layer's float weight as the integer op reads it ([K, N] for MatMul / Gemm, Gemm's
  // alpha folded in), its channel axis and its float bias (Gemm's C times beta).
  struct DynamicForm {
    Tensor weight;
    int64_t axis = 0;
    const Tensor* bias = nullptr;
    float bias_scale = 1.f;
  };
  // Whether `node` (layer's node) has a dynamic form: op type, ranks and constant inputs only, no
  // tensor built (dynamic_applies() is asked per layer, and for every layer by the target search).
  bool has_dynamic_form(const ir::Node& node, const Layer& layer) const;
  std::optional<DynamicForm> dynamic_form_of(const ir::Node& node, const Layer& layer) const;
  // Quantizes each Conv output whose readers all read 8-bit codes (their kernels declare
  // Fold::kDequantizedInput; a squeeze-excitation block's pool and gating) for all of them, for a
  // backend that reads it once as codes.
  void quantize_code_readable_inputs(const std::function<bool(const std::string&)>& known_non_float);

  // The If branches with quantizable layers (see layers()).
  struct Branch;
  void find_branches(const ir::Graph& typed);
  // `out` (a convert of float_graph_) with the branches converted: all layers of an If named in
  // `modes`, and layers inside branches named one by one.
  void convert_branches(ir::Graph& out, const LayerModes& modes) const;
  bool is_branching_layer(const std::string& name) const;
  const Branch* branch_holding(const std::string& layer) const;  // of all_layers(), or nullptr
  void save_state(std::ostream& out) const;
  void load_state(std::istream& in, const std::string& path);

  QuantConfig config_;
  std::vector<std::unique_ptr<Branch>> branches_;
  ir::Graph float_graph_;
  std::vector<Layer> layers_;
  std::map<std::string, size_t> layer_nodes_;  // layer name -> its node's index in float_graph_.nodes
  std::map<std::string, std::unique_ptr<Observer>> observers_;  // by activation tensor
  std::map<std::string, std::vector<float>> channel_abs_max_;     // conv inputs: max |x| per channel
  // GPTQ (weight_rounding gptq): X^T X (K x K, row-major, double) of each blocked layer's input,
  // accumulated by sample(); empty otherwise.
  std::map<std::string, std::vector<double>> input_gram_;
  bool channel_wise_conv_inputs_ = false;
  std::string selected_activation_algo_;  // "" until select_activation_algo()
  void rewrite_channel_wise_conv_inputs(ir::Graph& qdq, const std::vector<const Layer*>& chosen,
                                        const std::map<std::string, QuantParam>& act) const;
  std::unique_ptr<runtime::Session> session_;
  bool nested_ = false;  // a branch's PTQ: the model-wide checks (skip patterns) are its parent's
  size_t batches_ = 0;
  std::string fingerprint_;
  std::vector<std::string> warnings_;
};

// Quantizes float weights per channel to symmetric s8 in [-q, q], q = 2^(bits-1) - 1 (127 for 8
// bits; saturating, round half to even), given per-channel scales along `axis`. With
// bias_correction, QuantConfig::bias_correction's mean / standard deviation matching per channel.
Tensor quantize_weight_s8(const Tensor& weight, const std::vector<float>& scales, int64_t axis, int bits = 8,
                          bool bias_correction = false);

}  // namespace slimquant::quant
