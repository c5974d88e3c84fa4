#include "quant/qdq_export.h"

#include <algorithm>

namespace slimquant::quant {

namespace {
Tensor scalar_tensor(QuantDType dtype, int32_t zp) {
  if (dtype == QuantDType::kU8) return Tensor::scalar<uint8_t>(static_cast<uint8_t>(zp));
  return Tensor::scalar<int8_t>(static_cast<int8_t>(zp));
}
}  // namespace

ir::Graph write_qdq_graph(const ir::Graph& float_graph, const std::vector<const Layer*>& chosen,
                          const std::map<std::string, QuantParams>& act,
                          const std::function<QuantParams(const Layer&)>& weight_params,
                          const QdqExportOptions& options) {
  ir::Graph g = float_graph;
  // Activation Q/DQ pairs, one per tensor, read by the chosen layers only. Names are short
  // (<t>_s, <t>_zp, <t>_q, <t>_dq) and Q/DQ nodes unnamed (Node::describe() names them by their
  // output): on small models the names are a visible part of the file.
  std::map<std::string, std::string> dequantized;  // tensor -> its DQ output
  std::vector<ir::Node> qdq_nodes;
  // The Q/DQ nodes join the graph only at the end: until then value_info placeholders reserve
  // their output names (unique_value_name sees value_info).
  auto reserve = [&](const std::string& base) {
    const std::string name = g.unique_value_name(base);
    g.value_info[name] = {name, DType::kUndefined, std::nullopt};
    return name;
  };
  for (const auto& [tensor, p] : act) {
    const std::string base = tensor;
    const std::string scale = g.unique_value_name(base + "_s");
    g.initializers[scale] = Tensor::scalar<float>(p.scale.at(0));
    // Zero points are always stated, even ONNX's default (uint8, 0): ONNX Runtime 1.30's
    // extended optimizations fail on Conv -> Relu -> QuantizeLinear when the Q has none ("two
    // nodes with same node name"), and ONNX Runtime's own quantizer always writes them.
    const std::string zp = g.unique_value_name(base + "_zp");
    g.initializers[zp] = scalar_tensor(p.dtype, p.zero_point.at(0));
    const std::string q_out = reserve(base + "_q");
    const std::string dq_out = reserve(base + "_dq");
    ir::Node q;
    q.op_type = "QuantizeLinear";
    q.inputs = {tensor, scale, zp};
    q.outputs = {q_out};
    ir::Node dq;
    dq.op_type = "DequantizeLinear";
    dq.inputs = {q_out, scale, zp};
    dq.outputs = {dq_out};
    qdq_nodes.push_back(std::move(q));
    qdq_nodes.push_back(std::move(dq));
    dequantized[tensor] = dq_out;
  }
  std::map<std::string, const Layer*> by_name;
  for (const Layer* l : chosen) by_name[l->name] = l;
  std::vector<ir::Node> weight_nodes;
  for (auto& node : g.nodes) {
    auto it = by_name.find(node.name);
    if (options.rewire_all_readers)
      for (auto& in : node.inputs)
        if (auto d = dequantized.find(in); d != dequantized.end()) in = d->second;
    if (it == by_name.end()) continue;
    const Layer& layer = *it->second;
    for (auto& in : node.inputs)
      if (std::find(layer.activations.begin(), layer.activations.end(), in) != layer.activations.end())
        in = dequantized.at(in);
    if (layer.weight.empty()) continue;
    QuantParams wp = weight_params(layer);
    const Tensor& w = *float_graph.initializer(layer.weight);
    const std::string base = layer.weight;
    const std::string wq = g.unique_value_name(base + "_q");
    g.initializers[wq] = quantize_weight_s8(w, wp.scale, layer.weight_axis, wp.bits);
    const std::string scale = g.unique_value_name(base + "_s");
    const int64_t channels = static_cast<int64_t>(wp.scale.size());
    g.initializers[scale] = Tensor::from_vector<float>({channels}, wp.scale);
    // Symmetric int8 weights: zero point 0 is DequantizeLinear's default, the type comes from x.
    const std::string dq_out = reserve(base + "_dq");
    ir::Node dq;
    dq.op_type = "DequantizeLinear";
    dq.inputs = {wq, scale};
    dq.outputs = {dq_out};
    if (channels > 1 || w.rank() > 1) dq.attrs["axis"] = layer.weight_axis;
    weight_nodes.push_back(std::move(dq));
    for (auto& in : node.inputs)
      if (in == layer.weight) in = dq_out;
  }
  for (auto& n : weight_nodes) g.nodes.push_back(std::move(n));
  for (auto& n : qdq_nodes) g.nodes.push_back(std::move(n));
  // No value_info in the QDQ model (placeholders or what the float graph had): nothing reads it.
  // Sessions re-infer shapes when they bind inputs, the lowering takes the integer types from the
  // Q/DQ nodes and their initializers, and ONNX Runtime infers its own.
  g.value_info.clear();
  g.topological_sort();
  g.remove_unused_initializers();
  g.validate();
  g.producer_name = "slimquant";
  g.producer_version = "0.1.0";
  return g;
}

}  // namespace slimquant::quant
