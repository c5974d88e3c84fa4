#pragma once
// Helpers shared by the kernel tests: build a node, run one registered kernel on given tensors.
#include <gtest/gtest.h>

#include <cstring>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::kernel_test {

inline ir::Node make_node(const std::string& op, size_t n_inputs, size_t n_outputs = 1) {
  ir::Node n;
  n.op_type = op;
  n.name = "/" + op + "_0";
  for (size_t i = 0; i < n_inputs; ++i) n.inputs.push_back("in" + std::to_string(i));
  for (size_t i = 0; i < n_outputs; ++i) n.outputs.push_back("out" + std::to_string(i));
  return n;
}

// Runs node.op_type's kernel once. Output buffers are pre-filled with 0xAB: a session reuses
// buffers without zeroing, so an element a kernel forgets to write must show up here.
// Undefined tensors in `inputs` are absent optional inputs; `constant` marks inputs the kernel may
// read at creation time, as initializers would be.
inline std::vector<Tensor> run_op(const ir::Node& node, const std::vector<Tensor>& inputs, int64_t opset = 17,
                                  std::vector<bool> constant = {}) {
  const KernelFactory* f = KernelRegistry::instance().find(node.op_type);
  if (!f) ADD_FAILURE() << "no kernel registered for " << node.op_type;
  constant.resize(inputs.size(), false);
  KernelInit init{node, opset, [&](size_t i) -> const Tensor* {
                    return i < inputs.size() && constant[i] && inputs[i].defined() ? &inputs[i] : nullptr;
                  }};
  std::unique_ptr<Kernel> k = (*f)(init);
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : inputs) ptrs.push_back(t.defined() ? &t : nullptr);
  std::vector<Tensor> outputs(node.outputs.size());
  KernelContext ctx(node, ptrs, outputs, [](DType d, const Shape& s) {
    Tensor t(d, s);
    std::memset(t.raw(), 0xAB, t.nbytes());
    return t;
  });
  k->run(ctx);
  return outputs;
}

inline Tensor run1(const ir::Node& node, const std::vector<Tensor>& inputs, int64_t opset = 17) {
  return run_op(node, inputs, opset).at(0);
}

// The same with the opset first, for tests that sweep opsets.
inline std::vector<Tensor> run_op(const ir::Node& node, int64_t opset, const std::vector<Tensor>& inputs,
                                  std::vector<bool> constant = {}) {
  return run_op(node, inputs, opset, std::move(constant));
}
inline Tensor run1(const ir::Node& node, int64_t opset, const std::vector<Tensor>& inputs) {
  return run_op(node, inputs, opset).at(0);
}

inline Tensor random_floats(const Shape& s, std::mt19937& rng, float lo = -3.f, float hi = 3.f) {
  std::uniform_real_distribution<float> dist(lo, hi);
  Tensor t(DType::kFloat32, s);
  for (float& v : t.values<float>()) v = dist(rng);
  return t;
}

}  // namespace slimquant::runtime::kernel_test
