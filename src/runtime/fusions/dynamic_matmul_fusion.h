#pragma once
// Execution-only plan fusion (one rule of execution_fusion_rules()).
#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime {

// ONNX Runtime's dynamic quantization of a MatMul (what quantize --mode dynamic writes):
//   DynamicQuantizeLinear(x) -> MatMulInteger(x_q, w_q, z_x, z_w) -> Cast(to float)
//     -> Mul(., S) [-> Add(., bias)],   S = Mul(s_x, w_scale)
// with constant s8 w_q [K, N], zero z_w, w_scale and bias of one or N float32 values, becomes one
// fused_ops::kDynamicMatMul node reading x; a ConvInteger (2-D, s8 weights with zero points 0 or
// u8 ones with one zero point 128, a [1, M, 1, 1] bias) one fused_ops::kDynamicConv node (kernels/integer/dynamic_matmul.cpp). The intermediate
// values must be private (not kept, read by the chain alone); the DynamicQuantizeLinear goes once
// no reader of its outputs is left (others reading x_q keep it). Rule "fuse_dynamic_matmul"; it
// counts the MatMulInteger nodes fused.
ir::Rule dynamic_matmul_fusion_rule();
// After the erf GELU fusion: a GELU node alone feeding a fused dynamic MatMul's float x computes x's
// range in its pass (its second output, the MatMul's x_range input).
ir::Rule gelu_range_rule();

}  // namespace slimquant::runtime
