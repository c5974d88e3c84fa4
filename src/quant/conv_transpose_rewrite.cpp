#include "quant/conv_transpose_rewrite.h"

#include <algorithm>

namespace slimquant::quant {

namespace {

using ir::is_onnx_op;

bool all_zero(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [](int64_t e) { return e == 0; });
}

bool all_equal(const std::vector<int64_t>& v, int64_t value) {
  return std::all_of(v.begin(), v.end(), [&](int64_t e) { return e == value; });
}

// What the rewrite reads: the ConvTranspose, its weight's DequantizeLinear and the block size.
struct KernelSizedStride {
  int conv_transpose = -1, weight_dq = -1;
  int64_t block = 0;
};

// The weight DequantizeLinear's constants: s8 [C, M, s, s]; per-tensor scale, or per output
// channel (axis 1, M scales); zero points 0. Returns M, or -1 when the weight is not one of those.
int64_t quantized_weight_channels(const ir::Graph& g, const ir::Node& dq, int64_t block) {
  const Tensor* w = g.initializer(dq.input(0));
  const Tensor* scale = g.initializer(dq.input(1));
  if (!w || !scale || w->dtype() != DType::kInt8 || w->rank() != 4 || w->dim(2) != block || w->dim(3) != block)
    return -1;
  const int64_t m = w->dim(1);
  if (scale->numel() != 1 && (scale->numel() != m || dq.attr_int("axis", 1) != 1)) return -1;
  if (!dq.input(2).empty()) {
    const Tensor* zp = g.initializer(dq.input(2));
    if (!zp || zp->dtype() != DType::kInt8 || zp->numel() != scale->numel()) return -1;
    for (int8_t z : zp->values<int8_t>())
      if (z != 0) return -1;
  }
  return m;
}

std::optional<KernelSizedStride> select_kernel_sized_stride(const ir::Rewriter& ix, int id) {
  const ir::Node& n = ix.node(id);
  if (!is_onnx_op(n, "ConvTranspose") || n.outputs.size() != 1 || n.inputs.size() < 2) return std::nullopt;
  const int x_dq = ix.producer(n.input(0)), w_dq = ix.producer(n.input(1));
  if (x_dq < 0 || w_dq < 0 || !is_onnx_op(ix.node(x_dq), "DequantizeLinear") ||
      !is_onnx_op(ix.node(w_dq), "DequantizeLinear"))
    return std::nullopt;
  const std::vector<int64_t> strides = n.attr_ints("strides");
  if (strides.size() != 2 || strides[0] != strides[1] || strides[0] < 2 || n.attr_int("group", 1) != 1) return std::nullopt;
  const int64_t s = strides[0];
  const std::vector<int64_t> kernel = n.attr_ints("kernel_shape", {s, s});
  // With kernel == strides every auto_pad mode pads nothing: (in-1)*s + k - in*s = 0.
  if (kernel != strides || !all_equal(n.attr_ints("dilations", {1, 1}), 1) || !all_zero(n.attr_ints("pads")) ||
      !all_zero(n.attr_ints("output_padding")) || n.has_attr("output_shape"))
    return std::nullopt;
  const int64_t m = quantized_weight_channels(ix.graph(), ix.node(w_dq), s);
  if (m < 0) return std::nullopt;
  if (!n.input(2).empty()) {
    const Tensor* b = ix.graph().initializer(n.input(2));
    if (!b || b->dtype() != DType::kFloat32 || b->numel() != m) return std::nullopt;
  }
  return KernelSizedStride{id, w_dq, s};
}

// Each of the block*block kernel positions' copy of a per-output-channel vector, in DCR order.
template <typename T>
Tensor repeat_per_position(const Tensor& v, int64_t positions) {
  const int64_t m = v.numel();
  std::vector<T> out(static_cast<size_t>(m * positions));
  for (int64_t p = 0; p < positions; ++p) std::copy_n(v.data<T>(), m, out.begin() + p * m);
  return Tensor::from_vector<T>({m * positions}, out);
}

// W'[(i*s+j)*M + m, c, 0, 0] = W[c, m, i, j].
Tensor pointwise_weight(const Tensor& w) {
  const int64_t c_in = w.dim(0), m = w.dim(1), s = w.dim(2);
  Tensor out(DType::kInt8, {s * s * m, c_in, 1, 1});
  const int8_t* src = w.data<int8_t>();
  int8_t* dst = out.data<int8_t>();
  for (int64_t c = 0; c < c_in; ++c)
    for (int64_t o = 0; o < m; ++o)
      for (int64_t k = 0; k < s * s; ++k) dst[(k * m + o) * c_in + c] = src[(c * m + o) * s * s + k];
  return out;
}

std::string add_initializer(ir::Graph& g, const std::string& base, Tensor t) {
  const std::string name = g.unique_value_name(base);
  g.initializers[name] = std::move(t);
  return name;
}

void apply_kernel_sized_stride(ir::Rewriter& rw, const KernelSizedStride& m) {
  ir::Graph& g = rw.graph();
  const ir::Node ct = rw.node(m.conv_transpose);
  const ir::Node& wdq = rw.node(m.weight_dq);
  const int64_t positions = m.block * m.block;
  const Tensor* scale = g.initializer(wdq.input(1));
  const bool per_channel = scale->numel() > 1;

  ir::Node dq;
  dq.op_type = "DequantizeLinear";
  dq.name = wdq.name.empty() ? std::string() : wdq.name + "_pointwise";
  dq.inputs = {add_initializer(g, wdq.input(0) + "_pointwise", pointwise_weight(*g.initializer(wdq.input(0)))),
               per_channel ? add_initializer(g, wdq.input(1) + "_pointwise", repeat_per_position<float>(*scale, positions))
                           : wdq.input(1)};
  if (!wdq.input(2).empty()) {
    const Tensor* zp = g.initializer(wdq.input(2));
    dq.inputs.push_back(per_channel ? add_initializer(g, wdq.input(2) + "_pointwise", repeat_per_position<int8_t>(*zp, positions))
                                    : wdq.input(2));
  }
  dq.attrs["axis"] = int64_t{0};
  dq.outputs = {g.unique_value_name(dq.inputs[0] + "_dq")};

  ir::Node conv;
  conv.op_type = "Conv";
  conv.name = ct.name;  // reports and profiles keep naming the user's layer
  conv.inputs = {ct.inputs[0], dq.outputs[0]};
  if (!ct.input(2).empty())
    conv.inputs.push_back(add_initializer(g, ct.input(2) + "_pointwise", repeat_per_position<float>(*g.initializer(ct.input(2)), positions)));
  conv.attrs["kernel_shape"] = std::vector<int64_t>{1, 1};
  conv.outputs = {g.unique_value_name(ct.outputs[0] + "_blocks")};

  ir::Node d2s;
  d2s.op_type = "DepthToSpace";
  d2s.name = ct.name.empty() ? std::string() : ct.name + "_depth_to_space";
  d2s.inputs = {conv.outputs[0]};
  d2s.outputs = ct.outputs;
  d2s.attrs["blocksize"] = m.block;
  d2s.attrs["mode"] = std::string("DCR");

  rw.insert_before(m.conv_transpose, std::move(dq));
  rw.insert_before(m.conv_transpose, std::move(conv));
  rw.replace(m.conv_transpose, std::move(d2s));
}

// Elementwise maps with scalar parameters only: they commute with any permutation of elements.
bool elementwise_activation(const ir::Node& n) {
  for (const char* op : {"Relu", "LeakyRelu", "Clip", "Sigmoid", "HardSigmoid", "HardSwish", "Tanh", "Elu"})
    if (is_onnx_op(n, op)) return true;
  return false;
}

struct ActivationAfterDepthToSpace {
  int depth_to_space = -1, activation = -1;
};

}  // namespace

ir::Rule conv_transpose_as_pointwise_conv_rule() {
  return ir::make_rule<KernelSizedStride>("conv_transpose_as_pointwise_conv", select_kernel_sized_stride,
                                          apply_kernel_sized_stride, [](ir::Graph& g) {
                                            g.remove_dead_nodes();
                                            g.remove_unused_initializers();
                                          });
}

ir::Rule commute_activation_above_depth_to_space_rule() {
  auto select = [](const ir::Rewriter& ix, int id) -> std::optional<ActivationAfterDepthToSpace> {
    const ir::Node& d2s = ix.node(id);
    if (!is_onnx_op(d2s, "DepthToSpace") || d2s.outputs.size() != 1) return std::nullopt;
    const int a = ix.sole_reader(d2s.outputs[0], /*read_once=*/true);
    if (a < 0 || !elementwise_activation(ix.node(a)) || ix.node(a).inputs[0] != d2s.outputs[0] ||
        ix.node(a).outputs.size() != 1)
      return std::nullopt;
    // Only ahead of a QuantizeLinear, which then follows it up and ends the convolution's group:
    // a float map gains nothing, and oneDNN's int8 convolutions apply some activations (logistic)
    // several times slower as a post-op than a separate pass does.
    if (ix.sole_reader_op(ix.node(a).outputs[0], "QuantizeLinear") < 0) return std::nullopt;
    return ActivationAfterDepthToSpace{id, a};
  };
  auto apply = [](ir::Rewriter& rw, const ActivationAfterDepthToSpace& m) {
    ir::Node d2s = rw.node(m.depth_to_space), act = rw.node(m.activation);
    const std::string moved = d2s.outputs[0];
    act.inputs[0] = d2s.inputs[0];
    d2s.inputs[0] = moved;  // the value name now carries the activation's (pre-permutation) output
    d2s.outputs[0] = act.outputs[0];
    act.outputs[0] = moved;
    rw.graph().value_info.erase(moved);
    rw.replace(m.depth_to_space, std::move(act));
    rw.replace(m.activation, std::move(d2s));
  };
  return ir::make_rule<ActivationAfterDepthToSpace>("commute_activation_above_depth_to_space", select, apply);
}

}  // namespace slimquant::quant
