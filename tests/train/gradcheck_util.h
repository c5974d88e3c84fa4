#pragma once
// Finite-difference gradient checks for TrainOps: L = sum_k <w_k, y_k> with fixed random w_k, so
// dL/dy_k = w_k; analytic dL/dx from backward() is compared with central differences of L computed
// in double from float32 forwards.
#include <gtest/gtest.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <random>
#include <string>
#include <vector>

#include "graph_builder.h"  // random_tensor
#include "slimquant/train/train_graph.h"

namespace slimquant::test {

// Training runs many small parallel regions; on a shared, oversubscribed machine OpenMP's spinning
// barriers make them tens of times slower. Tests run them on one thread (restored afterwards).
class OneThread {
 public:
  OneThread() : prev_(omp_get_max_threads()) { omp_set_num_threads(1); }
  ~OneThread() { omp_set_num_threads(prev_); }
  OneThread(const OneThread&) = delete;
  OneThread& operator=(const OneThread&) = delete;

 private:
  int prev_;
};

// Values whose magnitude is at least `gap` (keeps finite differences off kinks at 0).
inline Tensor random_away_from_zero(const Shape& s, std::mt19937& rng, float scale = 1.f, float gap = 0.05f) {
  Tensor t = random_tensor(s, rng, -scale, scale);
  for (float& v : t.values<float>())
    if (std::fabs(v) < gap) v = v < 0 ? v - gap : v + gap;
  return t;
}

// Distinct values (a shuffled ramp with steps > 2 eps), so max-like ops have a unique winner.
inline Tensor random_distinct(const Shape& s, std::mt19937& rng, float step = 0.05f) {
  Tensor t(DType::kFloat32, s);
  auto v = t.values<float>();
  for (size_t i = 0; i < v.size(); ++i) v[i] = step * (static_cast<float>(i) - static_cast<float>(v.size()) / 2);
  std::shuffle(v.begin(), v.end(), rng);
  return t;
}

struct GradcheckOptions {
  float eps = 1e-2f;
  double rtol = 2e-2;
  double atol = 2e-3;
  int max_entries = 64;  // entries checked per input (spread over the tensor)
};

inline double projected_loss(train::TrainOp& op, const std::vector<Tensor>& inputs, const std::vector<Tensor>& w) {
  std::vector<Tensor> y = op.forward(inputs, false);
  double l = 0;
  for (size_t k = 0; k < w.size(); ++k) {
    if (!w[k].defined()) continue;
    const float* py = y[k].data<float>();
    const float* pw = w[k].data<float>();
    for (int64_t i = 0; i < y[k].numel(); ++i) l += static_cast<double>(py[i]) * pw[i];
  }
  return l;
}

// Checks the gradient of every input listed in `check` (float inputs). Returns the number of
// entries compared (so callers can assert something was checked).
inline int gradcheck(train::TrainOp& op, std::vector<Tensor> inputs, const std::vector<size_t>& check,
                     const GradcheckOptions& o = {}, unsigned seed = 7) {
  std::mt19937 rng(seed);
  std::vector<Tensor> y = op.forward(inputs, true);
  std::vector<Tensor> w;
  for (const Tensor& t : y)
    w.push_back(t.defined() && t.dtype() == DType::kFloat32 ? random_tensor(t.shape(), rng) : Tensor());
  std::vector<Tensor> g = op.backward(w);
  int compared = 0;
  for (size_t i : check) {
    EXPECT_LT(i, g.size());
    if (i >= g.size()) continue;
    EXPECT_TRUE(g[i].defined()) << "no gradient for input " << i;
    if (!g[i].defined()) continue;
    EXPECT_EQ(g[i].shape(), inputs[i].shape()) << "gradient shape of input " << i;
    Tensor x = inputs[i].clone();
    inputs[i] = x;
    float* px = x.data<float>();
    const float* pg = g[i].data<float>();
    const int64_t n = x.numel();
    const int64_t step = std::max<int64_t>(1, n / o.max_entries);
    for (int64_t j = 0; j < n; j += step) {
      const float keep = px[j];
      px[j] = keep + o.eps;
      const double lp = projected_loss(op, inputs, w);
      px[j] = keep - o.eps;
      const double lm = projected_loss(op, inputs, w);
      px[j] = keep;
      const double numeric = (lp - lm) / (2.0 * o.eps);
      const double analytic = pg[j];
      EXPECT_NEAR(analytic, numeric, o.atol + o.rtol * std::max(std::fabs(analytic), std::fabs(numeric)))
          << "input " << i << " entry " << j << " (x = " << keep << ")";
      ++compared;
    }
  }
  return compared;
}

// A one-node graph around `node`; `constants` become initializers (shapes, indices, Clip bounds...).
struct OneNode {
  ir::Graph graph;
  ir::Node node;
  OneNode(std::string op, std::vector<std::string> inputs, std::vector<std::string> outputs, int64_t opset = 17) {
    node.op_type = std::move(op);
    node.name = node.op_type + "_test";
    node.inputs = std::move(inputs);
    node.outputs = std::move(outputs);
    graph.opset = opset;
  }
  OneNode& attr(const std::string& k, ir::AttributeValue v) {
    node.attrs[k] = std::move(v);
    return *this;
  }
  OneNode& constant(const std::string& name, Tensor t) {
    graph.initializers[name] = std::move(t);
    return *this;
  }
  std::unique_ptr<train::TrainOp> make() {
    graph.nodes = {node};
    return train::make_train_op(node, graph);
  }
};

}  // namespace slimquant::test
