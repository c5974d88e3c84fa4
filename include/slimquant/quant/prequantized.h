#pragma once
// Files that others (or we) already quantized. Quantizing one again would observe the rounded
// values of its Q/DQ pairs and stack a second grid on its weights, so `quantize` names the form it
// found and stops, unless asked to requantize: then a static QDQ file is turned back into the float
// model it stands for (weights dequantized, activation pairs removed) and quantized from that.
#include <map>
#include <string>

#include "slimquant/ir/graph.h"

namespace slimquant::quant {

enum class QuantizedForm {
  kNone,
  kStaticQdq,  // QuantizeLinear / DequantizeLinear pairs (ONNX Runtime's QDQ format, ours)
  kQOperator,  // QLinearConv, QLinearMatMul, ... (ONNX Runtime's QOperator format)
  kDynamic,    // DynamicQuantizeLinear with ConvInteger / MatMulInteger (quantize_dynamic)
};

struct QuantizedFormFound {
  QuantizedForm form = QuantizedForm::kNone;
  std::map<std::string, int> op_counts;  // the quantization ops that tell the form, by op type
  // "static QDQ (12 QuantizeLinear, 30 DequantizeLinear)"; "" for kNone.
  std::string describe() const;
};

QuantizedFormFound find_quantized_form(const ir::Graph& g);

// The float model a static QDQ graph stands for: each DequantizeLinear of a constant becomes the
// dequantized float constant, each QuantizeLinear -> DequantizeLinear pair on a value is removed.
// Q/DQ nodes on graph inputs or outputs (integer interfaces) stay. Throws kUnsupported for blocked
// (block_size) weights.
ir::Graph dequantized_model(const ir::Graph& g);

}  // namespace slimquant::quant
