#pragma once
// Models with several inputs for the multi-input paths (side inputs): resnet_small with a second
// input, "offset" [n, 64], added to the classifier's features (as PaddleDetection models take
// scale_factor next to the image), or with a scalar gain; a small recurrent-style model whose state
// input has its batch on axis 1.
#include <algorithm>
#include <random>

#include "graph_builder.h"
#include "slimquant/ir/graph.h"
#include "slimquant/ir/onnx_io.h"
#include "test_util.h"

namespace slimquant::test {

inline ir::Graph resnet_with_offset_input() {
  ir::Graph g = ir::load_onnx(fixture_model("resnet_small"));
  auto gemm = std::find_if(g.nodes.begin(), g.nodes.end(), [](const ir::Node& n) { return n.op_type == "Gemm"; });
  if (gemm == g.nodes.end()) throw std::runtime_error("resnet_small has no Gemm");
  ir::Node add;
  add.name = "add_offset";
  add.op_type = "Add";
  add.inputs = {gemm->inputs[0], "offset"};
  add.outputs = {"features_with_offset"};
  gemm->inputs[0] = "features_with_offset";
  g.nodes.insert(gemm, add);
  g.inputs.push_back({"offset", DType::kFloat32, std::vector<ir::Dim>{{-1, "n"}, {64, ""}}});
  return g;
}

// resnet_small with a scalar input "gain" (rank 0) multiplying its logits, as audio models take a
// sample rate or detectors a threshold.
inline ir::Graph resnet_with_scalar_gain() {
  ir::Graph g = ir::load_onnx(fixture_model("resnet_small"));
  const std::string logits = g.outputs.at(0).name;
  for (ir::Node& n : g.nodes)
    for (auto& out : n.outputs)
      if (out == logits) out = "logits_before_gain";
  ir::Node mul;
  mul.name = "apply_gain";
  mul.op_type = "Mul";
  mul.inputs = {"logits_before_gain", "gain"};
  mul.outputs = {logits};
  g.nodes.push_back(mul);
  g.inputs.push_back({"gain", DType::kFloat32, std::vector<ir::Dim>{}});
  return g;
}

// A recurrent-style model whose second input is a state [2, batch, 8] (an LSTM's [layers, batch,
// hidden]): x [batch, 16] -> MatMul -> added to each layer of the state -> MatMul -> y [2, batch,
// 4], and state_out = Tanh(that sum) [2, batch, 8]. fixed_batch_one declares batch 1 ([1, 16],
// [2, 1, 8], y [2, 1, 4]) as exporters of one-stream models write it; state_out is declared with
// three unknown dimensions in both, as Silero VAD declares its stateN.
inline ir::Graph state_input_model(bool fixed_batch_one) {
  std::mt19937 rng(11);
  GraphBuilder b;
  const ir::Dim dynamic{-1, ""};
  const ir::Dim batch = fixed_batch_one ? ir::Dim{1, ""} : dynamic;
  b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{batch, {16, ""}}});
  b.g.inputs.push_back({"state", DType::kFloat32, std::vector<ir::Dim>{{2, ""}, batch, {8, ""}}});
  const std::string h = b.node("MatMul", {"x", b.constant(random_tensor({16, 8}, rng, -0.5f, 0.5f))});
  const std::string mixed = b.node("Add", {"state", h});
  const std::string y = b.node("MatMul", {mixed, b.constant(random_tensor({8, 4}, rng, -0.5f, 0.5f))});
  const std::string state_out = b.node("Tanh", {mixed});
  b.g.outputs.push_back({y, DType::kFloat32, std::vector<ir::Dim>{{2, ""}, batch, {4, ""}}});
  b.g.outputs.push_back({state_out, DType::kFloat32, std::vector<ir::Dim>{dynamic, dynamic, dynamic}});
  return b.g;
}

}  // namespace slimquant::test
