#pragma once
// Writing 4-bit blocked weights into a graph (weight-only mode, weight_bits 4): which layers take
// them, and the opset-21 DequantizeLinear that reads them.
#include <string>
#include <vector>

#include "slimquant/ir/graph.h"
#include "slimquant/quant/blocked_weights.h"

namespace slimquant::quant {

// The reduction (input-feature) axis of `node`'s weight when it takes 4-bit blocks, else -1:
// MatMul whose B is a 2-D float initializer (B [K, N]: 0), Gemm whose B is one (1 with transB).
int64_t blocked_weight_axis(const ir::Node& node, const ir::Graph& g);

struct BlockedLayer {
  std::string node;    // the MatMul / Gemm
  std::string weight;  // its float initializer
  int64_t axis = 0;
  BlockedWeights q;
};

// Raises g to opset 21 (ir::convert_opset: refused, naming the node, when an operator changed its
// meaning on the way), then reads each layer's weight through DequantizeLinear(INT4 codes, scales,
// axis, block_size) with no zero point (0); a float weight no other node reads is removed.
void write_blocked_weights(ir::Graph& g, const std::vector<BlockedLayer>& layers, int64_t block_size);

}  // namespace slimquant::quant
