// Optimizers and schedules: one and two steps against the update rules written out by hand.
#include <gtest/gtest.h>

#include <cmath>
#include <numbers>

#include "slimquant/train/optimizer.h"

using namespace slimquant;
using namespace slimquant::train;

namespace {
Parameter param(const std::string& name, float w, float g) {
  Parameter p;
  p.name = name;
  p.value = Tensor::from_vector<float>({1}, {w});
  p.grad = Tensor::from_vector<float>({1}, {g});
  return p;
}
float w_of(const Parameter& p) { return p.value.data<float>()[0]; }
}  // namespace

TEST(OptimizerSGD, MomentumTwoSteps) {
  OptimizerOptions o;
  o.type = "sgd";
  o.momentum = 0.9f;
  auto opt = make_optimizer(o);
  Parameter p = param("w", 1.0f, 0.5f);
  opt->add(&p, true);
  opt->step(0.1f);  // v = 0.5, w = 1 - 0.05
  EXPECT_NEAR(w_of(p), 0.95, 1e-7);
  opt->step(0.1f);  // v = 0.45 + 0.5 = 0.95, w = 0.95 - 0.095
  EXPECT_NEAR(w_of(p), 0.855, 1e-6);
}

TEST(OptimizerSGD, NesterovAndWeightDecayOnlyWhereAsked) {
  OptimizerOptions o;
  o.type = "sgd";
  o.momentum = 0.9f;
  o.nesterov = true;
  o.weight_decay = 0.1f;
  auto opt = make_optimizer(o);
  Parameter w = param("w", 1.0f, 0.5f), s = param("scale", 1.0f, 0.5f);
  opt->add(&w, true);
  opt->add(&s, false);
  opt->step(0.1f);
  // w: g = 0.5 + 0.1 * 1 = 0.6, v = 0.6, step = g + 0.9 v = 1.14
  EXPECT_NEAR(w_of(w), 1.0 - 0.114, 1e-6);
  // scale (no decay): g = 0.5, v = 0.5, step = 0.95
  EXPECT_NEAR(w_of(s), 1.0 - 0.095, 1e-6);
}

TEST(OptimizerAdam, TwoStepsWithBiasCorrection) {
  OptimizerOptions o;
  o.type = "adam";
  auto opt = make_optimizer(o);
  Parameter p = param("w", 1.0f, 0.5f);
  opt->add(&p, true);
  opt->step(0.1f);  // first step moves by lr * sign(g)
  EXPECT_NEAR(w_of(p), 0.9, 1e-6);
  p.grad.data<float>()[0] = -0.5f;
  opt->step(0.1f);
  const double m = 0.9 * 0.05 + 0.1 * -0.5, v = 0.999 * 0.00025 + 0.001 * 0.25;
  const double mhat = m / (1 - 0.81), vhat = v / (1 - 0.999 * 0.999);
  EXPECT_NEAR(w_of(p), 0.9 - 0.1 * mhat / (std::sqrt(vhat) + 1e-8), 1e-6);
  EXPECT_EQ(opt->steps(), 2);
}

TEST(OptimizerAdam, AdamWDecouplesWeightDecay) {
  OptimizerOptions o;
  o.type = "adamw";
  o.weight_decay = 0.5f;
  auto adamw = make_optimizer(o);
  o.type = "adam";
  auto adam = make_optimizer(o);
  Parameter a = param("w", 2.0f, 0.1f), b = param("w", 2.0f, 0.1f);
  adamw->add(&a, true);
  adam->add(&b, true);
  adamw->step(0.1f);
  adam->step(0.1f);
  // AdamW: w = 2 - 0.1 * 0.5 * 2 = 1.9, then - lr * sign(g) = 1.8.
  EXPECT_NEAR(w_of(a), 1.8, 1e-6);
  // Adam (L2): g = 0.1 + 0.5 * 2 = 1.1, first step moves by lr: 1.9.
  EXPECT_NEAR(w_of(b), 1.9, 1e-6);
}

TEST(OptimizerState, SaveAndRestoreContinuesIdentically) {
  OptimizerOptions o;
  o.type = "adam";
  auto a = make_optimizer(o);
  Parameter p = param("w", 1.0f, 0.3f);
  a->add(&p, true);
  a->step(0.01f);
  auto state = a->state();
  Parameter q = p;
  q.value = p.value.clone();
  q.grad = p.grad.clone();
  auto b = make_optimizer(o);
  b->add(&q, true);
  b->load_state(state);
  a->step(0.01f);
  b->step(0.01f);
  EXPECT_EQ(w_of(p), w_of(q));
  EXPECT_EQ(b->steps(), 2);
  state["other#m"] = Tensor::from_vector<float>({1}, {0});
  EXPECT_THROW(b->load_state(state), Error);
}

TEST(LRSchedule, CosineWithWarmupAndStep) {
  LRSchedule c;
  c.type = "cosine";
  c.lr = 1.0f;
  c.warmup_steps = 10;
  c.total_steps = 110;
  EXPECT_NEAR(c.at(0), 0.1, 1e-6);
  EXPECT_NEAR(c.at(9), 1.0, 1e-6);
  EXPECT_NEAR(c.at(10), 1.0, 1e-6);
  EXPECT_NEAR(c.at(60), 0.5, 1e-6);
  EXPECT_NEAR(c.at(35), 0.5 * (1 + std::cos(std::numbers::pi * 0.25)), 1e-6);
  EXPECT_NEAR(c.at(110), 0.0, 1e-6);
  LRSchedule s;
  s.type = "step";
  s.lr = 1.0f;
  s.step_size = 5;
  s.gamma = 0.1f;
  EXPECT_NEAR(s.at(4), 1.0, 1e-7);
  EXPECT_NEAR(s.at(5), 0.1, 1e-7);
  EXPECT_NEAR(s.at(10), 0.01, 1e-8);
  LRSchedule bad;
  bad.type = "linear";
  EXPECT_THROW(bad.at(0), Error);
  OptimizerOptions o;
  o.type = "rmsprop";
  EXPECT_THROW(make_optimizer(o), Error);
}
