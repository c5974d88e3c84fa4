#include "slimquant/quant/prequantized.h"

#include <algorithm>
#include <map>
#include <set>

#include "slimquant/core/error.h"
#include "slimquant/ir/qdq_params.h"
#include "quant/qdq_export.h"

namespace slimquant::quant {
namespace {

bool is_op(const ir::Node& n, const char* op) {
  return (n.domain.empty() || n.domain == "com.microsoft") && n.op_type == op;
}

// The float constant a DequantizeLinear of a constant stands for.
Tensor dequantized_constant(const ir::Graph& g, const ir::Node& dq) {
  SQ_CHECK(!dq.has_attr("block_size") || dq.attr_int("block_size", 0) == 0, ErrorKind::kUnsupported,
           dq.describe() + ": blocked weights (block_size) cannot be requantized");
  const QuantParam p = ir::qdq_params(g, dq);
  const Tensor& codes = *g.initializer(dq.inputs[0]);
  const std::vector<float> q = codes.to_float_vector();
  Tensor out(DType::kFloat32, codes.shape());
  float* y = out.data<float>();
  int64_t inner = 1;
  if (!p.per_tensor())
    for (size_t d = static_cast<size_t>(p.axis) + 1; d < codes.rank(); ++d) inner *= codes.dim(d);
  const int64_t channels = static_cast<int64_t>(p.scale.size());
  for (int64_t i = 0; i < codes.numel(); ++i) {
    const int64_t c = p.per_tensor() ? 0 : (i / inner) % channels;
    y[i] = (q[static_cast<size_t>(i)] - static_cast<float>(p.zero_point[static_cast<size_t>(c)])) * p.scale[static_cast<size_t>(c)];
  }
  return out;
}

void rename_reads(ir::Graph& g, const std::string& from, const std::string& to) {
  for (auto& n : g.nodes)
    for (auto& in : n.inputs)
      if (in == from) in = to;
}

}  // namespace

std::string QuantizedFormFound::describe() const {
  if (form == QuantizedForm::kNone) return "";
  std::string s = form == QuantizedForm::kStaticQdq   ? "static QDQ ("
                  : form == QuantizedForm::kQOperator ? "QOperator ("
                                                      : "dynamic (";
  bool first = true;
  for (const auto& [op, count] : op_counts) {
    s += (first ? "" : ", ") + std::to_string(count) + " " + op;
    first = false;
  }
  return s + ")";
}

QuantizedFormFound find_quantized_form(const ir::Graph& g) {
  static const std::set<std::string> qoperator = {
      "QLinearConv",     "QLinearMatMul",   "QLinearAdd",     "QLinearMul",      "QLinearConcat",
      "QLinearGlobalAveragePool", "QLinearAveragePool", "QLinearSigmoid", "QLinearLeakyRelu",
      "QLinearSoftmax",  "QLinearReduceMean", "QLinearWhere", "QGemm",          "QAttention"};
  static const std::set<std::string> dynamic = {"DynamicQuantizeLinear", "ConvInteger", "MatMulInteger",
                                                "DynamicQuantizeMatMul", "MatMulIntegerToFloat", "DynamicQuantizeLSTM"};
  static const std::set<std::string> qdq = {"QuantizeLinear", "DequantizeLinear"};
  QuantizedFormFound found;
  std::map<std::string, int> of_qoperator, of_dynamic, of_qdq;
  for (const auto& n : g.nodes) {
    if (!n.domain.empty() && n.domain != "com.microsoft") continue;
    if (qoperator.count(n.op_type)) ++of_qoperator[n.op_type];
    if (dynamic.count(n.op_type)) ++of_dynamic[n.op_type];
    if (qdq.count(n.op_type)) ++of_qdq[n.op_type];
  }
  // The integer ops tell the form; Q/DQ nodes appear around them too.
  if (!of_qoperator.empty()) found = {QuantizedForm::kQOperator, of_qoperator};
  else if (!of_dynamic.empty()) found = {QuantizedForm::kDynamic, of_dynamic};
  else if (!of_qdq.empty()) found = {QuantizedForm::kStaticQdq, of_qdq};
  return found;
}

ir::Graph dequantized_model(const ir::Graph& source) {
  ir::Graph g = source;
  // Weights: DequantizeLinear of a constant -> the float constant, under the DQ's output name.
  std::vector<ir::Node> kept;
  for (const auto& n : g.nodes) {
    const bool constant_dq = is_op(n, "DequantizeLinear") && g.is_initializer(n.input(0)) && n.outputs.size() == 1 &&
                             !g.is_graph_output(n.outputs[0]);
    if (!constant_dq) {
      kept.push_back(n);
      continue;
    }
    g.initializers[n.outputs[0]] = dequantized_constant(g, n);
  }
  g.nodes = std::move(kept);
  // Activations: QuantizeLinear -> DequantizeLinear on a value -> the value itself.
  std::set<size_t> removed;
  std::map<size_t, ir::Node> clamps;  // a Clip in place of a removed DequantizeLinear
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& q = g.nodes[i];
    if (!is_op(q, "QuantizeLinear") || q.outputs.size() != 1 || g.is_graph_output(q.outputs[0])) continue;
    const std::vector<int> readers = g.consumers(q.outputs[0]);
    const bool all_dq = !readers.empty() && std::all_of(readers.begin(), readers.end(), [&](int r) {
      const ir::Node& d = g.nodes[static_cast<size_t>(r)];
      return is_op(d, "DequantizeLinear") && d.input(0) == q.outputs[0] && !g.is_graph_output(d.outputs[0]);
    });
    if (!all_dq) continue;
    const std::string value = q.inputs[0];
    // A grid without negative values clamps: ONNX Runtime's quantizer folds a Relu or Clip into the
    // QuantizeLinear after it, so the pair is the model's activation, kept as a Clip to the grid.
    // (Not after an op that already bounds its output: our own exports keep their Relu.)
    static const std::set<std::string> kBounded = {"Relu", "Clip", "Sigmoid", "HardSigmoid", "Softmax"};
    const int producer = g.producer(value);
    const bool bounded = producer >= 0 && kBounded.count(g.nodes[static_cast<size_t>(producer)].op_type);
    const std::optional<std::pair<double, double>> grid = grid_bounds(g, q);
    if (grid && grid->first >= 0.0 && !bounded) {
      ir::Node clip;
      clip.op_type = "Clip";
      clip.name = q.name.empty() ? "" : q.name + "_clip";
      clip.inputs = {value};
      if (g.opset < 11) {  // bounds are attributes before opset 11
        clip.attrs["min"] = static_cast<float>(grid->first);
        clip.attrs["max"] = static_cast<float>(grid->second);
      } else {
        const std::string lo = g.unique_value_name(value + "_clip_min"), hi = g.unique_value_name(value + "_clip_max");
        g.initializers[lo] = Tensor::scalar(static_cast<float>(grid->first));
        g.initializers[hi] = Tensor::scalar(static_cast<float>(grid->second));
        clip.inputs.push_back(lo);
        clip.inputs.push_back(hi);
      }
      clip.outputs = {g.nodes[static_cast<size_t>(readers[0])].outputs[0]};
      for (size_t k = 1; k < readers.size(); ++k) rename_reads(g, g.nodes[static_cast<size_t>(readers[k])].outputs[0], clip.outputs[0]);
      clamps.emplace(static_cast<size_t>(readers[0]), std::move(clip));
    } else {
      for (int r : readers) rename_reads(g, g.nodes[static_cast<size_t>(r)].outputs[0], value);
    }
    for (int r : readers) removed.insert(static_cast<size_t>(r));
    removed.insert(i);
  }
  std::vector<ir::Node> remaining;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    if (auto c = clamps.find(i); c != clamps.end()) remaining.push_back(std::move(c->second));
    else if (!removed.count(i)) remaining.push_back(std::move(g.nodes[i]));
  g.nodes = std::move(remaining);
  g.value_info.clear();  // types of removed integer values; sessions infer again
  g.remove_unused_initializers();
  g.metadata.erase("slimquant.weight_bits");
  g.metadata.erase("slimquant.deploy_backend");
  g.metadata.erase("slimquant.float_layers");
  g.validate();
  return g;
}

}  // namespace slimquant::quant
