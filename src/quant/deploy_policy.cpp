#include "quant/deploy_policy.h"

#include <algorithm>
#include <set>

namespace slimquant::quant {
namespace {

// ONNX Runtime fuses DequantizeLinear -> op -> QuantizeLinear into one integer kernel around the
// ops it runs in integers (QLinearGlobalAveragePool, QLinearAdd, QLinearConcat, ...), and those
// take a single output scale: with a per-channel QuantizeLinear after them the model loads but
// fails at run time (ONNX Runtime 1.30: "y_scale must be a scalar or 1D tensor of size 1", on the
// pooled squeeze-excitation input of PP-OCRv4 det). True when x is written by an op other than a
// weighted one (whose fused kernels check the output's scale) from a DequantizeLinear's output.
bool written_by_integer_op_of_onnx_runtime(const ir::Graph& g, const std::string& x) {
  const int p = g.producer(x);
  if (p < 0) return false;
  const ir::Node& op = g.nodes[static_cast<size_t>(p)];
  if (op.op_type == "Conv" || op.op_type == "ConvTranspose" || op.op_type == "Gemm" || op.op_type == "MatMul" ||
      op.op_type == "DequantizeLinear")
    return false;
  return std::any_of(op.inputs.begin(), op.inputs.end(), [&](const std::string& in) {
    const int d = in.empty() ? -1 : g.producer(in);
    return d >= 0 && g.nodes[static_cast<size_t>(d)].op_type == "DequantizeLinear";
  });
}

// slimquant's own runtime: quantizes what quantizable_op_type lists (or every op with a spec under
// is_full_quantize), reads inputs that all their readers take as codes once (squeeze-excitation inputs), takes per-channel convolution inputs.
class SlimquantPolicy final : public DeployPolicy {
 public:
  bool quantizes(const ir::Node&, const OpQuantSpec&, bool listed, bool full_quantize) const override {
    return listed || full_quantize;
  }
  QuantScheme activation_scheme(QuantScheme observer_default, bool asymmetric_activations) const override {
    return asymmetric_activations ? QuantScheme::kAsymmetric : observer_default;
  }
  bool quantizes_code_readable_inputs() const override { return true; }
  // Our files also load in ONNX Runtime: not after an op it runs in integers.
  bool allows_channel_wise_conv_input(const ir::Graph& qdq, const std::string& x) const override {
    return !written_by_integer_op_of_onnx_runtime(qdq, x);
  }
  QdqExportOptions export_options() const override {
    QdqExportOptions o;
    o.state_weight_zero_points = false;
    return o;
  }
};

// ONNX Runtime's quantizer's form: uint8 asymmetric activations, int32 biases, and besides the
// listed types the ops its CPU provider runs in integers when their inputs and output are Q/DQ'd
// (QLinear* kernels, or Q/DQ dropped around data movement), as its quantizer places them. Relu and
// Clip are not quantized: they are folded into the QuantizeLinear that follows them.
class OnnxRuntimePolicy final : public DeployPolicy {
 public:
  bool quantizes(const ir::Node& node, const OpQuantSpec&, bool listed, bool full_quantize) const override {
    static const std::set<std::string> kOnnxRuntimeQuantizedOps = {
        "Add",     "Mul",       "Concat",  "MaxPool", "AveragePool", "GlobalAveragePool", "Sigmoid", "LeakyRelu", "Softmax",
        "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze",   "Resize",            "Split",   "Gather"};
    if (node.op_type == "Relu" || node.op_type == "Clip") return false;  // folded into the next Q
    return listed || full_quantize || kOnnxRuntimeQuantizedOps.count(node.op_type);
  }
  // ONNX Runtime 1.30's basic graph optimizations abort (an assertion in its graph code) on a
  // DequantizeLinear -> Transpose whose output a subgraph reads (Silero VAD: the LSTM branch of an
  // If reads two transposes of a convolution's output): such a Transpose stays float.
  std::vector<int> activation_inputs(const ir::Graph& g, const QuantConfig&, const ir::Node& node,
                                     std::vector<int> from_spec) const override {
    if (node.op_type != "Transpose" || node.outputs.empty()) return from_spec;
    for (int c : g.consumers(node.outputs[0])) {
      const ir::Node& reader = g.nodes[static_cast<size_t>(c)];
      for (size_t i = reader.declared_inputs(); i < reader.inputs.size(); ++i)
        if (reader.inputs[i] == node.outputs[0]) return {};
    }
    return from_spec;
  }
  QuantScheme activation_scheme(QuantScheme, bool) const override { return QuantScheme::kAsymmetric; }
  QdqExportOptions export_options() const override {
    QdqExportOptions o;
    o.quantize_bias = true;
    o.state_weight_zero_points = true;
    return o;
  }
  void finish_export(ir::Graph& qdq) const override { fold_activations_into_quantize(qdq); }
};

// TensorRT's explicit quantization: Q/DQ only where it fuses them (the weighted ops, pooling inputs,
// an Add's residual input), whatever is_full_quantize says; symmetric int8 activations.
class TensorRtPolicy final : public DeployPolicy {
 public:
  bool quantizes(const ir::Node& node, const OpQuantSpec& spec, bool listed, bool) const override {
    static const std::set<std::string> kTensorRtQuantizedOps = {"Add", "MaxPool", "AveragePool", "GlobalAveragePool"};
    return (listed && spec.compute_op) || kTensorRtQuantizedOps.count(node.op_type);
  }
  // TensorRT fuses an Add into the weighted op (Conv, Gemm, ...) that produces one of its inputs
  // when that op's output has no other reader and carries no Q/DQ; the other (residual) input must
  // be quantized. An Add with no such input is an int8 elementwise Add: both inputs are quantized.
  std::vector<int> activation_inputs(const ir::Graph& g, const QuantConfig& config, const ir::Node& node,
                                     std::vector<int> from_spec) const override {
    if (node.op_type != "Add") return from_spec;
    int fused = -1;
    for (size_t i = 0; i < node.inputs.size() && fused < 0; ++i) {
      const int p = g.producer(node.inputs[i]);
      if (p < 0) continue;
      const OpQuantSpec* spec = config.spec_for(g.nodes[static_cast<size_t>(p)]);
      if (spec && spec->compute_op && g.consumers(node.inputs[i]).size() == 1 && !g.is_graph_output(node.inputs[i]))
        fused = static_cast<int>(i);
    }
    std::vector<int> quantized;
    for (size_t i = 0; i < node.inputs.size(); ++i)
      if (static_cast<int>(i) != fused) quantized.push_back(static_cast<int>(i));
    return quantized;
  }
  QuantScheme activation_scheme(QuantScheme, bool) const override { return QuantScheme::kSymmetric; }
  bool fixed_softmax_grid() const override { return false; }
  QdqExportOptions export_options() const override {
    QdqExportOptions o;
    o.state_weight_zero_points = true;
    return o;
  }
};

}  // namespace

const DeployPolicy& DeployPolicy::of(DeployBackend backend) {
  static const SlimquantPolicy slimquant;
  static const OnnxRuntimePolicy onnxruntime;
  static const TensorRtPolicy tensorrt;
  switch (backend) {
    case DeployBackend::kSlimquant: return slimquant;
    case DeployBackend::kOnnxRuntime: return onnxruntime;
    case DeployBackend::kTensorRT: return tensorrt;
  }
  fail(ErrorKind::kInternal, "unknown deploy backend");
}

}  // namespace slimquant::quant
