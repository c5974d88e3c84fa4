#pragma once
// exp on 16 lanes for the hand-written AVX-512 kernels (softmax rows, the SiLU pass): n =
// round(x / ln2), r = x - n ln2 (ln2 in two parts, exact), exp(r) by the degree-6 polynomial of
// ew::exp_f32 (Cephes' expf coefficients), times 2^n by vscalefps. Within 2 ulp of expf over the
// normal range, like ew::exp_f32. Callers compile with target("avx512f").
#include <immintrin.h>

namespace slimquant::runtime::ew {

// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports once they are inlined (as in int8_depthwise.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// x in [-87.34, 88.72]: the caller clamps (or masks) beyond, and keeps NaN out or selects it back.
__attribute__((target("avx512f"))) inline __m512 exp_in_range_avx512(__m512 x) {
  const __m512 n = _mm512_roundscale_ps(_mm512_mul_ps(x, _mm512_set1_ps(1.44269504088896341f)),
                                        _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC);
  __m512 r = _mm512_fnmadd_ps(n, _mm512_set1_ps(0.693359375f), x);
  r = _mm512_fnmadd_ps(n, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_fmadd_ps(_mm512_mul_ps(p, r), r, _mm512_add_ps(r, _mm512_set1_ps(1.f)));
  return _mm512_scalef_ps(p, n);
}

inline constexpr float kExpLowest = -87.33654022216797f;  // below: exp under the normal range
inline constexpr float kExpHighest = 88.72283935546875f;  // above: exp overflows

#pragma GCC diagnostic pop

}  // namespace slimquant::runtime::ew
