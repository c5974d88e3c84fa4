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

#pragma GCC diagnostic pop

}  // namespace slimquant::runtime::ew
