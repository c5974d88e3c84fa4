#pragma once
// x * sigmoid(alpha x) in place on AVX-512 (swish_avx512.cpp): what the float convolutions run after
// their primitive instead of oneDNN 2.6's swish post-op, which cost a 16 -> 96 1x1 convolution at
// 112x112 0.60 ms over its 0.26 ms, where this pass takes 0.39 ms. (The INT8 convolutions keep the
// post-op: an f32 output, this pass and the rounding pass made EfficientNet-B0 INT8 7.8 -> 10.3 ms.)
#include <cstdint>

namespace slimquant::runtime::ew {

// Whether the CPU has AVX-512 and SLIMQUANT_SWISH is not "dnnl" (which keeps oneDNN's post-op, to
// compare).
bool swish_pass_available();
// x[i] = x[i] / (1 + exp(-alpha x[i])) for n floats (exp within 2 ulp; NaN stays NaN). Call only
// where swish_pass_available().
void swish_in_place_avx512(float* x, int64_t n, float alpha);

}  // namespace slimquant::runtime::ew
