#pragma once
// A model that selects by its data, as a detector's post-processing does, for the quantization and
// analysis tests of such models.
#include <random>
#include <string>

#include "graph_builder.h"

namespace slimquant::test {

struct SelectionModel {
  ir::Graph graph;
  std::string features;  // the dense values the selection reads
};

// x [1, 8] (a fixed batch of one) -> Gemm -> Relu = features [1, 16]; the features above
// `threshold` are picked (Greater -> NonZero -> Gather), each is scaled by the image size (a value
// of the input's shape only) and a second Gemm maps each picked value to 4 numbers: "boxes" [k, 4],
// k depending on the sample. A threshold above every feature leaves the second Gemm nothing.
inline SelectionModel selection_model(float threshold) {
  GraphBuilder b;
  b.g.opset = 13;
  b.g.inputs.push_back({"x", DType::kFloat32, std::vector<ir::Dim>{{1, ""}, {8, ""}}});
  std::mt19937 rng(5);
  const std::string w1 = b.constant(random_tensor({8, 16}, rng)), b1 = b.constant(random_tensor({16}, rng));
  const std::string features = b.node("Relu", {b.node("Gemm", {"x", w1, b1})});
  const std::string mask = b.node("Greater", {features, b.constant(Tensor::from_vector<float>({}, {threshold}))});
  const std::string positions = b.node("NonZero", {mask});  // [2, k]: rows, columns
  const std::string columns =
      b.node("Gather", {positions, b.constant(Tensor::from_vector<int64_t>({}, {1}))}, {{"axis", int64_t{0}}});
  const std::string picked = b.node("Gather", {features, columns}, {{"axis", int64_t{1}}});  // [1, k]
  const std::string size = b.node("Cast", {b.node("Shape", {"x"})}, {{"to", int64_t{1}}});   // [1, 8] as floats
  const std::string scale = b.node("ReduceMax", {size}, {{"keepdims", int64_t{0}}});
  const std::string scaled = b.node("Mul", {picked, scale});
  const std::string rows = b.node("Reshape", {scaled, b.constant(Tensor::from_vector<int64_t>({2}, {-1, 1}))});
  const std::string boxes = b.node("Gemm", {rows, b.constant(random_tensor({1, 4}, rng))});
  b.g.nodes.back().name = "box_head";
  b.g.outputs.push_back({boxes, DType::kFloat32, std::nullopt});
  return {b.g, features};
}

}  // namespace slimquant::test
