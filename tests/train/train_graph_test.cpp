// TrainGraph on the fixture models: forward parity with the inference runtime, parameters,
// whole-model gradients against finite differences, inserted ops, writing parameters back.
#include <gtest/gtest.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <random>
#include <set>

#include "slimquant/data/dataset.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/session.h"
#include "slimquant/train/train_graph.h"
#include "test_util.h"
#include "train/gradcheck_util.h"

namespace slimquant::test {
namespace {

Tensor fashion_images(size_t n, size_t offset = 0) {
  auto ds = data::open_dataset({.spec = "fashion-mnist:test", .limit = offset + n});
  Tensor x(DType::kFloat32, {static_cast<int64_t>(n), 1, 28, 28});
  for (size_t i = 0; i < n; ++i) ds->load(offset + i, x.data<float>() + i * 28 * 28);
  return x;
}

float max_abs(const Tensor& t) {
  float m = 0;
  for (float v : t.values<float>()) m = std::max(m, std::fabs(v));
  return m;
}

void expect_close(const Tensor& a, const Tensor& b, float rel) {
  ASSERT_EQ(a.shape(), b.shape());
  const float tol = rel * std::max(max_abs(b), 1e-6f);
  const float *pa = a.data<float>(), *pb = b.data<float>();
  for (int64_t i = 0; i < a.numel(); ++i) ASSERT_NEAR(pa[i], pb[i], tol) << "element " << i;
}

class TrainGraphFixture : public ::testing::TestWithParam<std::string> {
 protected:
  OneThread one_thread_;
};

TEST_P(TrainGraphFixture, ForwardMatchesSession) {
  const ir::Graph g = ir::load_onnx(fixture_model(GetParam()));
  runtime::Session session(g);
  train::TrainGraph tg(g);
  const Tensor x = fashion_images(4);
  const Tensor want = session.run({{"input", x}}).at("logits");
  const Tensor got = tg.forward({{"input", x}}, false).at("logits");
  expect_close(got, want, 1e-4f);
  // Training-mode forward computes the same values (no dropout; BatchNorm folded).
  expect_close(tg.forward({{"input", x}}, true).at("logits"), want, 1e-4f);
  // A different batch size needs no new TrainGraph.
  const Tensor x1 = fashion_images(1, 7);
  expect_close(tg.forward({{"input", x1}}, false).at("logits"), session.run({{"input", x1}}).at("logits"), 1e-4f);
}

// Parameters: every Conv/Gemm/MatMul weight and bias and LayerNorm scale/bias initializer.
// (vit_small's Linear layers are MatMul + Add(bias): those biases count.)
TEST_P(TrainGraphFixture, ParametersAreTheTrainableInitializers) {
  const ir::Graph g = ir::load_onnx(fixture_model(GetParam()));
  train::TrainGraph tg(g);
  const ir::Graph& opt = tg.graph();
  size_t expected = 0;
  std::set<std::string> seen;
  for (const auto& n : opt.nodes)
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      // MatMul + Add(1-D initializer): the Linear bias torch exports for 3-D inputs.
      const bool linear_bias = n.op_type == "Add" && opt.is_initializer(n.inputs[k]) &&
                               opt.initializer(n.inputs[k])->rank() == 1 && opt.producer(n.inputs[1 - k]) >= 0 &&
                               opt.nodes[opt.producer(n.inputs[1 - k])].op_type == "MatMul";
      if ((train::trainable_input(n.op_type, k) || linear_bias) && opt.is_initializer(n.inputs[k]) &&
          seen.insert(n.inputs[k]).second)
        ++expected;
    }
  EXPECT_GT(expected, 0u);
  EXPECT_EQ(tg.parameters().size(), expected);
  for (train::Parameter* p : tg.parameters()) {
    ASSERT_TRUE(opt.is_initializer(p->name)) << p->name;
    EXPECT_EQ(p->value.shape(), opt.initializer(p->name)->shape());
    EXPECT_EQ(p->grad.shape(), p->value.shape());
    EXPECT_EQ(tg.parameter(p->name), p);
  }
  EXPECT_EQ(tg.parameter("no such parameter"), nullptr);
}

// Every parameter gets a gradient from a loss on the logits (nothing is cut off), and after a
// gradient step the loss drops by the amount the gradient predicts.
TEST_P(TrainGraphFixture, GradientsReachEveryParameterAndDescentLowersLoss) {
  const ir::Graph g = ir::load_onnx(fixture_model(GetParam()));
  train::TrainGraph tg(g);
  const Tensor x = fashion_images(8, 100);
  std::mt19937 rng(3);
  const Tensor target = random_tensor({8, 10}, rng, -5.f, 5.f);
  auto loss_and_grad = [&](bool backward) {
    Tensor y = tg.forward({{"input", x}}, backward).at("logits");
    Tensor dy(DType::kFloat32, y.shape());
    double l = 0;
    for (int64_t i = 0; i < y.numel(); ++i) {
      const float d = y.data<float>()[i] - target.data<float>()[i];
      l += 0.5 * d * d / y.numel();
      dy.data<float>()[i] = d / static_cast<float>(y.numel());
    }
    if (backward) tg.backward({{"logits", dy}});
    return l;
  };
  for (auto* p : tg.parameters()) p->zero_grad();
  const double l0 = loss_and_grad(true);
  for (auto* p : tg.parameters()) {
    EXPECT_GT(max_abs(p->grad), 0.f) << p->name << " got no gradient";
  }
  // One gradient step sized for a 2% first-order decrease: lr |g|^2 = 0.02 l0. Correct gradients
  // make the actual decrease match the prediction closely (the step is small).
  double g2 = 0;
  for (auto* p : tg.parameters())
    for (float v : p->grad.values<float>()) g2 += static_cast<double>(v) * v;
  const float lr = static_cast<float>(0.02 * l0 / g2);
  for (auto* p : tg.parameters()) {
    float* v = p->value.data<float>();
    const float* gr = p->grad.data<float>();
    for (int64_t i = 0; i < p->value.numel(); ++i) v[i] -= lr * gr[i];
  }
  const double decrease = l0 - loss_and_grad(false);
  EXPECT_NEAR(decrease, 0.02 * l0, 0.3 * 0.02 * l0);
}

INSTANTIATE_TEST_SUITE_P(Fixtures, TrainGraphFixture,
                         ::testing::Values("resnet_small", "mobilenetv2_small", "vit_small"));

// d(loss)/d(weights) on 2 images against central differences of the whole model, for three
// entries (largest gradients: most signal over float32 noise) of each parameter in `picks`
// (indices into parameters(), negative from the end).
void whole_model_gradcheck(const std::string& model, const std::vector<int>& picks, double rtol) {
  const ir::Graph g = ir::load_onnx(fixture_model(model));
  train::TrainGraph tg(g);
  const Tensor x = fashion_images(2, 20);
  std::mt19937 rng(11);
  const Tensor w = random_tensor({2, 10}, rng);
  auto loss = [&](bool train) {
    const Tensor y = tg.forward({{"input", x}}, train).at("logits");
    double l = 0;
    for (int64_t i = 0; i < y.numel(); ++i) l += static_cast<double>(y.data<float>()[i]) * w.data<float>()[i];
    return l;
  };
  for (auto* p : tg.parameters()) p->zero_grad();
  loss(true);
  tg.backward({{"logits", w}});
  std::vector<train::Parameter*> params = tg.parameters();
  int compared = 0;
  for (int pick : picks) {
    const int n = static_cast<int>(params.size());
    ASSERT_LT(pick < 0 ? -pick - 1 : pick, n);
    train::Parameter* p = params[pick < 0 ? n + pick : pick];
    std::vector<int64_t> idx(p->value.numel());
    std::iota(idx.begin(), idx.end(), 0);
    const float* gr = p->grad.data<float>();
    std::partial_sort(idx.begin(), idx.begin() + std::min<int64_t>(3, idx.size()), idx.end(),
                      [&](int64_t a, int64_t b) { return std::fabs(gr[a]) > std::fabs(gr[b]); });
    for (int k = 0; k < 3 && k < static_cast<int>(idx.size()); ++k) {
      float* v = p->value.data<float>();
      const int64_t j = idx[k];
      const float keep = v[j], eps = 1e-3f * std::max(1.f, std::fabs(keep));
      v[j] = keep + eps;
      const double lp = loss(false);
      v[j] = keep - eps;
      const double lm = loss(false);
      v[j] = keep;
      const double numeric = (lp - lm) / (2.0 * eps);
      EXPECT_NEAR(gr[j], numeric, 2e-3 + rtol * std::fabs(numeric)) << model << " " << p->name << "[" << j << "]";
      ++compared;
    }
  }
  EXPECT_EQ(compared, 3 * static_cast<int>(picks.size()));
}

// First conv, a middle conv, the last conv and the classifier: their weights and biases.
TEST(TrainGraph, ResnetWholeModelGradcheck) {
  OneThread one_thread;
  whole_model_gradcheck("resnet_small", {0, 1, 14, 15, -2, -1}, 3e-2);
}

// The ViT (no ReLU kinks): patch embedding, LayerNorm scale/bias, attention and MLP matrices, head.
TEST(TrainGraph, VitWholeModelGradcheck) {
  OneThread one_thread;
  whole_model_gradcheck("vit_small", {0, 1, 2, 3, 4, 5, 6, 8, 10, -2, -1}, 2e-2);
}

// A test quanter stand-in: y = s * x with a trainable scalar s.
class ScaleOp final : public train::TrainOp {
 public:
  explicit ScaleOp(std::string name) {
    p_.name = std::move(name);
    p_.value = Tensor::scalar<float>(1.f);
    p_.zero_grad();
  }
  std::vector<Tensor> forward(const std::vector<Tensor>& in, bool training) override {
    Tensor y = in[0].clone();
    for (float& v : y.values<float>()) v *= p_.value.data<float>()[0];
    if (training) x_ = in[0];
    return {y};
  }
  std::vector<Tensor> backward(const std::vector<Tensor>& gy) override {
    const float s = p_.value.data<float>()[0];
    Tensor dx = gy[0].clone();
    double ds = 0;
    for (int64_t i = 0; i < dx.numel(); ++i) {
      ds += static_cast<double>(gy[0].data<float>()[i]) * x_.data<float>()[i];
      dx.data<float>()[i] *= s;
    }
    p_.grad.data<float>()[0] += static_cast<float>(ds);
    ++backward_calls;
    return {dx};
  }
  std::vector<train::Parameter*> parameters() override { return {&p_}; }
  int backward_calls = 0;

 private:
  train::Parameter p_;
  Tensor x_;
};

TEST(TrainGraph, InsertOnActivationAndWeight) {
  OneThread one_thread;
  const ir::Graph g = ir::load_onnx(fixture_model("resnet_small"));
  train::TrainGraph tg(g);
  const Tensor x = fashion_images(2, 40);
  const Tensor base = tg.forward({{"input", x}}, false).at("logits");
  const size_t n_params = tg.parameters().size();
  // The first Conv's weight and the first Conv's output (an activation read by a Relu).
  const ir::Node* conv = nullptr;
  for (const auto& n : tg.graph().nodes)
    if (n.op_type == "Conv") {
      conv = &n;
      break;
    }
  ASSERT_NE(conv, nullptr);
  auto act = std::make_unique<ScaleOp>("act_scale");
  auto wq = std::make_unique<ScaleOp>("w_scale");
  ScaleOp* act_op = act.get();
  tg.insert_on_tensor(conv->outputs[0], std::move(act), "act_q");
  tg.insert_on_tensor(conv->inputs[1], std::move(wq), "w_q");
  ASSERT_EQ(tg.parameters().size(), n_params + 2);
  ASSERT_NE(tg.parameter("act_scale"), nullptr);
  // With s = 1 the inserted ops change nothing.
  expect_close(tg.forward({{"input", x}}, false).at("logits"), base, 1e-6f);
  // d loss / d s against finite differences on s.
  std::mt19937 rng(5);
  const Tensor w = random_tensor({2, 10}, rng);
  auto loss = [&](bool train) {
    const Tensor y = tg.forward({{"input", x}}, train).at("logits");
    double l = 0;
    for (int64_t i = 0; i < y.numel(); ++i) l += static_cast<double>(y.data<float>()[i]) * w.data<float>()[i];
    return l;
  };
  for (auto* p : tg.parameters()) p->zero_grad();
  loss(true);
  tg.backward({{"logits", w}});
  EXPECT_EQ(act_op->backward_calls, 1);
  for (const char* name : {"act_scale", "w_scale"}) {
    train::Parameter* s = tg.parameter(name);
    const float eps = 1e-3f;
    s->value.data<float>()[0] = 1.f + eps;
    const double lp = loss(false);
    s->value.data<float>()[0] = 1.f - eps;
    const double lm = loss(false);
    s->value.data<float>()[0] = 1.f;
    const double numeric = (lp - lm) / (2 * eps);
    // ReLU kinks make the whole-model difference quotient wander by a few % with eps.
    EXPECT_NEAR(s->grad.data<float>()[0], numeric, 5e-2 * std::fabs(numeric)) << name;
  }
  // Exactly: d/ds L(s W) at s = 1 is <dL/dW, W>, with dL/dW the conv weight's own gradient.
  const train::Parameter* wp = tg.parameter(conv->inputs[1]);
  ASSERT_NE(wp, nullptr);
  double dot = 0;
  for (int64_t i = 0; i < wp->value.numel(); ++i)
    dot += static_cast<double>(wp->value.data<float>()[i]) * wp->grad.data<float>()[i];
  EXPECT_NEAR(tg.parameter("w_scale")->grad.data<float>()[0], dot, 1e-4 * std::fabs(dot) + 1e-5);
  EXPECT_THROW(tg.insert_on_tensor("no_such_value", std::make_unique<ScaleOp>("z"), "z_q"), Error);
}

// Inserting on a constant initializer (not a parameter) rebuilds its readers, which then read the
// inserted op's output at run time instead of a prepacked constant.
TEST(TrainGraph, InsertOnConstantInitializer) {
  OneThread one_thread;
  const ir::Graph g = ir::load_onnx(fixture_model("vit_small"));
  train::TrainGraph tg(g);
  std::string constant;
  for (const auto& n : tg.graph().nodes)
    if (n.op_type == "Add")
      for (const auto& in : n.inputs)
        if (tg.graph().is_initializer(in) && !tg.parameter(in) && tg.graph().initializer(in)->numel() > 1 &&
            constant.empty())
          constant = in;
  ASSERT_FALSE(constant.empty());
  const Tensor x = fashion_images(2, 60);
  const Tensor base = tg.forward({{"input", x}}, false).at("logits");
  tg.insert_on_tensor(constant, std::make_unique<ScaleOp>("c_scale"), "c_q");
  expect_close(tg.forward({{"input", x}}, false).at("logits"), base, 1e-6f);
  tg.parameter("c_scale")->value.data<float>()[0] = 3.f;
  const Tensor scaled = tg.forward({{"input", x}}, false).at("logits");
  float diff = 0;
  for (int64_t i = 0; i < base.numel(); ++i) diff = std::max(diff, std::fabs(scaled.data<float>()[i] - base.data<float>()[i]));
  EXPECT_GT(diff, 1e-3f) << "scaling '" << constant << "' changed nothing";
}

// The fold_batchnorm = false variant keeps BN with trainable scale/bias and still matches Session.
TEST(TrainGraph, UnfoldedBatchNorm) {
  OneThread one_thread;
  const ir::Graph g = ir::load_onnx(fixture_model("resnet_small"));
  train::TrainGraph tg(g, {.fold_batchnorm = false});
  int bn = 0;
  for (const auto& n : tg.graph().nodes)
    if (n.op_type == "BatchNormalization") {
      ++bn;
      EXPECT_NE(tg.parameter(n.inputs[1]), nullptr);
      EXPECT_NE(tg.parameter(n.inputs[2]), nullptr);
    }
  EXPECT_EQ(bn, 16);
  runtime::Session session(g);
  const Tensor x = fashion_images(3);
  expect_close(tg.forward({{"input", x}}, false).at("logits"), session.run({{"input", x}}).at("logits"), 1e-4f);
}

TEST(TrainGraph, ParametersWrittenBackIntoFloatGraph) {
  OneThread one_thread;
  const ir::Graph g = ir::load_onnx(fixture_model("mobilenetv2_small"));
  train::TrainGraph tg(g);
  for (auto* p : tg.parameters())
    for (float& v : p->value.values<float>()) v *= 0.9f;
  const Tensor x = fashion_images(2);
  const Tensor mine = tg.forward({{"input", x}}, false).at("logits");
  runtime::Session s(tg.float_graph_with_parameters());
  expect_close(s.run({{"input", x}}).at("logits"), mine, 1e-4f);
  expect_close(tg.forward({{"input", x}}, false).at("logits"), mine, 0.f);  // the graph copy was independent
}

TEST(TrainGraph, ForwardAndBackwardErrors) {
  OneThread one_thread;
  const ir::Graph g = ir::load_onnx(fixture_model("resnet_small"));
  train::TrainGraph tg(g);
  EXPECT_THROW(tg.forward({}, false), Error);
  const Tensor x = fashion_images(1);
  EXPECT_THROW(tg.forward({{"input", x}}, false, {"not_a_value"}), Error);
  tg.forward({{"input", x}}, false);
  EXPECT_THROW(tg.backward({{"logits", Tensor(DType::kFloat32, {1, 10})}}), Error);  // not a training forward
  tg.forward({{"input", x}}, true);
  EXPECT_THROW(tg.backward({{"not_a_value", Tensor(DType::kFloat32, {1, 10})}}), Error);
  tg.forward({{"input", x}}, true);
  EXPECT_THROW(tg.backward({{"logits", Tensor(DType::kFloat32, {2, 10})}}), Error);  // wrong shape
}

// Swin's window padding computes with Mod on the activation's Shape: such shape arithmetic is off
// every gradient path, so an op without a backward kernel runs forward only there. The same op
// where a gradient must pass through it is still refused, naming the node.
TEST(TrainGraph, OpsOffTheGradientPathNeedNoBackward) {
  auto graph = [](bool mod_on_activation) {
    ir::Graph g;
    g.opset = 13;
    // A symbolic batch: the Shape cannot be folded away before training.
    g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "N"}, {3, ""}}});
    g.outputs.push_back({"y", DType::kFloat32, std::nullopt});
    g.initializers["w"] = Tensor::from_vector<float>({3, 4}, {1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12});
    g.initializers["big"] = Tensor::from_vector<int64_t>({1}, {1000});
    g.initializers["two"] = Tensor::from_vector<float>({1}, {2.f});
    auto node = [&](const std::string& op, std::vector<std::string> in, const std::string& out) {
      ir::Node n;
      n.op_type = op;
      n.name = out + "_node";
      n.inputs = std::move(in);
      n.outputs = {out};
      if (op == "Mod" && n.inputs[1] == "two") n.attrs["fmod"] = int64_t{1};
      g.nodes.push_back(n);
    };
    node("MatMul", {"x", "w"}, "h");
    if (mod_on_activation) {
      node("Mod", {"h", "two"}, "y");
    } else {
      node("Shape", {"h"}, "s");
      node("Mod", {"s", "big"}, "s_same");  // the shape itself: 1000 exceeds every dim
      node("Reshape", {"h", "s_same"}, "y");
    }
    return g;
  };
  train::TrainGraph tg(graph(false));
  const Tensor x = Tensor::from_vector<float>({2, 3}, {1, 0, -1, 0.5f, 2, 1});
  const Tensor y = tg.forward({{"x", x}}, true).at("y");
  EXPECT_EQ(y.shape(), (Shape{2, 4}));
  EXPECT_FLOAT_EQ(y.data<float>()[0], 1.f * 1 - 9.f);  // x[0] . w[:, 0] = 1 - 9
  tg.backward({{"y", Tensor::from_vector<float>({2, 4}, std::vector<float>(8, 1.f))}});
  // dL/dw[i][j] = sum over rows of x[r][i]: column sums of x, the same for every j.
  const Tensor& gw = tg.parameter("w")->grad;
  EXPECT_FLOAT_EQ(gw.data<float>()[0], 1.5f);
  EXPECT_FLOAT_EQ(gw.data<float>()[4], 2.f);
  EXPECT_FLOAT_EQ(gw.data<float>()[8], 0.f);
  try {
    train::TrainGraph refused(graph(true));
    ADD_FAILURE() << "Mod on the gradient path was accepted";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("y_node"), std::string::npos) << e.what();
  }
}

// Not run by default: one forward+backward at batch 64 per fixture, timed.
TEST(TrainGraph, DISABLED_TimeForwardBackwardBatch64) {
  const Tensor x = fashion_images(64);
  for (const char* m : {"resnet_small", "mobilenetv2_small", "vit_small"}) {
    train::TrainGraph tg(ir::load_onnx(fixture_model(m)));
    Tensor dy(DType::kFloat32, {64, 10});
    for (float& v : dy.values<float>()) v = 1e-3f;
    double best = 1e9, best_fwd = 1e9;
    for (int rep = 0; rep < 4; ++rep) {
      auto t0 = std::chrono::steady_clock::now();
      tg.forward({{"input", x}}, true);
      auto t1 = std::chrono::steady_clock::now();
      tg.backward({{"logits", dy}});
      auto t2 = std::chrono::steady_clock::now();
      best = std::min(best, std::chrono::duration<double>(t2 - t0).count());
      best_fwd = std::min(best_fwd, std::chrono::duration<double>(t1 - t0).count());
    }
    std::printf("%s: forward+backward batch 64: %.1f ms (forward %.1f ms)\n", m, best * 1e3, best_fwd * 1e3);
  }
}

}  // namespace
}  // namespace slimquant::test
