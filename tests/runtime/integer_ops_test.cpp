// ONNX integer ops (DynamicQuantizeLinear, MatMulInteger, ConvInteger, QLinearConv, QLinearMatMul):
// what ONNX's node test data leaves out. Its cases are per-tensor, u8-only and tiny; here per-row /
// per-column / per-channel parameters, batching, groups, both GEMM forms (short and long
// reductions), full-range s8 weights (which oneDNN's non-VNNI int8 path would saturate) and the
// error messages, each against a plain reference written in the test.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "kernel_test_util.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {
namespace {

using kernel_test::make_node;
using kernel_test::run1;
using kernel_test::run_op;

template <typename T>
Tensor random_ints(const Shape& s, std::mt19937& rng, int lo, int hi) {
  std::uniform_int_distribution<int> dist(lo, hi);
  Tensor t(dtype_of<T>, s);
  for (T& v : t.values<T>()) v = static_cast<T>(dist(rng));
  return t;
}

// Plain 2-D convolution of integer values (zero points already subtracted), padding = 0.
struct Conv2d {
  int64_t group = 1, stride_h = 1, stride_w = 1, dilation_h = 1, dilation_w = 1;
  int64_t pad_top = 0, pad_left = 0, pad_bottom = 0, pad_right = 0;

  Shape out_shape(const Shape& x, const Shape& w) const {
    const int64_t eh = (w[2] - 1) * dilation_h + 1, ew = (w[3] - 1) * dilation_w + 1;
    return {x[0], w[0], (x[2] + pad_top + pad_bottom - eh) / stride_h + 1, (x[3] + pad_left + pad_right - ew) / stride_w + 1};
  }
  // out[n, m, oh, ow] = sum x[n, c, ih, iw] * w[m, c', kh, kw] (+ nothing: callers add what they need)
  std::vector<double> run(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                          const Shape& ws) const {
    const Shape os = out_shape(xs, ws);
    const int64_t cg = ws[1], mg = ws[0] / group;
    std::vector<double> out(static_cast<size_t>(shape_numel(os)), 0.0);
    for (int64_t n = 0; n < os[0]; ++n)
      for (int64_t m = 0; m < os[1]; ++m)
        for (int64_t oh = 0; oh < os[2]; ++oh)
          for (int64_t ow = 0; ow < os[3]; ++ow) {
            double sum = 0;
            for (int64_t c = 0; c < cg; ++c)
              for (int64_t kh = 0; kh < ws[2]; ++kh)
                for (int64_t kw = 0; kw < ws[3]; ++kw) {
                  const int64_t ih = oh * stride_h - pad_top + kh * dilation_h;
                  const int64_t iw = ow * stride_w - pad_left + kw * dilation_w;
                  if (ih < 0 || ih >= xs[2] || iw < 0 || iw >= xs[3]) continue;
                  const int64_t ci = (m / mg) * cg + c;
                  sum += x[((n * xs[1] + ci) * xs[2] + ih) * xs[3] + iw] * w[((m * cg + c) * ws[2] + kh) * ws[3] + kw];
                }
            out[((n * os[1] + m) * os[2] + oh) * os[3] + ow] = sum;
          }
    return out;
  }
  void set_attrs(ir::Node& node) const {
    node.attrs["group"] = group;
    node.attrs["strides"] = std::vector<int64_t>{stride_h, stride_w};
    node.attrs["dilations"] = std::vector<int64_t>{dilation_h, dilation_w};
    node.attrs["pads"] = std::vector<int64_t>{pad_top, pad_left, pad_bottom, pad_right};
  }
};

// Values minus a zero point that is per tensor (one value) or per slice of `inner` elements.
std::vector<double> minus_zero_point(const Tensor& t, const std::vector<int64_t>& zp, int64_t inner) {
  const std::vector<int64_t> v = t.to_int64_vector();
  std::vector<double> out(v.size());
  for (size_t i = 0; i < v.size(); ++i)
    out[i] = static_cast<double>(v[i] - zp[zp.size() == 1 ? 0 : (static_cast<int64_t>(i) / inner) % zp.size()]);
  return out;
}

// The quantized value of a real number v (in y units): saturate(round_half_even(v) + z). Values
// within 1e-3 of a rounding tie may land on either side (float32 vs double scale products).
void expect_requantized(const std::vector<double>& v_in_y_units, const Tensor& y, int32_t zero_point) {
  const int lo = y.dtype() == DType::kUInt8 ? 0 : -128, hi = y.dtype() == DType::kUInt8 ? 255 : 127;
  const std::vector<int64_t> got = y.to_int64_vector();
  ASSERT_EQ(got.size(), v_in_y_units.size());
  int exact = 0, unsaturated = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    unsaturated += got[i] > lo && got[i] < hi;
    const double v = v_in_y_units[i];
    const double want = std::clamp(std::nearbyint(v) + zero_point, double(lo), double(hi));
    const bool near_tie = std::abs(std::abs(v - std::floor(v)) - 0.5) < 1e-3;
    if (near_tie) EXPECT_NEAR(static_cast<double>(got[i]), want, 1.0) << "element " << i << " v " << v;
    else EXPECT_EQ(static_cast<double>(got[i]), want) << "element " << i << " v " << v;
    exact += !near_tie;
  }
  EXPECT_GT(exact, static_cast<int>(got.size()) / 2);
  EXPECT_GT(unsaturated, static_cast<int>(got.size()) / 2) << "the scales leave too few values in range";
}

TEST(IntegerOps, MatMulIntegerPerColumnZeroPointByHand) {
  // A - 1 = [[0 1 2] [3 4 5]];  B - [5 30] = [[5 -10] [25 10] [45 30]]
  const Tensor a = Tensor::from_vector<uint8_t>({2, 3}, {1, 2, 3, 4, 5, 6});
  const Tensor b = Tensor::from_vector<uint8_t>({3, 2}, {10, 20, 30, 40, 50, 60});
  const Tensor a_zp = Tensor::scalar<uint8_t>(1);
  const Tensor b_zp = Tensor::from_vector<uint8_t>({2}, {5, 30});
  const ir::Node node = make_node("MatMulInteger", 4);
  const std::vector<int32_t> want = {0 * 5 + 1 * 25 + 2 * 45, 0 * -10 + 1 * 10 + 2 * 30,   // 115, 70
                                     3 * 5 + 4 * 25 + 5 * 45, 3 * -10 + 4 * 10 + 5 * 30};  // 340, 160
  for (bool constant_b : {false, true}) {
    const Tensor y = run_op(node, {a, b, a_zp, b_zp}, 10, {false, constant_b, false, constant_b}).at(0);
    ASSERT_EQ(y.dtype(), DType::kInt32);
    ASSERT_EQ(y.shape(), (Shape{2, 2}));
    EXPECT_EQ(std::vector<int32_t>(y.values<int32_t>().begin(), y.values<int32_t>().end()), want)
        << "constant B " << constant_b;
  }
}

// Batched broadcasting with per-row / per-column zero points of the [..., M, 1] / [..., 1, N] form,
// long reductions (the dot kernel's 4 x 2 blocks and remainders) and a 1-D A (the transposed
// orientation), against a plain loop.
TEST(IntegerOps, MatMulIntegerBatchedMatchesLoop) {
  std::mt19937 rng(7);
  const int64_t m = 5, k = 37, n = 7;
  const Tensor a = random_ints<int8_t>({2, 1, m, k}, rng, -128, 127);
  const Tensor b = random_ints<uint8_t>({3, k, n}, rng, 0, 255);
  const Tensor a_zp = random_ints<int8_t>({2, 1, m, 1}, rng, -128, 127);
  const Tensor b_zp = random_ints<uint8_t>({3, 1, n}, rng, 0, 255);
  const Tensor y = run1(make_node("MatMulInteger", 4), {a, b, a_zp, b_zp}, 10);
  ASSERT_EQ(y.shape(), (Shape{2, 3, m, n}));
  const auto av = a.to_int64_vector(), bv = b.to_int64_vector(), za = a_zp.to_int64_vector(), zb = b_zp.to_int64_vector();
  for (int64_t i0 = 0; i0 < 2; ++i0)
    for (int64_t i1 = 0; i1 < 3; ++i1)
      for (int64_t i = 0; i < m; ++i)
        for (int64_t j = 0; j < n; ++j) {
          int64_t sum = 0;
          for (int64_t l = 0; l < k; ++l)
            sum += (av[(i0 * m + i) * k + l] - za[i0 * m + i]) * (bv[(i1 * k + l) * n + j] - zb[i1 * n + j]);
          ASSERT_EQ(y.data<int32_t>()[((i0 * 3 + i1) * m + i) * n + j], sum) << i0 << " " << i1 << " " << i << " " << j;
        }

  // A vector times a batch of matrices: [k] x [2, k, 9] -> [2, 9].
  const Tensor v = random_ints<uint8_t>({k}, rng, 0, 255);
  const Tensor mats = random_ints<int8_t>({2, k, 9}, rng, -128, 127);
  const Tensor yv = run1(make_node("MatMulInteger", 2), {v, mats}, 10);
  ASSERT_EQ(yv.shape(), (Shape{2, 9}));
  const auto vv = v.to_int64_vector(), mv = mats.to_int64_vector();
  for (int64_t bb = 0; bb < 2; ++bb)
    for (int64_t j = 0; j < 9; ++j) {
      int64_t sum = 0;
      for (int64_t l = 0; l < k; ++l) sum += vv[l] * mv[(bb * k + l) * 9 + j];
      EXPECT_EQ(yv.data<int32_t>()[bb * 9 + j], sum);
    }
}

// QLinearConv with per-channel weight scales and an int32 bias against dequantize -> float conv ->
// requantize, for a long reduction (27 products: the dot form) and a depthwise one (9: the
// transposed form), u8 and s8 outputs.
TEST(IntegerOps, QLinearConvPerChannelWithBiasMatchesFloatReference) {
  std::mt19937 rng(11);
  struct Case {
    Shape x, w;
    Conv2d conv;
    DType y_type;
  };
  Conv2d strided;
  strided.stride_h = strided.stride_w = 2;
  strided.pad_top = strided.pad_left = strided.pad_bottom = strided.pad_right = 1;
  Conv2d depthwise;
  depthwise.group = 3;
  depthwise.pad_top = depthwise.pad_left = 1;
  depthwise.pad_bottom = 2;
  depthwise.dilation_w = 2;
  const Case cases[] = {{{2, 3, 9, 8}, {4, 3, 3, 3}, strided, DType::kUInt8},
                        {{1, 3, 7, 9}, {3, 1, 3, 3}, depthwise, DType::kInt8}};
  for (const Case& c : cases) {
    const int64_t channels = c.w[0];
    const Tensor x = random_ints<uint8_t>(c.x, rng, 0, 255);
    const Tensor w = random_ints<int8_t>(c.w, rng, -128, 127);  // full range
    const float x_scale = 0.02f, y_scale = c.y_type == DType::kUInt8 ? 0.9f : 0.35f;
    const int32_t x_zp = 121, y_zp = c.y_type == DType::kUInt8 ? 97 : -5;
    std::vector<float> w_scale;
    std::vector<int32_t> bias;
    for (int64_t m = 0; m < channels; ++m) {
      w_scale.push_back(0.004f * static_cast<float>(m + 1));
      bias.push_back(static_cast<int32_t>(rng() % 40001) - 20000);
    }
    const Tensor y_zp_t = c.y_type == DType::kUInt8 ? Tensor::scalar<uint8_t>(static_cast<uint8_t>(y_zp))
                                                    : Tensor::scalar<int8_t>(static_cast<int8_t>(y_zp));
    ir::Node node = make_node("QLinearConv", 9);
    c.conv.set_attrs(node);
    const std::vector<Tensor> inputs = {x,
                                        Tensor::scalar(x_scale),
                                        Tensor::scalar<uint8_t>(static_cast<uint8_t>(x_zp)),
                                        w,
                                        Tensor::from_vector<float>({channels}, w_scale),
                                        Tensor::from_vector<int8_t>({channels}, std::vector<int8_t>(channels, 0)),
                                        Tensor::scalar(y_scale),
                                        y_zp_t,
                                        Tensor::from_vector<int32_t>({channels}, bias)};
    for (bool constant_w : {false, true}) {
      const Tensor y = run_op(node, inputs, 10, {false, false, false, constant_w, false, constant_w}).at(0);
      ASSERT_EQ(y.dtype(), c.y_type);
      const Shape os = c.conv.out_shape(c.x, c.w);
      ASSERT_EQ(y.shape(), os);
      // Real values: x_r = (x - z_x) s_x, w_r = w s_w[m], b_r = b s_x s_w[m].
      std::vector<double> xr = minus_zero_point(x, {x_zp}, 1), wr = minus_zero_point(w, {0}, 1);
      for (double& v : xr) v *= x_scale;
      const int64_t per_channel = shape_numel(c.w) / channels;
      for (size_t i = 0; i < wr.size(); ++i) wr[i] *= w_scale[i / per_channel];
      std::vector<double> v = c.conv.run(xr, c.x, wr, c.w);
      const int64_t pixels = os[2] * os[3];
      for (size_t i = 0; i < v.size(); ++i) {
        const int64_t m = (static_cast<int64_t>(i) / pixels) % channels;
        v[i] = (v[i] + double(bias[m]) * x_scale * w_scale[m]) / y_scale;
      }
      expect_requantized(v, y, y_zp);
    }
  }
}

// ConvInteger with group 2, per-output-channel weight zero points, asymmetric pads, strides and
// dilations (s8 x, u8 w), against a plain integer convolution.
TEST(IntegerOps, ConvIntegerGroupTwoMatchesLoop) {
  std::mt19937 rng(5);
  const Shape xs = {2, 4, 7, 6}, ws = {6, 2, 3, 2};
  const Tensor x = random_ints<int8_t>(xs, rng, -128, 127);
  const Tensor w = random_ints<uint8_t>(ws, rng, 0, 255);
  const Tensor x_zp = Tensor::scalar<int8_t>(-3);
  const Tensor w_zp = random_ints<uint8_t>({6}, rng, 0, 255);
  Conv2d conv;
  conv.group = 2;
  conv.stride_w = 2;
  conv.dilation_h = 2;
  conv.pad_top = 1;
  conv.pad_bottom = 2;
  conv.pad_right = 1;
  ir::Node node = make_node("ConvInteger", 4);
  conv.set_attrs(node);
  node.attrs["kernel_shape"] = std::vector<int64_t>{3, 2};
  const std::vector<int64_t> zw = w_zp.to_int64_vector();
  const std::vector<double> want = conv.run(minus_zero_point(x, {-3}, 1), xs, minus_zero_point(w, zw, 2 * 3 * 2), ws);
  for (bool constant_w : {false, true}) {
    const Tensor y = run_op(node, {x, w, x_zp, w_zp}, 10, {false, constant_w, false, constant_w}).at(0);
    ASSERT_EQ(y.dtype(), DType::kInt32);
    ASSERT_EQ(y.shape(), conv.out_shape(xs, ws));
    for (int64_t i = 0; i < y.numel(); ++i) ASSERT_EQ(y.data<int32_t>()[i], want[i]) << "element " << i;
  }
}

// QLinearMatMul with per-column b scales and zero points (s8 a, u8 b, s8 y) against dequantize ->
// float matmul -> requantize.
TEST(IntegerOps, QLinearMatMulPerColumnMatchesFloatReference) {
  std::mt19937 rng(3);
  const int64_t m = 6, k = 40, n = 5;
  const Tensor a = random_ints<int8_t>({2, m, k}, rng, -128, 127);
  const Tensor b = random_ints<uint8_t>({k, n}, rng, 0, 255);
  const float a_scale = 0.03f, y_scale = 0.8f;
  const std::vector<float> b_scale = {0.01f, 0.02f, 0.005f, 0.015f, 0.03f};
  const Tensor b_zp = random_ints<uint8_t>({n}, rng, 100, 150);
  const Tensor y = run1(make_node("QLinearMatMul", 8),
                        {a, Tensor::scalar(a_scale), Tensor::scalar<int8_t>(4), b, Tensor::from_vector<float>({n}, b_scale),
                         b_zp, Tensor::scalar(y_scale), Tensor::scalar<int8_t>(-10)},
                        10);
  ASSERT_EQ(y.dtype(), DType::kInt8);
  ASSERT_EQ(y.shape(), (Shape{2, m, n}));
  const auto av = a.to_int64_vector(), bv = b.to_int64_vector(), zb = b_zp.to_int64_vector();
  std::vector<double> v;
  for (int64_t bb = 0; bb < 2; ++bb)
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n; ++j) {
        double sum = 0;
        for (int64_t l = 0; l < k; ++l)
          sum += (av[(bb * m + i) * k + l] - 4) * a_scale * ((bv[l * n + j] - zb[j]) * double(b_scale[j]));
        v.push_back(sum / y_scale);
      }
  expect_requantized(v, y, -10);
}

TEST(IntegerOps, DynamicQuantizeLinearRanges) {
  const ir::Node node = make_node("DynamicQuantizeLinear", 1, 3);
  struct Case {
    std::vector<float> x;
    float scale;
    uint8_t zero_point;
  };
  const Case cases[] = {
      {{0.f, 0.f, 0.f}, 1.f, 0},            // empty range: scale 1 as in ONNX Runtime
      {{1.f, 2.f, 3.f}, 3.f / 255.f, 0},    // the range is widened to hold 0
      {{-1.f, -2.f, -5.1f}, 5.1f / 255.f, 255},
  };
  for (const Case& c : cases) {
    const std::vector<Tensor> out = run_op(node, {Tensor::from_vector<float>({3}, c.x)}, 11);
    ASSERT_EQ(out.size(), 3u);
    EXPECT_FLOAT_EQ(out[1].data<float>()[0], c.scale);
    EXPECT_EQ(out[2].data<uint8_t>()[0], c.zero_point);
    for (size_t i = 0; i < c.x.size(); ++i)
      EXPECT_EQ(out[0].data<uint8_t>()[i],
                static_cast<uint8_t>(std::clamp(std::nearbyint(c.x[i] / c.scale) + c.zero_point, 0.f, 255.f)));
  }
}

TEST(IntegerOps, WrongDtypesNameTheNode) {
  std::mt19937 rng(1);
  const ir::Node conv = make_node("ConvInteger", 2);
  try {
    run1(conv, {Tensor(DType::kFloat32, {1, 1, 3, 3}), random_ints<int8_t>({1, 1, 2, 2}, rng, -3, 3)}, 10);
    FAIL() << "float x accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("ConvInteger '/ConvInteger_0'"), std::string::npos) << e.what();
    EXPECT_NE(std::string(e.what()).find("x must be uint8 or int8, got float32"), std::string::npos) << e.what();
  }
  // A zero point whose dtype differs from its tensor's.
  const ir::Node matmul = make_node("QLinearMatMul", 8);
  try {
    run1(matmul,
         {random_ints<uint8_t>({2, 3}, rng, 0, 9), Tensor::scalar(0.1f), Tensor::scalar<uint8_t>(1),
          random_ints<int8_t>({3, 2}, rng, -9, 9), Tensor::scalar(0.1f), Tensor::scalar<uint8_t>(0),
          Tensor::scalar(0.1f), Tensor::scalar<uint8_t>(0)},
         10);
    FAIL() << "u8 zero point of an s8 b accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("QLinearMatMul '/QLinearMatMul_0': b_zero_point is uint8"), std::string::npos)
        << e.what();
  }
  // Per-channel weight scales of the wrong count.
  const ir::Node qconv = make_node("QLinearConv", 8);
  try {
    run1(qconv,
         {random_ints<uint8_t>({1, 2, 3, 3}, rng, 0, 9), Tensor::scalar(0.1f), Tensor::scalar<uint8_t>(1),
          random_ints<int8_t>({3, 2, 1, 1}, rng, -9, 9), Tensor::from_vector<float>({2}, {0.1f, 0.2f}),
          Tensor::scalar<int8_t>(0), Tensor::scalar(0.1f), Tensor::scalar<uint8_t>(0)},
         10);
    FAIL() << "2 weight scales for 3 channels accepted";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("QLinearConv '/QLinearConv_0': w_scale has shape [2]"), std::string::npos)
        << e.what();
  }
}

}  // namespace
}  // namespace slimquant::runtime
