#pragma once
// exp on 16 lanes for the hand-written AVX-512 kernels (softmax rows, the Swish pass): ew::exp_f32's
// reduction and polynomial (its constants, elementwise_math.h), times 2^n by vscalefps. Within 2 ulp
// of expf over the normal range, like ew::exp_f32. Callers compile with target("avx512f").
#include <immintrin.h>

#include "runtime/kernels/elementwise/elementwise_math.h"

namespace slimquant::runtime::ew {

// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports once they are inlined (as in int8_depthwise.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// x in [kExpLowest, kExpHighest]: the caller clamps (or masks) beyond, and keeps NaN out or selects it back.
__attribute__((target("avx512f"))) inline __m512 exp_in_range_avx512(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(kExpLog2e)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Hi), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(kExpLn2Lo), r);
  __m512 p = _mm512_set1_ps(kExpPoly[0]);
  for (int i = 1; i < 6; ++i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kExpPoly[i]));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

// The logistic function 1 / (1 + e^-x) for the activation passes (Swish, Sigmoid), lighter than
// exp_in_range_avx512 above: e^-x = 2^m e^-r with m = round(-x log2 e) and r = x + m ln 2 (ln 2 in
// two parts), e^-r by a degree-5 polynomial on |r| <= ln 2 / 2 (near-minimax, within 1.9e-7
// relative evaluated in float: about what expf's 2 ulp allow), and the reciprocal of 1 + e^-x from
// vrcp14ps and one Newton step (a vdivps per 16 values costs more than all the rest). On Swish's hot
// path (EfficientNet's activations: about a cycle per value) each instruction saved counts. Past
// |x| = 87 the value is 0 or 1 to float precision (x is clamped); a NaN x gives NaN.
// Coefficients of e^-r in powers of r (those of e^s near-minimax on |s| <= ln 2 / 2, odd ones negated).
inline constexpr float kLogisticExpPoly[6] = {1.00000012f, -0.999999702f, 0.499988943f,
                                              -0.166675746f, 0.0419153832f, -0.00829764642f};
__attribute__((target("avx512f"))) inline __m512 logistic_avx512(__m512 x) {
  // min / max return their second operand when one is NaN: x last keeps a NaN.
  x = _mm512_min_ps(_mm512_set1_ps(87.f), _mm512_max_ps(_mm512_set1_ps(-87.f), x));
  // round(-x log2 e) by adding and taking away 1.5 * 2^23 (|-x log2 e| <= 126; rounds half to even
  // like vroundscaleps, in two instructions any FMA port runs instead of two of port 0's).
  const __m512 magic = _mm512_set1_ps(12582912.f);
  const __m512 m = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(-kExpLog2e), magic), magic);
  __m512 r = _mm512_fmadd_ps(m, _mm512_set1_ps(kExpLn2Hi), x);
  r = _mm512_fmadd_ps(m, _mm512_set1_ps(kExpLn2Lo), r);
  __m512 p = _mm512_set1_ps(kLogisticExpPoly[5]);
  for (int i = 4; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kLogisticExpPoly[i]));
  const __m512 d = _mm512_add_ps(_mm512_set1_ps(1.f), _mm512_scalef_ps(p, m));
  const __m512 q = _mm512_rcp14_ps(d);
  return _mm512_fmadd_ps(q, _mm512_fnmadd_ps(d, q, _mm512_set1_ps(1.f)), q);
}

// The logistic function for passes that write 8-bit codes, where its 7e-5 relative error is under
// a fiftieth of a step even at the top of the range (255 steps from zero): e^-r by degree 4 (within 4e-6 of e^-r), ln 2 in one
// part (m ln 2's rounding, at most 2e-7 at |m| = 126), and vrcp14ps without the Newton step (2^-14
// relative): within 7e-5 relative of 1 / (1 + e^-x), five instructions fewer than logistic_avx512
// (0.41 -> 0.31 ns per value in the s8 Swish pass). Clamped above only: below -87, 2^m overflows
// to infinity and the reciprocal gives 0, as the clamp's value would (also where m is no longer
// rounded, past |x| = 2^22: e^-r stays positive); above, an unrounded m would leave r too large for
// the polynomial. A NaN x gives NaN, as logistic_avx512.
// Coefficients: least squares at 200 Chebyshev nodes of |r| <= ln 2 / 2.
inline constexpr float kLogisticCodesExpPoly[5] = {1.00000008f, -0.999962278f, 0.499988691f, -0.16792161f,
                                                   0.0419175297f};
__attribute__((target("avx512f"))) inline __m512 logistic_for_codes_avx512(__m512 x) {
  x = _mm512_min_ps(_mm512_set1_ps(87.f), x);
  const __m512 magic = _mm512_set1_ps(12582912.f);
  const __m512 m = _mm512_sub_ps(_mm512_fmadd_ps(x, _mm512_set1_ps(-kExpLog2e), magic), magic);
  const __m512 r = _mm512_fmadd_ps(m, _mm512_set1_ps(0.693147182f), x);
  __m512 p = _mm512_set1_ps(kLogisticCodesExpPoly[4]);
  for (int i = 3; i >= 0; --i) p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(kLogisticCodesExpPoly[i]));
  return _mm512_rcp14_ps(_mm512_add_ps(_mm512_set1_ps(1.f), _mm512_scalef_ps(p, m)));
}

// v / (1 + e^(-alpha v)) = v logistic(alpha v); kUnitAlpha: alpha is 1 (SiLU), one product less.
// kForCodes: the result is about to be quantized to 8 bits (logistic_for_codes_avx512).
template <bool kUnitAlpha = false, bool kForCodes = false>
__attribute__((target("avx512f"))) inline __m512 swish_avx512(__m512 v, __m512 alpha) {
  const __m512 x = kUnitAlpha ? v : _mm512_mul_ps(v, alpha);
  return _mm512_mul_ps(v, kForCodes ? logistic_for_codes_avx512(x) : logistic_avx512(x));
}

#pragma GCC diagnostic pop

}  // namespace slimquant::runtime::ew
