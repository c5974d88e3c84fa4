#pragma once
// Quantization parameters, one description for every layer (observers choose them, PTQ and QAT
// export them, lowering reads them back from a graph, the runtime kernels and QAT quanters apply
// them), and the one arithmetic they are applied with:
//
//   quantize:     q = saturate(round_half_even(x / scale) + zero_point)      (x / scale in float)
//   dequantize:   y = float(q - zero_point) * scale
//   fake quant:   y = dequantize(quantize(x)), bit-identical to running the two
//
// Division (not multiplication by 1 / scale) and ties to even match the ONNX reference and ONNX
// Runtime's MLAS kernels bit for bit. Saturation happens before rounding, on v = x / s against
// [qmin - z, qmax - z]: rounding is monotone and the bounds are integers, so this equals
// saturate-after-round, keeps |v| small enough for the exact add-magic rounding, and needs no
// integer overflow care. NaN quantizes to the lowest code, as in MLAS. The functions are inline and
// branch-free so the kernels' loops over them vectorise (runtime/kernels/elementwise/quantize_linear.cpp).
#include <cstdint>
#include <vector>

#include "slimquant/core/tensor.h"

namespace slimquant {

struct QuantParam {
  static constexpr int64_t kPerTensor = -1;

  DType dtype = DType::kInt8;       // u8, s8 (u16 / s16 in QuantizeLinear, s32 for a quantized bias)
  std::vector<float> scale;         // one per tensor, or one per channel along `axis`
  std::vector<int32_t> zero_point;  // as many as scale
  int64_t axis = kPerTensor;        // kPerTensor, or the channel axis (non-negative)
  int bits = 8;                     // < 8: a signed grid within +-(2^(bits-1) - 1) (weights)

  bool per_tensor() const { return axis < 0; }
  // The integer range of dtype (narrowed by bits for a signed type).
  int32_t qmin() const;
  int32_t qmax() const;
};

// The integer range of an element type: u8, s8, u16, s16, s32 (kUnsupported for any other).
int32_t qmin_of(DType t);
int32_t qmax_of(DType t);

namespace quant_math {

// 1.5 * 2^23: (v + m) - m rounds |v| < 2^22 half to even with plain float adds (vectorises without
// SSE4.1's roundps, unlike std::nearbyint).
inline constexpr float kRoundHalfEvenMagic = 12582912.f;

// v clamped to [lo, hi] (integers, |lo|, |hi| < 2^22), then rounded half to even; NaN gives lo.
// Both arms of each ?: are plain values, so x86 compiles them to one maxps / minps (whose operand
// order gives exactly this NaN rule) and loops over it vectorise.
inline float saturate_round(float v, float lo, float hi) {
  v = v > lo ? v : lo;
  v = v < hi ? v : hi;
  return (v + kRoundHalfEvenMagic) - kRoundHalfEvenMagic;
}

// round_half_even(x / s) saturated to [lo, hi] = [qmin - z, qmax - z]: the code minus the zero point.
inline float quantize_offset(float x, float s, float lo, float hi) { return saturate_round(x / s, lo, hi); }

// q = saturate(round_half_even(x / s) + z) within [qmin, qmax].
inline int32_t quantize(float x, float s, int32_t z, int32_t qmin, int32_t qmax) {
  return static_cast<int32_t>(quantize_offset(x, s, static_cast<float>(qmin - z), static_cast<float>(qmax - z))) + z;
}

inline float dequantize(int32_t q, float s, int32_t z) { return static_cast<float>(q - z) * s; }

// dequantize(quantize(x)) in one step.
inline float fake_quantize(float x, float s, int32_t z, int32_t qmin, int32_t qmax) {
  return quantize_offset(x, s, static_cast<float>(qmin - z), static_cast<float>(qmax - z)) * s;
}

}  // namespace quant_math

}  // namespace slimquant
