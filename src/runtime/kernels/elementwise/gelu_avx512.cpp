#include "runtime/kernels/elementwise/gelu_avx512.h"

#include <immintrin.h>

#include <cstdlib>
#include <string>

#include "slimquant/core/error.h"

namespace slimquant::runtime::ew {

bool gelu_pass_available() {
  static const bool on = [] {
    const char* v = std::getenv("SLIMQUANT_GELU");
    return __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512dq") && !(v && std::string(v) == "dnnl");
  }();
  return on;
}

namespace {
// Phi(-a) = erfc(a / sqrt 2) / 2 on [0, 6) in 32 intervals of width 6/32: on interval i,
// a = (i + t) * 6/32 and Phi(-a) = sum_j kPhiTable[j][i] t^j (scripts/fit_gelu_table.py; within
// 3.9e-8 evaluated in float). Beyond 6 the last interval's end, Phi(-6) = 1e-9, stands for it.
constexpr int kPhiDegree = 5;
constexpr float kPhiRange = 6.f, kPhiIntervals = 32.f;
alignas(64) constexpr float kPhiTable[kPhiDegree + 1][32] = {
    {0.5f, 0.425634325f, 0.353830248f, 0.286887705f, 0.22662735f, 0.174250707f, 0.130294517f, 0.0946757421f, 0.066807203f, 0.0457536243f, 0.0303963609f, 0.0195800792f, 0.0122244731f, 0.00739460718f, 0.00433244836f, 0.00245790114f, 0.00134989806f, 0.000717542309f, 0.000369078451f, 0.000183669952f, 8.84172841e-05f, 4.11674628e-05f, 1.85367371e-05f, 8.0709433e-06f, 3.3976728e-06f, 1.38281337e-06f, 5.44042166e-07f, 2.06896985e-07f, 7.60495809e-08f, 2.70166645e-08f, 9.27539467e-09f, 3.07733239e-09f},
    {-0.074801676f, -0.0734982938f, -0.0697228238f, -0.0638564155f, -0.0564632639f, -0.0482013561f, -0.0397268683f, -0.0316112228f, -0.0242845509f, -0.0180115327f, -0.0128974291f, -0.0089163566f, -0.00595118618f, -0.00383487716f, -0.00238578441f, -0.00143298856f, -0.000830971345f, -0.000465222984f, -0.000251459511f, -0.000131222012f, -6.61115118e-05f, -3.2157277e-05f, -1.51012573e-05f, -6.84665838e-06f, -2.99692533e-06f, -1.266499e-06f, -5.1673203e-07f, -2.03543664e-07f, -7.74072078e-08f, -2.84208337e-08f, -1.00745066e-08f, -3.4478016e-09f},
    {-1.19122152e-08f, 0.00129192567f, 0.00245114067f, 0.00336737186f, 0.00397002371f, 0.00423641317f, 0.00418992853f, 0.00388966547f, 0.00341503136f, 0.00284950435f, 0.00226715044f, 0.0017240817f, 0.00125534297f, 0.000876337697f, 0.000587129733f, 0.000377838209f, 0.00023370808f, 0.000139018361f, 7.956013e-05f, 4.38234274e-05f, 2.32403345e-05f, 1.18691878e-05f, 5.83906422e-06f, 2.76755736e-06f, 1.26403017e-06f, 5.56407031e-07f, 2.36081064e-07f, 9.6564051e-08f, 3.80804543e-08f, 1.44798085e-08f, 5.30927169e-09f, 1.87738025e-09f},
    {0.000438338757f, 0.000415667018f, 0.000351305091f, 0.000256015308f, 0.000144955644f, 3.43479987e-05f, -6.17654296e-05f, -0.000133864218f, -0.000177935435f, -0.000195095417f, -0.000190212813f, -0.000170087689f, -0.000141724668f, -0.000111070491f, -8.23603332e-05f, -5.80184133e-05f, -3.89405286e-05f, -2.49551977e-05f, -1.52953089e-05f, -8.97746304e-06f, -5.05120579e-06f, -2.72676039e-06f, -1.4132213e-06f, -7.0361682e-07f, -3.36695905e-07f, -1.54916123e-07f, -6.85597286e-08f, -2.9193826e-08f, -1.19641301e-08f, -4.72002037e-09f, -1.79296444e-09f, -6.55913768e-10f},
    {-8.18182642e-08f, -1.15092735e-05f, -2.09591235e-05f, -2.69434204e-05f, -2.8766477e-05f, -2.66170464e-05f, -2.14231059e-05f, -1.45382646e-05f, -7.37255004e-06f, -1.07939172e-06f, 3.62750689e-06f, 6.50836728e-06f, 7.71184204e-06f, 7.62569152e-06f, 6.72119177e-06f, 5.43229316e-06f, 4.08702135e-06f, 2.88815977e-06f, 1.92828179e-06f, 1.22128699e-06f, 7.35939352e-07f, 4.22868681e-07f, 2.32088325e-07f, 1.21836095e-07f, 6.12422468e-08f, 2.95033562e-08f, 1.36321461e-08f, 6.04513417e-09f, 2.57414112e-09f, 1.05304387e-09f, 4.1402326e-10f, 1.56502547e-10f},
    {-2.25667645e-06f, -1.87170463e-06f, -1.19264905e-06f, -3.74012217e-07f, 4.1074864e-07f, 1.01567412e-06f, 1.35561572e-06f, 1.41769851e-06f, 1.25087547e-06f, 9.40827135e-07f, 5.80809058e-07f, 2.47943916e-07f, -9.67993685e-09f, -1.74609369e-07f, -2.53450793e-07f, -2.66691984e-07f, -2.38966635e-07f, -1.9217417e-07f, -1.42097534e-07f, -9.79033246e-08f, -6.33716581e-08f, -3.87486665e-08f, -2.24677414e-08f, -1.23890542e-08f, -6.51079546e-09f, -3.26651062e-09f, -1.56667279e-09f, -7.19114657e-10f, -3.16185939e-10f, -1.33274364e-10f, -5.38883799e-11f, -2.09137811e-11f},
};

// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*() (see avx512_exp.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// One coefficient of each lane's interval: a 32-entry lookup over two registers.
__attribute__((target("avx512f,avx512dq"))) inline __m512 coefficient(int power, __m512i interval) {
  return _mm512_permutex2var_ps(_mm512_load_ps(kPhiTable[power]), interval, _mm512_load_ps(kPhiTable[power] + 16));
}

// x Phi(x) = x - x Phi(-x) for x >= 0, x Phi(-|x|) below. A NaN x gives NaN through the products.
__attribute__((target("avx512f,avx512dq"))) inline __m512 gelu_lanes(__m512 x) {
  const __m512 a = _mm512_min_ps(_mm512_abs_ps(x), _mm512_set1_ps(kPhiRange * (1.f - 1e-6f)));
  const __m512 s = _mm512_mul_ps(a, _mm512_set1_ps(kPhiIntervals / kPhiRange));
  const __m512i interval = _mm512_cvttps_epi32(s);
  const __m512 t = _mm512_reduce_ps(s, _MM_FROUND_TO_NEG_INF | _MM_FROUND_NO_EXC);  // s - floor(s)
  __m512 p = coefficient(kPhiDegree, interval);
  for (int j = kPhiDegree - 1; j >= 0; --j) p = _mm512_fmadd_ps(p, t, coefficient(j, interval));
  const __m512 xp = _mm512_mul_ps(x, p);
  const __mmask16 non_negative = _mm512_cmp_ps_mask(x, _mm512_setzero_ps(), _CMP_GE_OQ);
  return _mm512_mask_sub_ps(xp, non_negative, x, xp);
}

// saturate(round_half_even(gelu(x) * s + b)) as s32. max(q, lo) first: a NaN q gives lo (its second
// operand), as saturate_round does; the conversion rounds half to even (the default MXCSR mode).
__attribute__((target("avx512f,avx512dq"))) inline __m512i gelu_codes(__m512 x, __m512 s, __m512 b, __m512 lo, __m512 hi) {
  return _mm512_cvtps_epi32(_mm512_min_ps(_mm512_max_ps(_mm512_fmadd_ps(gelu_lanes(x), s, b), lo), hi));
}

template <bool kUnsigned>
__attribute__((target("avx512f,avx512dq"))) inline void store_codes(void* y, int64_t i, __m512i codes, __mmask16 mask) {
  if constexpr (kUnsigned) _mm512_mask_cvtusepi32_storeu_epi8(static_cast<uint8_t*>(y) + i, mask, codes);
  else _mm512_mask_cvtsepi32_storeu_epi8(static_cast<int8_t*>(y) + i, mask, codes);
}

template <bool kUnsigned>
__attribute__((target("avx512f,avx512dq"))) void gelu_requantize_typed(const float* v, void* y, int64_t n, float scale,
                                                               float shift) {
  const __m512 s = _mm512_set1_ps(scale), b = _mm512_set1_ps(shift);
  const __m512 lo = _mm512_set1_ps(kUnsigned ? 0.f : -128.f), hi = _mm512_set1_ps(kUnsigned ? 255.f : 127.f);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    store_codes<kUnsigned>(y, i, gelu_codes(_mm512_loadu_ps(v + i), s, b, lo, hi), 0xffff);
  if (i < n) {
    const auto tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    store_codes<kUnsigned>(y, i, gelu_codes(_mm512_maskz_loadu_ps(tail, v + i), s, b, lo, hi), tail);
  }
}

#pragma GCC diagnostic pop
}  // namespace

__attribute__((target("avx512f,avx512dq"))) void gelu_affine_avx512(const float* v, float* y, int64_t n, float scale,
                                                                       float shift) {
  const __m512 s = _mm512_set1_ps(scale), b = _mm512_set1_ps(shift);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) _mm512_storeu_ps(y + i, _mm512_fmadd_ps(gelu_lanes(_mm512_loadu_ps(v + i)), s, b));
  if (i < n) {
    const auto tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    _mm512_mask_storeu_ps(y + i, tail, _mm512_fmadd_ps(gelu_lanes(_mm512_maskz_loadu_ps(tail, v + i)), s, b));
  }
}

// The lane reductions start from _mm512_undefined_*() too (see above).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
__attribute__((target("avx512f,avx512dq"))) void gelu_with_range_avx512(const float* v, float* y, int64_t n,
                                                                           float& lo, float& hi) {
  // min(g, acc): a NaN g gives acc (the second operand), so NaNs are skipped.
  __m512 low = _mm512_setzero_ps(), high = _mm512_setzero_ps();
  int64_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = gelu_lanes(_mm512_loadu_ps(v + i));
    _mm512_storeu_ps(y + i, g);
    low = _mm512_min_ps(g, low);
    high = _mm512_max_ps(g, high);
  }
  if (i < n) {
    const auto tail = static_cast<__mmask16>((1u << (n - i)) - 1u);
    const __m512 g = gelu_lanes(_mm512_maskz_loadu_ps(tail, v + i));
    _mm512_mask_storeu_ps(y + i, tail, g);
    low = _mm512_mask_min_ps(low, tail, g, low);
    high = _mm512_mask_max_ps(high, tail, g, high);
  }
  lo = _mm512_reduce_min_ps(low);
  hi = _mm512_reduce_max_ps(high);
}
#pragma GCC diagnostic pop

void gelu_requantize_avx512(const float* v, void* y, DType y_type, int64_t n, float scale, float shift) {
  SQ_CHECK(y_type == DType::kUInt8 || y_type == DType::kInt8, ErrorKind::kInternal, "gelu_requantize: u8 or s8 only");
  if (y_type == DType::kUInt8) gelu_requantize_typed<true>(v, y, n, scale, shift);
  else gelu_requantize_typed<false>(v, y, n, scale, shift);
}

}  // namespace slimquant::runtime::ew
