#pragma once
// The execution-only MatMul with 4-bit blocked weights ("qb4w": XNNPACK's name for blockwise 4-bit
// weights, f32 activations): the fusion `fold_blocked_dequantize_into_matmul`
// (fusions/qb4w_matmul_fusion.cpp) writes it in place of DequantizeLinear(INT4 codes, scales,
// axis, block_size) -> MatMul / Gemm, and kernels/integer/matmul_f32_qb4w.cpp runs it, reading
// the 4-bit codes directly.
//
//   y[m, n] = sum_k a[m, k] * (q[k, n] * s[k / block_size, n])  (+ bias[n])
//
// with q the codes (in [-8, 7]) and s the scales as the DequantizeLinear holds them.
#include <cstdint>
#include <memory>

#include "runtime/fused_ops/gelu_erf.h"
#include "slimquant/ir/graph.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::fused_ops {

inline constexpr const char* kMatMulQb4wDomain = dnnl_kernels::kGeluDomain;  // com.slimquant.exec
inline constexpr const char* kMatMulQb4w = "MatMulQb4w";

// Inputs: A (float32, [..., K]), the codes (int8 constant in [-8, 7]; [K, N], or [N, K] when
// weight_transposed), the scales (float32 constant, the codes' shape with the K axis divided by
// block_size, rounded up), optionally a bias (float32 constant of N values).
enum class MatMulQb4wInput : size_t { kA = 0, kCodes = 1, kScales = 2, kBias = 3 };

// The model metadata key that chooses how the runtime multiplies 4-bit weights (written by
// `quantize --int4-activations`): "float" (absent: the default) multiplies A as it is by the exact
// weights; "int8" rounds each group of 32 values of A to int8 on its own symmetric scale first and
// multiplies in integers, as ONNX Runtime's MatMulNBits does at its default accuracy level 4.
inline constexpr const char* kInt4ActivationsKey = "slimquant.int4_activations";

struct MatMulQb4wAttrs {
  int64_t block_size = 32;
  bool weight_transposed = false;  // codes [N, K] (Gemm transB = 1, DequantizeLinear axis 1)
  bool int8_activations = false;   // kInt4ActivationsKey = "int8" (batch <= 8 rows; more run in float)

  static MatMulQb4wAttrs parse(const ir::Node& node) {
    MatMulQb4wAttrs a;
    a.block_size = node.attr_int("block_size", 32);
    a.weight_transposed = node.attr_int("weight_transposed", 0) != 0;
    a.int8_activations = node.attr_int("int8_activations", 0) != 0;
    return a;
  }
  void write(ir::Node& node) const {
    node.attrs["block_size"] = block_size;
    node.attrs["weight_transposed"] = int64_t{weight_transposed ? 1 : 0};
    if (int8_activations) node.attrs["int8_activations"] = int64_t{1};
  }
};

std::unique_ptr<Kernel> make_matmul_f32_qb4w(const KernelInit& init);

}  // namespace slimquant::runtime::fused_ops
