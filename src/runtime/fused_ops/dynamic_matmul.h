#pragma once
// The execution-only dynamically quantized MatMul (QuantMode::kDynamic's file, ONNX Runtime's
// quantize_dynamic form): the plan's fusion (fusions/dynamic_matmul_fusion.cpp) turns
//
//   DynamicQuantizeLinear(x) -> MatMulInteger(x_q, w_q, z_x, z_w = 0) -> Cast(float)
//     -> Mul(., Mul(s_x, s_w)) [-> Add(., bias)]
//
// (or ConvInteger) into one node that kernels/integer/dynamic_matmul.cpp runs: x's range and codes as
// DynamicQuantizeLinear computes them, one int8 matmul, y = float(acc) * (s_x * s_w[j]) (+ bias[j]).
#include <cstddef>

namespace slimquant::runtime::fused_ops {

inline constexpr const char* kDynamicMatMulDomain = "com.slimquant.exec";
inline constexpr const char* kDynamicMatMul = "DynamicQuantMatMul";
// The same for ConvInteger (2-D): w constant [M, C / group, kh, kw], s8 with zero point 0 or u8 with
// one zero point 128 (the exporter's ONNX Runtime-compatible form), w_scale and bias one or M
// values ([1, M, 1, 1] in the file); the Conv attributes copied from the ConvInteger.
inline constexpr const char* kDynamicConv = "DynamicQuantConv";

// x: float32 [..., K]; w: constant s8 [K, N]; w_zero_point: constant zeros (one or N) or absent;
// w_scale: constant float32, one or N values; bias: constant float32, one or N values, or absent.
// MatMul only: x may instead be the u8 codes of a DynamicQuantizeLinear that several MatMuls read
// (attention's q, k and v), with its scale and zero point as x_scale and x_zero_point: the codes
// are computed once for all of them. residual (MatMul only, optional): a float32 tensor of the
// output's shape added last, y = (float(acc) * s + bias) + residual (a transformer's skip
// connection, the Add the fusion took). x_range (MatMul with a float x only, optional): float32
// {min(0, min x), max(0, max x)}, NaNs skipped, computed by x's producer in its own pass (the GELU
// pass's second output): the kernel then skips its range scan.
enum DynamicMatMulInput : size_t {
  kDynamicX,
  kDynamicW,
  kDynamicWZeroPoint,
  kDynamicWScale,
  kDynamicBias,
  kDynamicXScale,
  kDynamicXZeroPoint,
  kDynamicResidual,
  kDynamicXRange
};

}  // namespace slimquant::runtime::fused_ops
