// The banded QConv with a Swish or HardSwish output stage (int8_conv_bands.h) against the plain-loop reference,
// code for code up to rounding ties: 1x1 expansions cut into row bands (top, middle, bottom and a
// short last band), 3x3 stride-2 stems with padding, grouped and depthwise filters, dilation,
// several images per band and a remainder band, inputs whose last rows no output reads, u8 / s8
// per-tensor and per-channel outputs and float32 ones, the post affine map. Runs only where the Swish pass runs
// (AVX-512).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "runtime/kernels/dnnl/dnnl_descriptors.h"
#include "runtime/kernels/elementwise/swish_avx512.h"
#include "runtime/kernels/integer/int8_conv_bands.h"
#include "channels_last.h"

namespace slimquant::runtime::int8 {
namespace {

struct BandCase {
  std::string name;
  int64_t batch, in_channels, out_channels, group, height, width, kernel, stride, dilation, pad_begin, pad_end;
  int64_t band_bytes;
  DType y_type;
  bool y_per_channel = false;
  bool post_affine = false;
  int32_t x_zero_point = 7;
  Activation activation = Activation::kSwish;  // or HardSwish (with a per-channel y)
};

class ConvBandsTest : public ::testing::TestWithParam<BandCase> {};

TEST_P(ConvBandsTest, MatchesTheReference) {
  if (!ew::swish_pass_available()) GTEST_SKIP() << "the banded convolution runs where the AVX-512 Swish pass does";
  const BandCase& c = GetParam();
  std::mt19937 rng(static_cast<uint32_t>(std::hash<std::string>{}(c.name)));
  // Without VNNI (DNNL_MAX_CPU_ISA=AVX2) oneDNN's u8 x s8 products are exact for 7-bit weights only,
  // which is when the QConv kernel runs them (resolve_compute).
  const int w_max = cpu_has_exact_int8_dot() ? 127 : kMaxExactWeightWithoutVnni;
  std::uniform_int_distribution<int> weight(-w_max, w_max), code(0, 255);
  std::uniform_real_distribution<float> unit(0.5f, 1.5f), signed_unit(-1.f, 1.f);

  QLinearAttrs q;
  q.x.scale = {0.03f};
  q.x.zero_point = {c.x_zero_point};
  q.w.scale.resize(static_cast<size_t>(c.out_channels));
  for (float& s : q.w.scale) s = 0.004f * unit(rng);
  q.w.zero_point.assign(static_cast<size_t>(c.out_channels), 0);
  q.w.axis = 0;
  q.activation = c.activation;
  q.activation_alpha = c.activation == Activation::kSwish && c.post_affine ? 1.702f : 1.f;
  if (c.post_affine) {
    q.post_scale = 1.25f;
    q.post_shift = -0.1f;
  }
  q.y.dtype = c.y_type;
  if (c.y_type == DType::kFloat32) {
    q.y = QLinearAttrs::unit_param(DType::kFloat32);
  } else if (c.y_per_channel) {
    q.y.scale.resize(static_cast<size_t>(c.out_channels));
    for (float& s : q.y.scale) s = 0.02f * unit(rng);
    q.y.zero_point.assign(static_cast<size_t>(c.out_channels), 0);
    q.y.axis = 1;
  } else {
    q.y.scale = {0.025f};
    q.y.zero_point = {c.y_type == DType::kUInt8 ? 12 : -3};
  }

  const int64_t per_group = c.in_channels / c.group;
  Tensor w(DType::kInt8, {c.out_channels, per_group, c.kernel, c.kernel});
  for (int8_t& v : w.values<int8_t>()) v = static_cast<int8_t>(weight(rng));
  Tensor bias(DType::kFloat32, {c.out_channels});
  for (float& v : bias.values<float>()) v = 0.5f * signed_unit(rng);
  const Requant r = make_requant(ir::Node(), q, c.out_channels, &bias);
  ASSERT_FALSE(r.multiplier.empty());

  Tensor x(DType::kUInt8, {c.batch, c.in_channels, c.height, c.width});
  for (uint8_t& v : x.values<uint8_t>()) v = static_cast<uint8_t>(code(rng));
  const int64_t span = (c.kernel - 1) * c.dilation + 1;
  const int64_t out_h = (c.height + c.pad_begin + c.pad_end - span) / c.stride + 1;
  const int64_t out_w = (c.width + c.pad_begin + c.pad_end - span) / c.stride + 1;
  const ConvProblem p{c.batch, c.in_channels, c.out_channels, c.group, {c.height, c.width}, {out_h, out_w},
                      {c.kernel, c.kernel}, {c.stride, c.stride}, {c.dilation, c.dilation}, {c.pad_begin, c.pad_begin}};
  Tensor expected(c.y_type, {c.batch, c.out_channels, out_h, out_w});
  reference_qconv(q, r, p, x, w, expected);

  using dnnl::memory;
  PackedConstant packed(w, dnnl_kernels::conv_weights_desc(w.shape(), c.group, dt::s8, memory::format_tag::undef));
  std::vector<float> b(r.bias);
  const memory bias_mem({{c.out_channels}, dt::f32, memory::format_tag::a}, dnnl_engine(), b.data());
  GatedOutputStage stage;
  ASSERT_TRUE(gated_output_stage(q, stage));
  ConvBands bands(p, dnnl_kernels::conv_weights_desc(w.shape(), c.group, dt::s8, memory::format_tag::any), packed,
                  bias_mem, r, c.x_zero_point, stage, c.band_bytes);
  ASSERT_TRUE(bands.usable());
  const Tensor x_nhwc = test::to_channels_last(x);
  Tensor y_nhwc(c.y_type, {c.batch, out_h, out_w, c.out_channels});
  bands.run(x_nhwc.data<uint8_t>(), y_nhwc.raw());
  const Tensor actual = test::from_channels_last(y_nhwc);

  // The reference evaluates libm's exp and rounds each product; the pass a polynomial and fused
  // multiply-adds: float32 values agree to a few ulp, and a value at a rounding boundary may land
  // one code away, rarely.
  const std::vector<float> a = actual.to_float_vector(), e = expected.to_float_vector();
  const bool float_y = c.y_type == DType::kFloat32;
  int64_t mismatches = 0;
  double worst = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    const double d = std::fabs(static_cast<double>(a[i]) - e[i]);
    worst = std::max(worst, float_y ? d / std::max(1.0, std::fabs(static_cast<double>(e[i]))) : d);
    if (d > 0) ++mismatches;
  }
  if (float_y) {
    EXPECT_LE(worst, 2e-6);
  } else {
    EXPECT_LE(worst, 1.0);
    EXPECT_LE(mismatches, std::max<int64_t>(1, static_cast<int64_t>(a.size()) / 500)) << "worst difference " << worst;
  }
}

constexpr int64_t kKiB = 1024;

INSTANTIATE_TEST_SUITE_P(
    Geometries, ConvBandsTest,
    ::testing::Values(
        // An EfficientNet expansion: 3 rows of 24 x 96 floats per band, 24 rows (8 bands).
        BandCase{"expansion_1x1_row_bands", 1, 16, 96, 1, 24, 24, 1, 1, 1, 0, 0, 27 * kKiB, DType::kUInt8},
        // Bands of 5 rows over 23: a short last band.
        BandCase{"expansion_1x1_short_last_band", 1, 24, 48, 1, 23, 9, 1, 1, 1, 0, 0, 5 * 9 * 48 * 4, DType::kInt8},
        // The stem: 3 -> 32, 3x3 stride 2, padding 1, top / middle / bottom bands.
        BandCase{"stem_3x3_stride2_pad", 1, 3, 32, 1, 30, 30, 3, 2, 1, 1, 1, 4 * kKiB, DType::kUInt8},
        // Depthwise (32 channels: below the direct kernel's minimum) and grouped filters; a float32
        // y (EfficientNet's depthwise layers feed the squeeze-excitation in float).
        BandCase{"depthwise_3x3_pad", 2, 32, 32, 32, 14, 14, 3, 1, 1, 1, 1, 4 * kKiB, DType::kUInt8, true},
        BandCase{"depthwise_3x3_float_y", 2, 32, 32, 32, 20, 20, 3, 1, 1, 1, 1, 8 * kKiB, DType::kFloat32},
        BandCase{"expansion_float_y_post_affine", 1, 8, 40, 1, 9, 11, 1, 1, 1, 0, 0, 2 * kKiB, DType::kFloat32, false,
                 true},
        BandCase{"grouped_5x5_dilated", 1, 16, 32, 4, 17, 15, 5, 1, 2, 4, 4, 6 * kKiB, DType::kInt8, false, true},
        // Whole images per band: 3 images each, then a remainder of 2.
        BandCase{"several_images_per_band", 5, 8, 16, 1, 6, 6, 3, 1, 1, 1, 1, 3 * 6 * 6 * 16 * 4, DType::kUInt8},
        // Stride 2 without padding on 9 rows: the last input row is never read (one image per band).
        BandCase{"unread_last_rows", 3, 8, 16, 1, 9, 8, 2, 2, 1, 0, 0, 64 * kKiB, DType::kUInt8, false, false, 200},
        // One band for everything.
        BandCase{"single_band_channel_y", 2, 40, 24, 1, 7, 7, 1, 1, 1, 0, 0, kConvBandBytes, DType::kInt8, true},
        // Hard-swish (MobileNetV3, PP-OCR): per tensor, and PP-LCNet's channel-wise quantized
        // convolutions with its affine block after.
        BandCase{"hardswish_tensor_y", 1, 16, 32, 1, 13, 13, 3, 2, 1, 1, 1, 2 * kKiB, DType::kUInt8, false, false, 0,
                 Activation::kHardSwish},
        BandCase{"hardswish_channel_y", 1, 24, 40, 1, 16, 12, 3, 1, 1, 1, 1, 4 * kKiB, DType::kInt8, true, false, 7,
                 Activation::kHardSwish},
        BandCase{"hardswish_channel_y_post_affine", 2, 16, 32, 1, 9, 20, 1, 1, 1, 0, 0, 3 * kKiB, DType::kUInt8, true,
                 true, 3, Activation::kHardSwish}),
    [](const ::testing::TestParamInfo<BandCase>& info) { return info.param.name; });

}  // namespace
}  // namespace slimquant::runtime::int8
