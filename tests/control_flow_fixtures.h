#pragma once
// The control-flow fixtures (tests/fixtures/make_control_flow_models.py) and what their tests
// share: where the files are, how far two outputs are apart, nodes built by hand.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "slimquant/ir/graph.h"
#include "test_util.h"

namespace slimquant::test {

inline std::string control_flow_fixture(const std::string& file) {
  return source_path("tests/fixtures/models/control_flow/" + file);
}

// The largest |a - b| (infinite, and a test failure, when the shapes differ).
inline float max_abs_difference(const Tensor& a, const Tensor& b) {
  EXPECT_EQ(a.shape(), b.shape());
  if (a.shape() != b.shape()) return INFINITY;
  const std::vector<float> x = a.to_float_vector(), y = b.to_float_vector();
  float worst = 0.f;
  for (size_t i = 0; i < x.size(); ++i) worst = std::max(worst, std::fabs(x[i] - y[i]));
  return worst;
}

// A node named after its first output.
inline ir::Node graph_node(const std::string& op, std::vector<std::string> in, std::vector<std::string> out) {
  ir::Node n;
  n.op_type = op;
  n.name = out.at(0) + "_node";
  n.inputs = std::move(in);
  n.outputs = std::move(out);
  return n;
}

}  // namespace slimquant::test
