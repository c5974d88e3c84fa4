// Calibration observers against closed-form cases and brute-force references over raw samples.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <random>

#include "slimquant/quant/observer.h"

namespace slimquant::quant {
namespace {

Tensor tensor(const std::vector<float>& v, Shape shape = {}) {
  if (shape.empty()) shape = {static_cast<int64_t>(v.size())};
  return Tensor::from_vector<float>(std::move(shape), v);
}

// Observes `data` as consecutive batches of `batch` values (rank-1 tensors).
void feed(Observer& obs, const std::vector<float>& data, size_t batch) {
  for (size_t i = 0; i < data.size(); i += batch) {
    const size_t end = std::min(data.size(), i + batch);
    obs.observe(tensor(std::vector<float>(data.begin() + i, data.begin() + end)));
  }
}

std::vector<float> laplace(size_t n, float b, uint32_t seed) {
  std::mt19937 rng(seed);
  std::exponential_distribution<float> e(1.0f / b);
  std::bernoulli_distribution sign(0.5);
  std::vector<float> v(n);
  for (auto& x : v) x = sign(rng) ? e(rng) : -e(rng);
  return v;
}

std::vector<float> gaussian(size_t n, float sigma, float mean, uint32_t seed) {
  std::mt19937 rng(seed);
  std::normal_distribution<float> d(mean, sigma);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

std::vector<float> uniform(size_t n, float lo, float hi, uint32_t seed) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<float> d(lo, hi);
  std::vector<float> v(n);
  for (auto& x : v) x = d(rng);
  return v;
}

// The threshold T the observer chose under `scheme`, read back from the symmetric extent of
// its range (T is at most max|x|, so the range is [-T, T] cut to the observed extremes).
float threshold_of(const Observer& obs, QuantScheme scheme) {
  const QuantParam p = obs.params(scheme);
  switch (scheme) {
    case QuantScheme::kSymmetric: return p.scale[0] * 127.0f;
    case QuantScheme::kUnsignedZeroPoint0: return p.scale[0] * 255.0f;
    case QuantScheme::kAsymmetric: return obs.range().hi;  // callers use data with max = max|x|
  }
  return 0.0f;
}

// Independent fake quantization: QuantizeLinear (round half to even, saturate) then dequantize.
float fake_quant(float x, float scale, int32_t zp, DType dtype) {
  const float qmin = dtype == DType::kInt8 ? -128.0f : 0.0f;
  const float qmax = dtype == DType::kInt8 ? 127.0f : 255.0f;
  const float q = std::clamp(std::nearbyint(x / scale) + static_cast<float>(zp), qmin, qmax);
  return (q - static_cast<float>(zp)) * scale;
}

// The per-tensor params for threshold t over data with extremes [mn, mx] (the observers' rule:
// [-t, t] cut to the extremes widened to include 0).
QuantParam params_for(double t, float mn, float mx, QuantScheme scheme) {
  const double lo = std::min(mn, 0.0f), hi = std::max(mx, 0.0f);
  return params_from_range(
      {static_cast<float>(std::max(-t, lo)), static_cast<float>(std::min(t, hi))}, scheme);
}

double brute_mse(const std::vector<float>& x, const QuantParam& p) {
  double s = 0.0;
  for (float v : x) {
    const double d = v - fake_quant(v, p.scale[0], p.zero_point[0], p.dtype);
    s += d * d;
  }
  return s / static_cast<double>(x.size());
}

double brute_emd(const std::vector<float>& x, const QuantParam& p) {
  double s1 = 0, s2 = 0, q1 = 0, q2 = 0;
  for (float v : x) {
    const double q = fake_quant(v, p.scale[0], p.zero_point[0], p.dtype);
    s1 += v;
    s2 += static_cast<double>(v) * v;
    q1 += q;
    q2 += q * q;
  }
  const double n = static_cast<double>(x.size());
  const double mx = s1 / n, mq = q1 / n;
  return std::abs(mx - mq) +
         std::abs(std::sqrt(s2 / n - mx * mx) - std::sqrt(std::max(q2 / n - mq * mq, 0.0)));
}

// ---- scheme arithmetic ----------------------------------------------------------------------

TEST(ObserverParams, SchemeFormulas) {
  QuantParam p = params_from_range({-1.0f, 0.5f}, QuantScheme::kSymmetric);
  EXPECT_EQ(p.dtype, DType::kInt8);
  EXPECT_FLOAT_EQ(p.scale[0], 1.0f / 127.0f);
  EXPECT_EQ(p.zero_point[0], 0);
  EXPECT_EQ(p.axis, -1);

  p = params_from_range({0.25f, 2.0f}, QuantScheme::kUnsignedZeroPoint0);
  EXPECT_EQ(p.dtype, DType::kUInt8);
  EXPECT_FLOAT_EQ(p.scale[0], 2.0f / 255.0f);
  EXPECT_EQ(p.zero_point[0], 0);

  // Asymmetric: [-3, 4] -> scale 7/255, zero point round(3 / (7/255)) = round(109.29) = 109.
  p = params_from_range({-3.0f, 4.0f}, QuantScheme::kAsymmetric);
  EXPECT_EQ(p.dtype, DType::kUInt8);
  EXPECT_FLOAT_EQ(p.scale[0], 7.0f / 255.0f);
  EXPECT_EQ(p.zero_point[0], 109);
  // Widened to include 0: [0.5, 2] -> [0, 2]; [-2, -1] -> [-2, 0] (zero point at the top).
  p = params_from_range({0.5f, 2.0f}, QuantScheme::kAsymmetric);
  EXPECT_FLOAT_EQ(p.scale[0], 2.0f / 255.0f);
  EXPECT_EQ(p.zero_point[0], 0);
  p = params_from_range({-2.0f, -1.0f}, QuantScheme::kAsymmetric);
  EXPECT_FLOAT_EQ(p.scale[0], 2.0f / 255.0f);
  EXPECT_EQ(p.zero_point[0], 255);

  // Degenerate range: the smallest scale, never 0.
  for (QuantScheme s : {QuantScheme::kSymmetric, QuantScheme::kUnsignedZeroPoint0,
                        QuantScheme::kAsymmetric}) {
    p = params_from_range({0.0f, 0.0f}, s);
    EXPECT_EQ(p.scale[0], kMinScale) << scheme_name(s);
    EXPECT_EQ(p.zero_point[0], 0) << scheme_name(s);
  }
  try {
    params_from_range({-0.5f, 1.0f}, QuantScheme::kUnsignedZeroPoint0);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
  }
}

TEST(ObserverParams, SearchFractionsAreGeometricUpToOne) {
  const std::vector<double> f = search_fractions(5, 0.01);
  ASSERT_EQ(f.size(), 5u);
  EXPECT_NEAR(f[0], 0.01, 1e-12);
  EXPECT_NEAR(f[1], std::pow(0.01, 0.75), 1e-12);
  EXPECT_NEAR(f[2], 0.1, 1e-12);
  EXPECT_EQ(f[4], 1.0);
  EXPECT_EQ(search_fractions(1, 0.5), std::vector<double>{1.0});
}

// ---- running-extreme observers --------------------------------------------------------------

TEST(ObserverAbsMax, ExactOnKnownTensors) {
  for (const char* algo : {"abs_max", "direct", "ABS_MAX"}) {
    auto obs = make_activation_observer(algo);
    EXPECT_EQ(obs->name(), "abs_max");
    obs->observe(tensor({-3.0f, 1.0f, 2.5f}));
    obs->observe(tensor({0.5f, 4.0f}, {1, 2}));
    EXPECT_TRUE(obs->seen_negative());
    EXPECT_EQ(obs->observed_count(), 5);
    EXPECT_EQ(obs->observed_batches(), 2);
    const ClipRange r = obs->range();
    EXPECT_EQ(r.lo, -3.0f);
    EXPECT_EQ(r.hi, 4.0f);
    QuantParam p = obs->params(QuantScheme::kSymmetric);
    EXPECT_EQ(p.dtype, DType::kInt8);
    EXPECT_FLOAT_EQ(p.scale[0], 4.0f / 127.0f);
    EXPECT_EQ(p.zero_point[0], 0);
    p = obs->params(QuantScheme::kAsymmetric);
    EXPECT_FLOAT_EQ(p.scale[0], 7.0f / 255.0f);
    EXPECT_EQ(p.zero_point[0], 109);
    EXPECT_THROW(obs->params(QuantScheme::kUnsignedZeroPoint0), Error);
  }
}

TEST(ObserverMinMax, ExactOnKnownTensors) {
  auto obs = make_activation_observer("min_max");
  obs->observe(tensor({0.5f, 1.5f}));
  obs->observe(tensor({0.25f, 5.1f, 3.0f}));
  EXPECT_FALSE(obs->seen_negative());
  EXPECT_EQ(obs->default_scheme(), QuantScheme::kUnsignedZeroPoint0);
  const ClipRange r = obs->range();
  EXPECT_EQ(r.lo, 0.25f);
  EXPECT_EQ(r.hi, 5.1f);
  QuantParam p = obs->params(QuantScheme::kUnsignedZeroPoint0);
  EXPECT_EQ(p.dtype, DType::kUInt8);
  EXPECT_FLOAT_EQ(p.scale[0], 5.1f / 255.0f);
  EXPECT_EQ(p.zero_point[0], 0);
  p = obs->params(QuantScheme::kSymmetric);
  EXPECT_FLOAT_EQ(p.scale[0], 5.1f / 127.0f);
  p = obs->params(QuantScheme::kAsymmetric);  // widened to [0, 5.1]
  EXPECT_FLOAT_EQ(p.scale[0], 5.1f / 255.0f);
  EXPECT_EQ(p.zero_point[0], 0);

  obs->observe(tensor({-2.0f}));
  EXPECT_EQ(obs->range().lo, -2.0f);
  p = obs->params(QuantScheme::kAsymmetric);
  EXPECT_FLOAT_EQ(p.scale[0], 7.1f / 255.0f);
  EXPECT_EQ(p.zero_point[0], static_cast<int>(std::nearbyint(2.0 / (7.1 / 255.0))));
}

TEST(ObserverAvg, MeanOfPerSampleAbsMax) {
  auto obs = make_activation_observer("avg");
  obs->observe(tensor({1, -3, 2, 0.5f, 1, -1}, {2, 3}));  // sample maxima 3 and 1
  EXPECT_FLOAT_EQ(obs->params(QuantScheme::kSymmetric).scale[0], 2.0f / 127.0f);
  obs->observe(tensor({5, -1}, {1, 2}));  // one more sample, max 5: (3 + 1 + 5) / 3
  EXPECT_FLOAT_EQ(obs->params(QuantScheme::kSymmetric).scale[0], 3.0f / 127.0f);
  EXPECT_EQ(obs->range().lo, -3.0f);  // [-3, 3] cut to the observed minimum -3
  EXPECT_EQ(obs->range().hi, 3.0f);
  // The per-sample scan still rejects NaN/Inf in any sample, leaving the state as it was.
  EXPECT_THROW(obs->observe(tensor({1, 2, std::nanf(""), 4}, {2, 2})), Error);
  EXPECT_THROW(obs->observe(tensor({1, 2, 3, INFINITY}, {2, 2})), Error);
  EXPECT_FLOAT_EQ(obs->params(QuantScheme::kSymmetric).scale[0], 3.0f / 127.0f);
}

// ---- guards ---------------------------------------------------------------------------------

TEST(ObserverErrors, UnknownNamesListTheKnownOnes) {
  try {
    make_activation_observer("percentile");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_EQ(std::string(e.what()),
              "unknown activation algo 'percentile' (known: abs_max, direct, min_max, avg, hist, "
              "KL, mse, emd, auto)");
  }
  try {
    make_weight_observer("KL");
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("channel_wise_abs_max"), std::string::npos);
  }
  for (const auto& a : activation_algos()) EXPECT_NO_THROW(make_activation_observer(a)) << a;
  for (const auto& w : weight_algos()) EXPECT_NO_THROW(make_weight_observer(w)) << w;
  EXPECT_EQ(make_activation_observer("kl")->name(), "KL");
}

TEST(ObserverErrors, NanAndInfAreRejectedAndLeaveTheObserverUnchanged) {
  for (const auto& algo : activation_algos()) {
    auto obs = make_activation_observer(algo);
    obs->observe(tensor({1.0f, -2.0f}));
    for (float bad : {std::numeric_limits<float>::quiet_NaN(),
                      std::numeric_limits<float>::infinity(),
                      -std::numeric_limits<float>::infinity()}) {
      std::vector<float> v(37, 0.5f);
      v[33] = bad;
      try {
        obs->observe(tensor(v));
        FAIL() << algo << ": expected an error";
      } catch (const Error& e) {
        EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
        EXPECT_EQ(std::string(e.what()), "observer " + obs->name() + ": tensor contains NaN/Inf");
      }
    }
    EXPECT_EQ(obs->observed_count(), 2) << algo;
    EXPECT_FLOAT_EQ(obs->observed_abs_max(), 2.0f) << algo;
  }
  auto w = make_weight_observer("mse_channel_wise");
  EXPECT_THROW(w->observe(tensor({1.0f, std::numeric_limits<float>::quiet_NaN()}, {2, 1})), Error);
}

TEST(ObserverErrors, WrongDtypeNothingObservedAndBadOptions) {
  auto obs = make_activation_observer("KL");
  try {
    obs->params(QuantScheme::kSymmetric);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidData);
    EXPECT_EQ(std::string(e.what()), "observer KL: no data observed yet");
  }
  EXPECT_THROW(obs->observe(Tensor::from_vector<int32_t>({2}, {1, 2})), Error);
  EXPECT_THROW(make_activation_observer("hist", {.hist_percent = 1.5f}), Error);
  EXPECT_THROW(make_activation_observer("KL", {.bins = 100}), Error);
  EXPECT_THROW(make_activation_observer("mse", {.fine_bins = 101}), Error);
  EXPECT_THROW(make_activation_observer("emd", {.search_min_fraction = 0.0f}), Error);
  auto w = make_weight_observer("channel_wise_abs_max", {.channel_axis = 3});
  EXPECT_THROW(w->observe(tensor({1, 2, 3, 4}, {2, 2})), Error);
}

TEST(ObserverErrors, AllZeroTensorsGiveTheSmallestScale) {
  for (const auto& algo : activation_algos()) {
    auto obs = make_activation_observer(algo);
    obs->observe(Tensor(DType::kFloat32, {4, 8}));
    obs->observe(Tensor(DType::kFloat32, {3}));
    for (QuantScheme s : {QuantScheme::kSymmetric, QuantScheme::kUnsignedZeroPoint0,
                          QuantScheme::kAsymmetric}) {
      const QuantParam p = obs->params(s);
      EXPECT_EQ(p.scale[0], kMinScale) << algo << " " << scheme_name(s);
      EXPECT_EQ(p.zero_point[0], 0) << algo;
    }
    EXPECT_EQ(obs->range().lo, 0.0f);
    EXPECT_EQ(obs->range().hi, 0.0f);
  }
  auto w = make_weight_observer("mse_channel_wise");
  w->observe(Tensor(DType::kFloat32, {2, 3}));
  for (float s : w->params(QuantScheme::kSymmetric).scale) EXPECT_EQ(s, kMinScale);
}

// ---- histogram observers --------------------------------------------------------------------

TEST(ObserverHist, PercentileOfUniform) {
  const std::vector<float> data = uniform(1000000, 0.0f, 1.0f, 7);
  auto obs = make_activation_observer("hist", {.hist_percent = 0.99f});
  feed(*obs, data, 100000);
  const float t = threshold_of(*obs, QuantScheme::kUnsignedZeroPoint0);
  // The empirical 0.99 quantile, within one bin of max|x| / bins.
  std::vector<float> sorted = data;
  std::nth_element(sorted.begin(), sorted.begin() + 989999, sorted.end());
  const float bin = obs->observed_abs_max() / 2048.0f;
  EXPECT_NEAR(t, sorted[989999], bin);
  EXPECT_NEAR(t, 0.99f, 1e-3f);
  EXPECT_EQ(obs->range().lo, 0.0f);

  // The default percentile 0.99999 on the signed data: the quantile of |x|.
  auto def = make_activation_observer("hist");
  std::vector<float> signed_data = data;
  for (size_t i = 0; i < signed_data.size(); i += 2) signed_data[i] = -signed_data[i];
  feed(*def, signed_data, 250000);
  std::nth_element(sorted.begin(), sorted.begin() + 999989, sorted.end());
  EXPECT_NEAR(threshold_of(*def, QuantScheme::kSymmetric), sorted[999989], bin);
}

TEST(ObserverKL, ClipsHeavyTailsAndKeepsUniformRanges) {
  auto lap = make_activation_observer("KL");
  feed(*lap, laplace(1000000, 1.0f, 11), 100000);
  const float max_lap = lap->observed_abs_max();
  const float t_lap = threshold_of(*lap, QuantScheme::kSymmetric);
  EXPECT_LT(t_lap, 0.85f * max_lap);
  EXPECT_GT(t_lap, 0.5f * max_lap);  // clipped, not collapsed

  auto uni = make_activation_observer("KL");
  feed(*uni, uniform(1000000, -1.0f, 1.0f, 12), 100000);
  EXPECT_GT(threshold_of(*uni, QuantScheme::kSymmetric), 0.97f * uni->observed_abs_max());

  // Post-ReLU data: half exact zeros, which must not drag the threshold down (with them in the
  // histogram, TensorRT's algorithm clips a ReLU'd N(0, 1) at a quarter of its max).
  auto relu = make_activation_observer("KL");
  std::vector<float> pos = gaussian(1000000, 1.0f, 0.0f, 13);
  for (float& v : pos) v = std::max(v, 0.0f);
  feed(*relu, pos, 100000);
  const float t_relu = threshold_of(*relu, QuantScheme::kUnsignedZeroPoint0);
  EXPECT_GT(t_relu, 0.75f * relu->observed_abs_max());
  EXPECT_LT(t_relu, 0.97f * relu->observed_abs_max());
}

// Against a direct NumPy implementation of TensorRT's algorithm (np.histogram of |x| with 2048
// bins over [0, max], P folded, Q from hist[0:i] spread over P's non-zero bins, KL over P > 0) on
// deterministic data: the exponential(1) quantiles -log1p(-(k + 0.5) / n) for k < n = 200000 in
// float32, every second one negated. It picks i = 1642 for 128 levels and i = 1741 for 256.
TEST(ObserverKL, MatchesReferenceImplementation) {
  constexpr int64_t n = 200000;
  std::vector<float> v(n);
  for (int64_t k = 0; k < n; ++k) {
    v[k] = static_cast<float>(-std::log1p(-(static_cast<double>(k) + 0.5) / n));
    if (k % 2) v[k] = -v[k];
  }
  auto sym = make_activation_observer("KL");
  feed(*sym, v, 30000);
  const double width = sym->observed_abs_max() / 2048.0;
  // Threshold (i + 0.5) * width; allow one bin for the last-ulp differences of log1p.
  EXPECT_NEAR(threshold_of(*sym, QuantScheme::kSymmetric) / width - 0.5, 1642.0, 1.01);

  for (float& x : v) x = std::abs(x);
  auto u8 = make_activation_observer("KL");
  feed(*u8, v, 30000);
  EXPECT_NEAR(threshold_of(*u8, QuantScheme::kUnsignedZeroPoint0) / width - 0.5, 1741.0, 1.01);
  // The asymmetric scheme over non-negative data uses the same 256 levels.
  EXPECT_EQ(u8->params(QuantScheme::kAsymmetric).scale[0],
            u8->params(QuantScheme::kUnsignedZeroPoint0).scale[0]);
}

// ---- search observers -----------------------------------------------------------------------

struct SearchCase {
  const char* algo;
  QuantScheme scheme;
  bool non_negative;
};

class ObserverSearch : public ::testing::TestWithParam<SearchCase> {};

// mse / emd pick the grid point that a brute-force search over the raw samples picks. The batches
// have different scales (the last one the narrowest), so an observer that only looked at the last
// batch, or lost data when its histogram grew, would pick a different point (checked below).
TEST_P(ObserverSearch, MatchesBruteForceOverAllSamples) {
  const SearchCase c = GetParam();
  std::vector<std::vector<float>> batches = {laplace(30000, 0.3f, 21), gaussian(30000, 1.0f, 0.2f, 22),
                                             laplace(30000, 1.5f, 23), gaussian(30000, 0.1f, 0.0f, 24)};
  std::vector<float> all;
  for (auto& b : batches) {
    if (c.non_negative) {
      for (float& v : b) v = std::max(v, 0.0f);
    }
    all.insert(all.end(), b.begin(), b.end());
  }
  const ObserverOptions opts{.search_steps = 100, .search_min_fraction = 0.02f};
  auto obs = make_activation_observer(c.algo, opts);
  for (const auto& b : batches) obs->observe(tensor(b));

  const float mn = *std::min_element(all.begin(), all.end());
  const float mx = *std::max_element(all.begin(), all.end());
  const double abs_max = std::max(-mn, mx);
  const std::vector<double> f = search_fractions(opts.search_steps, opts.search_min_fraction);
  const bool mse = std::string(c.algo) == "mse";
  auto loss = [&](const std::vector<float>& x, size_t k, float lo, float hi) {
    const QuantParam p = params_for(f[k] * std::max(-lo, hi), lo, hi, c.scheme);
    return mse ? brute_mse(x, p) : brute_emd(x, p);
  };
  auto argmin = [&](const std::vector<float>& x) {
    const float lo = *std::min_element(x.begin(), x.end());
    const float hi = *std::max_element(x.begin(), x.end());
    std::vector<double> l(f.size());
    for (size_t k = 0; k < f.size(); ++k) l[k] = loss(x, k, lo, hi);
    return std::make_pair(std::min_element(l.begin(), l.end()) - l.begin(), l);
  };
  const auto [k_bf, losses] = argmin(all);

  // The observer's threshold, as a grid index.
  const QuantParam p = obs->params(c.scheme);
  const QuantParam want = params_for(f[k_bf] * abs_max, mn, mx, c.scheme);
  int64_t k_obs = -1;
  for (size_t k = 0; k < f.size(); ++k) {
    const QuantParam pk = params_for(f[k] * abs_max, mn, mx, c.scheme);
    if (pk.scale[0] == p.scale[0] && pk.zero_point[0] == p.zero_point[0]) k_obs = k;
  }
  ASSERT_GE(k_obs, 0) << "the observer's scale " << p.scale[0] << " is not on the grid";
  EXPECT_LE(std::abs(k_obs - k_bf), 1) << "brute force picks scale " << want.scale[0];
  // Neighbouring grid points may only be swapped when their true losses are nearly equal: for
  // mse within 0.2 %, for emd (a V-shaped loss near 0) within 1 % of a histogram bin width.
  int exponent = 0;
  std::frexp(static_cast<float>(abs_max), &exponent);
  const double bin = std::ldexp(2.0, exponent) / opts.fine_bins;
  if (mse) {
    EXPECT_LE(losses[k_obs], losses[k_bf] * (1.0 + 2e-3));
  } else {
    EXPECT_LE(losses[k_obs], losses[k_bf] + 0.01 * bin);
  }
  EXPECT_LT(f[k_bf], 1.0) << "the case should need clipping to be meaningful";

  // Negative control: the threshold that the last batch alone would give is clearly worse on all
  // the data, so observing only the last batch could not pass.
  const auto [k_last, unused] = argmin(batches.back());
  const std::vector<float>& last = batches.back();
  const float last_lo = *std::min_element(last.begin(), last.end());
  const float last_hi = *std::max_element(last.begin(), last.end());
  const QuantParam p_last =
      params_for(f[k_last] * std::max(-last_lo, last_hi), mn, mx, c.scheme);
  const double loss_last = mse ? brute_mse(all, p_last) : brute_emd(all, p_last);
  EXPECT_GT(loss_last, 2.0 * losses[k_bf]);
}

INSTANTIATE_TEST_SUITE_P(
    ObserverSearchCases, ObserverSearch,
    ::testing::Values(SearchCase{"mse", QuantScheme::kSymmetric, false},
                      SearchCase{"mse", QuantScheme::kAsymmetric, false},
                      SearchCase{"mse", QuantScheme::kUnsignedZeroPoint0, true},
                      SearchCase{"emd", QuantScheme::kSymmetric, false},
                      SearchCase{"emd", QuantScheme::kAsymmetric, false},
                      SearchCase{"emd", QuantScheme::kUnsignedZeroPoint0, true}),
    [](const auto& info) {
      return std::string(info.param.algo) + "_" + scheme_name(info.param.scheme);
    });

// ---- batching independence ------------------------------------------------------------------

// The same values as one batch, as 10 equal batches, and as 10 batches of increasing range (which
// makes the histograms grow and merge many times) give the same thresholds within one bin.
TEST(ObserverBatching, ResultsDoNotDependOnTheSplit) {
  constexpr int64_t kRows = 1000, kCols = 100;
  std::mt19937 rng(5);
  std::vector<std::vector<float>> rows(kRows);
  for (int64_t r = 0; r < kRows; ++r) {
    // Row scales spread over 10 octaves, heavy-tailed values, a third of them exact zeros.
    rows[r] = laplace(kCols, std::ldexp(1.0f, static_cast<int>(r % 10) - 5), 1000 + r);
    for (int64_t c = 0; c < kCols; c += 3) rows[r][c] = 0.0f;
  }
  auto flat = [&](const std::vector<std::vector<float>>& rs, int64_t begin, int64_t end) {
    std::vector<float> v;
    for (int64_t r = begin; r < end; ++r) v.insert(v.end(), rs[r].begin(), rs[r].end());
    return tensor(v, {end - begin, kCols});
  };
  std::vector<std::vector<float>> sorted = rows;
  std::sort(sorted.begin(), sorted.end(), [](const auto& a, const auto& b) {
    auto amax = [](const std::vector<float>& v) {
      float m = 0;
      for (float x : v) m = std::max(m, std::abs(x));
      return m;
    };
    return amax(a) < amax(b);
  });

  for (const auto& algo : activation_algos()) {
    auto one = make_activation_observer(algo);
    auto ten = make_activation_observer(algo);
    auto growing = make_activation_observer(algo);
    one->observe(flat(rows, 0, kRows));
    for (int64_t b = 0; b < 10; ++b) ten->observe(flat(rows, b * 100, (b + 1) * 100));
    for (int64_t b = 0; b < 10; ++b) growing->observe(flat(sorted, b * 100, (b + 1) * 100));
    const double abs_max = one->observed_abs_max();
    // One bin: max|x| / bins for hist / KL, at most 4 max|x| / fine_bins for mse / emd.
    const double bin = std::max(abs_max / 2048.0, 4.0 * abs_max / 8192.0);
    for (QuantScheme s : {QuantScheme::kSymmetric, QuantScheme::kAsymmetric}) {
      const float t1 = one->params(s).scale[0];
      EXPECT_NEAR(ten->params(s).scale[0], t1, bin / 127.0) << algo << " " << scheme_name(s);
      EXPECT_NEAR(growing->params(s).scale[0], t1, bin / 127.0) << algo << " " << scheme_name(s);
    }
  }
}

// ---- weight observers -----------------------------------------------------------------------

TEST(ObserverWeights, ChannelWiseAbsMaxExactPerChannel) {
  // [3, 2, 2]: channel c along axis 0 has max |w| 4, 0.5, 9.
  const Tensor w = tensor({1, -4, 2, 3, 0.5f, 0.25f, -0.5f, 0, 9, 1, 1, -8}, {3, 2, 2});
  auto obs = make_weight_observer("channel_wise_abs_max");
  obs->observe(w);
  QuantParam p = obs->params(QuantScheme::kSymmetric);
  EXPECT_EQ(p.axis, 0);
  EXPECT_EQ(p.dtype, DType::kInt8);
  ASSERT_EQ(p.scale.size(), 3u);
  EXPECT_EQ(p.scale, (std::vector<float>{4.0f / 127, 0.5f / 127, 9.0f / 127}));
  EXPECT_EQ(p.zero_point, (std::vector<int32_t>{0, 0, 0}));
  EXPECT_EQ(obs->range().lo, -8.0f);
  EXPECT_EQ(obs->range().hi, 9.0f);
  p = obs->params(QuantScheme::kAsymmetric);  // channel 0: [-4, 3]
  EXPECT_FLOAT_EQ(p.scale[0], 7.0f / 255);
  EXPECT_EQ(p.zero_point[0], static_cast<int>(std::nearbyint(4.0 / (7.0 / 255))));

  // weight_bits 7: the same ranges on a grid of +-63 (mse_channel_wise searches that grid).
  auto seven = make_weight_observer("channel_wise_abs_max", {.weight_bits = 7});
  seven->observe(w);
  p = seven->params(QuantScheme::kSymmetric);
  EXPECT_EQ(p.scale, (std::vector<float>{4.0f / 63, 0.5f / 63, 9.0f / 63}));
  EXPECT_EQ(p.bits, 7);
  auto tensor_wise = make_weight_observer("abs_max", {.weight_bits = 7});
  tensor_wise->observe(w);
  EXPECT_EQ(tensor_wise->params(QuantScheme::kSymmetric).scale, (std::vector<float>{9.0f / 63}));
  EXPECT_THROW(make_weight_observer("channel_wise_abs_max", {.weight_bits = 9}), Error);
  EXPECT_THROW(make_weight_observer("abs_max", {.weight_bits = 1}), Error);

  // MatMul weight [K=2, N=3] along axis 1 (and -1): per column.
  for (int64_t axis : {1, -1}) {
    auto mm = make_weight_observer("channel_wise_abs_max", {.channel_axis = axis});
    mm->observe(tensor({1, -2, 0.5f, -3, 1, 0.25f}, {2, 3}));
    p = mm->params(QuantScheme::kSymmetric);
    EXPECT_EQ(p.axis, 1);
    EXPECT_EQ(p.scale, (std::vector<float>{3.0f / 127, 2.0f / 127, 0.5f / 127}));
  }

  // Per-tensor abs_max; observing again describes the new weight.
  auto pt = make_weight_observer("abs_max");
  pt->observe(w);
  EXPECT_EQ(pt->params(QuantScheme::kSymmetric).scale, std::vector<float>{9.0f / 127});
  EXPECT_EQ(pt->params(QuantScheme::kSymmetric).axis, -1);
  pt->observe(tensor({0.5f, -1.0f}));
  EXPECT_EQ(pt->params(QuantScheme::kSymmetric).scale, std::vector<float>{1.0f / 127});
}

// Seed 003's MSEObserver as a weight observer: one threshold for the whole tensor, the grid point
// (search_fractions(100, 0.3) of max|w|) with the least squared error, found by brute force here.
TEST(ObserverWeights, MsePerTensorIsTheBruteForceGridOptimum) {
  // Closed form: values on the abs_max grid itself quantize exactly, so nothing is clipped.
  std::vector<float> on_grid;
  for (int k = -127; k <= 127; ++k) on_grid.push_back(0.01f * static_cast<float>(k));
  auto exact = make_weight_observer("mse");
  EXPECT_EQ(exact->name(), "mse");
  exact->observe(tensor(on_grid, {5, 51}));
  const QuantParam pe = exact->params(QuantScheme::kSymmetric);
  ASSERT_EQ(pe.scale.size(), 1u);
  EXPECT_EQ(pe.axis, -1);
  EXPECT_FLOAT_EQ(pe.scale[0], exact->observed_abs_max() / 127.0f);

  // A small heavy-tailed weight: at the brute-force optimum on 8 and on 4 bits, where the coarse
  // grid makes clipping pay (about 0.66 of max|w| here, half the squared error of no clipping).
  const std::vector<float> w = laplace(2048, 0.02f, 7);
  const float wmin = *std::min_element(w.begin(), w.end()), wmax = *std::max_element(w.begin(), w.end());
  const std::vector<double> f = search_fractions(100, 0.3);
  for (int bits : {8, 4}) {
    auto mse = make_weight_observer("mse", {.weight_bits = bits});
    mse->observe(tensor(w, {16, 8, 4, 4}));
    const QuantParam pm = mse->params(QuantScheme::kSymmetric);
    ASSERT_EQ(pm.scale.size(), 1u);
    double best = std::numeric_limits<double>::infinity(), unclipped = 0;
    float best_scale = 0;
    for (auto k = f.rbegin(); k != f.rend(); ++k) {
      const double t = *k * std::max(-wmin, wmax);
      const QuantParam p = params_from_range({static_cast<float>(std::max<double>(-t, wmin)),
                                              static_cast<float>(std::min<double>(t, wmax))},
                                             QuantScheme::kSymmetric, bits);
      double e = 0;  // brute_mse on the grid of `bits`
      const float qmax = static_cast<float>((1 << (bits - 1)) - 1);
      for (float v : w) {
        const float q = std::clamp(std::nearbyint(v / p.scale[0]), -qmax, qmax) * p.scale[0];
        e += (v - q) * static_cast<double>(v - q);
      }
      if (k == f.rbegin()) unclipped = e;
      if (e < best) best = e, best_scale = p.scale[0];
    }
    EXPECT_EQ(pm.scale[0], best_scale) << bits << " bits";
    if (bits == 4) {
      EXPECT_LT(best, 0.7 * unclipped);
    }
  }
}

TEST(ObserverWeights, MseChannelWiseNeverWorseThanAbsMax) {
  for (int64_t axis : {0, 1}) {
    // Conv-like [6, 256, 16, 16] along axis 0, or MatMul-like [65536, 6] along axis 1 (strided).
    // Large channels: 8-bit MSE clipping only pays when the tail holds enough values (the optimum
    // for a Laplace(b) is about 9.9 b; the max of 65536 samples is about 11.7 b).
    const int64_t channels = 6, per = 65536;
    std::vector<float> v(channels * per);
    auto at = [&](int64_t c, int64_t i) -> float& {
      return axis == 0 ? v[c * per + i] : v[i * channels + c];
    };
    for (int64_t c = 0; c < channels; ++c) {
      // Every third channel heavy-tailed (Laplace), the others Gaussian.
      const std::vector<float> ch =
          c % 3 == 0 ? laplace(per, 0.05f, 40 + c) : gaussian(per, 0.1f, 0.0f, 40 + c);
      for (int64_t i = 0; i < per; ++i) at(c, i) = ch[i];
    }
    const Tensor w = axis == 0 ? tensor(v, {channels, 256, 16, 16}) : tensor(v, {per, channels});
    auto mse = make_weight_observer("mse_channel_wise", {.channel_axis = axis});
    auto amax = make_weight_observer("channel_wise_abs_max", {.channel_axis = axis});
    mse->observe(w);
    amax->observe(w);
    const QuantParam pm = mse->params(QuantScheme::kSymmetric);
    const QuantParam pa = amax->params(QuantScheme::kSymmetric);
    ASSERT_EQ(pm.scale.size(), static_cast<size_t>(channels));
    EXPECT_EQ(pm.axis, axis);
    for (int64_t c = 0; c < channels; ++c) {
      double em = 0, ea = 0;
      for (int64_t i = 0; i < per; ++i) {
        const float x = at(c, i);
        em += std::pow(x - fake_quant(x, pm.scale[c], 0, DType::kInt8), 2);
        ea += std::pow(x - fake_quant(x, pa.scale[c], 0, DType::kInt8), 2);
      }
      EXPECT_LE(em, ea * (1 + 1e-6)) << "axis " << axis << " channel " << c;
      if (c % 3 == 0) {  // the heavy-tailed channels gain from clipping
        EXPECT_LT(pm.scale[c], pa.scale[c]) << "axis " << axis << " channel " << c;
        EXPECT_LT(em, 0.95 * ea) << "axis " << axis << " channel " << c;
      }
    }
    // Brute force for one channel: the grid point with the least error.
    const std::vector<double> f = search_fractions(100, 0.3);
    std::vector<float> ch(per);
    for (int64_t i = 0; i < per; ++i) ch[i] = at(3, i);
    const float cmin = *std::min_element(ch.begin(), ch.end());
    const float cmax = *std::max_element(ch.begin(), ch.end());
    double best = std::numeric_limits<double>::infinity();
    float best_scale = 0;
    for (auto k = f.rbegin(); k != f.rend(); ++k) {
      const QuantParam p = params_for(*k * std::max(-cmin, cmax), cmin, cmax,
                                       QuantScheme::kSymmetric);
      const double e = brute_mse(ch, p);
      if (e < best) best = e, best_scale = p.scale[0];
    }
    EXPECT_EQ(pm.scale[3], best_scale);
  }
}

}  // namespace
}  // namespace slimquant::quant
