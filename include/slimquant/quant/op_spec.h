#pragma once
// Per-op quantization metadata: which inputs of an op are activations to quantize and which one is
// a weight (with its per-channel axis). Calibration and QDQ insertion are driven by this table,
// never by per-op quantizer functions. Users register custom op types the same way
// (QuantConfig::add_qat_layer_mapping).
#include <functional>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/ir/graph.h"

namespace slimquant::quant {

struct OpQuantSpec {
  // Inputs quantized as activations (per tensor). Negative = all inputs (Concat, Add, ...).
  std::vector<int> activation_inputs;
  // Input holding a constant weight, quantized per channel; -1 = none. For MatMul, input 1 is a
  // weight only when it is a constant, otherwise it is quantized as an activation.
  int weight_input = -1;
  // Axis of the weight's output channels for per-channel scales, given the node (e.g. Gemm transB).
  std::function<int64_t(const ir::Node&, const Tensor& weight)> weight_axis;
  // Compute-heavy ops that integer kernels accelerate (Conv, MatMul, Gemm): the default
  // `quantizable_op_type`. Others are only quantized with `is_full_quantize`.
  bool compute_op = false;
};

// Built-in specs by ONNX op type (Conv, ConvTranspose, MatMul, Gemm, and the full-quantize set:
// pooling, Add, Sub, Mul, Concat, Softmax, Reshape, Transpose, Resize, Slice, Squeeze, Unsqueeze,
// Flatten, Relu, Clip, Sigmoid, ...).
const std::map<std::string, OpQuantSpec>& builtin_op_specs();

// The source documents' op names mapped to ONNX op types (conv2d -> Conv, depthwise_conv2d -> Conv,
// mul -> MatMul/Gemm, matmul -> MatMul, elementwise_add -> Add, pool2d -> MaxPool/AveragePool/...).
// Unknown names are returned unchanged (already ONNX op types).
std::vector<std::string> onnx_op_types_for(const std::string& name);

}  // namespace slimquant::quant
