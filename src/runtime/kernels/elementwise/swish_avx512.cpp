#include "runtime/kernels/elementwise/swish_avx512.h"

#include <immintrin.h>

#include <cstdlib>
#include <string>

#include "runtime/kernels/elementwise/avx512_exp.h"
#include "slimquant/core/error.h"

namespace slimquant::runtime::ew {

bool swish_pass_available() {
  static const bool on = [] {
    const char* v = std::getenv("SLIMQUANT_SWISH");
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") && !(v && std::string(v) == "dnnl");
  }();
  return on;
}

namespace {
// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*() (see avx512_exp.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The gate's function, fixed per instantiation: Swish, Swish with alpha 1 (SiLU: one product less),
// HardSwish (as the direct depthwise kernel computes it).
enum class GateFn { kSwish, kSiLU, kHardSwish };
template <GateFn kFn, bool kForCodes>
__attribute__((target("avx512f"))) inline __m512 gated(__m512 v, __m512 alpha) {
  if constexpr (kFn == GateFn::kHardSwish) {
    const __m512 g = _mm512_fmadd_ps(v, _mm512_set1_ps(1.f / 6.f), _mm512_set1_ps(0.5f));
    return _mm512_mul_ps(v, _mm512_min_ps(_mm512_max_ps(g, _mm512_setzero_ps()), _mm512_set1_ps(1.f)));
  } else {
    return swish_avx512<kFn == GateFn::kSiLU, kForCodes>(v, alpha);
  }
}

// gate(v) * factor + offset stored under `mask` as float32, or as 8-bit codes (the gate then
// within a fiftieth of a step: logistic_for_codes_avx512): u8 max(q, lo) first (a NaN q gives lo,
// its second operand); s8 only min(hi, q) (a NaN stays NaN), since what converts to INT_MIN, NaN
// and anything below -2^31, saturates to -128; the conversion rounds half to even (the default
// MXCSR mode).
template <DType kY>
__attribute__((target("avx512f"))) inline __m512i codes_of(__m512 q) {
  if constexpr (kY == DType::kUInt8)
    return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(q, _mm512_setzero_ps()), _mm512_set1_ps(255.f)));
  else
    return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_set1_ps(127.f), q));
}

template <DType kY, GateFn kFn>
__attribute__((target("avx512f"))) inline void store_gated(void* y, int64_t i, __m512 v, __m512 alpha, __m512 factor,
                                                           __m512 offset, __mmask16 mask) {
  const __m512 q = _mm512_fmadd_ps(gated<kFn, kY != DType::kFloat32>(v, alpha), factor, offset);
  if constexpr (kY == DType::kFloat32) {
    _mm512_mask_storeu_ps(static_cast<float*>(y) + i, mask, q);
    return;
  }
  const __m512i codes = codes_of<kY>(q);
  if constexpr (kY == DType::kUInt8) _mm512_mask_cvtusepi32_storeu_epi8(static_cast<uint8_t*>(y) + i, mask, codes);
  else _mm512_mask_cvtsepi32_storeu_epi8(static_cast<int8_t*>(y) + i, mask, codes);
}

// 64 codes (in [0, 255] for u8) from four vectors of 16 in order, saturated to 8 bits as the
// narrowing stores above: two packs within 128-bit lanes leave dword 4 l + j holding vector j's
// lane l, which one permute puts back. Four stores of 16 narrowed values cost two shuffles each.
template <DType kY>
__attribute__((target("avx512f,avx512bw"))) inline __m512i packed_codes(const __m512i (&c)[4]) {
  const __m512i low = _mm512_packs_epi32(c[0], c[1]), high = _mm512_packs_epi32(c[2], c[3]);
  const __m512i bytes = kY == DType::kUInt8 ? _mm512_packus_epi16(low, high) : _mm512_packs_epi16(low, high);
  return _mm512_permutexvar_epi32(_mm512_setr_epi32(0, 4, 8, 12, 1, 5, 9, 13, 2, 6, 10, 14, 3, 7, 11, 15), bytes);
}

template <DType kY, GateFn kFn>
__attribute__((target("avx512f,avx512bw"))) void gated_output_typed(const float* v, void* y, int64_t n, float alpha,
                                                           int64_t channels, const float* factor, const float* offset) {
  const __m512 a = _mm512_set1_ps(alpha);
  if constexpr (kY != DType::kFloat32) {
    // Codes 64 at a time where each vector of 16 lies within a pixel: one scale, or channels in
    // whole vectors (then channel c of the first vector of each group wraps around the pixel).
    if (channels == 1 || channels % 16 == 0) {
      int64_t i = 0, c = 0;
      for (; i + 64 <= n; i += 64) {
        __m512i codes[4];
#pragma GCC unroll 4
        for (int j = 0; j < 4; ++j) {
          const int64_t at = channels == 1 ? 0 : c;
          const __m512 f = channels == 1 ? _mm512_set1_ps(factor[0]) : _mm512_loadu_ps(factor + at);
          const __m512 b = channels == 1 ? _mm512_set1_ps(offset[0]) : _mm512_loadu_ps(offset + at);
          codes[j] = codes_of<kY>(_mm512_fmadd_ps(gated<kFn, true>(_mm512_loadu_ps(v + i + 16 * j), a), f, b));
          if (channels > 1 && (c += 16) == channels) c = 0;
        }
        _mm512_storeu_si512(static_cast<uint8_t*>(y) + i, packed_codes<kY>(codes));
      }
      for (; i < n; i += 16) {
        const int64_t left = n - i;
        const auto mask = static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1u);
        const __m512 f = channels == 1 ? _mm512_set1_ps(factor[0]) : _mm512_loadu_ps(factor + c);
        const __m512 b = channels == 1 ? _mm512_set1_ps(offset[0]) : _mm512_loadu_ps(offset + c);
        store_gated<kY, kFn>(y, i, _mm512_maskz_loadu_ps(mask, v + i), a, f, b, mask);
        if (channels > 1 && (c += 16) == channels) c = 0;
      }
      return;
    }
  }
  if (channels == 1) {
    const __m512 f = _mm512_set1_ps(factor[0]), b = _mm512_set1_ps(offset[0]);
    int64_t i = 0;
    for (; i + 16 <= n; i += 16) store_gated<kY, kFn>(y, i, _mm512_loadu_ps(v + i), a, f, b, 0xffff);
    if (i < n) {
      const auto tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
      store_gated<kY, kFn>(y, i, _mm512_maskz_loadu_ps(tail, v + i), a, f, b, tail);
    }
    return;
  }
  // Per channel: each pixel's channels in vectors, the last one masked when channels % 16 != 0.
  for (int64_t base = 0; base < n; base += channels) {
    for (int64_t c = 0; c < channels; c += 16) {
      const int64_t left = channels - c;
      const auto mask = static_cast<__mmask16>(left >= 16 ? 0xffffu : (1u << left) - 1u);
      store_gated<kY, kFn>(y, base + c, _mm512_maskz_loadu_ps(mask, v + base + c), a,
                           _mm512_maskz_loadu_ps(mask, factor + c), _mm512_maskz_loadu_ps(mask, offset + c), mask);
    }
  }
}

template <DType kY>
void gated_output_dispatch(Gate gate, const float* v, void* y, int64_t n, float alpha, int64_t channels,
                           const float* factor, const float* offset) {
  if (gate == Gate::kHardSwish) gated_output_typed<kY, GateFn::kHardSwish>(v, y, n, alpha, channels, factor, offset);
  else if (alpha == 1.f) gated_output_typed<kY, GateFn::kSiLU>(v, y, n, alpha, channels, factor, offset);
  else gated_output_typed<kY, GateFn::kSwish>(v, y, n, alpha, channels, factor, offset);
}

#pragma GCC diagnostic pop
}  // namespace

__attribute__((target("avx512f"))) void swish_in_place_avx512(float* x, int64_t n, float alpha) {
  const __m512 a = _mm512_set1_ps(alpha);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(x + i, swish_avx512(_mm512_loadu_ps(x + i), a));
  if (i < n) {
    const auto tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(x + i, tail, swish_avx512(_mm512_maskz_loadu_ps(tail, x + i), a));
  }
}

void gated_output_avx512(Gate gate, const float* v, void* y, DType y_type, int64_t n, float alpha, int64_t channels,
                         const float* factor, const float* offset) {
  SQ_CHECK(channels >= 1 && n % channels == 0, ErrorKind::kInternal, "gated_output: values not whole pixels");
  switch (y_type) {
    case DType::kUInt8: return gated_output_dispatch<DType::kUInt8>(gate, v, y, n, alpha, channels, factor, offset);
    case DType::kInt8: return gated_output_dispatch<DType::kInt8>(gate, v, y, n, alpha, channels, factor, offset);
    case DType::kFloat32: return gated_output_dispatch<DType::kFloat32>(gate, v, y, n, alpha, channels, factor, offset);
    default: fail(ErrorKind::kInternal, std::string("gated_output: no ") + dtype_name(y_type) + " output");
  }
}

}  // namespace slimquant::runtime::ew
