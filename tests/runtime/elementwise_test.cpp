// Elementwise family behaviour the ONNX node test data does not cover: every broadcast fast path
// and the parallel paths against a plain index-arithmetic reference, QuantizeLinear rounding ties
// and saturation, per-axis Q/DQ layouts, fake quantization bit-exactness, reductions over
// arbitrary axis sets, the vectorised exp/tanh/rounding, integer edge cases and fused activations.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <random>
#include <utility>
#include <vector>

#include "kernel_test_util.h"
#include "runtime/fused_ops/fused_activation.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/elementwise/gelu_avx512.h"
#include "runtime/kernels/elementwise/swish_avx512.h"

namespace slimquant::runtime {
namespace {

using kernel_test::make_node;
using kernel_test::random_floats;
using kernel_test::run1;

// Offset of output index `i` into an input of shape `in` broadcast to `out` (division per
// element: the obviously-correct reference).
int64_t broadcast_offset(int64_t i, const Shape& out, const Shape& in) {
  int64_t off = 0, stride = 1;
  const size_t lead = out.size() - in.size();
  for (size_t d = out.size(); d-- > 0;) {
    const int64_t idx = i % out[d];
    i /= out[d];
    if (d >= lead) {
      const int64_t dim = in[d - lead];
      if (dim != 1) off += idx * stride;
      stride *= dim;
    }
  }
  return off;
}

struct BinCase {
  Shape a, b;
};

class BroadcastTest : public ::testing::TestWithParam<BinCase> {};

TEST_P(BroadcastTest, ArithmeticMatchesReference) {
  const BinCase c = GetParam();
  std::mt19937 rng(7);
  const Tensor a = random_floats(c.a, rng), b = random_floats(c.b, rng, 0.5f, 2.f);
  const Shape out = broadcast_shapes(c.a, c.b);
  struct Op {
    const char* name;
    float (*f)(float, float);
  };
  const Op ops[] = {{"Add", [](float x, float y) { return x + y; }},
                    {"Sub", [](float x, float y) { return x - y; }},
                    {"Mul", [](float x, float y) { return x * y; }},
                    {"Div", [](float x, float y) { return x / y; }},
                    {"Max", [](float x, float y) { return std::max(x, y); }},
                    {"PRelu", [](float x, float y) { return x < 0 ? x * y : x; }}};
  for (const Op& op : ops) {
    if (std::string(op.name) == "PRelu" && out != c.a) continue;  // PRelu broadcasts slope onto x only
    const Tensor y = run1(make_node(op.name, 2), {a, b});
    ASSERT_EQ(y.shape(), out) << op.name;
    for (int64_t i = 0; i < y.numel(); ++i) {
      const float want = op.f(a.data<float>()[broadcast_offset(i, out, c.a)], b.data<float>()[broadcast_offset(i, out, c.b)]);
      ASSERT_EQ(y.data<float>()[i], want) << op.name << " element " << i;
    }
  }
  // Comparison output is bool through the same walk.
  const Tensor lt = run1(make_node("Less", 2), {a, b});
  ASSERT_EQ(lt.dtype(), DType::kBool);
  for (int64_t i = 0; i < lt.numel(); ++i)
    ASSERT_EQ(lt.data<bool>()[i], a.data<float>()[broadcast_offset(i, out, c.a)] <
                                      b.data<float>()[broadcast_offset(i, out, c.b)]);
}

INSTANTIATE_TEST_SUITE_P(
    Shapes, BroadcastTest,
    ::testing::Values(BinCase{{2, 3, 4, 5}, {2, 3, 4, 5}},       // same shape: one flat loop
                      BinCase{{2, 3, 4, 5}, {}},                 // scalar
                      BinCase{{}, {2, 3, 4, 5}},                 // scalar on the left
                      BinCase{{2, 3, 4, 5}, {3, 1, 1}},          // per channel
                      BinCase{{2, 3, 4, 5}, {1, 3, 1, 1}},       // per channel, full rank
                      BinCase{{2, 3, 4, 5}, {5}},                // last-dim vector
                      BinCase{{1, 3, 1, 5}, {2, 1, 4, 1}},       // both sides broadcast
                      BinCase{{4, 1}, {1, 6}},                   // outer product
                      BinCase{{3, 1, 5}, {3, 4, 1}},             // alternating
                      BinCase{{2, 0, 3}, {1, 3}},                // empty
                      BinCase{{4, 64, 32, 32}, {64, 1, 1}},      // per channel, large: parallel rows
                      BinCase{{1 << 18}, {1}},                   // few long rows: parallel pieces
                      BinCase{{3, 70000}, {3, 1}},               // few long rows, broadcast inner
                      BinCase{{2, 3, 50000}, {2, 1, 50000}}));   // broadcast middle dim, long rows

TEST(Elementwise, VariadicBroadcastsAllInputs) {
  std::mt19937 rng(3);
  const Tensor a = random_floats({3, 1}, rng), b = random_floats({1, 4}, rng), c = random_floats({2, 1, 1}, rng);
  const Shape out{2, 3, 4};
  const Tensor mx = run1(make_node("Max", 3), {a, b, c});
  const Tensor mean = run1(make_node("Mean", 3), {a, b, c});
  const Tensor sum = run1(make_node("Sum", 3), {a, b, c});
  ASSERT_EQ(mx.shape(), out);
  for (int64_t i = 0; i < 24; ++i) {
    const float va = a.data<float>()[broadcast_offset(i, out, a.shape())];
    const float vb = b.data<float>()[broadcast_offset(i, out, b.shape())];
    const float vc = c.data<float>()[broadcast_offset(i, out, c.shape())];
    EXPECT_EQ(mx.data<float>()[i], std::max({va, vb, vc}));
    EXPECT_EQ(sum.data<float>()[i], (va + vb) + vc);
    EXPECT_EQ(mean.data<float>()[i], ((va + vb) + vc) / 3.f);
  }
}

TEST(Elementwise, WhereBroadcastsThreeWays) {
  std::mt19937 rng(5);
  Tensor cond(DType::kBool, {2, 1, 5});
  for (int64_t i = 0; i < cond.numel(); ++i) cond.data<bool>()[i] = (rng() & 1) != 0;
  const Tensor x = random_floats({3, 1}, rng), y = random_floats({1, 3, 5}, rng);
  const Shape out{2, 3, 5};
  const Tensor r = run1(make_node("Where", 3), {cond, x, y});
  ASSERT_EQ(r.shape(), out);
  for (int64_t i = 0; i < r.numel(); ++i) {
    const bool c = cond.data<bool>()[broadcast_offset(i, out, cond.shape())];
    const float want = c ? x.data<float>()[broadcast_offset(i, out, x.shape())]
                         : y.data<float>()[broadcast_offset(i, out, y.shape())];
    EXPECT_EQ(r.data<float>()[i], want);
  }
}

TEST(Elementwise, IncompatibleShapesNameTheNode) {
  const Tensor a(DType::kFloat32, {2, 3}), b(DType::kFloat32, {4});
  try {
    run1(make_node("Add", 2), {a, b});
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("Add '/Add_0'"), std::string::npos) << e.what();
  }
}

TEST(Elementwise, FusedActivationAppliesAfterAdd) {
  const Tensor a = Tensor::from_vector<float>({4}, {-2.f, -0.5f, 0.5f, 7.f});
  const Tensor b = Tensor::scalar<float>(1.f);
  ir::Node n = make_node("Add", 2);
  fused_ops::FusedActivation{fused_ops::Activation::kRelu, 0.f, 0.f}.write(n);
  EXPECT_EQ(run1(n, {a, b}).to_float_vector(), (std::vector<float>{0.f, 0.5f, 1.5f, 8.f}));
  fused_ops::FusedActivation{fused_ops::Activation::kClip, 0.f, 6.f}.write(n);
  EXPECT_EQ(run1(n, {a, b}).to_float_vector(), (std::vector<float>{0.f, 0.5f, 1.5f, 6.f}));
  n.attrs[fused_ops::FusedActivation::kOp] = std::string("Softmax");  // no activation of the vocabulary
  EXPECT_THROW(run1(n, {a, b}), Error);
  fused_ops::FusedActivation{fused_ops::Activation::kGelu}.write(n);  // oneDNN's kernels only
  EXPECT_THROW(run1(n, {a, b}), Error);
}

TEST(Elementwise, IntegerEdgeCasesDoNotTrap) {
  const Tensor a = Tensor::from_vector<int32_t>({4}, {7, std::numeric_limits<int32_t>::min(), -7, 5});
  const Tensor b = Tensor::from_vector<int32_t>({4}, {0, -1, 2, -3});
  EXPECT_EQ(run1(make_node("Div", 2), {a, b}).to_int64_vector(),
            (std::vector<int64_t>{0, std::numeric_limits<int32_t>::min(), -3, -1}));
  EXPECT_EQ(run1(make_node("Mod", 2), {a, b}).to_int64_vector(), (std::vector<int64_t>{0, 0, 1, -1}));
  ir::Node fmod = make_node("Mod", 2);
  fmod.attrs["fmod"] = int64_t{1};
  EXPECT_EQ(run1(fmod, {a, b}).to_int64_vector(), (std::vector<int64_t>{0, 0, -1, 2}));
  // Integer Pow is exact where a double pow would round.
  const Tensor base = Tensor::from_vector<int64_t>({2}, {3, -2});
  const Tensor exp = Tensor::from_vector<int64_t>({2}, {39, 63});
  EXPECT_EQ(run1(make_node("Pow", 2), {base, exp}).to_int64_vector(),
            (std::vector<int64_t>{4052555153018976267LL, std::numeric_limits<int64_t>::min()}));
}

TEST(Elementwise, PowScalarExponentFastPaths) {
  std::mt19937 rng(11);
  const Tensor x = random_floats({1000}, rng, 0.f, 4.f);
  for (float e : {2.f, 3.f, 0.5f, 1.f, 1.7f}) {
    const Tensor y = run1(make_node("Pow", 2), {x, Tensor::scalar<float>(e)});
    for (int64_t i = 0; i < x.numel(); ++i)
      EXPECT_NEAR(y.data<float>()[i], std::pow(x.data<float>()[i], e), 1e-6f * std::pow(4.f, e)) << e;
  }
}

TEST(Elementwise, VectorisedTranscendentalsAreAccurate) {
  std::vector<float> xs;
  for (int i = -20000; i <= 20000; ++i) xs.push_back(static_cast<float>(i) * 0.005f);  // [-100, 100]
  for (float v : {88.7f, 88.8f, -87.3f, -88.f, -104.f, 1e-8f, -1e-8f, 0.f}) xs.push_back(v);
  const Tensor x = Tensor::from_vector<float>({static_cast<int64_t>(xs.size())}, xs);
  const Tensor e = run1(make_node("Exp", 1), {x});
  const Tensor s = run1(make_node("Sigmoid", 1), {x});
  const Tensor t = run1(make_node("Tanh", 1), {x});
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i];
    const double we = std::exp(v), ws = 1.0 / (1.0 + std::exp(-v)), wt = std::tanh(v);
    if (we > std::numeric_limits<float>::max()) EXPECT_EQ(e.data<float>()[i], INFINITY) << v;
    else if (we >= std::numeric_limits<float>::min()) EXPECT_NEAR(e.data<float>()[i], we, 3e-7 * we) << v;
    else EXPECT_LE(e.data<float>()[i], 1.2e-38f) << v;
    EXPECT_NEAR(s.data<float>()[i], ws, 3e-7 * ws + 1e-38) << v;
    EXPECT_NEAR(t.data<float>()[i], wt, 4e-7 * std::abs(wt) + 1e-38) << v;
  }
  // erf: a polynomial below 1, exp(-x^2) times a fitted rational tail above.
  std::vector<float> es;
  for (int i = -8000; i <= 8000; ++i) es.push_back(static_cast<float>(i) * 0.001f);  // [-8, 8]
  for (float v : {1e-30f, -1e-7f, 0.9999999f, 1.f, 1.0000001f}) es.push_back(v);
  const Tensor ex = Tensor::from_vector<float>({static_cast<int64_t>(es.size())}, es);
  const Tensor erf = run1(make_node("Erf", 1), {ex});
  for (size_t i = 0; i < es.size(); ++i) {
    const double want = std::erf(static_cast<double>(es[i]));
    EXPECT_NEAR(erf.data<float>()[i], want, 2e-7 * std::abs(want) + 1e-45) << es[i];
  }

  const Tensor special = Tensor::from_vector<float>({3}, {NAN, INFINITY, -INFINITY});
  const auto ev = run1(make_node("Exp", 1), {special}).to_float_vector();
  EXPECT_TRUE(std::isnan(ev[0]));
  EXPECT_EQ(ev[1], INFINITY);
  EXPECT_EQ(ev[2], 0.f);
  const auto tv = run1(make_node("Tanh", 1), {special}).to_float_vector();
  EXPECT_TRUE(std::isnan(tv[0]));
  EXPECT_EQ(tv[1], 1.f);
  EXPECT_EQ(tv[2], -1.f);
  const auto erfv = run1(make_node("Erf", 1), {special}).to_float_vector();
  EXPECT_TRUE(std::isnan(erfv[0]));
  EXPECT_EQ(erfv[1], 1.f);
  EXPECT_EQ(erfv[2], -1.f);
}

// The AVX-512 swish pass the float convolutions run after their primitive: against x / (1 + exp(-a x))
// in double on every length around the 16-lane vector (masked tails), inputs past exp's range on both
// sides, zeros, and a NaN (which stays NaN).
TEST(Elementwise, SwishPassMatchesTheClosedFormInDouble) {
  if (!ew::swish_pass_available()) GTEST_SKIP() << "no AVX-512 on this CPU (the convolutions keep oneDNN's post-op)";
  std::mt19937 rng(5);
  std::uniform_real_distribution<float> d(-12.f, 12.f);
  for (const float alpha : {1.f, 1.702f}) {
    for (const int64_t n : {1, 15, 16, 17, 33, 200}) {
      std::vector<float> x(static_cast<size_t>(n));
      for (float& v : x) v = d(rng);
      x[0] = n > 3 ? -1000.f : x[0];
      if (n > 3) x[1] = 1000.f, x[2] = 0.f;
      if (n > 16) x[16] = std::numeric_limits<float>::quiet_NaN();
      std::vector<float> y = x;
      ew::swish_in_place_avx512(y.data(), n, alpha);
      for (int64_t i = 0; i < n; ++i) {
        const double v = x[static_cast<size_t>(i)], got = y[static_cast<size_t>(i)];
        if (std::isnan(v)) {
          EXPECT_TRUE(std::isnan(got)) << i;
          continue;
        }
        // The float product alpha x carries half an ulp of itself into the exponential.
        const double t = static_cast<double>(alpha) * v, want = v / (1.0 + std::exp(-t));
        EXPECT_NEAR(got, want, (4e-7 + 6e-8 * std::fabs(t)) * std::fabs(want) + 1e-30)
            << "alpha " << alpha << " n " << n << " x " << v;
      }
    }
  }
}

// The gated output pass writing 8-bit codes computes the logistic to 7e-5 relative
// (logistic_for_codes_avx512): each code is the double closed form's rounding to within a fiftieth
// of a step (the codes' scale puts the top of the range at 127 / 255 steps), saturated at both ends
// (also for values past the range the logistic rounds in), and a NaN gives the lowest code. Per
// tensor and per channel (21: a masked last vector; 48: whole vectors, packed 64 codes at a time
// across pixels), u8 and s8.
TEST(Elementwise, GatedOutputCodesAreTheClosedFormRounded) {
  if (!ew::swish_pass_available()) GTEST_SKIP() << "no AVX-512 on this CPU (the convolutions keep oneDNN's post-op)";
  std::mt19937 rng(11);
  std::uniform_real_distribution<float> d(-9.f, 9.f);
  for (const DType y_type : {DType::kUInt8, DType::kInt8}) {
    const double lo = y_type == DType::kUInt8 ? 0 : -128, hi = y_type == DType::kUInt8 ? 255 : 127;
    for (const int64_t channels : {int64_t{1}, int64_t{21}, int64_t{48}}) {
      for (const float alpha : {1.f, 1.702f}) {
        const int64_t n = channels * 67;
        std::vector<float> v(static_cast<size_t>(n)), factor(static_cast<size_t>(channels)),
            offset(static_cast<size_t>(channels));
        for (float& x : v) x = d(rng);
        v[3] = -1000.f, v[4] = 1000.f, v[5] = std::numeric_limits<float>::quiet_NaN();
        // Past the logistic's rounded range (|x| log2 e > 2^22) and near float's end.
        v[6] = -1e7f, v[7] = 1e7f, v[8] = -3e38f, v[9] = 3e38f, v[10] = -88.5f;
        for (int64_t c = 0; c < channels; ++c) {  // steps of 0.04-0.07; the offset holds the zero point
          factor[static_cast<size_t>(c)] = 1.f / (0.04f + 0.0015f * static_cast<float>(c));
          offset[static_cast<size_t>(c)] = static_cast<float>(y_type == DType::kUInt8 ? 40 + c : c - 10);
        }
        std::vector<uint8_t> y(static_cast<size_t>(n));
        ew::gated_output_avx512(ew::Gate::kSwish, v.data(), y.data(), y_type, n, alpha, channels, factor.data(),
                                offset.data());
        int64_t near_half = 0;
        for (int64_t i = 0; i < n; ++i) {
          const size_t at = static_cast<size_t>(i), c = static_cast<size_t>(i % channels);
          const double got = y_type == DType::kUInt8 ? double(y[at]) : double(static_cast<int8_t>(y[at]));
          if (std::isnan(v[at])) {
            EXPECT_EQ(got, lo) << "NaN";
            continue;
          }
          const double x = v[at], t = static_cast<double>(alpha) * x;
          const double q = x / (1.0 + std::exp(-t)) * factor[c] + offset[c];
          const double want = std::clamp(std::nearbyint(q), lo, hi);
          const double slack = 0.02 * std::max(1.0, std::fabs(q - offset[c]) / 127.0);
          if (std::fabs(std::fabs(q - std::floor(q)) - 0.5) < slack) {
            ++near_half;  // on a rounding boundary, either neighbour
            EXPECT_LE(std::fabs(got - want), 1.0) << "x " << x;
          } else {
            EXPECT_EQ(got, want) << "x " << x << " q " << q << " channels " << channels;
          }
        }
        EXPECT_LT(near_half, n / 5);  // about 2 * slack of the values
      }
    }
  }
}

TEST(Elementwise, GeluPassMatchesTheDefinitionInDouble) {
  if (!ew::gelu_pass_available()) GTEST_SKIP() << "no AVX-512 on this CPU (oneDNN's gelu_erf runs instead)";
  // Every interval of the table, its ends, the range's end (6), beyond it, and NaN.
  std::vector<float> x;
  for (int i = -1300; i <= 1300; ++i) x.push_back(static_cast<float>(i) * 0.00625f);  // [-8.125, 8.125]
  for (float v : {-1000.f, 1000.f, 0.f, -0.f, 5.99999f, -5.99999f, 6.f, -6.f, 1e-20f, -1e-20f})
    x.push_back(v);
  x.push_back(std::numeric_limits<float>::quiet_NaN());
  const auto n = static_cast<int64_t>(x.size());  // not a multiple of 16: the masked tail runs
  ASSERT_NE(n % 16, 0);
  auto gelu = [](double v) { return 0.5 * v * std::erfc(-v / std::sqrt(2.0)); };
  std::vector<float> y(x.size());
  ew::gelu_affine_avx512(x.data(), y.data(), n, 1.f, 0.f);
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(x[i])) {
      EXPECT_TRUE(std::isnan(y[i]));
      continue;
    }
    // Phi's table error times |x|, plus the rounding of the float products.
    const double want = gelu(x[i]);
    EXPECT_NEAR(y[i], want, 4e-8 * std::max(1.0, std::fabs(static_cast<double>(x[i]))) + 1.2e-7 * std::fabs(want))
        << x[i];
  }
  // With the range of what it writes (a dynamic MatMul's x): the same values, min / max with 0,
  // the NaN skipped.
  std::vector<float> with_range(x.size());
  float lo = 1.f, hi = -1.f;
  ew::gelu_with_range_avx512(x.data(), with_range.data(), n, lo, hi);
  float want_lo = 0.f, want_hi = 0.f;
  for (size_t i = 0; i < x.size(); ++i) {
    if (std::isnan(y[i])) {
      EXPECT_TRUE(std::isnan(with_range[i]));
      continue;
    }
    EXPECT_EQ(with_range[i], y[i]) << x[i];
    want_lo = std::min(want_lo, y[i]);
    want_hi = std::max(want_hi, y[i]);
  }
  EXPECT_EQ(lo, want_lo);
  EXPECT_EQ(hi, want_hi);
  // Fused with the output's quantization: y = saturate(round_half_even(gelu(v) / s + z)), u8 and
  // s8; a code may differ from the double reference only where gelu(v) / s lies within the pass's
  // error of a rounding tie.
  const float scale = 0.03f;
  for (const auto& [type, zero_point] : {std::pair{DType::kUInt8, 7}, std::pair{DType::kInt8, -20}}) {
    std::vector<uint8_t> codes(x.size());
    ew::gelu_requantize_avx512(x.data(), codes.data(), type, n, 1.f / scale, static_cast<float>(zero_point));
    const double lo = type == DType::kUInt8 ? 0 : -128, hi = type == DType::kUInt8 ? 255 : 127;
    for (size_t i = 0; i < x.size(); ++i) {
      const double got = type == DType::kUInt8 ? codes[i] : static_cast<int8_t>(codes[i]);
      if (std::isnan(x[i])) {
        EXPECT_EQ(got, lo);  // saturate_round's NaN
        continue;
      }
      const double v = gelu(x[i]) / scale + zero_point;
      const double want = std::clamp(std::nearbyint(v), lo, hi);
      const double tie_distance = std::fabs(v - std::floor(v) - 0.5);
      if (tie_distance > 1e-5) EXPECT_EQ(got, want) << x[i];
      else EXPECT_LE(std::fabs(got - want), 1.0) << x[i];
    }
  }
}

TEST(Elementwise, MishMatchesClosedForm) {  // opset 18, no node test data in ONNX 1.12
  std::vector<float> xs;
  for (int i = -400; i <= 400; ++i) xs.push_back(static_cast<float>(i) * 0.05f);  // [-20, 20]
  for (float v : {-100.f, 100.f, 1e-6f}) xs.push_back(v);
  const Tensor x = Tensor::from_vector<float>({static_cast<int64_t>(xs.size())}, xs);
  const Tensor y = run1(make_node("Mish", 1), {x}, 18);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], want = v * std::tanh(std::log1p(std::exp(v)));
    EXPECT_NEAR(y.data<float>()[i], want, 1e-6 * std::abs(want) + 1e-12) << v;
  }
}

TEST(Elementwise, RoundingIsExact) {
  const std::vector<float> xs{-2.5f, -1.5f, -0.5f, -0.f, 0.5f, 1.5f, 2.5f, 0.49999997f, -3.7f, 3.2f,
                              8388607.5f, 16777216.f, -1e30f, 1e30f, INFINITY, -INFINITY};
  const Tensor x = Tensor::from_vector<float>({static_cast<int64_t>(xs.size())}, xs);
  const auto r = run1(make_node("Round", 1), {x}).to_float_vector();
  const auto f = run1(make_node("Floor", 1), {x}).to_float_vector();
  const auto c = run1(make_node("Ceil", 1), {x}).to_float_vector();
  for (size_t i = 0; i < xs.size(); ++i) {
    EXPECT_EQ(r[i], std::nearbyint(xs[i])) << xs[i];
    EXPECT_EQ(f[i], std::floor(xs[i])) << xs[i];
    EXPECT_EQ(c[i], std::ceil(xs[i])) << xs[i];
    EXPECT_EQ(std::signbit(f[i]), std::signbit(std::floor(xs[i]))) << xs[i];
    EXPECT_EQ(std::signbit(c[i]), std::signbit(std::ceil(xs[i]))) << xs[i];
  }
  const Tensor nan = Tensor::from_vector<float>({1}, {NAN});
  EXPECT_TRUE(std::isnan(run1(make_node("Round", 1), {nan}).to_float_vector()[0]));
}

// ---- QuantizeLinear / DequantizeLinear ----

TEST(QuantizeLinear, RoundsTiesToEven) {
  const Tensor x = Tensor::from_vector<float>({8}, {0.5f, 1.5f, 2.5f, 3.5f, -0.5f, -1.5f, -2.5f, -3.5f});
  const Tensor zp = Tensor::scalar<int8_t>(0);
  const Tensor q = run1(make_node("QuantizeLinear", 3), {x, Tensor::scalar<float>(1.f), zp});
  EXPECT_EQ(q.dtype(), DType::kInt8);
  EXPECT_EQ(q.to_int64_vector(), (std::vector<int64_t>{0, 2, 2, 4, 0, -2, -2, -4}));
  // Ties produced by the division itself: 5 / 2 = 2.5 -> 2, 7 / 2 = 3.5 -> 4.
  const Tensor y = Tensor::from_vector<float>({4}, {5.f, 7.f, -5.f, 1.f});
  const Tensor zp_u8 = Tensor::scalar<uint8_t>(10);
  EXPECT_EQ(run1(make_node("QuantizeLinear", 3), {y, Tensor::scalar<float>(2.f), zp_u8}).to_int64_vector(),
            (std::vector<int64_t>{12, 14, 8, 10}));
}

TEST(QuantizeLinear, SaturatesAndDefaultsToUint8) {
  const Tensor x = Tensor::from_vector<float>({6}, {1e9f, -1e9f, 300.f, -300.f, INFINITY, -INFINITY});
  const Tensor q8 = run1(make_node("QuantizeLinear", 3), {x, Tensor::scalar<float>(1.f), Tensor::scalar<int8_t>(3)});
  EXPECT_EQ(q8.to_int64_vector(), (std::vector<int64_t>{127, -128, 127, -128, 127, -128}));
  const Tensor qu = run1(make_node("QuantizeLinear", 2), {x, Tensor::scalar<float>(1.f)});
  EXPECT_EQ(qu.dtype(), DType::kUInt8);
  EXPECT_EQ(qu.to_int64_vector(), (std::vector<int64_t>{255, 0, 255, 0, 255, 0}));
  // NaN maps to the lowest code (as MLAS does).
  const Tensor nan = Tensor::from_vector<float>({1}, {NAN});
  EXPECT_EQ(run1(make_node("QuantizeLinear", 3), {nan, Tensor::scalar<float>(1.f), Tensor::scalar<int8_t>(0)})
                .to_int64_vector()[0],
            -128);
}

TEST(QuantizeLinear, MatchesReferenceFormulaOnRandomData) {
  std::mt19937 rng(13);
  const Tensor x = random_floats({100000}, rng, -40.f, 40.f);
  const float scale = 0.173f;
  const int zp = -7;
  const Tensor q = run1(make_node("QuantizeLinear", 3), {x, Tensor::scalar<float>(scale), Tensor::scalar<int8_t>(zp)});
  for (int64_t i = 0; i < x.numel(); ++i) {
    const float r = std::nearbyint(x.data<float>()[i] / scale) + static_cast<float>(zp);
    ASSERT_EQ(q.data<int8_t>()[i], static_cast<int8_t>(std::clamp(r, -128.f, 127.f))) << x.data<float>()[i];
  }
}

// The per-tensor loops divide by multiplying with 1 / scale and correcting the quotient by one FMA
// (Markstein): the quotient must still be the division's, to the last bit, where it matters most:
// values within a few ulps of the half-way points (k + 0.5) * scale, across scales of many
// magnitudes (the tiniest and largest ones divide), for u8 / s8 / u16 / s16, plain and fake.
TEST(QuantizeLinear, NearTiesRoundExactlyAsTheDivisionAcrossScales) {
  std::mt19937 rng(29);
  std::uniform_real_distribution<float> mantissa(1.f, 2.f);
  std::vector<float> scales{1.f, 0.5f, 3.f, 1e-31f, 2e30f, 1.17549435e-38f};
  for (int e = -24; e <= 24; e += 3) scales.push_back(std::ldexp(mantissa(rng), e));
  for (const float scale : scales) {
    std::vector<float> xs{INFINITY, -INFINITY, NAN, 0.f, -0.f, 1e38f, -1e38f};
    for (int k = -300; k <= 300; k += 1) {
      float x = (static_cast<float>(k) + 0.5f) * scale;
      for (int step = 0; step < 3; ++step) x = std::nextafter(x, -INFINITY);
      for (int step = 0; step < 7; ++step, x = std::nextafter(x, INFINITY)) xs.push_back(x);
    }
    const Tensor x = Tensor::from_vector<float>({static_cast<int64_t>(xs.size())}, xs);
    for (const DType type : {DType::kUInt8, DType::kInt8, DType::kUInt16, DType::kInt16}) {
      SCOPED_TRACE(std::string(dtype_name(type)) + " scale " + std::to_string(scale));
      const int32_t zp = type == DType::kUInt8 ? 7 : type == DType::kInt8 ? -3 : type == DType::kUInt16 ? 1000 : -5;
      Tensor z(type, {});
      dispatch_dtype(type, [&](auto tag) { z.data<decltype(tag)>()[0] = static_cast<decltype(tag)>(zp); });
      const Tensor s = Tensor::scalar<float>(scale);
      Tensor q(type, x.shape()), fq(DType::kFloat32, x.shape());
      quantize_linear(x, s, &z, 1, q);
      fake_quantize_linear(x, s, &z, 1, type, fq);
      const std::vector<int64_t> got = q.to_int64_vector();
      const double lo = type == DType::kUInt8 ? 0 : type == DType::kInt8 ? -128 : type == DType::kUInt16 ? 0 : -32768;
      const double hi = type == DType::kUInt8 ? 255 : type == DType::kInt8 ? 127 : type == DType::kUInt16 ? 65535 : 32767;
      for (size_t i = 0; i < xs.size(); ++i) {
        const float quotient = xs[i] / scale;  // the division, rounded once
        const double want = std::isnan(quotient) ? lo : std::clamp(std::nearbyint(static_cast<double>(quotient)) + zp, lo, hi);
        ASSERT_EQ(got[i], static_cast<int64_t>(want)) << "x = " << xs[i];
        ASSERT_EQ(fq.data<float>()[i], static_cast<float>(want - zp) * scale) << "x = " << xs[i];
      }
    }
  }
}

TEST(QuantizeLinear, PerAxisAnyAxisRoundTrips) {
  std::mt19937 rng(17);
  const Shape shape{2, 3, 4, 5};
  const Tensor x = random_floats(shape, rng, -10.f, 10.f);
  for (int64_t axis : {0, 1, 2, 3, -1}) {
    const int64_t ax = axis < 0 ? axis + 4 : axis;
    const int64_t c = shape[ax];
    std::vector<float> s(c);
    std::vector<uint8_t> z(c);
    for (int64_t i = 0; i < c; ++i) {
      s[i] = 0.05f + 0.01f * static_cast<float>(i);
      z[i] = static_cast<uint8_t>(100 + 10 * i);
    }
    const Tensor scale = Tensor::from_vector<float>({c}, s), zp = Tensor::from_vector<uint8_t>({c}, z);
    ir::Node qn = make_node("QuantizeLinear", 3), dn = make_node("DequantizeLinear", 3);
    qn.attrs["axis"] = axis;
    dn.attrs["axis"] = axis;
    const Tensor q = run1(qn, {x, scale, zp});
    const Tensor y = run1(dn, {q, scale, zp});
    const auto strides = contiguous_strides(shape);
    for (int64_t i = 0; i < x.numel(); ++i) {
      const int64_t ch = (i / strides[ax]) % c;
      const float r = std::nearbyint(x.data<float>()[i] / s[ch]) + static_cast<float>(z[ch]);
      const uint8_t want = static_cast<uint8_t>(std::clamp(r, 0.f, 255.f));
      ASSERT_EQ(q.data<uint8_t>()[i], want) << "axis " << axis << " element " << i;
      ASSERT_EQ(y.data<float>()[i], static_cast<float>(static_cast<int>(want) - z[ch]) * s[ch]);
    }
  }
}

TEST(QuantizeLinear, PerAxisNeedsOpset13) {
  const Tensor x(DType::kFloat32, {1, 2});
  const Tensor scale = Tensor::from_vector<float>({2}, {1.f, 2.f});
  EXPECT_THROW(run1(make_node("QuantizeLinear", 2), {x, scale}, 10), Error);
  EXPECT_NO_THROW(run1(make_node("QuantizeLinear", 2), {x, scale}, 13));
}

TEST(QuantizeLinear, FakeQuantizeIsBitIdenticalToQThenDq) {
  std::mt19937 rng(19);
  const Tensor x = random_floats({4, 8, 6}, rng, -5.f, 5.f);
  std::vector<float> s(8);
  std::vector<int8_t> z(8);
  for (int i = 0; i < 8; ++i) {
    s[i] = 0.01f + 0.013f * static_cast<float>(i);
    z[i] = static_cast<int8_t>(i - 4);
  }
  const Tensor scale = Tensor::from_vector<float>({8}, s), zp = Tensor::from_vector<int8_t>({8}, z);
  Tensor q(DType::kInt8, x.shape()), dq(DType::kFloat32, x.shape()), fq(DType::kFloat32, x.shape());
  quantize_linear(x, scale, &zp, 1, q);
  dequantize_linear(q, scale, &zp, 1, dq);
  fake_quantize_linear(x, scale, &zp, 1, DType::kInt8, fq);
  for (int64_t i = 0; i < x.numel(); ++i) ASSERT_EQ(fq.data<float>()[i], dq.data<float>()[i]) << i;
}

TEST(DequantizeLinear, Int32WithoutZeroPoint) {
  const Tensor x = Tensor::from_vector<int32_t>({3}, {-1000000, 0, 123456});
  const Tensor y = run1(make_node("DequantizeLinear", 2), {x, Tensor::scalar<float>(0.5f)});
  EXPECT_EQ(y.to_float_vector(), (std::vector<float>{-500000.f, 0.f, 61728.f}));
}

// ---- reductions ----

// Reference reduction by iterating all input elements and mapping each to its output slot; `abs`
// gets the sum of magnitudes per slot (the scale of float rounding error in a sum).
std::vector<double> reference_reduce(const Tensor& x, const std::vector<bool>& reduced, bool max,
                                     std::vector<double>* abs = nullptr) {
  const Shape& s = x.shape();
  Shape kept_shape;
  for (size_t d = 0; d < s.size(); ++d) kept_shape.push_back(reduced[d] ? 1 : s[d]);
  std::vector<double> acc(static_cast<size_t>(shape_numel(kept_shape)), max ? -INFINITY : 0.0);
  if (abs) abs->assign(acc.size(), 0.0);
  const auto in_strides = contiguous_strides(s), out_strides = contiguous_strides(kept_shape);
  for (int64_t i = 0; i < x.numel(); ++i) {
    int64_t o = 0;
    for (size_t d = 0; d < s.size(); ++d)
      if (!reduced[d]) o += (i / in_strides[d]) % s[d] * out_strides[d];
    const double v = x.data<float>()[i];
    acc[o] = max ? std::max(acc[o], v) : acc[o] + v;
    if (abs) (*abs)[o] += std::abs(v);
  }
  return acc;
}

TEST(Reduce, EveryAxisSubsetMatchesReference) {
  std::mt19937 rng(23);
  for (const Shape& shape : {Shape{3, 4, 5, 6}, Shape{2, 64, 33, 31}}) {
    const Tensor x = random_floats(shape, rng);
    for (int mask = 0; mask < 16; ++mask) {
      std::vector<int64_t> axes;
      std::vector<bool> reduced(4);
      for (int d = 0; d < 4; ++d)
        if (mask & (1 << d)) {
          axes.push_back(d);
          reduced[d] = true;
        }
      if (axes.empty()) std::fill(reduced.begin(), reduced.end(), true);
      for (const char* op : {"ReduceSum", "ReduceMax"}) {
        const bool is_max = std::string(op) == "ReduceMax";
        ir::Node n = make_node(op, 1);
        n.attrs["keepdims"] = int64_t{0};
        n.attrs["axes"] = axes;
        const Tensor y = run1(n, {x}, 11);  // axes still an attribute for both ops
        std::vector<double> mag;
        const auto want = reference_reduce(x, reduced, is_max, &mag);
        ASSERT_EQ(y.numel(), static_cast<int64_t>(want.size()));
        for (size_t i = 0; i < want.size(); ++i)
          ASSERT_NEAR(y.data<float>()[i], want[i], is_max ? 0.0 : 1e-6 * mag[i] + 1e-6)
              << op << " mask " << mask << " element " << i;
      }
    }
  }
}

TEST(Reduce, AxesInputFromOpset18AndNoop) {
  const Tensor x = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 4, 5, 6});
  ir::Node n = make_node("ReduceMean", 2);
  const Tensor axes = Tensor::from_vector<int64_t>({1}, {-1});
  EXPECT_EQ(run1(n, {x, axes}, 18).to_float_vector(), (std::vector<float>{2.f, 5.f}));
  EXPECT_EQ(run1(n, {x, Tensor()}, 18).to_float_vector(), (std::vector<float>{3.5f}));
  n.attrs["noop_with_empty_axes"] = int64_t{1};
  EXPECT_EQ(run1(n, {x, Tensor()}, 18).shape(), x.shape());
  ir::Node lse = make_node("ReduceLogSumExp", 1);
  lse.attrs["axes"] = std::vector<int64_t>{1};
  const Tensor big = Tensor::from_vector<float>({1, 2}, {1000.f, 1000.f});
  EXPECT_NEAR(run1(lse, {big}, 13).to_float_vector()[0], 1000.f + std::log(2.f), 1e-3);
}

TEST(ArgMax, MatchesReferenceWithTies) {
  std::mt19937 rng(29);
  Tensor x(DType::kFloat32, {3, 7, 5});
  for (float& v : x.values<float>()) v = static_cast<float>(rng() % 4);  // many ties
  for (int64_t axis : {0, 1, 2}) {
    for (int64_t last : {0, 1}) {
      ir::Node n = make_node("ArgMax", 1);
      n.attrs["axis"] = axis;
      n.attrs["select_last_index"] = last;
      n.attrs["keepdims"] = int64_t{0};
      const Tensor y = run1(n, {x});
      const auto st = contiguous_strides(x.shape());
      int64_t k = 0;
      for (int64_t a = 0; a < 3; ++a)
        for (int64_t b = 0; b < 7; ++b)
          for (int64_t c = 0; c < 5; ++c) {
            int64_t idx[3] = {a, b, c};
            if (idx[axis] != 0) continue;
            int64_t best = 0;
            float bv = -1.f;
            for (int64_t r = 0; r < x.dim(axis); ++r) {
              idx[axis] = r;
              const float v = x.data<float>()[idx[0] * st[0] + idx[1] * st[1] + idx[2] * st[2]];
              if (v > bv || (last && v == bv)) {
                bv = v;
                best = r;
              }
            }
            ASSERT_EQ(y.data<int64_t>()[k++], best) << "axis " << axis << " last " << last;
          }
    }
  }
}

TEST(Clip, AttributesBeforeOpset11InputsAfter) {
  const Tensor x = Tensor::from_vector<float>({4}, {-5.f, -1.f, 1.f, 5.f});
  ir::Node old = make_node("Clip", 1);
  old.attrs["min"] = -2.f;
  old.attrs["max"] = 2.f;
  EXPECT_EQ(run1(old, {x}, 6).to_float_vector(), (std::vector<float>{-2.f, -1.f, 1.f, 2.f}));
  ir::Node now = make_node("Clip", 3);
  EXPECT_EQ(run1(now, {x, Tensor(), Tensor::scalar<float>(0.f)}, 13).to_float_vector(),
            (std::vector<float>{-5.f, -1.f, 0.f, 0.f}));
  // min > max: everything becomes max.
  EXPECT_EQ(run1(now, {x, Tensor::scalar<float>(3.f), Tensor::scalar<float>(1.f)}, 13).to_float_vector(),
            (std::vector<float>{1.f, 1.f, 1.f, 1.f}));
}

TEST(Cast, ConvertsAndRejectsMissingDtypes) {
  const Tensor x = Tensor::from_vector<float>({4}, {-1.7f, 0.f, 2.9f, 300.f});
  ir::Node n = make_node("Cast", 1);
  n.attrs["to"] = int64_t{6};  // int32
  EXPECT_EQ(run1(n, {x}).to_int64_vector(), (std::vector<int64_t>{-1, 0, 2, 300}));
  n.attrs["to"] = int64_t{9};  // bool
  const Tensor b = run1(n, {x});
  EXPECT_EQ(b.dtype(), DType::kBool);
  EXPECT_EQ(b.to_int64_vector(), (std::vector<int64_t>{1, 0, 1, 1}));
  n.attrs["to"] = int64_t{10};  // float16
  try {
    run1(n, {x});
    FAIL() << "expected kUnsupported";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kUnsupported);
    EXPECT_NE(std::string(e.what()).find("float16 tensors are not supported"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slimquant::runtime
