#pragma once
// GELU (erf form) on AVX-512 from a piecewise polynomial of the normal CDF (gelu_avx512.cpp): what
// the INT8 MatMul / Gemm run after their primitive, fused with the output's quantization, instead of
// oneDNN 2.6's gelu_erf post-op (which cost ViT-B/16's [197, 768] x [768, 3072] 0.33-0.57 ms over
// its 1.33 ms; this pass 0.24 ms), and what the float Gelu node runs.
// Accuracy: gelu(x) within 4e-8 max(|x|, 1) of x Phi(x) plus the float rounding of the products
// (Phi within 3.9e-8, relative 1.8e-6 in its tail); oneDNN's gelu_erf is within about 1.5e-7 max(|x|, 1).
#include <cstdint>

#include "slimquant/core/tensor.h"

namespace slimquant::runtime::ew {

// Whether the CPU has AVX-512 (F and DQ) and SLIMQUANT_GELU is not "dnnl" (which keeps oneDNN's, to compare).
bool gelu_pass_available();
// y[i] = gelu(v[i]) * scale + shift for n floats (y may be v). NaN stays NaN.
void gelu_affine_avx512(const float* v, float* y, int64_t n, float scale, float shift);
// The same (scale 1, shift 0) also returning lo = min(0, min y), hi = max(0, max y) over the values
// written, NaNs skipped: the range a dynamically quantized reader of y needs (integer::
// dynamic_quant_params_from_range), taken in this pass instead of another one over y.
void gelu_with_range_avx512(const float* v, float* y, int64_t n, float& lo, float& hi);
// y[i] = saturate(round_half_even(gelu(v[i]) * scale + shift)) as u8 or s8 (a NaN gives the type's
// lowest code, as quant_math::saturate_round does).
void gelu_requantize_avx512(const float* v, void* y, DType y_type, int64_t n, float scale, float shift);

}  // namespace slimquant::runtime::ew
