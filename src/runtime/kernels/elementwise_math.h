#pragma once
// Scalar math for the elementwise kernels, written so that the loops calling it vectorise
// (branch-free selects, no libm calls for the hot float32 functions): exp, sigmoid, tanh and
// rounding are inline polynomials / bit tricks. Accuracy: exp_f32 within 2 ulp over the normal
// range; tanh_f32 within a few ulp; rounding helpers are exact.
#include <bit>
#include <cmath>
#include <cstdint>
#include <limits>
#include <type_traits>

namespace slimquant::runtime::ew {

template <typename T> inline constexpr bool kIsFloat = std::is_floating_point_v<T>;
template <typename T> inline constexpr bool kIsBool = std::is_same_v<T, bool>;
template <typename T> inline constexpr bool kIsInt = std::is_integral_v<T> && !kIsBool<T>;
template <typename T> inline constexpr bool kIsNumeric = !kIsBool<T>;

// exp(x) = 2^n * exp(r), n = round(x / ln2), |r| <= ln2 / 2, exp(r) by a degree-6 polynomial
// (Cephes expf coefficients). Overflow gives +inf, underflow below the normal range gives 0.
inline float exp_f32(float x) {
  constexpr float kHi = 88.72283935546875f, kLo = -87.33654022216797f;
  const float xc = x < kLo ? kLo : (x > kHi ? kHi : x);
  float n = xc * 1.44269504088896341f;
  n = (n + 12582912.f) - 12582912.f;  // round to nearest integer (|n| <= 128)
  float r = xc - n * 0.693359375f;    // ln2 split in two parts for an exact reduction
  r = r - n * -2.12194440e-4f;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  // 2^n for n in [-126, 128]: 2^128 is not representable, so fold one factor 2 into p.
  const float big = n > 127.5f ? 1.f : 0.f;
  p = p + p * big;
  const int32_t e = (static_cast<int32_t>(n - big) + 127) << 23;
  float y = p * std::bit_cast<float>(e);
  y = x > kHi ? std::numeric_limits<float>::infinity() : y;
  y = x < kLo ? 0.f : y;
  return x != x ? x : y;
}

template <typename T> inline T exp_t(T x) {
  if constexpr (std::is_same_v<T, float>) return exp_f32(x);
  else return std::exp(x);
}

template <typename T> inline T sigmoid_t(T x) { return T(1) / (T(1) + exp_t<T>(-x)); }

// tanh: odd polynomial near 0 (where 1 - 2/(e^2x + 1) would cancel), the exp form elsewhere.
inline float tanh_f32(float x) {
  const float ax = std::fabs(x);
  const float z = x * x;
  float p = -5.70498872745e-3f;
  p = p * z + 2.06390887954e-2f;
  p = p * z - 5.37397155531e-2f;
  p = p * z + 1.33314422036e-1f;
  p = p * z - 3.33332819422e-1f;
  const float small = p * z * x + x;
  const float large = std::copysign(1.f - 2.f / (exp_f32(2.f * ax) + 1.f), x);
  return ax < 0.625f ? small : large;
}

template <typename T> inline T tanh_t(T x) {
  if constexpr (std::is_same_v<T, float>) return tanh_f32(x);
  else return std::tanh(x);
}

// Round half to even for |x| < 2^23 (2^52 for double) by the add-magic trick (exact in the
// default rounding mode); larger magnitudes, inf and NaN are already integral.
template <typename T> inline T round_even_t(T x) {
  constexpr T kMagic = std::is_same_v<T, float> ? T(8388608.0) : T(4503599627370496.0);
  const T ax = std::fabs(x);
  const T r = std::copysign((ax + kMagic) - kMagic, x);
  return ax < kMagic ? r : x;
}
template <typename T> inline T floor_t(T x) {
  const T t = round_even_t(x);
  return std::copysign(t > x ? t - T(1) : t, x);
}
template <typename T> inline T ceil_t(T x) {
  const T t = round_even_t(x);
  return std::copysign(t < x ? t + T(1) : t, x);
}

// Integer arithmetic that wraps (two's complement) instead of overflowing into undefined behaviour.
template <typename T> inline T wrap_add(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) + static_cast<U>(b)));
  } else {
    return a + b;
  }
}
template <typename T> inline T wrap_sub(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    return static_cast<T>(static_cast<U>(static_cast<U>(a) - static_cast<U>(b)));
  } else {
    return a - b;
  }
}
template <typename T> inline T wrap_mul(T a, T b) {
  if constexpr (kIsInt<T>) {
    using U = std::make_unsigned_t<T>;
    // Unsigned types narrower than int promote to int: multiply in a type that cannot overflow.
    using W = std::conditional_t<(sizeof(U) < sizeof(unsigned)), unsigned, U>;
    return static_cast<T>(static_cast<U>(static_cast<W>(static_cast<U>(a)) * static_cast<W>(static_cast<U>(b))));
  } else {
    return a * b;
  }
}
template <typename T> inline T wrap_neg(T a) { return wrap_sub(T(0), a); }

// NaN-propagating max/min (numpy maximum/minimum semantics).
template <typename T> inline T max_t(T a, T b) {
  if constexpr (kIsFloat<T>) return (a != a || a > b) ? a : b;
  else return a > b ? a : b;
}
template <typename T> inline T min_t(T a, T b) {
  if constexpr (kIsFloat<T>) return (a != a || a < b) ? a : b;
  else return a < b ? a : b;
}

// Integer division truncating toward zero; x/0 gives 0 and MIN/-1 wraps (both trap on x86).
template <typename T> inline T div_t(T a, T b) {
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
