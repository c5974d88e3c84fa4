#include "slimquant/quant/op_spec.h"

namespace slimquant::quant {

namespace {
int64_t axis0(const ir::Node&, const Tensor&) { return 0; }
int64_t conv_transpose_axis(const ir::Node&, const Tensor&) { return 1; }
// Gemm computes A·B: output channels are B's columns, or its rows when transB=1.
int64_t gemm_axis(const ir::Node& n, const Tensor&) { return n.attr_int("transB", 0) ? 0 : 1; }
// MatMul weights [.., K, N]: output channels along the last axis.
int64_t matmul_axis(const ir::Node&, const Tensor& w) { return w.rank() >= 2 ? static_cast<int64_t>(w.rank()) - 1 : 0; }
}  // namespace

const std::map<std::string, OpQuantSpec>& builtin_op_specs() {
  static const std::map<std::string, OpQuantSpec> specs = [] {
    std::map<std::string, OpQuantSpec> m;
    m["Conv"] = {{0}, 1, axis0, true};
    m["ConvTranspose"] = {{0}, 1, conv_transpose_axis, true};
    m["Gemm"] = {{0}, 1, gemm_axis, true};
    m["MatMul"] = {{0, 1}, 1, matmul_axis, true};
    // Full quantization: data-movement and elementwise ops quantized on all or first inputs.
    for (const char* op : {"Add", "Sub", "Mul", "Concat", "Sum", "Max", "Min", "Equal", "Greater", "Less",
                           "GreaterOrEqual", "LessOrEqual"})
      m[op] = {{-1}, -1, nullptr, false};
    for (const char* op : {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool", "Softmax", "Reshape",
                           "Transpose", "Resize", "Slice", "Squeeze", "Unsqueeze", "Flatten", "Relu", "Clip",
                           "Sigmoid", "LeakyRelu", "HardSwish", "HardSigmoid", "Tanh", "Split", "Gather",
                           "DepthToSpace", "SpaceToDepth", "Pad", "ReduceMean", "LayerNormalization",
                           "BatchNormalization", "Div", "Pow", "Sqrt", "Erf", "ArgMax"})
      m[op] = {{0}, -1, nullptr, false};
    return m;
  }();
  return specs;
}

std::vector<std::string> onnx_op_types_for(const std::string& name) {
  static const std::map<std::string, std::vector<std::string>> aliases = {
      {"conv2d", {"Conv"}},
      {"depthwise_conv2d", {"Conv"}},
      {"conv2d_transpose", {"ConvTranspose"}},
      {"mul", {"MatMul", "Gemm"}},
      {"matmul", {"MatMul"}},
      {"matmul_v2", {"MatMul"}},
      {"fc", {"Gemm"}},
      {"pool2d", {"MaxPool", "AveragePool", "GlobalAveragePool", "GlobalMaxPool"}},
      {"elementwise_add", {"Add"}},
      {"elementwise_sub", {"Sub"}},
      {"elementwise_mul", {"Mul"}},
      {"elementwise_div", {"Div"}},
      {"elementwise_pow", {"Pow"}},
      {"concat", {"Concat"}},
      {"softmax", {"Softmax"}},
      {"reshape", {"Reshape"}},
      {"reshape2", {"Reshape"}},
      {"transpose", {"Transpose"}},
      {"transpose2", {"Transpose"}},
      {"squeeze", {"Squeeze"}},
      {"squeeze2", {"Squeeze"}},
      {"unsqueeze", {"Unsqueeze"}},
      {"unsqueeze2", {"Unsqueeze"}},
      {"slice", {"Slice"}},
      {"relu", {"Relu"}},
      {"relu6", {"Clip"}},
      {"leaky_relu", {"LeakyRelu"}},
      {"sigmoid", {"Sigmoid"}},
      {"hard_swish", {"HardSwish"}},
      {"hard_sigmoid", {"HardSigmoid"}},
      {"tanh", {"Tanh"}},
      {"nearest_interp", {"Resize"}},
      {"nearest_interp_v2", {"Resize"}},
      {"bilinear_interp", {"Resize"}},
      {"bilinear_interp_v2", {"Resize"}},
      {"flatten", {"Flatten"}},
      {"flatten2", {"Flatten"}},
      {"flatten_contiguous_range", {"Flatten"}},
      {"split", {"Split"}},
      {"gather", {"Gather"}},
      {"trilinear_interp", {"Resize"}},
      {"trilinear_interp_v2", {"Resize"}},
      {"equal", {"Equal"}},
      // What paddle2onnx writes: not_equal is Not(Equal(a, b)) (the comparison reads the floats);
      // greater_equal / less_equal are GreaterOrEqual / LessOrEqual from opset 12 and
      // Not(Less) / Not(Greater) below it (the version converter keeps that form); mean, the mean
      // of all elements, is a ReduceMean.
      {"not_equal", {"Equal"}},
      {"greater_than", {"Greater"}},
      {"greater_equal", {"GreaterOrEqual", "Less"}},
      {"less_than", {"Less"}},
      {"less_equal", {"LessOrEqual", "Greater"}},
      {"argmax", {"ArgMax"}},
      {"arg_max", {"ArgMax"}},
      {"mean", {"ReduceMean"}},
      {"reduce_mean", {"ReduceMean"}},
      {"layer_norm", {"LayerNormalization"}},
      {"batch_norm", {"BatchNormalization"}},
      {"scale", {"Mul"}},
      {"dropout", {}},
  };
  auto it = aliases.find(name);
  if (it != aliases.end()) return it->second;
  return {name};
}

}  // namespace slimquant::quant
