#pragma once
// Graphs built node by node for runtime tests, and random float tensors to feed them.
#include <map>
#include <random>
#include <string>
#include <vector>

#include "slimquant/core/tensor.h"
#include "slimquant/ir/graph.h"

namespace slimquant::test {

// How many nodes of `g` run op_type `op`.
inline int count_op(const ir::Graph& g, const std::string& op) {
  int n = 0;
  for (const auto& node : g.nodes) n += node.op_type == op;
  return n;
}

inline Tensor random_tensor(const Shape& shape, std::mt19937& rng, float lo = -1.f, float hi = 1.f) {
  Tensor t(DType::kFloat32, shape);
  std::uniform_real_distribution<float> d(lo, hi);
  for (auto& v : t.values<float>()) v = d(rng);
  return t;
}

// A float32 value of a known shape (a graph input, output or value_info entry).
inline ir::ValueInfo float_value(const std::string& name, const Shape& shape) {
  ir::ValueInfo v;
  v.name = name;
  v.dtype = DType::kFloat32;
  std::vector<ir::Dim> dims;
  for (int64_t d : shape) dims.push_back({d, ""});
  v.dims = dims;
  return v;
}

struct GraphBuilder {
  ir::Graph g;
  // A new initializer holding t; returns its name.
  std::string constant(Tensor t) {
    const std::string name = g.unique_value_name("c");
    g.initializers[name] = std::move(t);
    return name;
  }
  // Appends an op_type node named after its position, with one output; returns the output's name.
  std::string node(const std::string& op, std::vector<std::string> in, std::map<std::string, ir::AttributeValue> attrs = {}) {
    ir::Node n;
    n.op_type = op;
    n.name = op + std::to_string(g.nodes.size());
    n.inputs = std::move(in);
    n.outputs = {n.name + "_out"};
    n.attrs = std::move(attrs);
    g.nodes.push_back(n);
    return n.outputs[0];
  }
};

}  // namespace slimquant::test
