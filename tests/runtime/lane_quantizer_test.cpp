// LaneQuantizer (the per-channel quantization of channel-blocked data inside folded Q's and
// QuantizeLinear) against the division, code for code: its reciprocal loop clamps x before
// dividing and reads the code's byte out of the rounding's bits, so every lane is checked where
// that could go wrong (half-way points, the ends of the range, NaN, infinities, +-0, huge x),
// for lane counts that are not a multiple of the vector width, runs of pixels with tails,
// strided rows, a first channel past 0, both code types and zero points at the range's ends; and
// its combined op + quantization the same way.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "runtime/kernels/elementwise/elementwise_qdq.h"

namespace slimquant::runtime {
namespace {

// The code of x as QuantizeLinear defines it: the division rounded once, then half to even, then
// saturated (NaN to the low end).
int32_t division_code(float x, float scale, int32_t zero_point, DType type) {
  const double lo = type == DType::kUInt8 ? 0 : -128, hi = type == DType::kUInt8 ? 255 : 127;
  const float quotient = x / scale;
  if (std::isnan(quotient)) return static_cast<int32_t>(lo);
  return static_cast<int32_t>(std::clamp(std::nearbyint(static_cast<double>(quotient)) + zero_point, lo, hi));
}

// The code a byte of a uint8 / int8 output holds.
int32_t code_of(uint8_t byte, DType type) {
  return type == DType::kUInt8 ? static_cast<int32_t>(byte) : static_cast<int32_t>(static_cast<int8_t>(byte));
}

// Values that probe channel c's parameters: a few ulps around the half-way points and the ends
// of the range, the range's ends as the quantizer computes them (lo * s, hi * s), specials, noise.
std::vector<float> probes(float scale, int32_t zero_point, DType type, std::mt19937& rng) {
  const float qmin = type == DType::kUInt8 ? 0.f : -128.f, qmax = type == DType::kUInt8 ? 255.f : 127.f;
  const float lo = qmin - static_cast<float>(zero_point), hi = qmax - static_cast<float>(zero_point);
  std::vector<float> xs{INFINITY, -INFINITY, NAN, -NAN, 0.f, -0.f, 1e38f, -1e38f, 3.4e38f, -3.4e38f};
  auto around = [&](float x) {
    for (int step = 0; step < 3; ++step) x = std::nextafter(x, -INFINITY);
    for (int step = 0; step < 7; ++step, x = std::nextafter(x, INFINITY)) xs.push_back(x);
  };
  for (const float k : {lo - 1.f, lo, hi, hi + 1.f, -1.f, 0.f, 1.f, 17.f}) {
    around((k + 0.5f) * scale);
    around((k - 0.5f) * scale);
    around(k * scale);
  }
  std::uniform_real_distribution<float> wide(2.f * lo - 10.f, 2.f * hi + 10.f);
  for (int i = 0; i < 40; ++i) xs.push_back(wide(rng) * scale);
  return xs;
}

struct Case {
  DType type;
  std::vector<float> scale;
  std::vector<int32_t> zero_point;
  QuantParam param() const {
    QuantParam q;
    q.dtype = type;
    q.scale = scale;
    q.zero_point = zero_point;
    return q;
  }
};

// Every channel's probe values laid out as `pixels` pixels of `lanes` channels from `first`, in
// rows x_stride floats apart, quantized into rows y_stride bytes apart (the bytes between rows
// must stay untouched). `shared`: a quantizer of c to use (and keep) instead of a fresh one.
void check_lanes(const Case& c, int64_t first, int64_t lanes, int64_t x_stride, int64_t y_stride, std::mt19937& rng,
                 const LaneQuantizer* shared = nullptr) {
  const int64_t channels = static_cast<int64_t>(c.scale.size());
  const LaneQuantizer fresh(c.param(), channels);
  const LaneQuantizer& quantizer = shared ? *shared : fresh;
  std::vector<std::vector<float>> values(static_cast<size_t>(lanes));
  size_t pixels = 0;
  for (int64_t l = 0; l < lanes; ++l) {
    const size_t ch = static_cast<size_t>(first + l);
    values[l] = probes(c.scale[ch], c.zero_point[ch], c.type, rng);
    std::shuffle(values[l].begin(), values[l].end(), rng);
    pixels = std::max(pixels, values[l].size());
  }
  // Shorter lanes repeat their values; a ragged count of pixels leaves a tail after whole tiles.
  pixels += 3;
  std::vector<float> x(pixels * static_cast<size_t>(x_stride), 0.f);
  for (size_t p = 0; p < pixels; ++p)
    for (int64_t l = 0; l < lanes; ++l) x[p * x_stride + l] = values[l][p % values[l].size()];
  constexpr uint8_t kUntouched = 0xA5;
  std::vector<uint8_t> y(pixels * static_cast<size_t>(y_stride), kUntouched);
  quantizer.quantize(x.data(), x_stride, static_cast<int64_t>(pixels), first, lanes, y.data(), y_stride);
  for (size_t p = 0; p < pixels; ++p)
    for (int64_t l = 0; l < y_stride; ++l) {
      const uint8_t got = y[p * y_stride + l];
      if (l >= lanes) {
        ASSERT_EQ(got, kUntouched) << "pixel " << p << " byte " << l << " past the lanes was written";
        continue;
      }
      const size_t ch = static_cast<size_t>(first + l);
      const float v = x[p * x_stride + l];
      const int32_t want = division_code(v, c.scale[ch], c.zero_point[ch], c.type);
      const int32_t code = code_of(got, c.type);
      ASSERT_EQ(code, want) << "pixel " << p << " lane " << l << " (channel " << ch << ") x = " << v << " scale "
                            << c.scale[ch] << " zero point " << c.zero_point[ch];
    }
}

// Scales of many magnitudes and zero points at both ends of the range and in between.
Case make_case(DType type, int64_t channels, std::mt19937& rng, bool with_extreme_scale) {
  Case c{type, {}, {}};
  std::uniform_real_distribution<float> mantissa(1.f, 2.f);
  std::uniform_int_distribution<int> exponent(-20, 6);
  const std::vector<int32_t> zero_points = type == DType::kUInt8 ? std::vector<int32_t>{0, 255, 128, 3, 131, 77}
                                                                  : std::vector<int32_t>{-128, 127, 0, -3, 5, 60};
  for (int64_t ch = 0; ch < channels; ++ch) {
    c.scale.push_back(std::ldexp(mantissa(rng), exponent(rng)));
    c.zero_point.push_back(zero_points[static_cast<size_t>(ch) % zero_points.size()]);
  }
  // A scale the reciprocal cannot serve (the quantizer then divides in every lane).
  if (with_extreme_scale) c.scale[static_cast<size_t>(channels / 2)] = 1e-31f;
  return c;
}

TEST(LaneQuantizer, ContiguousRowsMatchTheDivisionOnOddLaneCounts) {
  std::mt19937 rng(41);
  for (const DType type : {DType::kUInt8, DType::kInt8})
    for (const int64_t channels : {1, 3, 13, 24, 37, 96})
      for (const bool extreme : {false, true}) {
        SCOPED_TRACE(std::string(dtype_name(type)) + " channels " + std::to_string(channels) +
                     (extreme ? " with a 1e-31 scale" : ""));
        const Case c = make_case(type, channels, rng, extreme);
        check_lanes(c, 0, channels, channels, channels, rng);  // channels-last: whole pixels
      }
}

TEST(LaneQuantizer, BlocksPastTheFirstChannelAndStridedRowsMatchTheDivision) {
  std::mt19937 rng(43);
  for (const DType type : {DType::kUInt8, DType::kInt8}) {
    SCOPED_TRACE(dtype_name(type));
    const Case c = make_case(type, 48, rng, false);
    check_lanes(c, 16, 16, 16, 16, rng);  // the second block of 16 (aBcd16b)
    check_lanes(c, 40, 8, 8, 8, rng);     // the last block of 8
    check_lanes(c, 5, 24, 24, 48, rng);   // an input's channels inside a wider output pixel (Concat)
    check_lanes(c, 7, 13, 29, 13, rng);   // a gap between input pixels
  }
}

// A quantizer keeps the parameters it tiles for each block of channels: calls alternating between
// blocks and between quantizers (the nodes of one run) must each get their own channels' codes.
TEST(LaneQuantizer, AlternatingBlocksAndQuantizersKeepTheirOwnParameters) {
  std::mt19937 rng(47);
  const Case a = make_case(DType::kUInt8, 48, rng, false), b = make_case(DType::kInt8, 200, rng, false);
  const LaneQuantizer qa(a.param(), 48), qb(b.param(), 200);
  for (int round = 0; round < 2; ++round) {
    SCOPED_TRACE("round " + std::to_string(round));
    check_lanes(a, 16, 16, 16, 16, rng, &qa);
    check_lanes(b, 0, 200, 200, 200, rng, &qb);  // channels-last, 8-pixel tiles
    check_lanes(a, 0, 16, 16, 16, rng, &qa);
    check_lanes(b, 192, 8, 8, 8, rng, &qb);
    check_lanes(a, 32, 16, 16, 16, rng, &qa);
  }
}

// quantize_combined (the folded per-channel Q of a channel-blocked Add / Sub / Mul, op and
// quantization in one pass) against the float op followed by the division: whole tiles and a
// tail, the reciprocal loop and the dividing fallback. Half the pixels pair the probe values with
// the op's identity (so the near-ties and specials reach the quantization unchanged), half with
// noise.
TEST(LaneQuantizer, CombinedOpsMatchTheOpThenTheDivision) {
  using Combine = LaneQuantizer::Combine;
  std::mt19937 rng(47);
  std::normal_distribution<float> noise(0.f, 2.f);
  for (const DType type : {DType::kUInt8, DType::kInt8})
    for (const int64_t channels : {5, 24, 37, 96})
      for (const bool extreme : {false, true})
        for (const Combine op : {Combine::kAdd, Combine::kSub, Combine::kMul}) {
          SCOPED_TRACE(std::string(dtype_name(type)) + " channels " + std::to_string(channels) + " op " +
                       std::to_string(static_cast<int>(op)) + (extreme ? " with a 1e-31 scale" : ""));
          const Case c = make_case(type, channels, rng, extreme);
          const LaneQuantizer quantizer(c.param(), channels);
          std::vector<std::vector<float>> values(static_cast<size_t>(channels));
          size_t pixels = 0;
          for (int64_t l = 0; l < channels; ++l) {
            values[l] = probes(c.scale[l], c.zero_point[l], c.type, rng);
            pixels = std::max(pixels, values[l].size());
          }
          pixels = 2 * pixels + 5;  // identity pairs, then noise pairs, and a tail after whole tiles
          const float identity = op == Combine::kMul ? 1.f : 0.f;
          std::vector<float> a(pixels * channels), b(pixels * channels);
          for (size_t p = 0; p < pixels; ++p)
            for (int64_t l = 0; l < channels; ++l) {
              const size_t i = p * channels + l;
              a[i] = values[l][p % values[l].size()];
              b[i] = p % 2 == 0 ? identity : noise(rng);
            }
          std::vector<uint8_t> y(a.size(), 0xA5);
          quantizer.quantize_combined(op, a.data(), b.data(), static_cast<int64_t>(pixels), 0, channels, y.data());
          for (size_t i = 0; i < a.size(); ++i) {
            const size_t ch = i % static_cast<size_t>(channels);
            const float v = op == Combine::kAdd ? a[i] + b[i] : op == Combine::kSub ? a[i] - b[i] : a[i] * b[i];
            const int32_t want = division_code(v, c.scale[ch], c.zero_point[ch], c.type);
            const int32_t code = code_of(y[i], c.type);
            ASSERT_EQ(code, want) << "element " << i << " (channel " << ch << ") a = " << a[i] << " b = " << b[i];
          }
        }
}

// quantize_combined_with_halves (a gate Mul reading its float16-stored operand) against widening
// the operand, the float op and the division, per tensor: the probes rounded to half precision
// (with infinities and NaN) on either side of the op, both code types, ragged lengths, and a scale
// the reciprocal cannot serve (refused, nothing written). CPUs without AVX-512 refuse every call.
TEST(LaneQuantizer, CombinedWithFloat16OperandMatchesWideningThenTheDivision) {
  using Combine = LaneQuantizer::Combine;
  std::mt19937 rng(53);
  std::normal_distribution<float> noise(0.f, 2.f);
  for (const DType type : {DType::kUInt8, DType::kInt8})
    for (const float scale : {0.02f, 3.5e-4f, 1e-31f})
      for (const int32_t zero_point : {type == DType::kUInt8 ? 128 : 0, type == DType::kUInt8 ? 3 : -120})
        for (const Combine op : {Combine::kAdd, Combine::kSub, Combine::kMul})
          for (const bool halves_first : {true, false}) {
            SCOPED_TRACE(std::string(dtype_name(type)) + " scale " + std::to_string(scale) + " zero point " +
                         std::to_string(zero_point) + " op " + std::to_string(static_cast<int>(op)) +
                         (halves_first ? " halves first" : " halves second"));
            std::vector<float> values = probes(scale, zero_point, type, rng);
            const size_t n = 2 * values.size() + 7;  // identity pairs, noise pairs, a tail
            std::vector<uint16_t> halves(n);
            std::vector<float> floats(n);
            const float identity = op == Combine::kMul ? 1.f : 0.f;
            for (size_t i = 0; i < n; ++i) {
              halves[i] = float_to_16bit(values[i % values.size()], kOnnxFloat16);
              floats[i] = i % 2 == 0 ? identity : noise(rng);
            }
            std::vector<uint8_t> y(n, 0xA5);
            if (!quantize_combined_with_halves(op, halves.data(), floats.data(), halves_first, static_cast<int64_t>(n),
                                               scale, zero_point, type, y.data())) {
              EXPECT_TRUE(scale < 1e-30f || !__builtin_cpu_supports("avx512bw")) << "refused a plain scale";
              EXPECT_TRUE(std::all_of(y.begin(), y.end(), [](uint8_t b) { return b == 0xA5; }));
              continue;
            }
            EXPECT_GE(scale, 1e-30f);
            for (size_t i = 0; i < n; ++i) {
              const float h = float_from_16bit(halves[i], kOnnxFloat16), f = floats[i];
              const float first = halves_first ? h : f, second = halves_first ? f : h;
              const float v = op == Combine::kAdd ? first + second : op == Combine::kSub ? first - second : first * second;
              ASSERT_EQ(code_of(y[i], type), division_code(v, scale, zero_point, type))
                  << "element " << i << " half " << h << " float " << f;
            }
          }
}

}  // namespace
}  // namespace slimquant::runtime
