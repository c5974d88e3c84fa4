// core/quant_param.h: the one quantize / dequantize arithmetic, checked against closed forms.
#include "slimquant/core/quant_param.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

using namespace slimquant;
namespace qm = slimquant::quant_math;

TEST(QuantMath, TiesRoundHalfToEven) {
  // x / s = k + 0.5 exactly (s = 1): the even neighbour wins, on both sides of zero.
  EXPECT_EQ(qm::quantize(0.5f, 1.f, 0, -128, 127), 0);
  EXPECT_EQ(qm::quantize(1.5f, 1.f, 0, -128, 127), 2);
  EXPECT_EQ(qm::quantize(2.5f, 1.f, 0, -128, 127), 2);
  EXPECT_EQ(qm::quantize(-0.5f, 1.f, 0, -128, 127), 0);
  EXPECT_EQ(qm::quantize(-1.5f, 1.f, 0, -128, 127), -2);
  EXPECT_EQ(qm::quantize(-2.5f, 1.f, 0, -128, 127), -2);
  // With a scale: 0.75 / 0.5 = 1.5 -> 2, 1.25 / 0.5 = 2.5 -> 2; the zero point is added after rounding.
  EXPECT_EQ(qm::quantize(0.75f, 0.5f, 0, 0, 255), 2);
  EXPECT_EQ(qm::quantize(1.25f, 0.5f, 10, 0, 255), 12);
  // Not ties: nearest.
  EXPECT_EQ(qm::quantize(2.51f, 1.f, 0, -128, 127), 3);
  EXPECT_EQ(qm::quantize(-2.49f, 1.f, 0, -128, 127), -2);
}

TEST(QuantMath, SaturatesToTheTypeRange) {
  EXPECT_EQ(qm::quantize(1000.f, 1.f, 0, -128, 127), 127);
  EXPECT_EQ(qm::quantize(-1000.f, 1.f, 0, -128, 127), -128);
  EXPECT_EQ(qm::quantize(1000.f, 1.f, 128, 0, 255), 255);
  EXPECT_EQ(qm::quantize(-1000.f, 1.f, 128, 0, 255), 0);
  // The bound is reached through the zero point: 200 + 100 saturates at 255, -20 + 10 at 0.
  EXPECT_EQ(qm::quantize(200.f, 1.f, 100, 0, 255), 255);
  EXPECT_EQ(qm::quantize(-20.f, 1.f, 10, 0, 255), 0);
  // Far beyond the exact rounding range of the add-magic (|v| >= 2^22) and infinities.
  EXPECT_EQ(qm::quantize(1e30f, 1e-8f, 0, -128, 127), 127);
  EXPECT_EQ(qm::quantize(-std::numeric_limits<float>::infinity(), 1.f, 3, 0, 255), 0);
  EXPECT_EQ(qm::quantize(std::numeric_limits<float>::infinity(), 1.f, 3, 0, 255), 255);
  // NaN takes the lowest code (as MLAS).
  EXPECT_EQ(qm::quantize(std::nanf(""), 1.f, 0, -128, 127), -128);
  EXPECT_EQ(qm::quantize(std::nanf(""), 1.f, 7, 0, 255), 0);
}

TEST(QuantMath, DequantizeAndFakeQuantize) {
  EXPECT_FLOAT_EQ(qm::dequantize(130, 0.5f, 128), 1.f);
  EXPECT_FLOAT_EQ(qm::dequantize(-128, 0.25f, 0), -32.f);
  // fake = dequantize(quantize(x)), bit for bit, including saturation and ties.
  for (float x : {-300.f, -2.5f, -0.3f, 0.f, 0.74f, 1.25f, 63.9f, 500.f}) {
    const int32_t q = qm::quantize(x, 0.5f, 3, 0, 255);
    EXPECT_EQ(qm::fake_quantize(x, 0.5f, 3, 0, 255), qm::dequantize(q, 0.5f, 3)) << x;
  }
  EXPECT_FLOAT_EQ(qm::fake_quantize(1.25f, 0.5f, 3, 0, 255), 1.f);   // 2.5 -> 2
  EXPECT_FLOAT_EQ(qm::fake_quantize(500.f, 0.5f, 3, 0, 255), 126.f);  // (255 - 3) * 0.5
}

TEST(QuantParam, IntegerRangeOfTypesAndBits) {
  QuantParam p;
  EXPECT_TRUE(p.per_tensor());
  p.dtype = DType::kInt8;
  EXPECT_EQ(p.qmin(), -128);
  EXPECT_EQ(p.qmax(), 127);
  p.bits = 7;  // weights: symmetric within +-63
  EXPECT_EQ(p.qmin(), -63);
  EXPECT_EQ(p.qmax(), 63);
  p.bits = 4;
  EXPECT_EQ(p.qmin(), -7);
  EXPECT_EQ(p.qmax(), 7);
  p.bits = 8;
  p.dtype = DType::kUInt8;
  EXPECT_EQ(p.qmin(), 0);
  EXPECT_EQ(p.qmax(), 255);
  EXPECT_EQ(qmin_of(DType::kInt16), -32768);
  EXPECT_EQ(qmax_of(DType::kUInt16), 65535);
  EXPECT_THROW(qmin_of(DType::kFloat32), Error);
}

TEST(QuantParam, PerChannelAlongAxis) {
  // A [2, 3] tensor quantized along axis 1: column c uses scale[c], zero_point[c].
  QuantParam p;
  p.dtype = DType::kUInt8;
  p.axis = 1;
  p.scale = {1.f, 0.5f, 0.25f};
  p.zero_point = {0, 10, 100};
  EXPECT_FALSE(p.per_tensor());
  const float x[2][3] = {{1.f, 1.f, 1.f}, {-1.f, 200.f, -30.f}};
  const int32_t want[2][3] = {{1, 12, 104}, {0, 255, 0}};
  for (int r = 0; r < 2; ++r)
    for (int c = 0; c < 3; ++c)
      EXPECT_EQ(qm::quantize(x[r][c], p.scale[c], p.zero_point[c], p.qmin(), p.qmax()), want[r][c]) << r << "," << c;
}
