// Losses: values against the direct formula, gradients against central finite differences.
#include <gtest/gtest.h>

#include <cmath>

#include "slimquant/train/loss.h"

using namespace slimquant;
using namespace slimquant::train;

namespace {
// Central differences of f over every logit (double-precision losses, float logits).
template <typename F>
void check_gradient(const Tensor& logits, const Tensor& analytic, F&& f, double tol) {
  const float h = 1e-2f;
  for (int64_t i = 0; i < logits.numel(); ++i) {
    Tensor plus = logits.clone(), minus = logits.clone();
    plus.data<float>()[i] += h;
    minus.data<float>()[i] -= h;
    const double fd = (f(plus) - f(minus)) / (2.0 * h);
    EXPECT_NEAR(analytic.data<float>()[i], fd, tol) << "logit " << i;
  }
}
}  // namespace

TEST(LossCrossEntropy, ValueAndGradient) {
  Tensor z = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 0.5f, -1, 2});
  auto r = softmax_cross_entropy(z, {2, 0});
  const double l0 = std::log(std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) - 3.0;
  const double l1 = std::log(std::exp(0.5) + std::exp(-1.0) + std::exp(2.0)) - 0.5;
  EXPECT_NEAR(r.loss, (l0 + l1) / 2, 1e-9);
  // Row 0, class 0: softmax / N.
  EXPECT_NEAR(r.dlogits.data<float>()[0], std::exp(1.0) / (std::exp(1.0) + std::exp(2.0) + std::exp(3.0)) / 2, 1e-7);
  check_gradient(z, r.dlogits, [](const Tensor& t) { return softmax_cross_entropy(t, {2, 0}).loss; }, 1e-4);
  // Large logits stay finite.
  auto big = softmax_cross_entropy(Tensor::from_vector<float>({1, 2}, {1000, 0}), {1});
  EXPECT_NEAR(big.loss, 1000.0, 1e-6);
  EXPECT_THROW(softmax_cross_entropy(z, {2, 3}), Error);
  EXPECT_THROW(softmax_cross_entropy(z, {2}), Error);
}

TEST(LossKL, ValueScaledByTSquaredAndGradient) {
  Tensor s = Tensor::from_vector<float>({2, 3}, {1, 2, 3, 0, 0.5f, -0.5f});
  Tensor t = Tensor::from_vector<float>({2, 3}, {3, 1, 0, 0.2f, 0.1f, 0});
  const float T = 2.0f;
  auto r = kl_divergence(s, t, T);
  double want = 0.0;
  for (int n = 0; n < 2; ++n) {
    double zs = 0, zt = 0;
    for (int c = 0; c < 3; ++c) zs += std::exp(s.data<float>()[n * 3 + c] / T), zt += std::exp(t.data<float>()[n * 3 + c] / T);
    for (int c = 0; c < 3; ++c) {
      const double ps = std::exp(s.data<float>()[n * 3 + c] / T) / zs, pt = std::exp(t.data<float>()[n * 3 + c] / T) / zt;
      want += pt * std::log(pt / ps);
    }
  }
  EXPECT_NEAR(r.loss, T * T * want / 2, 1e-6);  // the reference divides float logits in float
  check_gradient(s, r.dlogits, [&](const Tensor& x) { return kl_divergence(x, t, T).loss; }, 1e-4);
  EXPECT_NEAR(kl_divergence(t, t, T).loss, 0.0, 1e-12);  // identical logits: no divergence
  EXPECT_THROW(kl_divergence(s, t, 0.0f), Error);
  EXPECT_THROW(kl_divergence(s, Tensor::from_vector<float>({1, 3}, {0, 0, 0}), T), Error);
}
