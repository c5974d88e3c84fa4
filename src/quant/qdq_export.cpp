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
  // Activation Q/DQ pairs, one per tensor, read by the chosen layers only.
  std::map<std::string, std::string> dequantized;  // tensor -> its DQ output
  std::vector<ir::Node> qdq_nodes;
  for (const auto& [tensor, p] : act) {
    const std::string base = tensor;
    const std::string scale = g.unique_value_name(base + "_scale");
    g.initializers[scale] = Tensor::scalar<float>(p.scale.at(0));
    const std::string zp = g.unique_value_name(base + "_zero_point");
    g.initializers[zp] = scalar_tensor(p.dtype, p.zero_point.at(0));
    const std::string q_out = g.unique_value_name(base + "_quantized");
    const std::string dq_out = g.unique_value_name(base + "_dequantized");
    ir::Node q;
    q.op_type = "QuantizeLinear";
    q.name = base + "_QuantizeLinear";
    q.inputs = {tensor, scale, zp};
    q.outputs = {q_out};
    ir::Node dq;
    dq.op_type = "DequantizeLinear";
    dq.name = base + "_DequantizeLinear";
    dq.inputs = {q_out, scale, zp};
    dq.outputs = {dq_out};
    qdq_nodes.push_back(std::move(q));
    qdq_nodes.push_back(std::move(dq));
    // Reserve the names before the next unique_value_name call sees the graph.
    g.value_info[q_out] = {q_out, p.dtype == QuantDType::kU8 ? DType::kUInt8 : DType::kInt8, std::nullopt};
    g.value_info[dq_out] = {dq_out, DType::kFloat32, std::nullopt};
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
    const std::string wq = g.unique_value_name(base + "_quantized");
    g.initializers[wq] = quantize_weight_s8(w, wp.scale, layer.weight_axis, wp.bits);
    const std::string scale = g.unique_value_name(base + "_scale");
    const std::string zp = g.unique_value_name(base + "_zero_point");
    const int64_t channels = static_cast<int64_t>(wp.scale.size());
    g.initializers[scale] = Tensor::from_vector<float>({channels}, wp.scale);
    g.initializers[zp] = Tensor(DType::kInt8, {channels});
    const std::string dq_out = g.unique_value_name(base + "_dequantized");
    g.value_info[dq_out] = {dq_out, DType::kFloat32, std::nullopt};
    ir::Node dq;
    dq.op_type = "DequantizeLinear";
    dq.name = base + "_DequantizeLinear";
    dq.inputs = {wq, scale, zp};
    dq.outputs = {dq_out};
    if (channels > 1 || w.rank() > 1) dq.attrs["axis"] = layer.weight_axis;
    weight_nodes.push_back(std::move(dq));
    for (auto& in : node.inputs)
      if (in == layer.weight) in = dq_out;
  }
  for (auto& n : weight_nodes) g.nodes.push_back(std::move(n));
  for (auto& n : qdq_nodes) g.nodes.push_back(std::move(n));
  // Drop the placeholder value_info entries (types only; shapes get re-inferred on export).
  g.topological_sort();
  g.remove_unused_initializers();
  g.validate();
  g.producer_name = "slimquant";
  g.producer_version = "0.1.0";
  return g;
}

}  // namespace slimquant::quant
