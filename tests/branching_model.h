#pragma once
// A model that runs layers inside an If, for the quantization of branches (Silero VAD's form: an
// If on the sample rate holds the network, the weights outside): see branching_model().
#include <random>
#include <string>

#include "graph_builder.h"
#include "slimquant/ir/graph.h"
#include "slimquant/ir/onnx_io.h"
#include "test_util.h"

namespace slimquant::test {

inline ir::ValueInfo branch_output(const std::string& name) { return {name, DType::kFloat32, std::nullopt}; }

// y = If(rate == 16000) then Relu(x W_shared) W_then + h else x W_shared, with h = x W_outer. The
// branches read x, h and the outer weight W_shared from outside; their nodes are named as the
// outer ones are (MatMul0, ...). Loaded back from the file, so that captured values are the
// loader's.
inline ir::Graph branching_model(const std::string& path) {
  std::mt19937 rng(5);
  GraphBuilder outer;
  outer.g.opset = 13;
  outer.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{-1, "n"}, {8, ""}}});
  outer.g.inputs.push_back({"rate", DType::kInt64, std::vector<ir::Dim>{}});
  outer.g.initializers["W_shared"] = random_tensor({8, 8}, rng);
  outer.node("MatMul", {"x", outer.constant(random_tensor({8, 8}, rng))});
  const std::string h = outer.g.nodes.back().outputs[0] = "h";
  const std::string cond = outer.node("Equal", {"rate", outer.constant(Tensor::scalar<int64_t>(16000))});

  GraphBuilder then_body;
  then_body.g.opset = 13;
  const std::string t = then_body.node("Relu", {then_body.node("MatMul", {"x", "W_shared"})});
  const std::string w_then = "W_then";
  then_body.g.initializers[w_then] = random_tensor({8, 8}, rng);
  const std::string then_out = then_body.node("Add", {then_body.node("MatMul", {t, w_then}), h});
  then_body.g.outputs.push_back(branch_output(then_out));

  GraphBuilder else_body;
  else_body.g.opset = 13;
  const std::string else_out = else_body.node("MatMul", {"x", "W_shared"});
  else_body.g.outputs.push_back(branch_output(else_out));
  // Distinct output names per scope (single static assignment across the model).
  for (auto* body : {&then_body.g, &else_body.g}) {
    const std::string prefix = body == &then_body.g ? "then_" : "else_";
    std::map<std::string, std::string> renames;
    for (const auto& n : body->nodes) renames[n.outputs[0]] = prefix + n.outputs[0];
    ir::rename_values(*body, renames);
  }

  ir::Node branch;
  branch.op_type = "If";
  branch.name = "If_rate";
  branch.inputs = {cond};
  branch.outputs = {"y"};
  branch.attrs["then_branch"] = std::make_shared<const ir::Graph>(then_body.g);
  branch.attrs["else_branch"] = std::make_shared<const ir::Graph>(else_body.g);
  outer.g.nodes.push_back(branch);
  outer.g.outputs.push_back(branch_output("y"));
  ir::save_onnx(outer.g, path);
  return ir::load_onnx(path);
}

}  // namespace slimquant::test
