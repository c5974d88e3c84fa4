#include "runtime/kernels/elementwise/swish_avx512.h"

#include <immintrin.h>

#include <cstdlib>
#include <string>

#include "runtime/kernels/elementwise/avx512_exp.h"

namespace slimquant::runtime::ew {

bool swish_pass_available() {
  static const bool on = [] {
    const char* v = std::getenv("SLIMQUANT_SWISH");
    return __builtin_cpu_supports("avx512f") && !(v && std::string(v) == "dnnl");
  }();
  return on;
}

namespace {
// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*() (see avx512_exp.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// v / (1 + exp(-alpha v)), the exponent's argument clamped to exp's range: past it the quotient is
// v (large positive v) or v / 3.4e38 (large negative v, within a denormal of the true 0). A NaN v
// gives NaN through the division.
__attribute__((target("avx512f"))) inline __m512 swish_lanes(__m512 v, __m512 minus_alpha) {
  __m512 t = _mm512_mul_ps(v, minus_alpha);
  t = _mm512_min_ps(_mm512_max_ps(t, _mm512_set1_ps(kExpLowest)), _mm512_set1_ps(kExpHighest));
  return _mm512_div_ps(v, _mm512_add_ps(_mm512_set1_ps(1.f), exp_in_range_avx512(t)));
}

#pragma GCC diagnostic pop
}  // namespace

__attribute__((target("avx512f"))) void swish_in_place_avx512(float* x, int64_t n, float alpha) {
  const __m512 minus_alpha = _mm512_set1_ps(-alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, swish_lanes(_mm512_loadu_ps(x + i), minus_alpha));
  if (i < n) {
    const auto tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(x + i, tail, swish_lanes(_mm512_maskz_loadu_ps(tail, x + i), minus_alpha));
  }
}

}  // namespace slimquant::runtime::ew
