// Quanters: forward values and gradients against the formulas in quanters.h, on small hand-made
// tensors whose quantized values are worked out in the comments.
#include <gtest/gtest.h>

#include <cmath>

#include "slimquant/train/optimizer.h"
#include "slimquant/train/quanters.h"

using namespace slimquant;
using namespace slimquant::train;

namespace {
Tensor vec(Shape shape, std::vector<float> v) { return Tensor::from_vector<float>(std::move(shape), v); }
std::vector<float> values(const Tensor& t) { return t.to_float_vector(); }
QuanterInit act_init(float lo, float hi) {
  QuanterInit init;
  init.has_range = true;
  init.range = {lo, hi};
  init.never_negative = lo >= 0.0f;
  return init;
}
void expect_near(const std::vector<float>& got, const std::vector<double>& want, double tol = 1e-6) {
  ASSERT_EQ(got.size(), want.size());
  for (size_t i = 0; i < got.size(); ++i) EXPECT_NEAR(got[i], want[i], tol) << "element " << i;
}
}  // namespace

TEST(QuanterPACT, SignedClipQuantizeAndGradients) {
  PACTQuanter q(act_init(-1.0f, 1.0f), "t");
  EXPECT_FLOAT_EQ(q.alpha().value.data<float>()[0], 1.0f);
  // alpha 1, scale 1/127: -2 clips to -1; 0.3 -> 38.1 -> 38; -0.49 -> -62.23 -> -62; 1.5 clips to 1.
  auto y = q.forward({vec({1, 4}, {-2.0f, -0.49f, 0.3f, 1.5f})}, true);
  expect_near(values(y[0]), {-1.0, -62.0 / 127, 38.0 / 127, 1.0});
  q.alpha().zero_grad();
  auto dx = q.backward({vec({1, 4}, {1, 2, 3, 4})});
  expect_near(values(dx[0]), {0, 2, 3, 0});  // straight through inside, zero where clipped
  // d/dalpha: -1 for x <= -alpha (g = 1), +1 for x >= alpha (g = 4): 3.
  EXPECT_NEAR(q.alpha().grad.data<float>()[0], 3.0f, 1e-6);
  auto p = q.export_params();
  EXPECT_EQ(p.dtype, DType::kInt8);
  EXPECT_FLOAT_EQ(p.scale.at(0), 1.0f / 127);
  EXPECT_EQ(p.zero_point.at(0), 0);
}

TEST(QuanterPACT, UnsignedForNeverNegativeInputs) {
  PACTQuanter q(act_init(0.0f, 2.0f), "t");
  EXPECT_FALSE(q.is_signed());
  // alpha 2, scale 2/255: -1 -> 0; 0.5 -> 63.75 -> 64; 3 clips to 2.
  auto y = q.forward({vec({3}, {-1.0f, 0.5f, 3.0f})}, true);
  expect_near(values(y[0]), {0.0, 64 * 2.0 / 255, 2.0});
  q.alpha().zero_grad();
  auto dx = q.backward({vec({3}, {1, 1, 1})});
  expect_near(values(dx[0]), {0, 1, 0});
  EXPECT_NEAR(q.alpha().grad.data<float>()[0], 1.0f, 1e-6);  // the lower bound 0 does not move with alpha
  auto p = q.export_params();
  EXPECT_EQ(p.dtype, DType::kUInt8);
  EXPECT_FLOAT_EQ(p.scale.at(0), 2.0f / 255);
}

TEST(QuanterWeightLSQplus, InitFromMeanAndStdPerChannel) {
  QuanterInit init;
  init.is_weight = true;
  init.channel_axis = 0;
  init.initial_weight = vec({2, 3}, {0.1f, -0.2f, 0.3f, 1.0f, 2.0f, 3.0f});
  WeightLSQplusQuanter q(init, "w");
  ASSERT_EQ(q.scale().value.numel(), 2);
  // channel 0: mu = 0.0666667, sigma = sqrt(0.0466667 - mu^2) = 0.2054805 -> (mu + 3 sigma) / 128.
  EXPECT_NEAR(q.scale().value.data<float>()[0], (0.0666667 + 3 * 0.2054805) / 128, 1e-7);
  // channel 1: mu = 2, sigma = sqrt(14/3 - 4) = 0.8164966 -> (2 + 2.4494897) / 128.
  EXPECT_NEAR(q.scale().value.data<float>()[1], (2 + 3 * 0.8164966) / 128, 1e-6);
}

TEST(QuanterWeightLSQplus, ForwardAndGradientsWithClipping) {
  QuanterInit init;
  init.is_weight = true;
  init.initial_weight = vec({2, 3}, {0, 0, 0, 0, 0, 0});
  WeightLSQplusQuanter q(init, "w");
  q.scale().value.data<float>()[0] = 0.002f;
  q.scale().value.data<float>()[1] = 0.01f;
  // ch0 u = [61.7, -100, 150]: round 62, -100, clip 127.  ch1 u = [100, 200, -300]: 100, 127, -127.
  auto y = q.forward({vec({2, 3}, {0.1234f, -0.2f, 0.3f, 1.0f, 2.0f, -3.0f})}, true);
  expect_near(values(y[0]), {62 * 0.002, -0.2, 127 * 0.002, 1.0, 1.27, -1.27}, 1e-6);
  q.scale().zero_grad();
  auto dx = q.backward({vec({2, 3}, {1, 2, 3, 4, 5, 6})});
  expect_near(values(dx[0]), {1, 2, 0, 4, 0, 0});
  // ds = gs * sum g * (round(u) - u inside | Qp above | -Qn below), gs = 1/sqrt(3 * 127).
  const double gs = 1.0 / std::sqrt(3.0 * 127);
  EXPECT_NEAR(q.scale().grad.data<float>()[0], gs * (1 * 0.3 + 2 * 0 + 3 * 127), 2e-4);
  EXPECT_NEAR(q.scale().grad.data<float>()[1], gs * (4 * 0 + 5 * 127 + 6 * -127), 2e-4);
  auto p = q.export_params();
  EXPECT_EQ(p.axis, 0);
  ASSERT_EQ(p.scale.size(), 2u);
  EXPECT_FLOAT_EQ(p.scale[1], 0.01f);
}

TEST(QuanterActLSQplus, AsymmetricForwardAndGradients) {
  ActLSQplusQuanter q(act_init(-1.0f, 3.0f), "a");
  // s = 4/255, beta = -1 -> zero point round(63.75) = 64.
  const double s = 4.0 / 255;
  EXPECT_NEAR(q.scale().value.data<float>()[0], s, 1e-9);
  auto p = q.export_params();
  EXPECT_EQ(p.dtype, DType::kUInt8);
  EXPECT_EQ(p.zero_point.at(0), 64);
  // u = x/s + 64: -2 -> -63.5 (below, 0); 0 -> 64; 1 -> 127.75 -> 128; 5 -> 382.75 (above, 255).
  auto y = q.forward({vec({1, 4}, {-2.0f, 0.0f, 1.0f, 5.0f})}, true);
  expect_near(values(y[0]), {-64 * s, 0.0, 64 * s, 191 * s}, 1e-6);
  q.scale().zero_grad();
  q.beta().zero_grad();
  auto dx = q.backward({vec({1, 4}, {1, 1, 1, 1})});
  expect_near(values(dx[0]), {0, 1, 1, 0});
  const double gs = 1.0 / std::sqrt(4.0 * 255);
  EXPECT_NEAR(q.scale().grad.data<float>()[0], gs * (0 + 0 + 0.25 + 255), 1e-4);
  EXPECT_NEAR(q.beta().grad.data<float>()[0], gs * 2, 1e-6);  // only the two clipped elements
}

TEST(QuanterMovingAbsMax, MovingAverageInTrainingFrozenInEval) {
  MovingAbsMaxQuanter q(QuanterInit{}, "m");
  q.forward({vec({2}, {-2.0f, 1.0f})}, true);  // accum 2, state 1
  EXPECT_FLOAT_EQ(q.threshold(), 2.0f);
  auto y = q.forward({vec({3}, {4.0f, -1.0f, 0.5f})}, true);  // accum 0.9*2 + 4 = 5.8, state 1.9
  const double t = 5.8 / 1.9, s = t / 127;
  EXPECT_NEAR(q.threshold(), t, 1e-5);
  expect_near(values(y[0]), {127 * s /* 4 saturates */, std::nearbyint(-1.0 / s) * s, std::nearbyint(0.5 / s) * s}, 1e-5);
  auto dx = q.backward({vec({3}, {1, 2, 3})});
  expect_near(values(dx[0]), {0, 2, 3});  // 4 > threshold is clipped
  q.forward({vec({1}, {100.0f})}, false);  // evaluation does not move the threshold
  EXPECT_NEAR(q.threshold(), t, 1e-5);
  auto p = q.export_params();
  EXPECT_EQ(p.dtype, DType::kInt8);
  EXPECT_NEAR(p.scale.at(0), s, 1e-7);
}

TEST(QuanterAbsMaxWeight, PerChannelScalesFollowTheWeights) {
  QuanterInit init;
  init.is_weight = true;
  init.channel_axis = 1;  // e.g. a MatMul weight [K, N]
  AbsMaxWeightQuanter q(init, "w");
  auto y = q.forward({vec({2, 2}, {1.01f, -0.5f, -2.0f, 0.25f})}, true);
  // column scales 2/127 and 0.5/127; 1.01 -> 64.1 -> 64.
  expect_near(values(y[0]), {64 * 2.0 / 127, -0.5, -2.0, std::nearbyint(0.25 / (0.5 / 127)) * 0.5 / 127});
  q.observe_final(vec({2, 2}, {3.0f, 1.0f, 0.0f, 0.0f}));
  auto p = q.export_params();
  EXPECT_EQ(p.axis, 1);
  EXPECT_FLOAT_EQ(p.scale.at(0), 3.0f / 127);
  EXPECT_FLOAT_EQ(p.scale.at(1), 1.0f / 127);
}

TEST(QuanterAbsMaxWeight, SevenBitWeightsUseSixtyThreeLevels) {
  QuanterInit init;
  init.is_weight = true;
  init.bits = 7;
  AbsMaxWeightQuanter q(init, "w");
  // one channel, max |w| 2: scale 2/63; 1.01 -> 31.8 -> 32.
  auto y = q.forward({vec({1, 3}, {1.01f, -2.0f, 0.0f})}, true);
  expect_near(values(y[0]), {32 * 2.0 / 63, -2.0, 0.0});
  auto p = q.export_params();
  EXPECT_FLOAT_EQ(p.scale.at(0), 2.0f / 63);
  EXPECT_EQ(p.bits, 7);

  QuanterInit lsq = init;
  lsq.initial_weight = vec({1, 4}, {0.1f, -0.3f, 0.2f, 0.4f});
  WeightLSQplusQuanter l(lsq, "l");
  l.scale().value.data<float>()[0] = 0.004f;  // 0.4 / 0.004 = 100 saturates at 63
  auto yl = l.forward({lsq.initial_weight}, false);
  EXPECT_NEAR(values(yl[0])[3], 63 * 0.004, 1e-6);
  EXPECT_EQ(l.export_params().bits, 7);

  QuanterInit act;
  act.bits = 7;  // activations stay 8-bit
  EXPECT_THROW(make_quanter("pact", act, "a"), Error);
  init.bits = 9;
  EXPECT_THROW(make_quanter("abs_max", init, "w"), Error);
}

TEST(QuanterFactory, NamesAndErrors) {
  QuanterInit w;
  w.is_weight = true;
  w.initial_weight = vec({2, 1}, {1, 2});
  EXPECT_EQ(make_quanter("lsq_plus", w, "x")->name(), "lsq_plus");
  EXPECT_NE(dynamic_cast<WeightLSQplusQuanter*>(make_quanter("WeightLSQplusQuanter", w, "x").get()), nullptr);
  EXPECT_NE(dynamic_cast<ActLSQplusQuanter*>(make_quanter("lsq_plus", QuanterInit{}, "x").get()), nullptr);
  EXPECT_EQ(make_quanter("PACTQuanter", QuanterInit{}, "x")->name(), "pact");
  try {
    make_quanter("moving_abs_max", w, "x");  // not a weight quanter
    FAIL() << "expected an error";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), ErrorKind::kInvalidArgument);
    EXPECT_NE(std::string(e.what()).find("unknown weight quanter 'moving_abs_max'"), std::string::npos) << e.what();
  }
  EXPECT_THROW(check_quanter_name("lsq", false), Error);
}

TEST(QuanterPACT, InitValueReplacesTheCalibratedClip) {
  QuanterInit init = act_init(-1.0f, 1.0f);
  init.init_value = 2.5f;
  auto q = make_quanter("pact", init, "t");
  // alpha 2.5, scale 2.5/127: 2.0 stays inside the clip (2.0 * 50.8 = 101.6 -> 102).
  auto y = q->forward({vec({2}, {2.0f, 3.0f})}, false);
  expect_near(values(y[0]), {102 * 2.5 / 127, 2.5}, 1e-5);
  EXPECT_FLOAT_EQ(q->export_params().scale.at(0), 2.5f / 127);
  init.init_value = -1.0f;
  EXPECT_THROW(make_quanter("pact", init, "t"), Error);
  init.init_value = 1.0f;
  EXPECT_THROW(make_quanter("lsq_plus", init, "t"), Error);  // PACT's setting only
}

TEST(QuanterFactory, LearningRateFactorReachesTheParameters) {
  QuanterInit init = act_init(-1.0f, 1.0f);
  init.lr_scale = 1000.0f;
  auto q = make_quanter("pact", init, "t");
  ASSERT_EQ(q->parameters().size(), 1u);
  EXPECT_FLOAT_EQ(q->parameters()[0]->lr_scale, 1000.0f);
  // SGD without momentum: alpha -= lr * lr_scale * grad = 1e-3 * 1000 * 0.25.
  OptimizerOptions o;
  o.type = "sgd";
  o.momentum = 0.0f;
  auto opt = make_optimizer(o);
  opt->add(q->parameters()[0], false);
  opt->zero_grad();
  q->parameters()[0]->grad.data<float>()[0] = 0.25f;
  opt->step(1e-3f);
  EXPECT_NEAR(q->parameters()[0]->value.data<float>()[0], 1.0f - 0.25f, 1e-6);
}

TEST(QuanterActLSQplus, SymmetricHasNoOffsetAndHonoursSign) {
  QuanterInit init = act_init(-1.0f, 2.0f);
  init.symmetric = true;
  ActLSQplusQuanter q(init, "t");
  ASSERT_EQ(q.parameters().size(), 1u);  // the scale only
  // Signed (calibration saw negatives): s = 2/127. -3 clips to -127; 0.5 -> 31.75 -> 32; 5 clips to 127.
  auto y = q.forward({vec({1, 3}, {-3.0f, 0.5f, 5.0f})}, true);
  const double s = 2.0 / 127;
  expect_near(values(y[0]), {-127 * s, 32 * s, 127 * s}, 1e-6);
  q.scale().zero_grad();
  auto dx = q.backward({vec({1, 3}, {1, 1, 1})});
  expect_near(values(dx[0]), {0, 1, 0});
  // dL/ds = gs * (-127 + (32 - 31.75) + 127), gs = 1 / sqrt(3 * 127).
  EXPECT_NEAR(q.scale().grad.data<float>()[0], 0.25 / std::sqrt(3.0 * 127), 1e-5);
  auto p = q.export_params();
  EXPECT_EQ(p.dtype, DType::kInt8);
  EXPECT_EQ(p.zero_point.at(0), 0);
  EXPECT_FLOAT_EQ(p.scale.at(0), 2.0f / 127);

  // sign = false: u8 with zero point 0 whatever the calibration saw; negatives clip to 0.
  init.sign = false;
  ActLSQplusQuanter u(init, "u");
  auto yu = u.forward({vec({2}, {-1.0f, 1.5f})}, false);
  expect_near(values(yu[0]), {0.0, 191 * 2.0 / 255}, 1e-6);  // 1.5 / (2/255) = 191.25 -> 191
  EXPECT_EQ(u.export_params().dtype, DType::kUInt8);
  EXPECT_FLOAT_EQ(u.export_params().scale.at(0), 2.0f / 255);
}
