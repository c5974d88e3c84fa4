#pragma once
// Reading the quantization parameters of a QuantizeLinear / DequantizeLinear node from a graph: the
// one reader lowering, the session's quantize folds and QDQ export share.
#include <cstdint>
#include <optional>
#include <string>

#include "slimquant/core/quant_param.h"
#include "slimquant/ir/graph.h"

namespace slimquant::ir {

// What a caller knows about the node's input x better than the graph's value infos (lowering traces
// element types through the ops a QuantizeLinear was moved above; a Conv's output has its weight's
// rank). Unset fields are looked up in the graph (initializers, then value infos).
struct QdqInputFacts {
  DType dtype = DType::kUndefined;
  int64_t rank = -1;
};

// Reads node n's parameters into `out`, or returns why they cannot be read (naming the node):
//   - scale: a float32 constant of rank 0 or 1, every value positive and finite;
//   - zero point (optional): a constant with as many elements as scale; its element type is the
//     quantized type. Without one: QuantizeLinear's output_dtype attribute, else uint8;
//     DequantizeLinear's input type;
//   - one scale is per tensor (axis kPerTensor); several are per axis along the `axis` attribute
//     (default 1), which must be within the input's rank and is returned non-negative.
// n must be a QuantizeLinear or DequantizeLinear of the default domain.
std::optional<std::string> read_qdq_params(const Graph& g, const Node& n, QuantParam& out, QdqInputFacts facts = {});

// The same, failing with kInvalidModel and that reason.
QuantParam qdq_params(const Graph& g, const Node& n, QdqInputFacts facts = {});

}  // namespace slimquant::ir
