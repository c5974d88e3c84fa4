#pragma once
// Float32 values a compiled plan holds as half-precision bits (DType::kFloat16): a producer that
// offers it (KernelLayouts::float16_outputs) writes them where every reader quantizes what it
// computes from them (KernelLayouts::float16_inputs), halving the bytes of a map that passes
// through the last-level cache. These widen them back to float32.
#include <cstdint>

#include "slimquant/core/tensor.h"

namespace slimquant::runtime {

// dst[i] = the float32 value of the half-precision bits src[i] (exact).
void widen_float16(const uint16_t* src, float* dst, int64_t n);

// t's values as float32: t itself unless it holds float16 bits, else a widened copy (same shape and
// element order).
Tensor as_float32(const Tensor& t);

}  // namespace slimquant::runtime
