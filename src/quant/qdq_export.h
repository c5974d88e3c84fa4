#pragma once
// The QDQ writer PTQ and QAT share: given a float graph, its quantized layers and the parameters
// of every activation tensor and weight, writes the standard ONNX QDQ graph (activation
// QuantizeLinear -> DequantizeLinear pairs, int8 weight initializers in [-127, 127] feeding
// per-channel DequantizeLinear, float biases). Activation zero points are always stated; weight
// zero points (0, int8) are left to DequantizeLinear's default. The graph carries no value_info.
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/ir/graph.h"
#include "slimquant/quant/observer.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::quant {

struct QdqExportOptions {
  // false (PTQ): only the quantized layers read an activation's DequantizeLinear; other readers
  // keep the float tensor. true (QAT): every reader does, as in the training graph, where the
  // quanter sits on the tensor itself.
  bool rewire_all_readers = false;
  // QuantConfig::bias_correction for the weights.
  bool bias_correction = false;
  // Conv / Gemm float biases become int32 initializers (scale = x scale * weight scale, per channel)
  // read through a DequantizeLinear, as ONNX Runtime's quantizer writes them (its QLinearConv
  // fusion takes the bias only in that form).
  bool quantize_bias = false;
  // Weight zero points written (int8 zeros, one per channel) instead of left to DequantizeLinear's
  // default: ONNX Runtime 1.20's QGemm rejects a per-channel scale without a zero point of its shape.
  bool state_weight_zero_points = false;
};

// `act` holds the parameters of every activation tensor to quantize (those the layers read);
// weight_params gives a layer's per-channel weight parameters (called for layers with a weight,
// whose float values are taken from float_graph).
ir::Graph write_qdq_graph(const ir::Graph& float_graph, const std::vector<const Layer*>& layers,
                          const std::map<std::string, QuantParam>& act,
                          const std::function<QuantParam(const Layer&)>& weight_params,
                          const QdqExportOptions& options = {});

// ONNX Runtime's form of an activation: a Relu or Clip whose output is only quantized is removed
// and its input quantized in its place, when the QuantizeLinear's grid already clips to the same
// bounds (u8 with zero point 0 for Relu; a grid inside [min, max] for Clip): Q(x) then equals
// Q(Relu(x)) for every x. The grid keeps the activation's calibrated range. Returns how many were
// folded.
int fold_activations_into_quantize(ir::Graph& qdq);
// The float interval an 8-bit per-tensor QuantizeLinear's grid covers, [(qmin - zp) s, (qmax - zp) s]
// (nullopt for another one).
std::optional<std::pair<double, double>> grid_bounds(const ir::Graph& g, const ir::Node& q);

}  // namespace slimquant::quant
