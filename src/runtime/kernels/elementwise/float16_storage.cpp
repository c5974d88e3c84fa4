#include "runtime/kernels/elementwise/float16_storage.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define SQ_HAS_F16C 1
#else
#define SQ_HAS_F16C 0
#endif

namespace slimquant::runtime {

namespace {
#if SQ_HAS_F16C
__attribute__((target("avx,f16c"))) int64_t widen_float16_f16c(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm256_storeu_ps(dst + i, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(src + i))));
  return i;
}
#endif
}  // namespace

void widen_float16(const uint16_t* src, float* dst, int64_t n) {
  int64_t i = 0;
#if SQ_HAS_F16C
  static const bool f16c = __builtin_cpu_supports("f16c") && __builtin_cpu_supports("avx");
  if (f16c) i = widen_float16_f16c(src, dst, n);
#endif
  for (; i < n; ++i) dst[i] = float_from_16bit(src[i], kOnnxFloat16);
}

Tensor as_float32(const Tensor& t) {
  if (t.dtype() != DType::kFloat16) return t;
  Tensor wide(DType::kFloat32, t.shape());
  widen_float16(static_cast<const uint16_t*>(t.raw()), wide.data<float>(), t.numel());
  return wide;
}

}  // namespace slimquant::runtime
