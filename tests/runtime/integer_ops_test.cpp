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

// Plain N-D convolution (1 to 3 spatial dims) of real values with zero padding, written from the
// ONNX Conv definition; SAME_UPPER puts the odd padding at the end, SAME_LOWER at the beginning.
struct ConvRef {
  int64_t group = 1;
  std::vector<int64_t> strides, dilations, pads;  // empty: the defaults
  std::string auto_pad;                           // empty: explicit pads

  ConvRef with_group(int64_t v) const { ConvRef c = *this; c.group = v; return c; }
  ConvRef with_strides(std::vector<int64_t> v) const { ConvRef c = *this; c.strides = std::move(v); return c; }
  ConvRef with_dilations(std::vector<int64_t> v) const { ConvRef c = *this; c.dilations = std::move(v); return c; }
  ConvRef with_pads(std::vector<int64_t> v) const { ConvRef c = *this; c.pads = std::move(v); return c; }
  ConvRef with_auto_pad(std::string v) const { ConvRef c = *this; c.auto_pad = std::move(v); return c; }

  struct Resolved {
    Shape stride{1, 1, 1}, dilation{1, 1, 1}, pad{0, 0, 0}, in{1, 1, 1}, kernel{1, 1, 1}, out{1, 1, 1};
  };
  // Spatial parameters padded to 3 dims (leading 1s).
  Resolved resolve(const Shape& x, const Shape& w) const {
    const size_t spatial = x.size() - 2, o = 3 - spatial;
    Resolved r;
    for (size_t i = 0; i < spatial; ++i) {
      const int64_t s = strides.empty() ? 1 : strides[i], d = dilations.empty() ? 1 : dilations[i];
      const int64_t in = x[2 + i], k = w[2 + i], extent = (k - 1) * d + 1;
      int64_t out = 0, pad = 0;
      if (auto_pad == "SAME_UPPER" || auto_pad == "SAME_LOWER") {
        out = (in + s - 1) / s;
        const int64_t total = std::max<int64_t>(0, (out - 1) * s + extent - in);
        pad = auto_pad == "SAME_UPPER" ? total / 2 : total - total / 2;
      } else if (auto_pad == "VALID") {
        out = (in - extent) / s + 1;
      } else {
        pad = pads.empty() ? 0 : pads[i];
        out = (in + pad + (pads.empty() ? 0 : pads[i + spatial]) - extent) / s + 1;
      }
      r.stride[o + i] = s;
      r.dilation[o + i] = d;
      r.pad[o + i] = pad;
      r.in[o + i] = in;
      r.kernel[o + i] = k;
      r.out[o + i] = out;
    }
    return r;
  }
  Shape out_shape(const Shape& x, const Shape& w) const {
    const Resolved r = resolve(x, w);
    Shape s = {x[0], w[0]};
    s.insert(s.end(), r.out.end() - static_cast<int64_t>(x.size() - 2), r.out.end());
    return s;
  }
  // out[n, m, o...] = sum over c, k... of x[n, group(m) * C/group + c, o * stride - pad + k * dilation] * w[m, c, k...]
  std::vector<double> run(const std::vector<double>& x, const Shape& xs, const std::vector<double>& w,
                          const Shape& ws) const {
    const Resolved r = resolve(xs, ws);
    const int64_t batch = xs[0], channels = xs[1], outs = ws[0], cg = ws[1], mg = outs / group;
    const int64_t in_size = r.in[0] * r.in[1] * r.in[2], k_size = r.kernel[0] * r.kernel[1] * r.kernel[2];
    std::vector<double> out;
    for (int64_t n = 0; n < batch; ++n)
      for (int64_t m = 0; m < outs; ++m)
        for (int64_t o0 = 0; o0 < r.out[0]; ++o0)
          for (int64_t o1 = 0; o1 < r.out[1]; ++o1)
            for (int64_t o2 = 0; o2 < r.out[2]; ++o2) {
              double sum = 0;
              for (int64_t c = 0; c < cg; ++c)
                for (int64_t k0 = 0; k0 < r.kernel[0]; ++k0)
                  for (int64_t k1 = 0; k1 < r.kernel[1]; ++k1)
                    for (int64_t k2 = 0; k2 < r.kernel[2]; ++k2) {
                      const int64_t i0 = o0 * r.stride[0] - r.pad[0] + k0 * r.dilation[0];
                      const int64_t i1 = o1 * r.stride[1] - r.pad[1] + k1 * r.dilation[1];
                      const int64_t i2 = o2 * r.stride[2] - r.pad[2] + k2 * r.dilation[2];
                      if (i0 < 0 || i0 >= r.in[0] || i1 < 0 || i1 >= r.in[1] || i2 < 0 || i2 >= r.in[2]) continue;
                      const int64_t ci = (m / mg) * cg + c;
                      sum += x[(n * channels + ci) * in_size + (i0 * r.in[1] + i1) * r.in[2] + i2] *
                             w[(m * cg + c) * k_size + (k0 * r.kernel[1] + k1) * r.kernel[2] + k2];
                    }
              out.push_back(sum);
            }
    return out;
  }
  void set_attrs(ir::Node& node) const {
    node.attrs["group"] = group;
    if (!strides.empty()) node.attrs["strides"] = strides;
    if (!dilations.empty()) node.attrs["dilations"] = dilations;
    if (!pads.empty()) node.attrs["pads"] = pads;
    if (!auto_pad.empty()) node.attrs["auto_pad"] = auto_pad;
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
  const auto av = a.to_int64_vector(), bv = b.to_int64_vector();
  const auto za = a_zp.to_int64_vector(), zb = b_zp.to_int64_vector();
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

  // Enough work to be split between threads, with a constant (prepacked) B.
  const Tensor big_a = random_ints<uint8_t>({2, 64, 128}, rng, 0, 255);
  const Tensor big_b = random_ints<int8_t>({128, 160}, rng, -128, 127);
  const Tensor big_y = run_op(make_node("MatMulInteger", 3), {big_a, big_b, Tensor::scalar<uint8_t>(77)}, 10,
                              {false, true, false})
                           .at(0);
  ASSERT_EQ(big_y.shape(), (Shape{2, 64, 160}));
  const auto ba = big_a.to_int64_vector(), bbv = big_b.to_int64_vector();
  for (int64_t i = 0; i < 2 * 64; ++i)
    for (int64_t j = 0; j < 160; ++j) {
      int64_t sum = 0;
      for (int64_t l = 0; l < 128; ++l) sum += (ba[i * 128 + l] - 77) * bbv[l * 160 + j];
      ASSERT_EQ(big_y.data<int32_t>()[i * 160 + j], sum) << i << " " << j;
    }
}

// QLinearConv with per-channel weight scales and an int32 bias against dequantize -> float conv ->
// requantize, for a long reduction (27 products: the dot form) and a depthwise one (9: the
// transposed form), u8 and s8 outputs.
TEST(IntegerOps, QLinearConvPerChannelWithBiasMatchesFloatReference) {
  std::mt19937 rng(11);
  struct Case {
    Shape x, w;
    ConvRef conv;
    DType y_type;
  };
  const Case cases[] = {
      {{2, 3, 9, 8}, {4, 3, 3, 3}, ConvRef().with_strides({2, 2}).with_pads({1, 1, 1, 1}), DType::kUInt8},
      {{1, 3, 7, 9}, {3, 1, 3, 3}, ConvRef().with_group(3).with_dilations({1, 2}).with_pads({1, 1, 2, 0}),
       DType::kInt8}};
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
      const int64_t pixels = shape_numel(os) / (os[0] * os[1]);
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
  const ConvRef conv = ConvRef().with_group(2).with_strides({1, 2}).with_dilations({2, 1}).with_pads({1, 0, 2, 1});
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

// ConvInteger over the geometry the kernel special-cases: 1-D and 3-D, every auto_pad, kernel
// widths with and without an unrolled copy, strided short reductions (the transposed form), tiles
// that end inside an output row, and work large enough to be split between threads.
TEST(IntegerOps, ConvIntegerGeometriesMatchLoop) {
  std::mt19937 rng(9);
  struct Case {
    Shape x, w;
    ConvRef conv;
  };
  const Case cases[] = {
      // 1-D, a reduction of 15 (transposed form) with stride 2; 1-D, dilated, 24 (dot form)
      {{2, 3, 17}, {4, 3, 5}, ConvRef().with_strides({2}).with_pads({2, 1})},
      {{1, 8, 20}, {5, 8, 3}, ConvRef().with_dilations({3}).with_pads({3, 3})},
      // 3-D, grouped, kernel width 2 (no unrolled copy)
      {{1, 4, 5, 6, 7}, {6, 2, 2, 3, 2}, ConvRef().with_group(2).with_strides({1, 2, 1}).with_pads({1, 0, 1, 0, 1, 1})},
      // every auto_pad; kernel widths 7 and 4
      {{1, 2, 11, 10}, {3, 2, 7, 7}, ConvRef().with_strides({2, 2}).with_auto_pad("SAME_LOWER")},
      {{1, 4, 9, 8}, {4, 1, 3, 3}, ConvRef().with_group(4).with_strides({2, 2}).with_auto_pad("SAME_UPPER")},
      {{1, 3, 9, 9}, {2, 3, 4, 4}, ConvRef().with_strides({2, 1}).with_auto_pad("VALID")},
      // 1 x 1
      {{1, 40, 5, 6}, {9, 40, 1, 1}, ConvRef()},
      // two tiles, the first ending inside an output row (dot form, then transposed form)
      {{1, 3, 50, 50}, {2, 3, 3, 3}, ConvRef().with_pads({1, 1, 1, 1})},
      {{1, 1, 30000}, {1, 1, 3}, ConvRef().with_pads({1, 1})},
      // enough work for several threads
      {{1, 16, 40, 40}, {16, 16, 3, 3}, ConvRef().with_pads({1, 1, 1, 1})},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE("x " + shape_str(c.x) + " w " + shape_str(c.w));
    const bool signed_x = c.x[1] % 2 == 0;
    const Tensor x = signed_x ? random_ints<int8_t>(c.x, rng, -128, 127) : random_ints<uint8_t>(c.x, rng, 0, 255);
    const Tensor x_zp = signed_x ? Tensor::scalar<int8_t>(7) : Tensor::scalar<uint8_t>(131);
    const Tensor w = random_ints<int8_t>(c.w, rng, -128, 127);
    ir::Node node = make_node("ConvInteger", 3);
    c.conv.set_attrs(node);
    const Tensor y = run1(node, {x, w, x_zp}, 10);
    ASSERT_EQ(y.shape(), c.conv.out_shape(c.x, c.w));
    const std::vector<double> want =
        c.conv.run(minus_zero_point(x, x_zp.to_int64_vector(), 1), c.x, minus_zero_point(w, {0}, 1), c.w);
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
                        {a, Tensor::scalar(a_scale), Tensor::scalar<int8_t>(4), b,
                         Tensor::from_vector<float>({n}, b_scale), b_zp, Tensor::scalar(y_scale),
                         Tensor::scalar<int8_t>(-10)},
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
