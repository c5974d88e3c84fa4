#pragma once
// Scalar math for the elementwise kernels, written so that the loops calling it vectorise
// (branch-free selects, no libm calls for the hot float32 functions): exp, sigmoid, tanh and
// rounding are inline polynomials / bit tricks. Accuracy: exp_f32 within 2 ulp over the normal
// range; tanh_f32 within a few ulp; rounding helpers are exact.
//
// Why select(): with GCC's default -ftrapping-math a `c ? f(x) : x` whose arm holds a float
// operation (or a nested ?:) is kept as a branch, since the operation "might trap", and a loop
// with a branch does not vectorise. select() computes both values and picks one with bit masks.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

#include "runtime/kernels/cpu_clones.h"

namespace slimquant::runtime::ew {

// The per-element functions below are forced inline: whether GCC inlines them into a kernel's loop
// (and vectorises it) must not depend on how much else its translation unit holds (unity batches),
// where one out-of-line exp_f32 call per element made a fused Sigmoid 5x slower.
#define SQ_ELEMENT_FN [[gnu::always_inline]] inline

template <typename T> inline constexpr bool kIsFloat = std::is_floating_point_v<T>;
template <typename T> inline constexpr bool kIsBool = std::is_same_v<T, bool>;
template <typename T> inline constexpr bool kIsInt = std::is_integral_v<T> && !kIsBool<T>;
template <typename T> inline constexpr bool kIsNumeric = !kIsBool<T>;

// The same as type predicates, for kernels parameterised by which element types an op accepts.
template <typename T> struct FloatP : std::bool_constant<kIsFloat<T>> {};
template <typename T> struct NumericP : std::bool_constant<kIsNumeric<T>> {};
template <typename T> struct SignedNumericP : std::bool_constant<kIsFloat<T> || std::is_signed_v<T>> {};
template <typename T> struct UnsignedP : std::bool_constant<kIsInt<T> && std::is_unsigned_v<T>> {};
template <typename T> struct BoolP : std::bool_constant<kIsBool<T>> {};
template <typename T> struct AnyP : std::true_type {};

// Loops read and write bool tensors as bytes (0 or 1): GCC does not vectorise loads of `bool`.
template <typename T> using Storage = std::conditional_t<kIsBool<T>, uint8_t, T>;
template <typename T> inline const Storage<T>* storage_ptr(const void* p) { return static_cast<const Storage<T>*>(p); }
template <typename T> inline Storage<T>* storage_ptr(void* p) { return static_cast<Storage<T>*>(p); }

// Branch-free c ? a : b for any arithmetic T (both a and b are already evaluated).
template <typename T> SQ_ELEMENT_FN T select(bool c, T a, T b) {
  if constexpr (kIsBool<T>) {
    return (c & a) | (!c & b);
  } else {
    using U = std::conditional_t<sizeof(T) == 1, uint8_t,
              std::conditional_t<sizeof(T) == 2, uint16_t, std::conditional_t<sizeof(T) == 4, uint32_t, uint64_t>>>;
    const U m = static_cast<U>(U(0) - static_cast<U>(c));
    return std::bit_cast<T>(static_cast<U>((std::bit_cast<U>(a) & m) | (std::bit_cast<U>(b) & static_cast<U>(~m))));
  }
}
// Clamp to [lo, hi]; NaN passes through; lo > hi gives hi (the ONNX Clip rule).
template <typename T> SQ_ELEMENT_FN T clamp_t(T x, T lo, T hi) {
  const T v = select(x < lo, lo, x);
  return select(v > hi, hi, v);
}

// exp's constants (Cephes expf), shared with the AVX-512 kernels' exp_in_range_avx512: ln2 in two
// parts (the high one exact in 10 bits, so n * kExpLn2Hi is exact), the degree-6 polynomial's
// coefficients from the highest power down, and the input range past which exp overflows (+inf) or
// falls under the normal range (0).
inline constexpr float kExpLog2e = 1.44269504088896341f, kExpLn2Hi = 0.693359375f, kExpLn2Lo = -2.12194440e-4f;
inline constexpr float kExpPoly[6] = {1.9875691500e-4f, 1.3981999507e-3f, 8.3334519073e-3f,
                                      4.1665795894e-2f, 1.6666665459e-1f, 5.0000001201e-1f};
inline constexpr float kExpHighest = 88.72283935546875f, kExpLowest = -87.33654022216797f;

// exp(x) = 2^n * exp(r), n = round(x / ln2), |r| <= ln2 / 2, exp(r) by a degree-6 polynomial
// (Cephes expf coefficients). Overflow gives +inf, underflow below the normal range gives 0.
SQ_ELEMENT_FN float exp_f32(float x) {
  // NaN is kept out of the reduction: converting it to int32_t below is undefined behaviour (found by
  // UBSan). The result for NaN is x itself, selected at the end.
  const float xc = clamp_t(select(x != x, 0.f, x), kExpLowest, kExpHighest);
  float n = xc * kExpLog2e;
  n = (n + 12582912.f) - 12582912.f;  // round to nearest integer (|n| <= 128)
  float r = xc - n * kExpLn2Hi;       // ln2 split in two parts for an exact reduction
  r = r - n * kExpLn2Lo;
  float p = kExpPoly[0];
  p = p * r + kExpPoly[1];
  p = p * r + kExpPoly[2];
  p = p * r + kExpPoly[3];
  p = p * r + kExpPoly[4];
  p = p * r + kExpPoly[5];
  p = p * r * r + r + 1.0f;
  // 2^n for n in [-126, 128]: 2^128 is not representable, so fold one factor 2 into p.
  const float big = select(n > 127.5f, 1.f, 0.f);
  p = p + p * big;
  const int32_t e = (static_cast<int32_t>(n - big) + 127) << 23;
  float y = p * std::bit_cast<float>(e);
  y = select(x > kExpHighest, std::numeric_limits<float>::infinity(), y);
  y = select(x < kExpLowest, 0.f, y);
  return select(x != x, x, y);
}

template <typename T> SQ_ELEMENT_FN T exp_t(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
  else return std::exp(x);
}

template <typename T> SQ_ELEMENT_FN T sigmoid_t(T x) { return T(1) / (T(1) + exp_t<T>(-x)); }

// tanh: odd polynomial near 0 (where 1 - 2/(e^2x + 1) would cancel), the exp form elsewhere.
SQ_ELEMENT_FN float tanh_f32(float x) {
  const float ax = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float large = std::copysign(1.f - 2.f / (exp_f32(2.f * ax) + 1.f), x);
  return select(ax < 0.625f, small, large);
}

template <typename T> SQ_ELEMENT_FN T tanh_t(T x) {
  if constexpr (std::is_same_v<T, float>) return tanh_f32(x);
  else return std::tanh(x);
}

// erf / erfc for float in two pieces, both fitted here (Chebyshev least squares, then power basis):
//   |x| < 1:  erf(x)  = x * A(x^2)                      (A: degree 6, rel. error 1.4e-9)
//   |x| >= 1: erfc(x) = exp(-x^2) * B(1/|x| - 0.5)      (B: degree 10, fits erfc(x) e^(x^2) on
//                                                        [1, 9.5], rel. error 6e-7 evaluated in float;
//                                                        beyond 9.5 exp(-x^2) underflows to 0 anyway)
// Gelu uses erfc directly for negative inputs, keeping relative accuracy where 1 + erf(x) cancels.
SQ_ELEMENT_FN float erf_small_f32(float ax) {  // erf(ax) for 0 <= ax < 1
  const float t = ax * ax;
  float p = 7.8825004462e-05f;
  p = p * t - 8.0188590140e-04f;
  p = p * t + 5.1893128125e-03f;
  p = p * t - 2.6854329538e-02f;
  p = p * t + 1.1283597492e-01f;
  p = p * t - 3.7612626908e-01f;
  p = p * t + 1.1283791659e+00f;
  return ax * p;
}
SQ_ELEMENT_FN float erfc_large_f32(float ax) {  // erfc(ax) for ax >= 1
  const float w = 1.f / clamp_t(ax, 1.f, 9.5f) - 0.5f;
  float p = -5.110111342e-02f;
  p = p * w + 8.818377592e-02f;
  p = p * w - 5.218650333e-02f;
  p = p * w - 1.184320631e-02f;
  p = p * w + 6.373718434e-02f;
  p = p * w - 8.752292402e-02f;
  p = p * w + 6.454117442e-02f;
  p = p * w + 2.284895296e-02f;
  p = p * w - 1.855268714e-01f;
  p = p * w + 4.271858409e-01f;
  p = p * w + 2.553956741e-01f;
  return exp_f32(-ax * ax) * p;
}
SQ_ELEMENT_FN float erf_f32(float x) {
  const float ax = std::fabs(x);
  return std::copysign(select(ax < 1.f, erf_small_f32(ax), 1.f - erfc_large_f32(ax)), x);
}
// 1 + erf(x), accurate also where it is tiny (x << 0).
SQ_ELEMENT_FN float one_plus_erf_f32(float x) {
  const float ax = std::fabs(x);
  const float small = erf_small_f32(ax);
  const float erfc = select(ax < 1.f, 1.f - small, erfc_large_f32(ax));  // erfc(|x|)
  const float r = select(x < 0.f, erfc, 2.f - erfc);
  return select(ax < 1.f, 1.f + std::copysign(small, x), r);
}

template <typename T> SQ_ELEMENT_FN T erf_t(T x) {
  if constexpr (std::is_same_v<T, float>) return erf_f32(x);
  else return std::erf(x);
}

// Round half to even for |x| < 2^23 (2^52 for double) by the add-magic trick (exact in the
// default rounding mode); larger magnitudes, inf and NaN are already integral.
template <typename T> SQ_ELEMENT_FN T round_even_t(T x) {
  constexpr T kMagic = std::is_same_v<T, float> ? T(8388608.0) : T(4503599627370496.0);
  const T ax = std::fabs(x);
  const T r = std::copysign((ax + kMagic) - kMagic, x);
  return select(ax < kMagic, r, x);
}
template <typename T> SQ_ELEMENT_FN T floor_t(T x) {
  const T t = round_even_t(x);
  return std::copysign(select(t > x, t - T(1), t), x);
}
template <typename T> SQ_ELEMENT_FN T ceil_t(T x) {
  const T t = round_even_t(x);
  return std::copysign(select(t < x, t + T(1), t), x);
}

// Integer arithmetic that wraps (two's complement) instead of overflowing into undefined behaviour.
template <typename T> SQ_ELEMENT_FN T wrap_add(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <typename T> SQ_ELEMENT_FN T wrap_sub(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
  } else {
    return a - b;
  }
}
template <typename T> SQ_ELEMENT_FN T wrap_mul(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    // Unsigned types narrower than int promote to int: multiply in a type that cannot overflow.
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else {
    return a * b;
  }
}
template <typename T> SQ_ELEMENT_FN T wrap_neg(T a) { return wrap_sub(T(0), a); }

// NaN-propagating max/min (numpy maximum/minimum semantics).
template <typename T> SQ_ELEMENT_FN T max_t(T a, T b) {
  if constexpr (kIsFloat<T>) return select((a > b) | (a != a), a, b);
  else return select(a > b, a, b);
}
template <typename T> SQ_ELEMENT_FN T min_t(T a, T b) {
  if constexpr (kIsFloat<T>) return select((a < b) | (a != a), a, b);
  else return select(a < b, a, b);
}

// Integer division truncating toward zero; x/0 gives 0 and MIN/-1 wraps (both trap on x86).
template <typename T> SQ_ELEMENT_FN T div_t(T a, T b) {
  if constexpr (kIsInt<T>) {
    if (b == 0) return T(0);
    if constexpr (std::is_signed_v<T>) {
      if (b == T(-1)) return wrap_neg(a);
    }
    return static_cast<T>(a / b);
  } else {
    return a / b;
  }
}

}  // namespace slimquant::runtime::ew
