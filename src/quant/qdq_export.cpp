#include "quant/qdq_export.h"

#include <algorithm>
#include <cmath>
#include <optional>

#include "slimquant/ir/qdq_params.h"

namespace slimquant::quant {

namespace {
Tensor scalar_tensor(DType dtype, int32_t zp) {
  if (dtype == DType::kUInt8) return Tensor::scalar<uint8_t>(static_cast<uint8_t>(zp));
  return Tensor::scalar<int8_t>(static_cast<int8_t>(zp));
}

// Bias input 2 of `node` (a float [channels] initializer) as int32 b / (x_scale * w_scale[c]),
// saturated, through a per-channel DequantizeLinear; unchanged when the bias has another form.
// The DequantizeLinear is appended to `new_nodes` (the caller is iterating over g.nodes).
void quantize_bias_input(ir::Graph& g, ir::Node& node, const QuantParam& x, const QuantParam& w, int64_t channels,
                         std::vector<ir::Node>& new_nodes) {
  const std::string& bias = node.input(2);
  const Tensor* b = bias.empty() ? nullptr : g.initializer(bias);
  if (!b || b->dtype() != DType::kFloat32 || b->rank() != 1 || b->numel() != channels || x.scale.size() != 1) return;
  Tensor q(DType::kInt32, {channels});
  std::vector<float> scales(static_cast<size_t>(channels));
  for (int64_t c = 0; c < channels; ++c) {
    const float ws = w.scale.size() == 1 ? w.scale[0] : w.scale[static_cast<size_t>(c)];
    scales[static_cast<size_t>(c)] = x.scale[0] * ws;
    const double v = std::nearbyint(static_cast<double>(b->data<float>()[c]) / scales[static_cast<size_t>(c)]);
    q.data<int32_t>()[c] = static_cast<int32_t>(std::clamp(v, -2147483648.0, 2147483647.0));
  }
  const std::string bq = g.unique_value_name(bias + "_q");
  g.initializers[bq] = std::move(q);
  const std::string bs = g.unique_value_name(bias + "_s");
  g.initializers[bs] = Tensor::from_vector<float>({channels}, scales);
  const std::string out = g.unique_value_name(bias + "_dq");
  g.value_info[out] = {out, DType::kUndefined, std::nullopt};
  ir::Node dq;
  dq.op_type = "DequantizeLinear";
  dq.inputs = {bq, bs};
  dq.outputs = {out};
  dq.attrs["axis"] = int64_t{0};
  node.inputs[2] = out;
  new_nodes.push_back(std::move(dq));
}
}  // namespace

ir::Graph write_qdq_graph(const ir::Graph& float_graph, const std::vector<const Layer*>& chosen,
                          const std::map<std::string, QuantParam>& act,
                          const std::function<QuantParam(const Layer&)>& weight_params,
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
    QuantParam wp = weight_params(layer);
    const Tensor& w = *float_graph.initializer(layer.weight);
    const std::string base = layer.weight;
    const std::string wq = g.unique_value_name(base + "_q");
    g.initializers[wq] = quantize_weight_s8(w, wp.scale, layer.weight_axis, wp.bits, options.bias_correction);
    const std::string scale = g.unique_value_name(base + "_s");
    const int64_t channels = static_cast<int64_t>(wp.scale.size());
    g.initializers[scale] = Tensor::from_vector<float>({channels}, wp.scale);
    // Symmetric int8 weights: zero point 0 is DequantizeLinear's default, the type comes from x.
    const std::string dq_out = reserve(base + "_dq");
    ir::Node dq;
    dq.op_type = "DequantizeLinear";
    dq.inputs = {wq, scale};
    if (options.state_weight_zero_points) {
      const std::string zp = g.unique_value_name(base + "_zp");
      g.initializers[zp] = channels > 1 || w.rank() > 1 ? Tensor(DType::kInt8, {channels}) : Tensor::scalar<int8_t>(0);
      dq.inputs.push_back(zp);
    }
    dq.outputs = {dq_out};
    if (channels > 1 || w.rank() > 1) dq.attrs["axis"] = layer.weight_axis;
    weight_nodes.push_back(std::move(dq));
    for (auto& in : node.inputs)
      if (in == layer.weight) in = dq_out;
    if (options.quantize_bias && (node.op_type == "Conv" || node.op_type == "Gemm") && !layer.activations.empty())
      quantize_bias_input(g, node, act.at(layer.activations[0]), wp, channels, weight_nodes);
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

namespace slimquant::quant {

namespace {
// The constant scalar a Clip input names, or `otherwise` when absent.
std::optional<float> clip_bound(const ir::Graph& g, const ir::Node& clip, size_t i, float otherwise) {
  if (clip.input(i).empty()) return otherwise;
  const Tensor* t = g.initializer(clip.input(i));
  if (!t || t->numel() != 1 || t->dtype() != DType::kFloat32) return std::nullopt;
  return t->data<float>()[0];
}

}  // namespace

// The float interval a per-tensor QuantizeLinear's grid covers, [(qmin - zp) s, (qmax - zp) s].
std::optional<std::pair<double, double>> grid_bounds(const ir::Graph& g, const ir::Node& q) {
  QuantParam p;
  if (ir::read_qdq_params(g, q, p) || !p.per_tensor() || (p.dtype != DType::kUInt8 && p.dtype != DType::kInt8))
    return std::nullopt;
  const double s = p.scale[0], z = p.zero_point[0];
  return std::make_pair((p.qmin() - z) * s, (p.qmax() - z) * s);
}

int fold_activations_into_quantize(ir::Graph& g) {
  int folded = 0;
  std::vector<bool> removed(g.nodes.size(), false);
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& act = g.nodes[i];
    if (!act.domain.empty() || (act.op_type != "Relu" && act.op_type != "Clip")) continue;
    const std::string& x = act.input(0);
    const std::string& y = act.outputs.at(0);
    if (x.empty() || g.is_graph_output(x) || g.is_graph_output(y) || g.producer(x) < 0) continue;
    if (g.consumers(x).size() != 1) continue;  // x's other readers need it unclipped
    const std::vector<int> readers = g.consumers(y);
    std::optional<float> lo = 0.f, hi = INFINITY;
    if (act.op_type == "Clip") lo = clip_bound(g, act, 1, -INFINITY), hi = clip_bound(g, act, 2, INFINITY);
    if (readers.empty() || !lo || !hi) continue;
    // Saturation reproduces the clip when the grid's ends are within half a step inside [lo, hi].
    const bool covered = std::all_of(readers.begin(), readers.end(), [&](int r) {
      const ir::Node& q = g.nodes[static_cast<size_t>(r)];
      if (q.op_type != "QuantizeLinear" || !q.domain.empty()) return false;
      const auto bounds = grid_bounds(g, q);
      if (!bounds) return false;
      const double half_step = (bounds->second - bounds->first) / 255.0 / 2.0;
      return bounds->first + half_step >= *lo && bounds->second - half_step <= *hi;
    });
    if (!covered) continue;
    for (int r : readers) g.nodes[static_cast<size_t>(r)].inputs[0] = x;
    removed[i] = true;
    ++folded;
  }
  std::vector<ir::Node> kept;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (!removed[i]) kept.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(kept);
  g.remove_unused_initializers();
  g.validate();
  return folded;
}

}  // namespace slimquant::quant
