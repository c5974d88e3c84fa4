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
#include <map>
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
  const ir::Graph& src = float_graph_;
  // Layers by node name and weight (unnamed nodes have an empty layer name).
  std::map<std::pair<std::string, std::string>, const Layer*> by_name;
  for (const auto& l : layers_)
    if (!l.weight.empty() && (!only_layers || only_layers->count(l.name))) by_name[{l.name, l.weight}] = &l;

  ir::Graph out = src;
  out.nodes.clear();
  std::set<std::string> quantized_inputs;  // activations whose DynamicQuantizeLinear is written
  const int bits = config_.effective_weight_bits();
  for (const ir::Node& node : src.nodes) {
    auto it = node.inputs.size() > 1 ? by_name.find({node.name, node.inputs[1]}) : by_name.end();
    const bool kind_ok = node.op_type == "MatMul" || node.op_type == "Gemm" || node.op_type == "Conv";
    if (it == by_name.end() || !kind_ok || node.outputs.size() != 1 || node.input(0).empty() ||
        src.is_initializer(node.input(0))) {
      out.nodes.push_back(node);
      continue;
    }
    const Layer& layer = *it->second;
    const Tensor& w = *src.initializer(layer.weight);
    const std::string& x = node.input(0);
    const std::string& y = node.outputs[0];
    const std::string base = node.name.empty() ? y : node.name;

    // The float weight as the integer op reads it, its channel axis and the float bias.
    Tensor weight = w;
    int64_t axis = 0;
    const Tensor* bias = nullptr;
    float bias_scale = 1.f;
    if (node.op_type == "MatMul") {
      if (w.rank() != 2 || node.input(1) != layer.weight) {
        out.nodes.push_back(node);
        continue;
      }
      axis = 1;
    } else if (node.op_type == "Gemm") {
      const std::string& c = node.input(2);
      if (node.attr_int("transA", 0) != 0 || w.rank() != 2 || node.input(1) != layer.weight ||
          (!c.empty() && !src.is_initializer(c))) {
        out.nodes.push_back(node);
        continue;
      }
      weight = gemm_weight_kn(w, node.attr_int("transB", 0) != 0, node.attr_float("alpha", 1.f));
      axis = 1;
      if (!c.empty()) bias = src.initializer(c), bias_scale = node.attr_float("beta", 1.f);
    } else {  // Conv
      const std::string& b = node.input(2);
      if (w.rank() < 3 || node.input(1) != layer.weight || (!b.empty() && !src.is_initializer(b))) {
        out.nodes.push_back(node);
        continue;
      }
      if (!b.empty()) bias = src.initializer(b);
    }
    Layer as_read = layer;
    as_read.weight_axis = axis;
    const QuantParam wp = weight_params(as_read, &weight);
    const Tensor codes = quantize_weight_s8(weight, wp.scale, axis, bits, config_.bias_correction);
    const int64_t channels = weight.dim(axis);

    // The activation's DynamicQuantizeLinear, once per tensor.
    const std::string xq = x + "_quantized", xs = x + "_scale", xz = x + "_zero_point";
    if (quantized_inputs.insert(x).second)
      out.nodes.push_back(make_node("DynamicQuantizeLinear", x + "_QuantizeLinear", {x}, {xq, xs, xz}));

    // A weight read by several layers gets one set per layer after the first (Gemm's alpha and
    // transB make different integers of the same float tensor).
    const std::string wbase = out.initializers.count(layer.weight + "_quantized") ? base + "_" + layer.weight : layer.weight;
    const std::string wq = wbase + "_quantized", wz = wbase + "_zero_point", ws = wbase + "_scale";
    const std::string acc = y + "_output_quantized", accf = y + "_output_quantized_cast_output";
    const std::string scales = y + "_scales_mul";
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
      scale_shape.assign(static_cast<size_t>(w.rank()), 1);
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
    const std::string scaled = y + "_output_scale_mul_output", b = y + "_bias";
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

  out.metadata["slimquant.weight_bits"] = std::to_string(bits);
  out.metadata["slimquant.mode"] = quant_mode_name(QuantMode::kDynamic);
  out.metadata["slimquant.deploy_backend"] = deploy_backend_name(config_.deploy_backend);
  return out;
}

}  // namespace slimquant::quant
