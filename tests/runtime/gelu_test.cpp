// Gelu (ONNX opset 20; no node test data in ONNX 1.12): both modes against the closed forms
// evaluated in double.
#include <gtest/gtest.h>

#include <cmath>

#include "kernel_test_util.h"

namespace slimquant::runtime {
namespace {

using kernel_test::make_node;
using kernel_test::run1;

Tensor grid() {
  std::vector<float> v;
  for (int i = -1200; i <= 1200; ++i) v.push_back(static_cast<float>(i) * 0.01f);  // [-12, 12]
  for (float x : {-80.f, -30.f, 30.f, 80.f, 1e-6f, -1e-6f, 0.f}) v.push_back(x);
  return Tensor::from_vector<float>({static_cast<int64_t>(v.size())}, v);
}

void expect_close(const Tensor& got, const Tensor& x, double (*ref)(double)) {
  ASSERT_EQ(got.dtype(), DType::kFloat32);
  ASSERT_EQ(got.shape(), x.shape());
  for (int64_t i = 0; i < x.numel(); ++i) {
    const double xv = x.data<float>()[i];
    const double want = ref(xv);
    EXPECT_NEAR(got.data<float>()[i], want, 2e-6 + 2e-6 * std::abs(want)) << "x = " << xv;
  }
}

TEST(Gelu, ExactModeMatchesErfForm) {
  const Tensor x = grid();
  ir::Node n = make_node("Gelu", 1);
  expect_close(run1(n, {x}, 20), x, [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); });
  n.attrs["approximate"] = std::string("none");
  expect_close(run1(n, {x}, 20), x, [](double v) { return 0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))); });
}

TEST(Gelu, NegativeTailKeepsRelativeAccuracy) {
  // 1 + erf(x / sqrt 2) is tiny there; computing it as erfc keeps the digits.
  std::vector<float> xs;
  for (int i = 0; i <= 100; ++i) xs.push_back(-3.f - 0.07f * static_cast<float>(i));  // [-10, -3]
  const Tensor x = Tensor::from_vector<float>({static_cast<int64_t>(xs.size())}, xs);
  const Tensor y = run1(make_node("Gelu", 1), {x}, 20);
  for (size_t i = 0; i < xs.size(); ++i) {
    const double v = xs[i], want = 0.5 * v * std::erfc(-v / std::sqrt(2.0));
    // exp(-x^2 / 2) inherits the float rounding of x^2 / 2: relative error grows like x^2 * eps.
    EXPECT_NEAR(y.data<float>()[i], want, (2e-6 + 1.2e-7 * v * v) * std::abs(want)) << v;
  }
}

TEST(Gelu, TanhModeMatchesTanhForm) {
  const Tensor x = grid();
  ir::Node n = make_node("Gelu", 1);
  n.attrs["approximate"] = std::string("tanh");
  expect_close(run1(n, {x}, 20), x, [](double v) {
    return 0.5 * v * (1.0 + std::tanh(std::sqrt(2.0 / M_PI) * (v + 0.044715 * v * v * v)));
  });
}

TEST(Gelu, KnownValues) {
  const Tensor x = Tensor::from_vector<float>({3}, {-1.f, 0.f, 1.f});
  const Tensor y = run1(make_node("Gelu", 1), {x}, 20);
  EXPECT_NEAR(y.data<float>()[0], -0.15865526f, 1e-7);
  EXPECT_EQ(y.data<float>()[1], 0.f);
  EXPECT_NEAR(y.data<float>()[2], 0.84134474f, 1e-7);
}

TEST(Gelu, DoubleInputAndBadAttribute) {
  const Tensor x = Tensor::from_vector<double>({2}, {1.0, -2.0});
  const Tensor y = run1(make_node("Gelu", 1), {x}, 20);
  EXPECT_NEAR(y.data<double>()[0], 0.8413447460685429, 1e-12);
  EXPECT_NEAR(y.data<double>()[1], -0.04550026389635842, 1e-12);

  ir::Node n = make_node("Gelu", 1);
  n.attrs["approximate"] = std::string("fast");
  try {
    run1(n, {x}, 20);
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidModel);
    EXPECT_NE(std::string(e.what()).find("Gelu '/Gelu_0'"), std::string::npos) << e.what();
  }
}

}  // namespace
}  // namespace slimquant::runtime
