#pragma once
// Execution-only plan fusion (one rule of execution_fusion_rules()).
#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime {

// DequantizeLinear(constant int8 codes in [-8, 7] (INT4 weights are held so), constant float32
// scales, axis, block_size a multiple of 32; no zero point or zeros) whose output only a MatMul
// reads as its B (axis 0), or a Gemm (transA 0, alpha and beta 1, bias absent or a constant of N
// values; axis 0, or 1 with transB) becomes one fused_ops::MatMulQb4w node reading the 4-bit codes
// directly. Rule "fold_blocked_dequantize_into_matmul"; it counts the MatMul / Gemm nodes fused.
ir::Rule qb4w_matmul_fusion_rule();

// Whether `dq` (a node of g) is a DequantizeLinear the rule above would fold: constant folding
// leaves those for it (the folded float weight would be 8 times the bytes).
bool foldable_into_qb4w_matmul(const ir::Graph& g, const ir::Node& dq);

}  // namespace slimquant::runtime
