#pragma once
// x * sigmoid(alpha x) (and x * hard_sigmoid(x)) on AVX-512 (swish_avx512.cpp): what the float
// convolutions run after their
// primitive instead of oneDNN 2.6's swish post-op, which cost a 16 -> 96 1x1 convolution at 112x112
// 0.60 ms over its 0.26 ms, where this pass takes 0.39 ms; and what the INT8 convolutions run, fused
// with the output's quantization, on bands of their f32 output that stay in cache
// (int8_conv_bands.h; over a whole f32 output the pass was memory-bound and made EfficientNet-B0
// INT8 slower, 7.8 -> 10.3 ms).
#include <cstdint>

#include "slimquant/core/tensor.h"

namespace slimquant::runtime::ew {

// Whether the CPU has AVX-512 (F and BW) and SLIMQUANT_SWISH is not "dnnl" (which keeps oneDNN's post-op, to
// compare).
bool swish_pass_available();
// x[i] = x[i] / (1 + exp(-alpha x[i])) for n floats (exp within 2 ulp; NaN stays NaN). Call only
// where swish_pass_available().
void swish_in_place_avx512(float* x, int64_t n, float alpha);
// The gated activations the output pass evaluates: Swish, x * sigmoid(alpha x), and HardSwish,
// x * clip(x / 6 + 1 / 2, 0, 1).
enum class Gate { kSwish, kHardSwish };
// y[i] = gate(v[i]) * factor[c] + offset[c] for n values laid out [..., channels] (c = i % channels,
// channels-last; channels 1: factor[0] and offset[0] for all): as float32 (y may be v), or rounded
// half to even and saturated as u8 / s8 codes (a NaN gives the type's lowest code, as
// quant_math::saturate_round does). alpha: Swish's.
void gated_output_avx512(Gate gate, const float* v, void* y, DType y_type, int64_t n, float alpha, int64_t channels,
                         const float* factor, const float* offset);

}  // namespace slimquant::runtime::ew
