#pragma once
// Precision fallback: after calibration, when the quantized model's outputs (the logits before a
// final Softmax) drift too far from FP32 on calibration samples, keep the few layers whose quantization costs the most in float.
// Some real models (PP-OCRv4 rec: HardSwish + affine activations over 38 convolutions, errors
// compounding to 13.5 dB output SQNR) lose many points with every observer; a handful of early
// layers in float recovers them (docs/quantization.md). Models that quantize well (the fixtures:
// 36-43 dB) are left untouched at the cost of one evaluation.
#include <map>
#include <set>
#include <string>
#include <vector>

#include "slimquant/core/tensor.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::quant {

struct PrecisionFallbackOptions {
  // Output SQNR (dB, all float outputs together, against FP32) the quantized model must reach;
  // 0 disables the fallback.
  double target_sqnr_db = 20.0;
  // At most this fraction of the quantized layers (rounded up) stays in float.
  double max_float_fraction = 0.1;
  // Work bound in single-sample inferences (0 = none). The exact ranking runs one evaluation per
  // layer; when that does not fit (a large network at high resolution), layers are ranked by the
  // noise each adds in the quantized model (one pass of it, compared with the reference pass on a
  // strided sample of every layer's input and output), tried in doubling groups, on as few samples
  // as the bound allows. PostTrainingQuantization bounds it by twice the
  // calibration's samples.
  size_t max_sample_runs = 0;
};

struct PrecisionFallbackResult {
  double sqnr_db_before = 0, sqnr_db_after = 0;
  std::vector<std::string> float_layers;  // layers left in float, in the order they were chosen
  bool triggered = false;                 // the model was below the target
  // Convolution inputs quantized per channel (PTQ::set_channel_wise_conv_inputs), the first
  // remedy: left on when it raised the output SQNR (sqnr_db_per_tensor: before it).
  bool channel_wise_conv_inputs = false;
  double sqnr_db_per_tensor = 0;
  size_t evaluations = 0;                 // quantized models evaluated
  size_t samples = 0;                     // samples each evaluation ran
  // "output" (each layer alone quantized, measured at the output) or "added noise" (the noise each
  // layer adds to what reaches it, in the whole quantized model).
  std::string ranking;
  std::set<std::string> quantized_layers(const PTQ& ptq) const;  // every layer but float_layers
};

// The Softmax / LogSoftmax node whose result a graph output is (directly, or through the Reshape
// that follows an opset < 13 Softmax after the opset upgrade), or nullptr.
const ir::Node* softmax_writing(const ir::Graph& graph, const std::string& output);
// The values whose drift from FP32 is measured: the graph outputs, except that an output written by
// Softmax / LogSoftmax (softmax_writing) is measured at its input (the logits), and an output
// computed after a data-dependent selection (NonZero, NonMaxSuppression, TopK, Compress, Unique: a
// detector's post-processing) or holding integers or booleans (a segmentation's ArgMax classes) at
// the float values it was chosen or decided from that the inputs determine.
std::vector<std::string> drift_measured_values(const ir::Graph& graph);
// The float32 values drift_measured_values measures when an output of `graph` follows a selection
// (a detector's boxes after NMS) or is a decision (ArgMax classes), else none: what an analysis
// ranking layers by one output compares.
std::vector<std::string> selection_inputs(const ir::Graph& graph);
// `graph` (the float model or a QDQ variant of it) with one output, kJoinedMeasuredValues [1, n]:
// `values` flattened and concatenated, one row per run (selection_inputs of the float model, whose
// runs take one image); what only the former outputs needed is removed.
inline constexpr const char* kJoinedMeasuredValues = "slimquant_selection_inputs";
ir::Graph join_measured_values(ir::Graph graph, const std::vector<std::string>& values);

// SQNR in dB of `quantized` against `reference`: that of the worst float output they share (each
// output's over all its values); outputs all zero in FP32 are left out unless every output is.
double output_sqnr_db(const std::map<std::string, Tensor>& reference, const std::map<std::string, Tensor>& quantized);

// `ptq` calibrated; `samples` a few calibration feeds (graph inputs by name). Below the target, first
// quantizes convolution inputs per channel (kept when that raises the SQNR; `ptq` is left set
// accordingly), then ranks layers by the output SQNR with each alone quantized and leaves the most
// damaging ones in float one at a time until the target is met or the budget is spent; keeps the
// best set seen. Beyond options.max_sample_runs, the cheaper ranking described there.
PrecisionFallbackResult choose_precision_fallback(PTQ& ptq, const std::map<std::string, Tensor>& samples,
                                                  const PrecisionFallbackOptions& options = {});

}  // namespace slimquant::quant
