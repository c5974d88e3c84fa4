#include "quant/blocked_export.h"

#include "slimquant/ir/onnx_io.h"

namespace slimquant::quant {

namespace {
constexpr int kOnnxInt4 = 22;
}

int64_t blocked_weight_axis(const ir::Node& node, const ir::Graph& g) {
  if (!node.domain.empty() || node.inputs.size() < 2) return -1;
  const Tensor* w = g.initializer(node.inputs[1]);
  if (!w || w->dtype() != DType::kFloat32 || w->rank() != 2) return -1;
  if (node.op_type == "MatMul") return 0;
  if (node.op_type == "Gemm") return node.attr_int("transB", 0) ? 1 : 0;
  return -1;
}

void write_blocked_weights(ir::Graph& g, const std::vector<BlockedLayer>& layers, int64_t block_size) {
  if (layers.empty()) return;
  ir::convert_opset(g, 21);  // blocked DequantizeLinear and INT4 exist from opset 21
  for (const BlockedLayer& l : layers) {
    ir::Node* target = nullptr;
    for (auto& n : g.nodes)
      if (n.name == l.node) target = &n;
    SQ_CHECK(target && target->inputs.size() > 1 && target->inputs[1] == l.weight, ErrorKind::kInternal,
             "4-bit weights: layer '" + l.node + "' reading '" + l.weight + "' not found in the graph");
    const std::string codes = g.unique_value_name(l.weight + "_int4");
    g.initializers[codes] = l.q.codes;
    g.stored_4bit_types[codes] = kOnnxInt4;
    const std::string scales = g.unique_value_name(l.weight + "_scale");
    g.initializers[scales] = l.q.scales;
    const std::string read = g.unique_value_name(l.weight + "_dequantized");
    ir::Node dq;
    dq.op_type = "DequantizeLinear";
    dq.name = g.unique_value_name(l.node + "_weight_dequantize");
    dq.inputs = {codes, scales};
    dq.outputs = {read};
    dq.attrs["axis"] = l.axis;
    dq.attrs["block_size"] = block_size;
    target->inputs[1] = read;
    g.nodes.push_back(std::move(dq));
    if (g.consumers(l.weight).empty() && !g.is_graph_output(l.weight)) g.initializers.erase(l.weight);
  }
  g.topological_sort();
}

}  // namespace slimquant::quant
