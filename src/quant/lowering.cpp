// INT8 lowering: selectors recognise QDQ groups, the action writes one fused com.slimquant node
// per group (the contract with the kernels is runtime/kernels/integer/int8_common.h).
#include "slimquant/quant/lowering.h"

#include <algorithm>
#include <cmath>
#include <optional>
#include <unordered_map>
#include <unordered_set>

#include "quant/conv_transpose_rewrite.h"
#include "runtime/fused_ops/fused_activation.h"
#include "runtime/kernels/integer/int8_common.h"
#include "slimquant/ir/passes.h"
#include "slimquant/ir/qdq_params.h"
#include "slimquant/ir/rewrite.h"
#include "slimquant/runtime/optimize.h"

namespace slimquant::quant {

namespace {

namespace i8 = runtime::int8;

bool is_op(const ir::Node& n, const char* op) { return ir::is_onnx_op(n, op); }

// Ops a per-tensor QuantizeLinear commutes with, reading their data from input 0: MaxPool
// (quantization is monotonic, so the max of the quantized values is the quantized max) and the
// data-movement ops (they only move or relabel elements; other inputs such as Reshape's shape stay).
bool quantize_commutes_with(const ir::Node& n) {
  for (const char* op : {"MaxPool", "Transpose", "Reshape", "Flatten", "Squeeze", "Unsqueeze", "Identity",
                         "DepthToSpace", "SpaceToDepth"})
    if (is_op(n, op)) return true;
  return false;
}

// ir's index plus what the selector asks about element types and ranks.
class GraphIndex : public ir::GraphIndex {
 public:
  explicit GraphIndex(const ir::Graph& g) : ir::GraphIndex(g) {}

  // The node that alone reads v, in one input slot, when v is not a graph output either; -1 otherwise.
  int sole_consumer(const std::string& v) const { return sole_reader(v, /*read_once=*/true); }
  // The value's element type as far as the graph states it.
  DType dtype(const std::string& v) const {
    const ir::Graph& g = graph();
    if (const Tensor* t = g.initializer(v)) return t->dtype();
    if (const ir::ValueInfo* vi = g.find_value_info(v); vi && vi->dtype != DType::kUndefined) return vi->dtype;
    const int p = producer(v);
    if (p >= 0 && is_op(g.nodes[p], "QuantizeLinear")) {
      const std::string& zp = g.nodes[p].input(2);
      if (zp.empty()) return DType::kUInt8;  // QuantizeLinear's default output type
      if (const Tensor* t = g.initializer(zp)) return t->dtype();
    }
    // Through the ops a QuantizeLinear was moved above: they keep the element type.
    if (p >= 0 && quantize_commutes_with(g.nodes[p])) return dtype(g.nodes[p].input(0));
    return DType::kUndefined;
  }
  int64_t rank(const std::string& v) const {
    if (const Tensor* t = graph().initializer(v)) return static_cast<int64_t>(t->rank());
    if (const ir::ValueInfo* vi = graph().find_value_info(v); vi && vi->dims) return static_cast<int64_t>(vi->dims->size());
    return -1;
  }
};

// Errors are values inside the selector: each check returns a reason, or nothing when it passes.
using Why = std::optional<std::string>;

// Scale / zero point / axis of a QuantizeLinear or DequantizeLinear node (ir::read_qdq_params, with
// the input's element type as the index traces it). known_rank: the rank of its input when the
// caller knows it better than the graph's value infos (-1: look it up).
Why read_qparams(const GraphIndex& ix, const ir::Node& n, QuantParam& p, int64_t known_rank = -1) {
  const std::string& x = n.inputs.at(0);
  return ir::read_qdq_params(ix.graph(), n, p, {ix.dtype(x), known_rank >= 0 ? known_rank : ix.rank(x)});
}

bool is_8bit(DType t) { return t == DType::kUInt8 || t == DType::kInt8; }

// The activation a node applies (Clip: when its bounds are constants), with its parameters, in the
// integer kernels' attributes.
Why read_activation(const ir::Graph& g, const ir::Node& n, i8::QLinearAttrs& q) {
  const std::optional<runtime::fused_ops::FusedActivation> a = runtime::fused_ops::read_activation_node(g, n);
  if (!a) return "not an activation";
  q.activation = a->kind;
  if (a->kind == i8::Activation::kClip) {
    q.activation_min = a->alpha;
    q.activation_max = a->beta;
  } else {
    q.activation_alpha = a->alpha;
    q.activation_beta = a->beta;
  }
  return std::nullopt;
}

// Takes a Mul by a positive scalar constant that alone reads a MatMul's result `cur` into the group:
// it becomes a factor of the output scale (attention's 1 / sqrt(d) written after Q K^T).
void take_scale_mul(const GraphIndex& ix, QdqGroup& grp, std::string& cur) {
  const ir::Graph& g = ix.graph();
  const int c = ix.sole_consumer(cur);
  if (c < 0 || !is_op(g.nodes[c], "Mul")) return;
  const std::optional<float> factor = ir::scalar_constant(g, ir::other_input(g.nodes[c], cur));
  if (!factor || !(*factor > 0.f) || !std::isfinite(*factor)) return;
  grp.scale_mul = c;
  grp.output_factor = *factor;
  cur = g.nodes[c].outputs.at(0);
}

// x * Sigmoid(x) (swish) or x * HardSigmoid(x; 1/6, 0.5) (hard-swish before opset 14): the gate
// reads x, its output is read by Mul(x, gate) alone, and x has no other reader.
struct GatedActivation {
  int gate = -1, mul = -1;
};
std::optional<GatedActivation> match_gated_activation(const GraphIndex& ix, const std::string& x) {
  if (!ix.is_private(x) || ix.readers(x).size() != 2) return std::nullopt;
  for (int gate : ix.readers(x)) {
    const ir::Node& n = ix.node(gate);
    const bool sigmoid = is_op(n, "Sigmoid");
    const bool hard_sigmoid = is_op(n, "HardSigmoid") && std::fabs(n.attr_float("alpha", 0.2f) - 1.f / 6.f) <= 1e-6f &&
                              std::fabs(n.attr_float("beta", 0.5f) - 0.5f) <= 1e-6f;
    if (!(sigmoid || hard_sigmoid) || n.inputs.size() != 1 || n.outputs.size() != 1) continue;
    const std::string& s = n.outputs[0];
    const int mul = ix.sole_reader(s);
    if (mul < 0) continue;
    const ir::Node& m = ix.node(mul);
    const bool reads_x_and_s = m.inputs.size() == 2 && ((m.inputs[0] == x && m.inputs[1] == s) || (m.inputs[0] == s && m.inputs[1] == x));
    if (is_op(m, "Mul") && reads_x_and_s) return GatedActivation{gate, mul};
  }
  return std::nullopt;
}

// The activation a group took in: a gated one (by its gate), else its one node.
void read_group_activation(const ir::Graph& g, const QdqGroup& grp, i8::QLinearAttrs& q) {
  if (grp.gate >= 0) {
    const bool swish = g.nodes[grp.gate].op_type == "Sigmoid";
    q.activation = swish ? i8::Activation::kSwish : i8::Activation::kHardSwish;
    if (swish) q.activation_alpha = 1.f;
  } else if (grp.activation >= 0) {
    read_activation(g, g.nodes[grp.activation], q);
  }
}

// Takes the activation that alone reads `cur` into the group (one node, or the erf GELU chain
// PyTorch exports) and moves `cur` to its output.
void take_activation(const GraphIndex& ix, QdqGroup& grp, std::string& cur) {
  const ir::Graph& g = ix.graph();
  const int c = ix.sole_consumer(cur);
  i8::QLinearAttrs probe;
  if (c >= 0 && g.nodes[c].outputs.size() == 1 && !read_activation(g, g.nodes[c], probe)) {
    grp.activation = c;
    cur = g.nodes[c].outputs[0];
    return;
  }
  std::string out;
  std::vector<int> gelu = ir::match_erf_gelu(ix, cur, out);
  if (!gelu.empty()) {
    grp.gelu_chain = std::move(gelu);
    cur = out;
    return;
  }
  // Right after the layer only (the hard-swish and swish spellings the exporters write there).
  if (ix.producer(cur) != grp.target) return;
  if (const std::optional<GatedActivation> gated = match_gated_activation(ix, cur)) {
    grp.gate = gated->gate;
    grp.activation = gated->mul;
    cur = g.nodes[gated->mul].outputs[0];
  }
}

// Takes a Mul and then an Add by scalar float constants after an activation computed in real units
// (PPLCNetV3: hard-swish -> Mul -> Add -> Q) into the group as the post affine map.
void take_post_affine(const GraphIndex& ix, QdqGroup& grp, std::string& cur) {
  const ir::Graph& g = ix.graph();
  i8::QLinearAttrs probe;
  read_group_activation(g, grp, probe);
  if (!grp.gelu_chain.empty()) probe.activation = i8::Activation::kGelu;
  if (!probe.real_units()) return;
  for (const char* op : {"Mul", "Add"}) {
    const int c = ix.sole_consumer(cur);
    if (c < 0 || !is_op(g.nodes[c], op) || g.nodes[c].outputs.size() != 1) continue;
    const std::string k = ir::other_input(g.nodes[c], cur);
    const std::optional<float> v = ir::scalar_constant(g, k);
    if (!v || !std::isfinite(*v) || g.initializer(k)->rank() > 1) continue;  // rank <= 1: no broadcast
    if (op == std::string("Mul")) {
      grp.post_mul = c;
      grp.post_scale = *v;
    } else {
      grp.post_add = c;
      grp.post_shift = *v;
    }
    cur = g.nodes[c].outputs[0];
  }
}

// Takes the QuantizeLinear that alone reads the group's output into the group (integer output):
// per tensor, or for a Conv also per output channel (axis 1) with zero point 0, the channel-wise
// input of the next convolution (PTQ::set_channel_wise_conv_inputs).
Why end_in_quantize(const GraphIndex& ix, const LoweringOptions& options, QdqGroup& grp) {
  if (!options.fuse_output_quantize) return std::nullopt;
  const ir::Graph& g = ix.graph();
  const int c = ix.sole_consumer(grp.output);
  if (c < 0 || !is_op(g.nodes[c], "QuantizeLinear") || g.nodes[c].inputs[0] != grp.output) return std::nullopt;
  QuantParam y;
  // A Conv's output has the rank of its weight.
  const Tensor* w = grp.op == LoweredOp::kConv ? g.initializer(grp.w_q) : nullptr;
  if (read_qparams(ix, g.nodes[c], y, w ? static_cast<int64_t>(w->rank()) : -1) || !is_8bit(y.dtype)) return std::nullopt;
  if (!y.per_tensor()) {
    const bool zero = std::all_of(y.zero_point.begin(), y.zero_point.end(), [](int32_t z) { return z == 0; });
    if (!w || y.axis != 1 || !zero || static_cast<int64_t>(y.scale.size()) != w->dim(0)) return std::nullopt;
  }
  grp.y = y;
  grp.q_output = c;
  grp.output = g.nodes[c].outputs.at(0);
  return std::nullopt;
}

// x: a per-tensor u8/s8 activation, read through DequantizeLinear node dqx.
Why select_activation_input(const GraphIndex& ix, const ir::Node& dqx, QdqGroup& grp) {
  grp.x_q = dqx.inputs.at(0);
  if (ix.graph().is_initializer(grp.x_q)) return std::string("input 0 is a constant, not an activation");
  if (Why why = read_qparams(ix, dqx, grp.x)) return why;
  if (!grp.x.per_tensor()) return std::string("the activation is quantized per channel; integer kernels need per tensor");
  if (!is_8bit(grp.x.dtype)) return std::string("the activation is ") + dtype_name(grp.x.dtype) + ", not uint8/int8";
  const int32_t x_lo = grp.x.dtype == DType::kUInt8 ? 0 : -128, x_hi = grp.x.dtype == DType::kUInt8 ? 255 : 127;
  if (grp.x.zero_point[0] < x_lo || grp.x.zero_point[0] > x_hi) return std::string("the activation zero point is out of range");
  return std::nullopt;
}

// Activation x activation: oneDNN's int8 matmul takes the second operand as s8 "weights".
Why select_runtime_weight(const GraphIndex& ix, const ir::Node& dqw, const LoweringOptions& options, QdqGroup& grp) {
  if (!options.activation_matmul)
    return std::string("input 1 is an activation (activation x activation MatMul lowering is disabled)");
  if (Why why = read_qparams(ix, dqw, grp.w)) return why;
  if (!grp.w.per_tensor()) return std::string("input 1 is an activation quantized per channel");
  if (grp.w.dtype != DType::kInt8 || grp.w.zero_point[0] != 0)
    return std::string("input 1 is an activation that is not int8 with zero point 0 (activation x activation "
                       "MatMul needs an s8 symmetric second operand)");
  grp.runtime_weight = true;
  return std::nullopt;
}

// w: a constant s8 weight with zero point 0, per tensor or per output channel; sets `channels`.
Why select_constant_weight(const GraphIndex& ix, const ir::Node& n, const LoweredFamily& family, const ir::Node& dqw,
                           const Tensor& w, QdqGroup& grp, int64_t& channels) {
  if (w.dtype() != DType::kInt8)
    return std::string("the weight is ") + dtype_name(w.dtype()) + "; integer kernels need int8 weights";
  if (Why why = read_qparams(ix, dqw, grp.w)) return why;
  for (int32_t z : grp.w.zero_point)
    if (z != 0) return "weight zero point must be 0 for s8 weights (got " + std::to_string(z) + ")";
  const int64_t axis = family.weight_channel_axis(n, w);
  if (axis < 0) return "the weight of shape " + shape_str(w.shape()) + " is not one the integer kernel takes";
  if (!grp.w.per_tensor()) {
    if (grp.w.axis != axis)
      return "the weight is quantized along axis " + std::to_string(grp.w.axis) + "; integer kernels need the "
             "output-channel axis " + std::to_string(axis);
    if (static_cast<int64_t>(grp.w.scale.size()) != w.dim(static_cast<size_t>(axis)))
      return std::string("the weight has a scale count that does not match its channels");
  }
  channels = w.dim(static_cast<size_t>(axis));
  return std::nullopt;
}

// Bias: Conv's B / Gemm's C, float32 or DequantizeLinear(int32) constants of one value per channel.
Why select_bias(const GraphIndex& ix, const std::string& b, int64_t channels, QdqGroup& grp) {
  const ir::Graph& g = ix.graph();
  const Tensor* bt = g.initializer(b);
  const int pb = ix.producer(b);
  if (!bt && pb >= 0 && is_op(g.nodes[pb], "DequantizeLinear")) {
    bt = g.initializer(g.nodes[pb].inputs.at(0));
    if (!bt || bt->dtype() != DType::kInt32) return std::string("the dequantized bias is not an int32 constant");
    QuantParam bp;
    if (Why why = read_qparams(ix, g.nodes[pb], bp)) return why;
    grp.quantized_bias = true;
    grp.dq_inputs.push_back(pb);
  } else if (!bt || bt->dtype() != DType::kFloat32) {
    return std::string("the bias is not a float32 constant");
  }
  const bool shape_ok = bt->numel() == channels && (bt->rank() == 1 || (bt->rank() == 2 && bt->dim(0) == 1));
  if (!shape_ok) return "the bias of shape " + shape_str(bt->shape()) + " is not one value per output channel";
  return std::nullopt;
}

// MatMul -> Add(constant [channels]) that alone reads `cur`: the fused node's bias.
void take_bias_add(const GraphIndex& ix, int64_t channels, QdqGroup& grp, std::string& cur) {
  const ir::Graph& g = ix.graph();
  const int c = ix.sole_consumer(cur);
  if (c < 0 || !is_op(g.nodes[c], "Add") || g.nodes[c].inputs.size() != 2) return;
  const ir::Node& add = g.nodes[c];
  const std::string& other = add.inputs[0] == cur ? add.inputs[1] : add.inputs[0];
  const Tensor* bt = g.initializer(other);
  if (bt && bt->dtype() == DType::kFloat32 && bt->rank() == 1 && bt->numel() == channels) {
    grp.bias_add = c;
    cur = add.outputs.at(0);
  }
}

// The chain after the target: [Mul(scalar)] [Add(bias)] [activation [post affine]] [QuantizeLinear].
// channels < 0: a run-time weight (no bias Add, no post affine map).
Why select_tail(const GraphIndex& ix, const LoweredFamily& family, const LoweringOptions& options, int64_t channels,
                QdqGroup& grp) {
  std::string cur = ix.graph().nodes[grp.target].outputs[0];
  if (family.matmul_tail) take_scale_mul(ix, grp, cur);
  if (family.matmul_tail && channels >= 0 && options.fuse_matmul_bias) take_bias_add(ix, channels, grp, cur);
  if (options.fuse_activation) {
    take_activation(ix, grp, cur);
    if (channels >= 0) take_post_affine(ix, grp, cur);
  }
  grp.output = cur;
  return end_in_quantize(ix, options, grp);
}

// Checks a candidate and fills the group; returns the reason when it cannot be lowered.
Why select_group(const GraphIndex& ix, int t, const LoweredFamily& family, const LoweringOptions& options, QdqGroup& grp) {
  const ir::Graph& g = ix.graph();
  const ir::Node& n = g.nodes[t];
  grp.op = family.op;
  grp.target = t;
  if (n.outputs.size() != 1) return std::string("it has more than one output");
  const int px = ix.producer(n.input(0)), pw = ix.producer(n.input(1));
  const bool x_dq = px >= 0 && is_op(g.nodes[px], "DequantizeLinear");
  const bool w_dq = pw >= 0 && is_op(g.nodes[pw], "DequantizeLinear");
  if (!x_dq) return std::string("input 0 is not dequantized (a float activation stays in simulation)");
  if (!w_dq) return std::string("input 1 is not dequantized");
  if (Why why = select_activation_input(ix, g.nodes[px], grp)) return why;
  grp.w_q = g.nodes[pw].inputs.at(0);
  const Tensor* w = g.initializer(grp.w_q);
  if (!w && family.runtime_weight) {
    if (Why why = select_runtime_weight(ix, g.nodes[pw], options, grp)) return why;
    grp.dq_inputs = {px, pw};
    return select_tail(ix, family, options, -1, grp);
  }
  if (!w) return std::string("the weight is not a constant");
  int64_t channels = 0;
  if (Why why = select_constant_weight(ix, n, family, g.nodes[pw], *w, grp, channels)) return why;
  grp.dq_inputs = {px, pw};
  if (family.check_attributes)
    if (Why why = family.check_attributes(n)) return why;
  if (family.bias_input && !n.input(2).empty())
    if (Why why = select_bias(ix, n.input(2), channels, grp)) return why;
  return select_tail(ix, family, options, channels, grp);
}

// The output-channel axis of each family's weight, or -1 when the layout is not one its kernel takes.
int64_t conv_weight_axis(const ir::Node&, const Tensor& w) { return w.rank() >= 3 && w.rank() <= 5 ? 0 : -1; }
int64_t gemm_weight_axis(const ir::Node& n, const Tensor& w) {
  return w.rank() == 2 ? (n.attr_int("transB", 0) ? 0 : 1) : -1;
}
int64_t matmul_weight_axis(const ir::Node&, const Tensor& w) { return w.rank() == 2 ? 1 : -1; }
std::optional<std::string> check_gemm_alpha(const ir::Node& n) {
  const float alpha = n.attr_float("alpha", 1.f);
  if (!(alpha != 0.f) || !std::isfinite(alpha)) return std::string("alpha must be finite and non-zero");
  return std::nullopt;
}

}  // namespace

const std::vector<LoweredFamily>& lowered_families() {
  static const std::vector<LoweredFamily> families = {
      {LoweredOp::kConv, "Conv", i8::kQConv, &LoweringOptions::conv, &LoweringReport::conv, conv_weight_axis, nullptr,
       /*bias_input=*/true, /*runtime_weight=*/false, /*matmul_tail=*/false},
      {LoweredOp::kGemm, "Gemm", i8::kQGemm, &LoweringOptions::gemm, &LoweringReport::gemm, gemm_weight_axis,
       check_gemm_alpha, /*bias_input=*/true, /*runtime_weight=*/false, /*matmul_tail=*/false},
      {LoweredOp::kMatMul, "MatMul", i8::kQMatMul, &LoweringOptions::matmul, &LoweringReport::matmul,
       matmul_weight_axis, nullptr, /*bias_input=*/false, /*runtime_weight=*/true, /*matmul_tail=*/true},
  };
  return families;
}

const LoweredFamily* find_lowered_family(const ir::Node& n) {
  if (!n.domain.empty()) return nullptr;
  for (const LoweredFamily& f : lowered_families())
    if (n.op_type == f.float_op) return &f;
  return nullptr;
}

const LoweredFamily& lowered_family(LoweredOp op) {
  for (const LoweredFamily& f : lowered_families())
    if (f.op == op) return f;
  fail(ErrorKind::kInternal, "no lowered family for op " + std::to_string(static_cast<int>(op)));
}

const char* lowered_op_type(LoweredOp op) { return lowered_family(op).fused_op; }

std::optional<QuantizedLayerMatch> match_quantized_layer(const ir::GraphIndex& ix, int node) {
  QuantizedLayerMatch m;
  for (const auto& in : ix.node(node).inputs) {
    const int dq = in.empty() ? -1 : ix.producer(in);
    if (dq < 0 || !is_op(ix.node(dq), "DequantizeLinear")) continue;
    m.dequantize.push_back(dq);
    const int q = ix.producer(ix.node(dq).inputs.at(0));
    if (q >= 0 && is_op(ix.node(q), "QuantizeLinear") && !ix.graph().is_initializer(ix.node(q).inputs.at(0)))
      m.activations.push_back(ix.node(q).inputs[0]);
  }
  if (m.dequantize.empty()) return std::nullopt;
  return m;
}

std::vector<QdqGroup> select_qdq_groups(const ir::Graph& g, const LoweringOptions& options,
                                        std::vector<LoweringSkip>* skipped) {
  const GraphIndex ix(g);
  std::vector<QdqGroup> groups;
  for (size_t t = 0; t < g.nodes.size(); ++t) {
    const ir::Node& n = g.nodes[t];
    const LoweredFamily* family = find_lowered_family(n);
    if (!family || !(options.*(family->enabled))) continue;
    // Candidates are the quantized layers: the rest is plain float.
    if (!match_quantized_layer(ix, static_cast<int>(t))) continue;
    QdqGroup grp;
    if (Why why = select_group(ix, static_cast<int>(t), *family, options, grp)) {
      if (skipped) skipped->push_back({n.name, "cannot lower " + n.describe() + ": " + *why});
      continue;
    }
    groups.push_back(std::move(grp));
  }
  return groups;
}

ir::Node make_fused_node(ir::Graph& g, const QdqGroup& grp, const LoweringOptions& options) {
  const ir::Node& t = g.nodes.at(grp.target);
  ir::Node f;
  f.name = t.name;  // the layer keeps its name: errors and analysis still point at it
  f.domain = i8::kDomain;
  f.op_type = lowered_op_type(grp.op);
  f.attrs = t.attrs;  // Conv's window attributes / Gemm's transA, transB, alpha, beta
  f.inputs = {grp.x_q, grp.w_q};
  std::string bias;
  if (grp.op == LoweredOp::kMatMul) {
    if (grp.bias_add >= 0) {
      const ir::Node& add = g.nodes[grp.bias_add];
      const std::string& fed = grp.scale_mul >= 0 ? g.nodes[grp.scale_mul].outputs[0] : t.outputs[0];
      bias = ir::other_input(add, fed);
    }
  } else {
    bias = t.input(2);
    if (grp.quantized_bias) {
      // b = (b_q - z) * s, folded once into a float32 initializer.
      const ir::Node& dq = g.nodes.at(g.producer(bias));
      const Tensor& bq = *g.initializer(dq.inputs.at(0));
      const auto scale = g.initializer(dq.input(1))->to_float_vector();
      std::vector<int64_t> zp(scale.size(), 0);
      if (!dq.input(2).empty()) zp = g.initializer(dq.input(2))->to_int64_vector();
      Tensor b(DType::kFloat32, bq.shape());
      for (int64_t i = 0; i < bq.numel(); ++i) {
        const size_t c = scale.size() == 1 ? 0 : static_cast<size_t>(i);
        b.data<float>()[i] = static_cast<float>(bq.data<int32_t>()[i] - zp[c]) * scale[c];
      }
      bias = g.unique_value_name(bias + "_float");
      g.initializers[bias] = b;
    }
  }
  if (!bias.empty()) f.inputs.push_back(bias);
  f.outputs = {grp.output};

  i8::QLinearAttrs q;
  q.x = grp.x;
  q.w = grp.w;
  for (float& s : q.w.scale) s *= grp.output_factor;
  if (grp.q_output >= 0) q.y = grp.y;
  read_group_activation(g, grp, q);
  if (!grp.gelu_chain.empty()) q.activation = i8::Activation::kGelu;
  q.post_scale = grp.post_scale;
  q.post_shift = grp.post_shift;
  q.compute = i8::parse_compute(options.compute, f.describe());  // validates the option's spelling
  q.write(f);
  return f;
}

namespace {
// A QuantizeLinear whose scale (and zero point, if given) are one-element constants: the same
// elementwise map on every element, which the rewrites below may move across a MaxPool, a Concat or
// a data-movement op.
bool per_tensor_constant_params(const ir::Graph& g, const ir::Node& q) {
  const Tensor* scale = g.initializer(q.input(1));
  if (!scale || scale->numel() != 1) return false;
  if (q.input(2).empty()) return true;
  const Tensor* zp = g.initializer(q.input(2));
  return zp && zp->numel() == 1;
}

// op -> QuantizeLinear (per tensor) becomes QuantizeLinear -> op for quantize_commutes_with ops, bit for bit,
// repeated until no Q moves (Reshape -> Transpose -> Q climbs both). The Q then ends the group of
// the layer feeding them (integer output, no separate quantization pass) and the op moves 8-bit
// values: ResNet's stem pool; in transformers the q/k/v projections' Reshape -> Transpose and the
// attention output's Transpose -> Reshape.
struct QuantizeAfterOp {
  int op = -1, quantize = -1;
};
ir::Rule commute_quantize_upward_rule() {
  auto select = [](const ir::Rewriter& ix, int id) -> std::optional<QuantizeAfterOp> {
    const ir::Node& op = ix.node(id);
    if (!quantize_commutes_with(op) || op.inputs.empty() || op.inputs[0].empty() ||
        (op.outputs.size() > 1 && !op.outputs[1].empty()))  // MaxPool's Indices
      return std::nullopt;
    const int q = ix.sole_reader(op.outputs[0]);
    if (q < 0 || !is_op(ix.node(q), "QuantizeLinear") || ix.node(q).inputs[0] != op.outputs[0] ||
        !per_tensor_constant_params(ix.graph(), ix.node(q)))
      return std::nullopt;
    return QuantizeAfterOp{id, q};
  };
  auto apply = [](ir::Rewriter& rw, const QuantizeAfterOp& m) {
    ir::Node op = rw.node(m.op), q = rw.node(m.quantize);
    const std::string y = op.outputs[0];
    const std::string xq = rw.graph().unique_value_name(q.outputs[0] + "_before_" + op.op_type);
    q.inputs[0] = op.inputs[0];
    op.inputs[0] = xq;
    op.outputs[0] = q.outputs[0];
    q.outputs[0] = xq;
    rw.replace(m.op, std::move(q));  // the Q now runs where the op did
    rw.replace(m.quantize, std::move(op));
    rw.graph().value_info.erase(y);
  };
  return ir::make_rule<QuantizeAfterOp>("commute_quantize_upward", select, apply);
}

// Div(x, c) or Mul(x, c) by a positive scalar constant, read by a per-tensor QuantizeLinear alone,
// becomes that QuantizeLinear of x with its scale times c (Div) or over c (Mul): round(x / c / s)
// is round(x / (s c)) up to the float rounding of the product. Only where x comes from an op the Q
// then climbs (Reshape, Transpose, ...) to end a layer's group: attention's q / sqrt(d), written by
// PyTorch after the heads' Reshape and Transpose, costs no pass of its own. (Right after a layer the
// group takes the Mul itself, and a GELU's or hard-swish's last Mul / Div is part of its pattern.)
// The DequantizeLinear after the Q keeps scale s: the codes still stand for x / c.
struct ScalarBeforeQuantize {
  int scaling = -1, quantize = -1;
  std::string x;
  float factor = 1.f;  // the Q's scale is multiplied by this
};
ir::Rule fold_scalar_into_quantize_rule() {
  auto select = [](const ir::Rewriter& ix, int id) -> std::optional<ScalarBeforeQuantize> {
    const ir::Node& op = ix.node(id);
    const bool div = is_op(op, "Div");
    if ((!div && !is_op(op, "Mul")) || op.inputs.size() != 2 || op.outputs.size() != 1) return std::nullopt;
    const ir::Graph& g = ix.graph();
    // Div's divisor is its second input; Mul's constant either.
    std::string x, k;
    for (size_t side : {size_t{1}, size_t{0}}) {
      if (div && side == 0) break;
      const Tensor* t = g.initializer(op.inputs[side]);
      if (t && t->numel() == 1 && t->rank() <= 1 && !g.is_initializer(op.inputs[1 - side])) {
        k = op.inputs[side];
        x = op.inputs[1 - side];
        break;
      }
    }
    if (k.empty()) return std::nullopt;
    const int p = ix.producer(x);
    if (p < 0 || !quantize_commutes_with(ix.node(p))) return std::nullopt;
    const std::optional<float> c = ir::scalar_constant(g, k);
    if (!c || !(*c > 0.f) || !std::isfinite(*c)) return std::nullopt;
    const ir::ValueInfo* xi = g.find_value_info(x);
    if (g.initializer(k)->rank() == 1 && xi && xi->dims && xi->dims->empty()) return std::nullopt;  // a scalar x
    const int q = ix.sole_reader(op.outputs[0]);
    if (q < 0 || !is_op(ix.node(q), "QuantizeLinear") || ix.node(q).inputs[0] != op.outputs[0] ||
        !per_tensor_constant_params(g, ix.node(q)))
      return std::nullopt;
    const Tensor* s = g.initializer(ix.node(q).input(1));
    if (s->dtype() != DType::kFloat32) return std::nullopt;
    const double scaled = static_cast<double>(s->data<float>()[0]) * (div ? *c : 1.0 / *c);
    if (!std::isnormal(static_cast<float>(scaled))) return std::nullopt;
    return ScalarBeforeQuantize{id, q, x, div ? *c : 1.f / *c};
  };
  auto apply = [](ir::Rewriter& rw, const ScalarBeforeQuantize& m) {
    ir::Node q = rw.node(m.quantize);
    const Tensor& s = *rw.graph().initializer(q.inputs[1]);
    Tensor scaled(DType::kFloat32, s.shape());
    scaled.data<float>()[0] = static_cast<float>(static_cast<double>(s.data<float>()[0]) * m.factor);
    const std::string name = rw.graph().unique_value_name(q.inputs[1] + "_times_scalar");
    rw.graph().initializers[name] = std::move(scaled);
    rw.graph().value_info.erase(rw.node(m.scaling).outputs[0]);
    q.inputs[0] = m.x;
    q.inputs[1] = name;
    rw.remove(m.scaling);
    rw.replace(m.quantize, std::move(q));
  };
  return ir::make_rule<ScalarBeforeQuantize>("fold_scalar_into_quantize", select, apply);
}

// Concat -> QuantizeLinear (per tensor) becomes QuantizeLinear on each input -> Concat: the same
// elementwise map applied before or after concatenating. Each Q can then end the group of the
// layer that produced the input (SqueezeNet's fire modules, Inception's branches), and the concat
// copies bytes instead of floats.
ir::Rule commute_quantize_through_concat_rule() {
  auto select = [](const ir::Rewriter& ix, int id) -> std::optional<QuantizeAfterOp> {
    const ir::Node& cat = ix.node(id);
    if (!is_op(cat, "Concat") || cat.outputs.size() != 1) return std::nullopt;
    const int q = ix.sole_reader(cat.outputs[0]);
    if (q < 0 || !is_op(ix.node(q), "QuantizeLinear") || ix.node(q).inputs[0] != cat.outputs[0] ||
        !per_tensor_constant_params(ix.graph(), ix.node(q)))
      return std::nullopt;
    return QuantizeAfterOp{id, q};
  };
  auto apply = [](ir::Rewriter& rw, const QuantizeAfterOp& m) {
    ir::Node cat = rw.node(m.op);
    const ir::Node q = rw.node(m.quantize);
    for (std::string& in : cat.inputs) {
      ir::Node qk = q;
      qk.name = q.name.empty() ? std::string() : q.name + "_" + in;
      qk.inputs[0] = in;
      qk.outputs = {rw.graph().unique_value_name(in + "_q")};
      in = qk.outputs[0];
      rw.insert_before(m.op, std::move(qk));
    }
    rw.graph().value_info.erase(cat.outputs[0]);
    cat.outputs[0] = q.outputs[0];
    rw.remove(m.quantize);
    rw.replace(m.op, std::move(cat));
  };
  return ir::make_rule<QuantizeAfterOp>("commute_quantize_through_concat", select, apply);
}

}  // namespace

ir::Graph lower_to_int8(const ir::Graph& qdq, const LoweringOptions& options, LoweringReport* report) {
  ir::Graph g = qdq;
  runtime::optimize_graph(g);
  runtime::fold_batch_invariant_sizes(g);
  // A packed q / k / v projection cut by Slices becomes one layer per part, each with its own
  // output quantization.
  ir::apply_rules(g, {ir::split_matmul_by_column_slices_rule()});
  if (options.fuse_activation) {
    // paddle2onnx's decomposed hard-swish after a Conv / Gemm / MatMul in the standard spelling
    // x * HardSigmoid(x), which the selector takes as an activation (as x * Sigmoid(x)); what no
    // group takes stays exportable ONNX, and the session's execution fusions merge it there.
    auto after_layer = [&](const std::string& x, const std::string&) {
      const int p = g.producer(x);
      return p >= 0 && (is_op(g.nodes[p], "Conv") || is_op(g.nodes[p], "Gemm") || is_op(g.nodes[p], "MatMul")) &&
             !g.is_graph_output(x) && g.consumers(x).size() == 2;
    };
    ir::spell_hardswish_as_gate(g, after_layer);
  }
  // A ConvTranspose with kernel == strides becomes a 1x1 Conv (lowered below) and a DepthToSpace
  // that its activation and output Q move above (quant/conv_transpose_rewrite.h).
  if (options.conv)
    ir::apply_rules(g, {conv_transpose_as_pointwise_conv_rule(), commute_activation_above_depth_to_space_rule()}, {},
                    /*until_stable=*/true);
  // Pools and data movement first: Concat -> MaxPool -> Q becomes Concat -> Q -> MaxPool, then
  // Q -> Concat -> MaxPool. A scalar Div / Mul before a Q goes into its scale first, so that the Q
  // climbs past where it stood.
  ir::apply_rules(g, {fold_scalar_into_quantize_rule()});
  ir::apply_rules(g, {commute_quantize_upward_rule()}, {}, /*until_stable=*/true);
  ir::apply_rules(g, {commute_quantize_through_concat_rule()});
  LoweringReport local;
  LoweringReport& r = report ? *report : local;
  r = LoweringReport{};
  const std::vector<QdqGroup> groups = select_qdq_groups(g, options, &r.skipped);

  // Every fused node is built from the unedited graph first (a group reads its own nodes only).
  std::vector<ir::Node> fused;
  fused.reserve(groups.size());
  for (const QdqGroup& grp : groups) fused.push_back(make_fused_node(g, grp, options));
  ir::Rewriter rw(g);
  for (size_t k = 0; k < groups.size(); ++k) {
    const QdqGroup& grp = groups[k];
    for (int i : {grp.scale_mul, grp.bias_add, grp.gate, grp.activation, grp.post_mul, grp.post_add, grp.q_output})
      if (i >= 0) rw.remove(i);
    for (int i : grp.gelu_chain) rw.remove(i);
    rw.replace(grp.target, std::move(fused[k]));
    ++(r.*(lowered_family(grp.op).lowered));
  }
  rw.compact();
  // The weights of layers left in simulation (a ConvTranspose that is not kernel-sized, a candidate
  // that could not be lowered) become float constants: their kernels then prepack them once instead
  // of taking run-time weights (oneDNN 2.6 runs some of those shapes only in its reference kernels).
  runtime::FoldOptions fold_weights;
  fold_weights.keep_dequantize_linear = false;
  runtime::fold_constants(g, fold_weights);
  // DequantizeLinear nodes whose readers were all lowered (and Q nodes feeding only those) go.
  g.remove_dead_nodes();
  g.remove_unused_initializers();
  std::unordered_set<std::string> live;
  for (const auto& n : g.nodes) live.insert(n.outputs.begin(), n.outputs.end());
  std::erase_if(g.value_info, [&](const auto& kv) { return !live.count(kv.first); });
  if (!groups.empty()) g.extra_opsets[i8::kDomain] = 1;
  g.validate();
  for (const auto& n : g.nodes) {
    if (is_op(n, "QuantizeLinear")) ++r.quantize_kept;
    if (is_op(n, "DequantizeLinear")) ++r.dequantize_kept;
  }
  return g;
}

bool has_qdq_nodes(const ir::Graph& g) {
  return std::any_of(g.nodes.begin(), g.nodes.end(), [](const ir::Node& n) {
    return is_op(n, "QuantizeLinear") || is_op(n, "DequantizeLinear");
  });
}

runtime::Session make_int8_session(const ir::Graph& qdq, runtime::SessionOptions options,
                                   const LoweringOptions& lowering) {
  if (options.split_batches && !options.sample_independence)  // on the QDQ ops: the lowered ones are ours
    options.sample_independence = runtime::analyze_sample_independence(qdq, runtime::input_batch_axes(qdq.inputs));
  return runtime::Session(lower_to_int8(qdq, lowering), options);
}

}  // namespace slimquant::quant
