// PTQ::convert_dynamic: the dynamic quantization graph (QuantMode::kDynamic), written as ONNX
// Runtime's quantize_dynamic writes it, for each MatMul / Gemm / Conv with a constant weight:
//
//   x -> DynamicQuantizeLinear -> x_q (u8), s_x, z_x          (one per activation, shared by readers)
//   MatMul / Gemm: MatMulInteger(x_q, w_q s8 [K, N], z_x, z_w = 0 s8 [N])            -> acc (s32)
//   Conv:          ConvInteger(x_q, w_q + 128 as u8, z_x, z_w = 128 u8 per tensor)   -> acc (s32)
//   y = Cast(acc -> float) * (s_x * s_w[c])  (+ bias: Conv's B, Gemm's beta * C)
//
// The weights are symmetric per output channel (s_w[c] = the weight observer's scale, codes in
// [-127, 127]); the per-channel scales live in the Mul, so the integer ops need only a zero point.
// ConvInteger's weights are u8 with one zero point 128 (u8 = s8 + 128: the same products): ONNX
// Runtime 1.20.1 has no ConvInteger for s8 weights and 1.30.0 refuses a per-channel w_zero_point
// (docs/quantization.md, "Dynamic mode"). Gemm folds alpha into the weight and transB into its
// layout (transA = 1 stays float). Everything else stays float.
#include <array>
#include <map>
#include <optional>
#include <set>
#include <utility>

#include "slimquant/core/error.h"
#include "slimquant/quant/ptq.h"

namespace slimquant::quant {

namespace {

ir::Node make_node(std::string op, std::string name, std::vector<std::string> inputs, std::vector<std::string> outputs) {
  ir::Node n;
  n.op_type = std::move(op);
  n.name = std::move(name);
  n.inputs = std::move(inputs);
  n.outputs = std::move(outputs);
  return n;
}

// [M, K] -> [K, N] = alpha * W^T (transB) or alpha * W.
Tensor gemm_weight_kn(const Tensor& w, bool trans_b, float alpha) {
  const int64_t rows = w.dim(0), cols = w.dim(1);
  Tensor out(DType::kFloat32, trans_b ? Shape{cols, rows} : Shape{rows, cols});
  const float* src = w.data<float>();
  float* dst = out.data<float>();
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t c = 0; c < cols; ++c) dst[trans_b ? c * rows + r : r * cols + c] = alpha * src[r * cols + c];
  return out;
}

}  // namespace

ir::Graph PTQ::convert_dynamic(const std::optional<std::set<std::string>>& only_layers) const {
  SQ_CHECK(session_ != nullptr, ErrorKind::kInvalidArgument, "PTQ::convert_dynamic called before quantize()");
  ir::Graph out = write_dynamic(float_graph_, only_layers);
  out.metadata["slimquant.weight_bits"] = std::to_string(config_.effective_weight_bits());
  out.metadata["slimquant.mode"] = quant_mode_name(QuantMode::kDynamic);
  out.metadata["slimquant.deploy_backend"] = deploy_backend_name(config_.deploy_backend);
  return out;
}

bool PTQ::dynamic_applies(const Layer& layer) const {
  const auto it = layer_nodes_.find(layer.name);
  return !layer.weight.empty() && it != layer_nodes_.end() && has_dynamic_form(float_graph_.nodes[it->second], layer);
}

bool PTQ::has_dynamic_form(const ir::Node& node, const Layer& layer) const {
  const bool kind_ok = node.op_type == "MatMul" || node.op_type == "Gemm" || node.op_type == "Conv";
  if (!kind_ok || node.outputs.size() != 1 || node.inputs.size() < 2 || node.input(0).empty() ||
      node.input(1) != layer.weight || float_graph_.is_initializer(node.input(0)))
    return false;
  const Tensor* w = float_graph_.initializer(layer.weight);
  if (!w) return false;
  if (node.op_type == "MatMul") return w->rank() == 2;
  const std::string& extra = node.input(2);  // Gemm's C, Conv's bias
  if (!extra.empty() && !float_graph_.is_initializer(extra)) return false;
  if (node.op_type == "Gemm") return node.attr_int("transA", 0) == 0 && w->rank() == 2;
  return w->rank() >= 3;
}

std::optional<PTQ::DynamicForm> PTQ::dynamic_form_of(const ir::Node& node, const Layer& layer) const {
  if (!has_dynamic_form(node, layer)) return std::nullopt;
  DynamicForm form;
  form.weight = *float_graph_.initializer(layer.weight);
  form.axis = node.op_type == "Conv" ? 0 : 1;
  const std::string& extra = node.input(2);
  if (!extra.empty()) form.bias = float_graph_.initializer(extra);
  if (node.op_type == "Gemm") {
    form.weight = gemm_weight_kn(form.weight, node.attr_int("transB", 0) != 0, node.attr_float("alpha", 1.f));
    form.bias_scale = node.attr_float("beta", 1.f);
  }
  return form;
}

ir::Graph PTQ::write_dynamic(const ir::Graph& src, const std::optional<std::set<std::string>>& only_layers) const {
  // Layers by node name and weight (unnamed nodes have an empty layer name).
  std::map<std::pair<std::string, std::string>, const Layer*> by_name;
  for (const auto& l : layers_)
    if (!l.weight.empty() && (!only_layers || only_layers->count(l.name))) by_name[{l.name, l.weight}] = &l;

  // New value names never take one `src` already uses (a static neighbour's Q/DQ names, say).
  ir::ValueNames names(src);

  ir::Graph out = src;
  out.nodes.clear();
  std::map<std::string, std::array<std::string, 3>> quantized_inputs;  // activation -> its codes, scale, zero point
  const int bits = config_.effective_weight_bits();
  for (const ir::Node& node : src.nodes) {
    auto it = node.inputs.size() > 1 ? by_name.find({node.name, node.inputs[1]}) : by_name.end();
    const std::optional<DynamicForm> form = it == by_name.end() ? std::nullopt : dynamic_form_of(node, *it->second);
    if (!form || src.is_initializer(node.input(0))) {
      out.nodes.push_back(node);
      continue;
    }
    const Layer& layer = *it->second;
    const std::string& x = node.input(0);
    const std::string& y = node.outputs[0];
    const std::string base = node.name.empty() ? y : node.name;
    const Tensor& weight = form->weight;
    const int64_t axis = form->axis;
    const Tensor* bias = form->bias;
    const float bias_scale = form->bias_scale;
    Layer as_read = layer;
    as_read.weight_axis = axis;
    const QuantParam wp = weight_params(as_read, &weight);
    const Tensor codes = quantize_weight_s8(weight, wp.scale, axis, bits, config_.bias_correction);
    const int64_t channels = weight.dim(axis);

    // The activation's DynamicQuantizeLinear, once per tensor.
    if (!quantized_inputs.count(x)) {
      quantized_inputs[x] = {names.fresh(x + "_quantized"), names.fresh(x + "_scale"),
                             names.fresh(x + "_zero_point")};
      const auto& [q, sc, zp] = quantized_inputs[x];
      out.nodes.push_back(make_node("DynamicQuantizeLinear", x + "_QuantizeLinear", {x}, {q, sc, zp}));
    }
    const auto& [xq, xs, xz] = quantized_inputs[x];

    // A weight read by several layers gets one set per layer after the first (Gemm's alpha and
    // transB make different integers of the same float tensor).
    const std::string wbase = out.initializers.count(layer.weight + "_quantized") ? base + "_" + layer.weight : layer.weight;
    const std::string wq = names.fresh(wbase + "_quantized"), wz = names.fresh(wbase + "_zero_point"),
                      ws = names.fresh(wbase + "_scale");
    const std::string acc = names.fresh(y + "_output_quantized"),
                      accf = names.fresh(y + "_output_quantized_cast_output");
    const std::string scales = names.fresh(y + "_scales_mul");
    Shape scale_shape{channels};
    if (node.op_type == "Conv") {
      // u8 = s8 + 128 with one zero point 128 (see the top of the file).
      Tensor u8(DType::kUInt8, codes.shape());
      for (int64_t i = 0; i < codes.numel(); ++i)
        u8.data<uint8_t>()[i] = static_cast<uint8_t>(int32_t{codes.data<int8_t>()[i]} + 128);
      out.initializers[wq] = u8;
      out.initializers[wz] = Tensor::scalar<uint8_t>(128);
      ir::Node conv = make_node("ConvInteger", base + "_quant", {xq, wq, xz, wz}, {acc});
      for (const char* a : {"auto_pad", "dilations", "group", "kernel_shape", "pads", "strides"})
        if (node.has_attr(a)) conv.attrs[a] = node.attrs.at(a);
      out.nodes.push_back(std::move(conv));
      scale_shape.assign(static_cast<size_t>(weight.rank()), 1);
      scale_shape[1] = channels;
    } else {
      out.initializers[wq] = codes;
      out.initializers[wz] = Tensor(DType::kInt8, {channels});  // zeros: symmetric per column
      out.nodes.push_back(make_node("MatMulInteger", base + "_quant", {xq, wq, xz, wz}, {acc}));
    }
    out.initializers[ws] = Tensor::from_vector<float>(scale_shape, wp.scale);
    ir::Node cast = make_node("Cast", acc + "_cast", {acc}, {accf});
    cast.attrs["to"] = int64_t{1};  // FLOAT
    out.nodes.push_back(std::move(cast));
    out.nodes.push_back(make_node("Mul", base + "_scales_mul", {xs, ws}, {scales}));
    if (!bias) {
      out.nodes.push_back(make_node("Mul", base + "_output_scale_mul", {accf, scales}, {y}));
      continue;
    }
    const std::string scaled = names.fresh(y + "_output_scale_mul_output"), b = names.fresh(y + "_bias");
    out.nodes.push_back(make_node("Mul", base + "_output_scale_mul", {accf, scales}, {scaled}));
    Tensor bias_t = bias->cast(DType::kFloat32);
    if (node.op_type == "Conv") {
      bias_t = Tensor::from_vector<float>(scale_shape, {bias_t.values<float>().begin(), bias_t.values<float>().end()});
    } else {
      for (int64_t i = 0; i < bias_t.numel(); ++i) bias_t.data<float>()[i] *= bias_scale;
    }
    out.initializers[b] = bias_t;
    out.nodes.push_back(make_node("Add", base + "_bias_add", {scaled, b}, {y}));
  }
  // The float weights and biases nothing reads any more.
  std::set<std::string> read;
  for (const auto& n : out.nodes) read.insert(n.inputs.begin(), n.inputs.end());
  for (const auto& o : out.outputs) read.insert(o.name);
  std::erase_if(out.initializers, [&](const auto& kv) { return !read.count(kv.first); });

  return out;
}

}  // namespace slimquant::quant
