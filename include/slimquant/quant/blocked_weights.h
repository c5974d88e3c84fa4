#pragma once
// 4-bit blocked weights (weight-only mode, weight_bits 4): a MatMul / Gemm weight quantized with one
// symmetric scale per block of `block_size` consecutive values along its reduction (input-feature)
// axis, codes in ONNX INT4's range [-8, 7], read back by an opset-21 DequantizeLinear(axis,
// block_size). Two roundings: to nearest (RTN), and GPTQ (Frantar et al., "GPTQ: Accurate
// Post-Training Quantization for Generative Pre-trained Transformers", 2022).
//
// Grid: s = max |w| over the block / 7 (1 when the block is all zero); q = clamp(round_half_even(w
// / s), -8, 7); the weight is read as q * s.
#include <cstdint>
#include <vector>

#include "slimquant/core/tensor.h"

namespace slimquant::quant {

struct BlockedWeights {
  Tensor codes;   // int8 in [-8, 7], the weight's shape (held unpacked; saved as INT4)
  Tensor scales;  // float32: the weight's shape with dim `axis` = ceil(dim / block_size)
};

inline constexpr int kBlockedWeightMaxCode = 7;  // scale = max |w| / 7
inline constexpr int kBlockedWeightMinCode = -8;

// The block sizes offered (32, 64, 128): kInvalidArgument naming them otherwise.
void check_block_size(int64_t block_size);

// `weight` is 2-D float32; `axis` (0 or 1) is its reduction axis.
BlockedWeights quantize_blocked_rtn(const Tensor& weight, int64_t axis, int64_t block_size);

// GPTQ options. `damp`: the fraction of the mean diagonal of H added to its diagonal (the paper's
// 1%); `column_block`: the columns processed together before the lazy update of the rest (the
// paper's B = 128; the result does not depend on it beyond float rounding).
struct GptqOptions {
  double damp = 0.01;
  int64_t column_block = 128;
};

// `gram` = X^T X (K x K row-major, K = the weight's reduction size) over the calibration rows x of
// the layer's input; H = 2 X^T X. Quantizes the columns (input features) in order, each rounded
// with the scale of its block, computed from the then-updated weights when the block is reached;
// each column's error, divided by the Cholesky factor's diagonal, is spread over the remaining
// columns through the upper Cholesky factor of H^-1.
BlockedWeights quantize_blocked_gptq(const Tensor& weight, int64_t axis, int64_t block_size,
                                     const std::vector<double>& gram, const GptqOptions& options = {});

// codes * scales, as the DequantizeLinear computes it (float32, the weight's shape).
Tensor dequantize_blocked_weights(const BlockedWeights& q, int64_t axis, int64_t block_size);

// Accumulates x^T x of `rows` rows of k values each into gram (k x k, row-major).
void accumulate_gram(const float* x, int64_t rows, int64_t k, std::vector<double>& gram);

}  // namespace slimquant::quant
