#pragma once
// A two-input model for the multi-input paths (side inputs): resnet_small with a second input,
// "offset" [n, 64], added to the classifier's features (as PaddleDetection models take
// scale_factor next to the image).
#include <algorithm>

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

}  // namespace slimquant::test
