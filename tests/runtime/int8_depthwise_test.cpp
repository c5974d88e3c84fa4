// The direct depthwise QConv kernel (int8_depthwise.h) against the plain-loop reference, code for
// code: channel counts around the 64-channel chunk and 16-lane boundaries, 1x1 to 16x1 and
// non-square filters, strides 1 to 5 and mixed, padding on every side and none, u8 / s8 inputs with
// zero points, every supported activation, u8 / s8 / per-channel / float32 outputs. Runs only on
// CPUs the kernel runs on (AVX-512 VNNI; DNNL_MAX_CPU_ISA below that skips it).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/integer/int8_depthwise.h"
#include "runtime/kernels/integer/int8_reference.h"
#include "channels_last.h"

namespace slimquant::runtime::int8 {
namespace {

struct DepthwiseCase {
  std::string name;
  int64_t channels, height, width, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left, pad_bottom, pad_right;
  DType x_type;
  int32_t x_zero_point;
  Activation activation;
  DType y_type;
  int32_t y_zero_point;
  bool y_per_channel = false;
  bool post_affine = false;  // HardSwish followed by a scalar Mul / Add
  int64_t batch = 1;
};

class DirectDepthwiseTest : public ::testing::TestWithParam<DepthwiseCase> {};

TEST_P(DirectDepthwiseTest, MatchesTheReferenceCodeForCode) {
  if (!direct_depthwise_available()) GTEST_SKIP() << "the direct depthwise kernel needs AVX-512 VNNI";
  const DepthwiseCase& c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(c.name)));
  std::uniform_int_distribution<int> weight(-127, 127), code(c.x_type == DType::kUInt8 ? 0 : -128,
                                                             c.x_type == DType::kUInt8 ? 255 : 127);
  std::uniform_real_distribution<float> unit(0.5f, 1.5f), signed_unit(-1.f, 1.f);

  QLinearAttrs q;
  q.x.scale = {0.02f};
  q.x.zero_point = {c.x_zero_point};
  q.w.scale.resize(c.channels);
  for (float& s : q.w.scale) s = 0.004f * unit(rng);
  q.w.zero_point.assign(c.channels, 0);
  q.w.axis = 0;
  q.activation = c.activation;
  if (c.activation == Activation::kClip) {
    q.activation_min = -0.5f;
    q.activation_max = 1.5f;
  }
  if (c.activation == Activation::kLeakyRelu) q.activation_alpha = 0.1f;
  if (c.activation == Activation::kSwish) q.activation_alpha = 1.702f;
  if (c.activation == Activation::kHardSigmoid) {
    q.activation_alpha = 0.2f;
    q.activation_beta = 0.5f;
  }
  if (c.post_affine) {
    q.post_scale = 1.25f;
    q.post_shift = -0.1f;
  }
  q.y.dtype = c.y_type;
  if (c.y_type != DType::kFloat32) {
    if (c.y_per_channel) {
      q.y.scale.resize(c.channels);
      for (float& s : q.y.scale) s = 0.01f * unit(rng);
      q.y.zero_point.assign(c.channels, 0);
      q.y.axis = 1;
    } else {
      q.y.scale = {0.012f};
      q.y.zero_point = {c.y_zero_point};
    }
  }

  Tensor w(DType::kInt8, {c.channels, 1, c.kernel_h, c.kernel_w});
  for (int8_t& v : w.values<int8_t>()) v = static_cast<int8_t>(weight(rng));
  Tensor bias(DType::kFloat32, {c.channels});
  for (float& v : bias.values<float>()) v = 0.3f * signed_unit(rng);
  const Requant r = make_requant(ir::Node(), q, c.channels, &bias);

  Tensor x(c.x_type, {c.batch, c.channels, c.height, c.width});
  for (int64_t i = 0; i < x.numel(); ++i) {
    if (c.x_type == DType::kUInt8) x.data<uint8_t>()[i] = static_cast<uint8_t>(code(rng));
    else x.data<int8_t>()[i] = static_cast<int8_t>(code(rng));
  }
  const int64_t out_h = (c.height + c.pad_top + c.pad_bottom - c.kernel_h) / c.stride_h + 1;
  const int64_t out_w = (c.width + c.pad_left + c.pad_right - c.kernel_w) / c.stride_w + 1;

  Tensor expected(c.y_type, {c.batch, c.channels, out_h, out_w});
  const ConvProblem p{c.batch, c.channels, c.channels, c.channels, {c.height, c.width}, {out_h, out_w},
                      {c.kernel_h, c.kernel_w}, {c.stride_h, c.stride_w}, {1, 1}, {c.pad_top, c.pad_left}};
  reference_qconv(q, r, p, x, w, expected);

  // 16 and 32 channels at a horizontal stride of 1: chunks of 4 / 2 pixels, as int8_conv.cpp runs them.
  const DirectDepthwise kernel(q, r, w, c.x_type, pixel_group_for(p));
  const Tensor x_nhwc = test::to_channels_last(x);
  Tensor y_nhwc(c.y_type, {c.batch, out_h, out_w, c.channels});
  kernel.run(p, x_nhwc.raw(), y_nhwc.raw());
  const Tensor actual = test::from_channels_last(y_nhwc);

  // Exact where the output stage is the reference's own float expression. HardSwish and
  // HardSigmoid (and the post affine map) are fused into fewer roundings, and Sigmoid / Swish use a
  // polynomial e^x, not libm's: a value at a rounding boundary may land one code away, rarely.
  const bool exact = c.activation == Activation::kNone || c.activation == Activation::kRelu ||
                     c.activation == Activation::kClip || c.activation == Activation::kLeakyRelu;
  const std::vector<float> a = actual.to_float_vector(), e = expected.to_float_vector();
  int64_t mismatches = 0;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - e[i]);
    // Swish's logistic is the one for codes (7e-5 relative: the codes' own error is far larger).
    const double relative = c.activation == Activation::kSwish ? 1e-4 : 2e-6;
    const double tolerance = c.y_type == DType::kFloat32 && !exact ? relative * std::max(1.0, std::fabs(double(e[i]))) : 0.0;
    worst = std::max(worst, d);
    if (d > tolerance) ++mismatches;
  }
  if (c.y_type == DType::kFloat32) {
    // The channel sums taken as y is written (a fused squeeze-excitation pool): y unchanged, each
    // sum that of y's values over the pixels.
    std::vector<float> sums(static_cast<size_t>(c.batch * c.channels), -1.f);
    Tensor y_again(c.y_type, y_nhwc.shape());
    kernel.run(p, x_nhwc.raw(), y_again.raw(), sums.data());
    EXPECT_EQ(std::memcmp(y_again.raw(), y_nhwc.raw(), y_nhwc.nbytes()), 0);
    const float* yv = y_nhwc.data<float>();
    const int64_t pixels = out_h * out_w;
    for (int64_t n = 0; n < c.batch; ++n)
      for (int64_t ch = 0; ch < c.channels; ++ch) {
        double want = 0, magnitude = 0;
        for (int64_t px = 0; px < pixels; ++px) {
          want += yv[(n * pixels + px) * c.channels + ch];
          magnitude += std::fabs(yv[(n * pixels + px) * c.channels + ch]);
        }
        EXPECT_NEAR(sums[static_cast<size_t>(n * c.channels + ch)], want, 1e-5 * magnitude + 1e-6) << n << " " << ch;
      }
    // Float16 storage: each value is the float32 one rounded to half precision, and the sums are
    // still the float32 values' (bit for bit: the same additions).
    ASSERT_TRUE(kernel.float16_holds_outputs());
    std::vector<uint16_t> halves(static_cast<size_t>(y_nhwc.numel()));
    std::vector<float> half_sums(sums.size(), -1.f);
    kernel.run(p, x_nhwc.raw(), halves.data(), half_sums.data(), true);
    int64_t rounded = 0;
    for (int64_t i = 0; i < y_nhwc.numel(); ++i) {
      ASSERT_EQ(halves[static_cast<size_t>(i)], float_to_16bit(yv[i], kOnnxFloat16)) << i << " of " << yv[i];
      rounded += float_from_16bit(halves[static_cast<size_t>(i)], kOnnxFloat16) != yv[i];
    }
    EXPECT_GT(rounded, 0);  // not trivially equal
    EXPECT_EQ(half_sums, sums);
  }
  if (exact) {
    EXPECT_EQ(mismatches, 0) << "worst difference " << worst;
  } else if (c.y_type == DType::kFloat32) {
    EXPECT_EQ(mismatches, 0) << "worst difference " << worst;
  } else {
    EXPECT_LE(worst, 1.0);
    EXPECT_LE(mismatches, std::max<int64_t>(1, static_cast<int64_t>(a.size()) / 200)) << "worst difference " << worst;
  }
}

// Float16 storage is offered only where no input codes can give a float32 y past half precision's
// largest finite value: 3x3 weights of 127, u8 codes with zero point 0, so |acc| <= 9 * 127 * 255,
// scaled to a largest output of 60000 (offered) or 70000 (refused, for Swish, Relu and no
// activation alike; a Sigmoid's output is at most 1 whatever the scale). Storage the kernel refused
// is an internal error.
TEST(DirectDepthwiseFloat16, OfferedOnlyWhereEveryOutputIsFiniteInHalfPrecision) {
  if (!direct_depthwise_available()) GTEST_SKIP() << "the direct depthwise kernel needs AVX-512 VNNI";
  constexpr int64_t kChannels = 64;
  const double largest_acc = 9.0 * 127 * 255;
  Tensor w(DType::kInt8, {kChannels, 1, 3, 3});
  for (int8_t& v : w.values<int8_t>()) v = 127;
  for (const Activation act : {Activation::kNone, Activation::kRelu, Activation::kSwish, Activation::kSigmoid})
    for (const double largest : {60000.0, 70000.0}) {
      QLinearAttrs q;
      q.x.scale = {1.f};
      q.x.zero_point = {0};
      q.w.scale.assign(kChannels, static_cast<float>(largest / largest_acc));
      q.w.zero_point.assign(kChannels, 0);
      q.w.axis = 0;
      q.activation = act;
      q.activation_alpha = 1.f;
      q.y.dtype = DType::kFloat32;
      const Requant r = make_requant(ir::Node(), q, kChannels, nullptr);
      const DirectDepthwise kernel(q, r, w, DType::kUInt8);
      const bool holds = largest < 65504 || act == Activation::kSigmoid;
      EXPECT_EQ(kernel.float16_holds_outputs(), holds) << activation_name(act) << " " << largest;
      if (holds) continue;
      const ConvProblem p{1, kChannels, kChannels, kChannels, {3, 3}, {3, 3}, {3, 3}, {1, 1}, {1, 1}, {1, 1}};
      std::vector<uint8_t> x(9 * kChannels, 255);
      std::vector<uint16_t> y(9 * kChannels);
      EXPECT_THROW(kernel.run(p, x.data(), y.data(), nullptr, true), Error);
    }
}

constexpr DType kU8 = DType::kUInt8, kS8 = DType::kInt8, kF32 = DType::kFloat32;
using A = Activation;

INSTANTIATE_TEST_SUITE_P(
    Shapes, DirectDepthwiseTest,
    ::testing::Values(
        // name, C, H, W, kh, kw, sh, sw, pads t l b r, x type, z_x, activation, y type, z_y, per-channel y, post affine, N
        DepthwiseCase{"c240_5x5_s8_hardswish_channel_y", 240, 12, 20, 5, 5, 1, 1, 2, 2, 2, 2, kS8, 0, A::kHardSwish, kS8,
                      0, true, true},
        DepthwiseCase{"c64_3x3_u8zp_relu_u8", 64, 9, 11, 3, 3, 1, 1, 1, 1, 1, 1, kU8, 37, A::kRelu, kU8, 0},
        DepthwiseCase{"c16_3x3_stride2_s8zp_clip_s8zp", 16, 15, 17, 3, 3, 2, 2, 1, 1, 1, 1, kS8, -5, A::kClip, kS8, 3},
        DepthwiseCase{"c24_5x5_stride2x1_none_f32", 24, 10, 9, 5, 5, 2, 1, 2, 2, 2, 2, kS8, 0, A::kNone, kF32, 0},
        DepthwiseCase{"c80_3x3_stride1x2_leaky_u8zp", 80, 7, 13, 3, 3, 1, 2, 1, 1, 1, 1, kU8, 128, A::kLeakyRelu, kU8, 100},
        DepthwiseCase{"c130_7x7_unpadded_none_s8", 130, 11, 12, 7, 7, 1, 1, 0, 0, 0, 0, kU8, 0, A::kNone, kS8, -7},
        DepthwiseCase{"c48_3x5_asymmetric_pads_hardsigmoid_u8", 48, 6, 8, 3, 5, 1, 1, 0, 2, 2, 1, kS8, 4, A::kHardSigmoid,
                      kU8, 0},
        DepthwiseCase{"c32_5x5_hardswish_f32_batch2", 32, 8, 8, 5, 5, 1, 1, 2, 2, 2, 2, kS8, 0, A::kHardSwish, kF32, 0,
                      false, false, 2},
        DepthwiseCase{"c96_1x1_relu_channel_y", 96, 4, 5, 1, 1, 1, 1, 0, 0, 0, 0, kU8, 0, A::kRelu, kS8, 0, true},
        DepthwiseCase{"c200_9x3_stride2_clip_channel_y", 200, 13, 6, 9, 3, 2, 1, 4, 1, 4, 1, kU8, 9, A::kClip, kU8, 0,
                      true},
        // Tall filters and large strides: windows over up to five row quads, quads no row reads.
        DepthwiseCase{"c70_13x2_stride3x2_none_s8", 70, 29, 9, 13, 2, 3, 2, 6, 1, 6, 0, kS8, 2, A::kNone, kS8, 1},
        DepthwiseCase{"c64_2x2_stride5_relu_u8", 64, 23, 21, 2, 2, 5, 5, 1, 0, 0, 1, kU8, 0, A::kRelu, kU8, 0},
        DepthwiseCase{"c128_16x1_relu_f32", 128, 20, 3, 16, 1, 1, 1, 7, 0, 8, 0, kU8, 0, A::kRelu, kF32, 0},
        // EfficientNet's depthwise layers end in Swish (SiLU); Sigmoid gates.
        DepthwiseCase{"c144_5x5_stride2_swish_channel_y", 144, 14, 15, 5, 5, 2, 2, 2, 2, 2, 2, kU8, 3, A::kSwish, kS8, 0,
                      true},
        DepthwiseCase{"c96_3x3_swish_post_affine_u8", 96, 9, 10, 3, 3, 1, 1, 1, 1, 1, 1, kS8, 0, A::kSwish, kU8, 60,
                      false, true},
        DepthwiseCase{"c64_3x3_sigmoid_f32", 64, 7, 7, 3, 3, 1, 1, 1, 1, 1, 1, kU8, 0, A::kSigmoid, kF32, 0},
        // A squeeze-excitation's input: Swish into float32, the channels' sums taken alongside
        // (144 channels: a last chunk of 16; 30 columns: two tiles).
        DepthwiseCase{"c144_3x3_swish_f32_batch2", 144, 9, 30, 3, 3, 1, 1, 1, 1, 1, 1, kU8, 5, A::kSwish, kF32, 0,
                      false, false, 2},
        DepthwiseCase{"c80_3x3_sigmoid_u8", 80, 7, 9, 3, 3, 1, 1, 1, 1, 1, 1, kS8, -9, A::kSigmoid, kU8, 0},
        // Pixel groups (16 / 32 channels, horizontal stride 1): rows whose last group is partial
        // (13 and 10 columns), padding cutting a group at both edges, a vertical stride, the
        // channel sums of a float32 y over two images, and 32 channels at stride 2 (no groups).
        DepthwiseCase{"c32_3x3_odd_width_swish_f32_batch2", 32, 9, 13, 3, 3, 1, 1, 1, 1, 1, 1, kU8, 3, A::kSwish, kF32, 0,
                      false, false, 2},
        DepthwiseCase{"c16_5x5_width10_relu_u8zp", 16, 8, 10, 5, 5, 1, 1, 2, 2, 2, 2, kS8, 0, A::kRelu, kU8, 7},
        DepthwiseCase{"c16_3x3_stride2x1_asymmetric_pads_hardswish_s8", 16, 11, 21, 3, 3, 2, 1, 0, 1, 1, 0, kU8, 12,
                      A::kHardSwish, kS8, -3},
        DepthwiseCase{"c32_3x3_unpadded_channel_y", 32, 6, 38, 3, 3, 1, 1, 0, 0, 0, 0, kS8, -2, A::kNone, kS8, 0, true},
        DepthwiseCase{"c32_3x3_stride2_sigmoid_f32", 32, 9, 12, 3, 3, 2, 2, 1, 1, 1, 1, kU8, 0, A::kSigmoid, kF32, 0},
        DepthwiseCase{"c16_3x3_wide_swish_f32_threads", 16, 40, 96, 3, 3, 1, 1, 1, 1, 1, 1, kU8, 5, A::kSwish, kF32, 0,
                      false, false, 2},
        // Enough work for the units to be split across OpenMP threads (each with its own ring).
        DepthwiseCase{"c256_5x5_40x40_threads_relu_u8", 256, 40, 40, 5, 5, 1, 1, 2, 2, 2, 2, kU8, 5, A::kRelu, kU8, 0,
                      false, false, 2}),
    [](const ::testing::TestParamInfo<DepthwiseCase>& info) { return info.param.name; });

}  // namespace
}  // namespace slimquant::runtime::int8
