// core/float16.h and tensor.h's 16-bit float conversions, checked bit for bit against the
// compiler's IEEE binary16 type (_Float16) and bfloat16's closed form: every float16 pattern, every
// float16 value's rounding boundaries (ties, one float32 ulp either side), the subnormal and
// overflow edges, NaNs and 2^18 random float32 patterns.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "slimquant/core/float16.h"
#include "slimquant/core/tensor.h"

using namespace slimquant;

namespace {

uint32_t f16test_bits(float v) {
  uint32_t w;
  std::memcpy(&w, &v, sizeof w);
  return w;
}
float f16test_float(uint32_t w) {
  float v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}
uint16_t binary16_bits(float v) {
  const _Float16 h = static_cast<_Float16>(v);
  uint16_t b;
  std::memcpy(&b, &h, sizeof b);
  return b;
}
float binary16_value(uint16_t b) {
  _Float16 h;
  std::memcpy(&h, &b, sizeof h);
  return static_cast<float>(h);
}
// bfloat16: the top half of a float32 rounded to nearest even; NaN stays a quiet NaN.
uint16_t bfloat16_bits(float v) {
  const uint32_t w = f16test_bits(v);
  if (std::isnan(v)) return static_cast<uint16_t>((w >> 16) | 0x40);
  return static_cast<uint16_t>((w + 0x7FFF + ((w >> 16) & 1)) >> 16);
}

// The float32 inputs where a conversion to 16 bits can go wrong, and a random spread.
std::vector<float> hard_float32_inputs() {
  std::vector<float> v;
  const float inf = std::numeric_limits<float>::infinity();
  for (uint32_t b = 0; b < 0x7C00; ++b) {  // every finite float16 magnitude and the tie above it
    const float here = binary16_value(static_cast<uint16_t>(b));
    const float next = binary16_value(static_cast<uint16_t>(b + 1));
    const float tie = here + (next - here) / 2;
    for (float x : {here, tie, std::nextafter(tie, -inf), std::nextafter(tie, inf), std::nextafter(here, inf)})
      v.insert(v.end(), {x, -x});
  }
  for (uint32_t w = 0; w < (1u << 23); w += 977) v.push_back(f16test_float(w));  // float32 subnormals
  for (float x : {65504.f, 65519.99f, 65520.f, 65536.f, 1e30f, std::numeric_limits<float>::max(), inf,
                  std::ldexp(1.f, -25), std::nextafter(std::ldexp(1.f, -25), inf), std::ldexp(1.f, -14),
                  std::nextafter(std::ldexp(1.f, -14), 0.f), std::numeric_limits<float>::min()})
    v.insert(v.end(), {x, -x});
  for (uint32_t nan : {0x7FC00000u, 0x7F800001u, 0x7FA01234u, 0x7FFFFFFFu, 0xFFC00000u, 0xFF812345u})
    v.push_back(f16test_float(nan));
  std::mt19937 rng(20261129);
  for (int i = 0; i < (1 << 18); ++i) v.push_back(f16test_float(static_cast<uint32_t>(rng())));
  return v;
}

TEST(Float16Conversion, WideningEqualsBinary16ForEveryPattern) {
  std::vector<uint16_t> all(65536);
  for (uint32_t b = 0; b < all.size(); ++b) all[b] = static_cast<uint16_t>(b);
  std::vector<float> half(all.size()), brain(all.size());
  floats_from_16bit(all.data(), half.data(), static_cast<int64_t>(all.size()), kOnnxFloat16);
  floats_from_16bit(all.data(), brain.data(), static_cast<int64_t>(all.size()), kOnnxBFloat16);
  for (uint32_t b = 0; b < all.size(); ++b) {
    ASSERT_EQ(f16test_bits(half[b]), f16test_bits(binary16_value(all[b]))) << std::hex << b;
    ASSERT_EQ(f16test_bits(float_from_16bit(all[b], kOnnxFloat16)), f16test_bits(half[b])) << std::hex << b;
    ASSERT_EQ(f16test_bits(brain[b]), b << 16) << std::hex << b;
    ASSERT_EQ(f16test_bits(float_from_16bit(all[b], kOnnxBFloat16)), b << 16) << std::hex << b;
  }
}

TEST(Float16Conversion, NarrowingAndRoundingEqualBinary16AndBfloat16) {
  const std::vector<float> x = hard_float32_inputs();
  const auto n = static_cast<int64_t>(x.size());
  for (int type : {kOnnxFloat16, kOnnxBFloat16}) {
    std::vector<uint16_t> narrow(x.size());
    std::vector<float> rounded(x.size());
    floats_to_16bit(x.data(), narrow.data(), n, type);
    round_to_16bit_floats(x.data(), rounded.data(), n, type);
    std::vector<float> in_place = x;
    round_to_16bit_floats(in_place.data(), in_place.data(), n, type);
    int failures = 0;
    for (size_t i = 0; i < x.size() && failures < 10; ++i) {
      const uint16_t want = type == kOnnxFloat16 ? binary16_bits(x[i]) : bfloat16_bits(x[i]);
      const uint32_t want_value = type == kOnnxFloat16 ? f16test_bits(binary16_value(want)) : uint32_t{want} << 16;
      if (narrow[i] == want && float_to_16bit(x[i], type) == want && f16test_bits(rounded[i]) == want_value &&
          f16test_bits(in_place[i]) == want_value && f16test_bits(round_to_16bit_float(x[i], type)) == want_value)
        continue;
      ++failures;
      ADD_FAILURE() << onnx_16bit_float_name(type) << " of float32 bits " << std::hex << f16test_bits(x[i])
                    << ": want " << want << " (value bits " << want_value << "), array " << narrow[i] << ", scalar "
                    << float_to_16bit(x[i], type) << ", rounded " << f16test_bits(rounded[i]) << ", in place "
                    << f16test_bits(in_place[i]) << ", scalar rounded "
                    << f16test_bits(round_to_16bit_float(x[i], type));
    }
  }
}

}  // namespace
