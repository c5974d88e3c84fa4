#include "slimquant/ir/passes.h"

#include <algorithm>
#include <cmath>
#include <set>
#include <unordered_map>
#include <unordered_set>

#include "slimquant/ir/onnx_io.h"

namespace slimquant::ir {

void name_nodes(Graph& g) {
  std::unordered_set<std::string> names;
  for (auto& node : g.nodes) {
    if (node.name.empty() || names.count(node.name))
      node.name = g.unique_value_name(node.name.empty() ? node.outputs.at(0) : node.name);
    names.insert(node.name);
  }
}

// Every model pass below is a selector (looks at one anchor node, edits nothing, returns its
// match) and an action (edits through the Rewriter); the public functions run their rule alone.
namespace {

// Runs one rule over g (values in `keep` are never merged away); returns how often it fired.
int run_rule_alone(Graph& g, Rule rule, const std::set<std::string>& keep = {}) {
  return total(apply_rules(g, {std::move(rule)}, keep));
}

bool is_graph_input(const Graph& g, const std::string& v) {
  for (const auto& i : g.inputs)
    if (i.name == v) return true;
  return false;
}

void drop_unread_initializers(Graph& g) { g.remove_unused_initializers(); }

// --- Constant nodes -> initializers -------------------------------------------------------------
struct ConstantValue {
  int node = -1;
  Tensor value;
};

std::optional<ConstantValue> select_constant(const Rewriter& rw, int id) {
  const Node& n = rw.node(id);
  if (!is_onnx_op(n, "Constant") || n.outputs.size() != 1) return std::nullopt;
  ConstantValue m{id, {}};
  if (const Tensor* t = n.attr_tensor("value")) m.value = *t;
  else if (n.has_attr("value_float")) m.value = Tensor::scalar<float>(n.attr_float("value_float", 0));
  else if (n.has_attr("value_int")) m.value = Tensor::scalar<int64_t>(n.attr_int("value_int", 0));
  else if (n.has_attr("value_floats")) {
    auto v = n.attr_floats("value_floats");
    m.value = Tensor::from_vector<float>({static_cast<int64_t>(v.size())}, v);
  } else if (n.has_attr("value_ints")) {
    auto v = n.attr_ints("value_ints");
    m.value = Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v);
  } else {
    return std::nullopt;  // string / sparse constants: left to the kernel to reject
  }
  return m;
}

void constant_to_initializer(Rewriter& rw, const ConstantValue& m) {
  rw.graph().initializers[rw.node(m.node).outputs[0]] = m.value;
  rw.remove(m.node);
}

Rule constants_rule() {
  return make_rule<ConstantValue>("constants_to_initializers", select_constant, constant_to_initializer);
}

// --- Mul by a rank-0 constant 1 -> Identity ----------------------------------------------------
struct NeutralMul {
  int node = -1;
  std::string x;
};

std::optional<NeutralMul> select_neutral_mul(const Rewriter& rw, int id) {
  const Graph& g = rw.graph();
  const Node& n = rw.node(id);
  if (!is_onnx_op(n, "Mul") || n.inputs.size() != 2 || n.outputs.size() != 1) return std::nullopt;
  for (size_t side = 0; side < 2; ++side) {
    const Tensor* t = g.initializer(n.inputs[1 - side]);
    // Rank 0: the other operand's shape and type come out unchanged (no broadcast, no promotion).
    if (!t || t->rank() != 0 || t->dtype() != DType::kFloat32 || t->to_float_vector()[0] != 1.f ||
        g.is_initializer(n.inputs[side]))
      continue;
    return NeutralMul{id, n.inputs[side]};
  }
  return std::nullopt;
}

void mul_to_identity(Rewriter& rw, const NeutralMul& m) {
  Node n = rw.node(m.node);
  n.op_type = "Identity";
  n.inputs = {m.x};
  n.attrs.clear();
  rw.replace(m.node, std::move(n));
}

Rule neutral_mul_rule() {
  return make_rule<NeutralMul>("neutral_elementwise_to_identity", select_neutral_mul, mul_to_identity);
}

// --- Identity / inference Dropout removal ------------------------------------------------------
// The node goes and every use of `from` becomes `to`.
struct IdentityRemoval {
  int node = -1;
  std::string from, to;
};

std::optional<IdentityRemoval> select_identity(const Rewriter& rw, int id) {
  const Graph& g = rw.graph();
  const Node& n = rw.node(id);
  const bool dropout = is_onnx_op(n, "Dropout");
  if ((!is_onnx_op(n, "Identity") && !dropout) || n.inputs.empty() || n.outputs.empty()) return std::nullopt;
  if (dropout) {
    // Dropout is the identity only at inference; a mask output that someone reads needs the kernel.
    const std::string& training = n.input(2);
    if (!training.empty() && !g.is_initializer(training)) return std::nullopt;
    if (n.outputs.size() > 1 && !n.outputs[1].empty() && (rw.reads(n.outputs[1]) > 0 || !rw.is_private(n.outputs[1])))
      return std::nullopt;
  }
  const std::string &in = n.inputs[0], &out = n.outputs[0];
  if (rw.is_private(out)) return IdentityRemoval{id, out, in};
  // The output name is part of the model's interface: keep it, drop the input's name instead.
  if (rw.is_private(in) && !is_graph_input(g, in) && !g.is_initializer(in) && rw.producer(in) >= 0)
    return IdentityRemoval{id, in, out};
  return std::nullopt;
}

void remove_identity(Rewriter& rw, const IdentityRemoval& m) {
  rw.remove(m.node);
  rw.rename_value(m.from, m.to);
}

Rule identity_rule() {
  // The final sort only matters for a graph that came in unsorted (the renames keep a sorted one sorted).
  return make_rule<IdentityRemoval>("remove_identity_ops", select_identity, remove_identity,
                                    [](Graph& g) { g.topological_sort(); });
}

// --- com.microsoft DynamicQuantizeLSTM -> LSTM on the dequantized weights -----------------------
// ONNX Runtime's quantize_dynamic writes each LSTM with constant weights as its contrib op: W and R
// as 8-bit codes transposed to [dirs, input, 4 * hidden] / [dirs, hidden, 4 * hidden], with a
// scale and zero point per direction ([dirs]) or per gate row ([dirs, 4 * hidden]); inputs 0-7 and
// the attributes are LSTM's. The weights are exactly (code - zero point) * scale: the LSTM on
// those floats is the model (ORT also quantizes X and H per step, which only rounds).
struct QuantizedLstm {
  int node = -1;
  Tensor w, r;  // float, LSTM's layout
};

// (codes [dirs, k, rows] - zero point) * scale, transposed to [dirs, rows, k].
std::optional<Tensor> dequantize_transposed(const Graph& g, const std::string& codes, const std::string& scale,
                                            const std::string& zero_point) {
  const Tensor* q = g.initializer(codes);
  const Tensor* s = g.initializer(scale);
  const Tensor* z = zero_point.empty() ? nullptr : g.initializer(zero_point);
  if (!q || !s || (!zero_point.empty() && !z) || q->rank() != 3 ||
      (q->dtype() != DType::kInt8 && q->dtype() != DType::kUInt8) || s->dtype() != DType::kFloat32)
    return std::nullopt;
  const int64_t dirs = q->dim(0), k = q->dim(1), rows = q->dim(2);
  // One value per direction, or one per direction and row.
  const int64_t per = s->numel() == dirs ? 1 : s->numel() == dirs * rows ? rows : 0;
  if (per == 0 || (z && z->numel() != s->numel())) return std::nullopt;
  const std::vector<float> codes_f = q->to_float_vector(), scales = s->to_float_vector();
  const std::vector<float> zeros = z ? z->to_float_vector() : std::vector<float>(scales.size(), 0.f);
  Tensor out(DType::kFloat32, {dirs, rows, k});
  float* y = out.data<float>();
  for (int64_t d = 0; d < dirs; ++d)
    for (int64_t row = 0; row < rows; ++row) {
      const size_t p = static_cast<size_t>(d * per + (per == 1 ? 0 : row));
      for (int64_t i = 0; i < k; ++i)
        y[(d * rows + row) * k + i] = (codes_f[static_cast<size_t>((d * k + i) * rows + row)] - zeros[p]) * scales[p];
    }
  return out;
}

std::optional<QuantizedLstm> select_quantized_lstm(const Rewriter& rw, int id) {
  const Graph& g = rw.graph();
  const Node& n = rw.node(id);
  if (n.domain != "com.microsoft" || n.op_type != "DynamicQuantizeLSTM" || n.inputs.size() < 11) return std::nullopt;
  std::optional<Tensor> w = dequantize_transposed(g, n.input(1), n.input(8), n.input(9));
  std::optional<Tensor> r = dequantize_transposed(g, n.input(2), n.input(10), n.input(11));
  if (!w || !r) return std::nullopt;
  return QuantizedLstm{id, std::move(*w), std::move(*r)};
}

void dequantize_lstm(Rewriter& rw, const QuantizedLstm& m) {
  Graph& g = rw.graph();
  Node n = rw.node(m.node);
  const std::string w = g.unique_value_name(n.input(1) + "_dequantized");
  g.initializers[w] = m.w;
  const std::string r = g.unique_value_name(n.input(2) + "_dequantized");
  g.initializers[r] = m.r;
  n.domain.clear();
  n.op_type = "LSTM";
  n.inputs.resize(std::min<size_t>(n.inputs.size(), 8));
  n.inputs[1] = w;
  n.inputs[2] = r;
  while (!n.inputs.empty() && n.inputs.back().empty()) n.inputs.pop_back();
  rw.replace(m.node, std::move(n));
}

Rule quantized_lstm_rule() {
  return make_rule<QuantizedLstm>("dequantize_lstm_weights", select_quantized_lstm, dequantize_lstm,
                                  [](Graph& g) { g.remove_unused_initializers(); });
}

// --- Folding a per-channel affine map (BatchNorm, Mul/Add/Sub/Div by a constant) into a Conv ------
// Conv weights are [M, C/group, k...]; ConvTranspose weights are [C, M/group, k...] (C input, M
// output channels). The number of output channels of a Conv or ConvTranspose with weights w.
int64_t output_channels(const Node& conv, const Tensor& w) {
  if (conv.op_type == "Conv") return w.dim(0);
  return w.dim(1) * conv.attr_int("group", 1);
}

// Multiplies every weight by k[its output channel], in place.
void scale_weights_per_output_channel(const Node& conv, Tensor& w, const std::vector<float>& k) {
  float* wd = w.data<float>();
  const int64_t cout = output_channels(conv, w);
  if (conv.op_type == "Conv") {
    const int64_t per_channel = w.numel() / cout;
    for (int64_t c = 0; c < cout; ++c)
      for (int64_t j = 0; j < per_channel; ++j) wd[c * per_channel + j] *= k[static_cast<size_t>(c)];
    return;
  }
  const int64_t group = conv.attr_int("group", 1), cin = w.dim(0), cin_g = cin / group, cout_g = w.dim(1);
  const int64_t window = w.numel() / (cin * cout_g);
  for (int64_t ci = 0; ci < cin; ++ci)
    for (int64_t j = 0; j < cout_g; ++j) {
      const float f = k[static_cast<size_t>((ci / cin_g) * cout_g + j)];
      for (int64_t e = 0; e < window; ++e) wd[(ci * cout_g + j) * window + e] *= f;
    }
}

// A Conv, or a ConvTranspose whose weights divide into its groups (what the folds below handle).
bool is_foldable_conv(const Node& n, const Tensor& w) {
  if (!n.domain.empty() || w.rank() < 3) return false;
  if (n.op_type == "Conv") return true;
  if (n.op_type != "ConvTranspose") return false;
  const int64_t group = n.attr_int("group", 1);
  return group >= 1 && w.dim(0) % group == 0;
}

// The Conv / ConvTranspose writing x, when only one node reads x and the conv's weight and bias (if
// any) are float32 constants of its output channels that a per-channel map can fold into; else -1.
int foldable_conv_producer(const Rewriter& rw, const std::string& x) {
  const int p = rw.producer(x);
  if (p < 0 || rw.sole_reader(x) < 0) return -1;
  const Node& conv = rw.node(p);
  if ((conv.op_type != "Conv" && conv.op_type != "ConvTranspose") || conv.outputs.size() != 1 ||
      has_execution_attrs(conv))
    return -1;
  const Graph& g = rw.graph();
  const Tensor* w = g.initializer(conv.input(1));
  const Tensor* b = conv.input(2).empty() ? nullptr : g.initializer(conv.input(2));
  if (!w || w->dtype() != DType::kFloat32 || !is_foldable_conv(conv, *w) ||
      (!conv.input(2).empty() && (!b || b->dtype() != DType::kFloat32)))
    return -1;
  if (b && b->numel() != output_channels(conv, *w)) return -1;
  return p;
}

// The folded tensors replace the originals under their names where only this Conv reads them (what
// an exported model then shows is the source's weight names); shared ones stay, and the folded
// copies get fresh names.
std::string folded_name(const Rewriter& rw, const std::string& original, const std::string& fresh) {
  if (!original.empty() && rw.readers(original).size() == 1 && !rw.graph().is_graph_output(original)) return original;
  return rw.graph().unique_value_name(fresh);
}

// The conv (with `weight` and `bias` as its inputs 1 and 2) takes over the output of `absorbed`.
void fold_into_conv(Rewriter& rw, int conv_id, int absorbed, const std::string& weight, const std::string& bias) {
  Node conv = rw.node(conv_id);
  conv.inputs.resize(3);
  conv.inputs[1] = weight;
  conv.inputs[2] = bias;
  conv.outputs[0] = rw.node(absorbed).outputs[0];
  rw.remove(absorbed);
  rw.replace(conv_id, std::move(conv));
}

struct BatchNormFold {
  int bn = -1, conv = -1;
};

std::optional<BatchNormFold> select_batchnorm(const Rewriter& rw, int id) {
  const Graph& g = rw.graph();
  const Node& bn = rw.node(id);
  if (!is_onnx_op(bn, "BatchNormalization") || bn.inputs.size() < 5 || bn.attr_int("training_mode", 0) != 0)
    return std::nullopt;
  for (size_t k = 1; k < bn.outputs.size(); ++k)  // running statistics that someone reads
    if (!bn.outputs[k].empty() && (rw.reads(bn.outputs[k]) > 0 || !rw.is_private(bn.outputs[k]))) return std::nullopt;
  const int p = foldable_conv_producer(rw, bn.inputs[0]);
  if (p < 0) return std::nullopt;
  const int64_t cout = output_channels(rw.node(p), *g.initializer(rw.node(p).input(1)));
  for (size_t k = 1; k <= 4; ++k) {  // scale, shift, mean, variance
    const Tensor* t = g.initializer(bn.inputs[k]);
    if (!t || t->numel() != cout) return std::nullopt;
  }
  return BatchNormFold{id, p};
}

void fold_batchnorm(Rewriter& rw, const BatchNormFold& m) {
  Graph& g = rw.graph();
  const Node &bn = rw.node(m.bn), &conv = rw.node(m.conv);
  const Tensor& w = *g.initializer(conv.input(1));
  const Tensor* b = conv.input(2).empty() ? nullptr : g.initializer(conv.input(2));
  const int64_t cout = output_channels(conv, w);
  const float eps = bn.attr_float("epsilon", 1e-5f);
  const auto sc = g.initializer(bn.inputs[1])->to_float_vector(), sh = g.initializer(bn.inputs[2])->to_float_vector(),
             mu = g.initializer(bn.inputs[3])->to_float_vector(), vr = g.initializer(bn.inputs[4])->to_float_vector();
  Tensor new_w = w.clone();
  Tensor new_b(DType::kFloat32, {cout});
  std::vector<float> k(static_cast<size_t>(cout));
  for (int64_t c = 0; c < cout; ++c) {
    k[c] = sc[c] / std::sqrt(vr[c] + eps);
    const float bias = b ? b->data<float>()[c] : 0.f;
    new_b.data<float>()[c] = (bias - mu[c]) * k[c] + sh[c];
  }
  scale_weights_per_output_channel(conv, new_w, k);
  const std::string w_name = folded_name(rw, conv.input(1), conv.input(1) + "_bnfolded");
  const std::string b_name =
      folded_name(rw, conv.input(2), (conv.name.empty() ? conv.outputs[0] : conv.name) + (b ? ".bias_bnfolded" : ".bias"));
  g.initializers[w_name] = std::move(new_w);
  g.initializers[b_name] = std::move(new_b);
  fold_into_conv(rw, m.conv, m.bn, w_name, b_name);
}

Rule batchnorm_rule() {
  return make_rule<BatchNormFold>("fold_batchnorm_into_conv", select_batchnorm, fold_batchnorm,
                                  drop_unread_initializers);
}

// conv * k / conv / k scale weights and bias per output channel (k stored as the factor); conv + k
// and conv - k shift the bias (k stored as the shift).
struct AffineFold {
  int op = -1, conv = -1;
  std::vector<float> k;
  bool scales = false;
};

std::optional<AffineFold> select_affine(const Rewriter& rw, int id) {
  const Node& op = rw.node(id);
  const bool mul = is_onnx_op(op, "Mul"), add = is_onnx_op(op, "Add"), sub = is_onnx_op(op, "Sub"),
             div = is_onnx_op(op, "Div");
  if (!(mul || add || sub || div) || op.inputs.size() != 2 || op.outputs.size() != 1) return std::nullopt;
  // The Conv's output and the constant; Sub and Div only as conv - c and conv / c.
  for (size_t side = 0; side < ((sub || div) ? 1u : 2u); ++side) {
    const std::string &y = op.inputs[side], &c = op.inputs[1 - side];
    if (y == c) continue;
    const int p = foldable_conv_producer(rw, y);
    if (p < 0) continue;
    const Node& conv = rw.node(p);
    const Tensor& w = *rw.graph().initializer(conv.input(1));
    std::optional<std::vector<float>> k = per_channel_constant(rw.graph(), c, output_channels(conv, w), w.rank());
    if (!k) continue;
    if (div) {
      if (std::any_of(k->begin(), k->end(), [](float d) { return d == 0.f || !std::isfinite(d); })) return std::nullopt;
      for (float& d : *k) d = 1.f / d;
    }
    if (sub)
      for (float& d : *k) d = -d;
    return AffineFold{id, p, std::move(*k), mul || div};
  }
  return std::nullopt;
}

void fold_affine(Rewriter& rw, const AffineFold& m) {
  Graph& g = rw.graph();
  const Node& conv = rw.node(m.conv);
  const Tensor& w = *g.initializer(conv.input(1));
  const Tensor* b = conv.input(2).empty() ? nullptr : g.initializer(conv.input(2));
  const int64_t cout = output_channels(conv, w);
  // y * k: weights and bias scaled per output channel (any sign); y + k: bias shifted.
  Tensor new_b(DType::kFloat32, {cout});
  for (int64_t ch = 0; ch < cout; ++ch) new_b.data<float>()[ch] = b ? b->data<float>()[ch] : 0.f;
  std::string w_name = conv.input(1);
  if (m.scales) {
    Tensor new_w = w.clone();
    scale_weights_per_output_channel(conv, new_w, m.k);
    for (int64_t ch = 0; ch < cout; ++ch) new_b.data<float>()[ch] *= m.k[static_cast<size_t>(ch)];
    w_name = folded_name(rw, conv.input(1), conv.input(1) + "_affine_folded");
    g.initializers[w_name] = std::move(new_w);
  } else {
    for (int64_t ch = 0; ch < cout; ++ch) new_b.data<float>()[ch] += m.k[static_cast<size_t>(ch)];
  }
  const std::string base = conv.name.empty() ? conv.outputs[0] : conv.name;
  const std::string b_name = folded_name(rw, conv.input(2), base + (b ? ".bias_affine_folded" : ".bias"));
  g.initializers[b_name] = std::move(new_b);
  fold_into_conv(rw, m.conv, m.op, w_name, b_name);
}

Rule affine_rule() {
  return make_rule<AffineFold>("fold_affine_into_conv", select_affine, fold_affine, drop_unread_initializers);
}

// --- Gated activations: Mul(x, Gate(x)) -> one node --------------------------------------------
using Accept = std::function<bool(const std::string& x, const std::string& s)>;

bool accepts(const Accept& accept, const std::string& x, const std::string& s) { return !accept || accept(x, s); }

// The pattern behind hard-swish and swish: a gate node reading x whose output s is read only by
// Mul(x, s) (and s is not kept).
struct GatedMul {
  int gate = -1, mul = -1;
  std::string x;
};

std::optional<GatedMul> select_gated_mul(const Rewriter& rw, int id, const std::function<bool(const Node&)>& is_gate,
                                         const Accept& accept) {
  const Node& gate = rw.node(id);
  if (!gate.domain.empty() || gate.inputs.size() != 1 || gate.outputs.size() != 1 || !is_gate(gate))
    return std::nullopt;
  const std::string &x = gate.inputs[0], &s = gate.outputs[0];
  const int mul = rw.sole_reader(s);
  if (mul < 0 || !accepts(accept, x, s)) return std::nullopt;
  const Node& m = rw.node(mul);
  const bool reads_x_and_s = m.inputs.size() == 2 && ((m.inputs[0] == x && m.inputs[1] == s) ||
                                                      (m.inputs[0] == s && m.inputs[1] == x));
  if (!is_onnx_op(m, "Mul") || !reads_x_and_s) return std::nullopt;
  return GatedMul{id, mul, x};
}

// Replaces the Mul by `fused` (inputs {x}, the Mul's name and outputs) at the Mul's place, where x
// and everything the Mul needed are computed, and drops the gate.
Rule gated_mul_rule(std::string name, std::function<bool(const Node&)> is_gate, Node fused, Accept accept) {
  return make_rule<GatedMul>(
      std::move(name),
      [is_gate = std::move(is_gate), accept = std::move(accept)](const Rewriter& rw, int id) {
        return select_gated_mul(rw, id, is_gate, accept);
      },
      [fused = std::move(fused)](Rewriter& rw, const GatedMul& m) {
        Node node = fused;
        node.name = rw.node(m.mul).name;
        node.inputs = {m.x};
        node.outputs = rw.node(m.mul).outputs;
        rw.remove(m.gate);
        rw.replace(m.mul, std::move(node));
      });
}

Rule hardswish_rule(Accept accept) {
  Node hard_swish;
  hard_swish.op_type = "HardSwish";
  return gated_mul_rule(
      "merge_hardswish",
      [](const Node& n) {
        return n.op_type == "HardSigmoid" && std::fabs(n.attr_float("alpha", 0.2f) - 1.f / 6.f) <= 1e-6f &&
               std::fabs(n.attr_float("beta", 0.5f) - 0.5f) <= 1e-6f;
      },
      std::move(hard_swish), std::move(accept));
}

Rule swish_rule(Accept accept) {
  Node swish;
  swish.op_type = "Swish";
  swish.domain = kSlimquantDomain;
  swish.attrs["alpha"] = 1.f;
  return gated_mul_rule("merge_swish", [](const Node& n) { return n.op_type == "Sigmoid"; }, std::move(swish),
                        std::move(accept));
}

// paddle2onnx's hard-swish before opset 14: Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6) (or the Add's
// operands swapped, or a Mul by 1/6 at the end), anchored at the Add. Each intermediate has one
// reader and is not kept.
struct DecomposedHardswish {
  int add = -1, clip = -1, mul = -1, scale = -1;
  std::string x;
};

// The node that divides the product p by 6 (Div(p, 6) or Mul by 1/6) and alone reads it, or -1.
int divide_by_six(const Rewriter& rw, const std::string& p) {
  const Graph& g = rw.graph();
  const int div = rw.sole_reader_op(p, "Div");
  if (div >= 0 && rw.node(div).inputs.size() == 2 && rw.node(div).inputs[0] == p &&
      is_scalar_close_to(g, rw.node(div).inputs[1], 6.f, 1e-5f))
    return div;
  const int mul = rw.sole_reader_op(p, "Mul");
  if (mul < 0 || rw.node(mul).inputs.size() != 2) return -1;
  const Node& s = rw.node(mul);
  const std::string& k = s.inputs[0] == p ? s.inputs[1] : s.inputs[0];
  return is_scalar_close_to(g, k, 1.f / 6.f, 1e-5f) ? mul : -1;
}

std::optional<DecomposedHardswish> select_decomposed_hardswish(const Rewriter& rw, int id, const Accept& accept) {
  const Graph& g = rw.graph();
  const Node& add = rw.node(id);
  if (!is_onnx_op(add, "Add") || add.inputs.size() != 2 || add.outputs.size() != 1) return std::nullopt;
  const int side = is_scalar_close_to(g, add.inputs[1], 3.f, 1e-5f)   ? 0
                   : is_scalar_close_to(g, add.inputs[0], 3.f, 1e-5f) ? 1
                                                                      : -1;
  if (side < 0) return std::nullopt;
  const std::string& x = add.inputs[static_cast<size_t>(side)];
  const int clip = rw.sole_reader_op(add.outputs[0], "Clip");
  if (clip < 0) return std::nullopt;
  const Node& c = rw.node(clip);
  const std::optional<float> lo = g.opset < 11 ? std::optional<float>(c.attr_float("min", -1.f)) : scalar_constant(g, c.input(1));
  const std::optional<float> hi = g.opset < 11 ? std::optional<float>(c.attr_float("max", 0.f)) : scalar_constant(g, c.input(2));
  if (!(lo && hi && *lo == 0.f && std::fabs(*hi - 6.f) <= 1e-5f * 6.f)) return std::nullopt;
  const int mul = rw.sole_reader_op(c.outputs[0], "Mul");
  if (mul < 0) return std::nullopt;
  const Node& m = rw.node(mul);
  if (m.inputs.size() != 2 || !((m.inputs[0] == x && m.inputs[1] == c.outputs[0]) ||
                                (m.inputs[1] == x && m.inputs[0] == c.outputs[0])))
    return std::nullopt;
  const int scale = divide_by_six(rw, m.outputs[0]);
  if (scale < 0 || !accepts(accept, x, add.outputs[0]) || !accepts(accept, x, c.outputs[0]) ||
      !accepts(accept, x, m.outputs[0]))
    return std::nullopt;
  return DecomposedHardswish{id, clip, mul, scale, x};
}

// The chain becomes one HardSwish at the last node's place or, with as_gate, the standard opset-13
// spelling Mul(x, HardSigmoid(x; 1/6, 0.5)) there.
void merge_decomposed_hardswish(Rewriter& rw, const DecomposedHardswish& m, bool as_gate) {
  Node node;
  node.op_type = "HardSwish";
  node.name = rw.node(m.scale).name;
  node.inputs = {m.x};
  node.outputs = rw.node(m.scale).outputs;
  if (as_gate) {
    Node gate;
    gate.op_type = "HardSigmoid";
    gate.name = node.name + "_hardsigmoid";
    gate.inputs = {m.x};
    gate.outputs = {rw.graph().unique_value_name(node.outputs[0] + "_hardsigmoid")};
    gate.attrs["alpha"] = 1.f / 6.f;
    gate.attrs["beta"] = 0.5f;
    node.op_type = "Mul";
    node.inputs = {m.x, gate.outputs[0]};
    rw.insert_before(m.scale, std::move(gate));
  }
  for (int k : {m.add, m.clip, m.mul}) rw.remove(k);
  rw.replace(m.scale, std::move(node));
}

Rule decomposed_hardswish_rule(std::string name, Accept accept, bool as_gate) {
  return make_rule<DecomposedHardswish>(
      std::move(name),
      [accept = std::move(accept)](const Rewriter& rw, int id) { return select_decomposed_hardswish(rw, id, accept); },
      [as_gate](Rewriter& rw, const DecomposedHardswish& m) { merge_decomposed_hardswish(rw, m, as_gate); });
}

// --- LayerNorm over the last axis -> LayerNormalization ----------------------------------------
// The reduction axes of a ReduceMean (attribute before opset 18, constant input from 18), or
// nullopt when they are not constant or keepdims is 0.
std::optional<std::vector<int64_t>> reduce_mean_axes(const Graph& g, const Node& n) {
  if (n.op_type != "ReduceMean" || !n.domain.empty() || n.attr_int("keepdims", 1) != 1) return std::nullopt;
  if (g.opset < 18) return n.attr_ints("axes");
  const Tensor* t = n.input(1).empty() ? nullptr : g.initializer(n.input(1));
  if (!t) return std::nullopt;
  return t->to_int64_vector();
}

struct LayerNormMerge {
  std::vector<int> gone;  // the pattern's nodes but the last
  int last = -1;
  Node layer_norm;
};

// Anchored at the first ReduceMean; every intermediate is private and read inside the pattern only.
std::optional<LayerNormMerge> select_layernorm(const Rewriter& rw, int id) {
  const Graph& g = rw.graph();
  const Node& mean = rw.node(id);
  const std::optional<std::vector<int64_t>> axes = reduce_mean_axes(g, mean);
  if (!axes || axes->size() != 1 || mean.inputs.empty() || mean.outputs.size() != 1) return std::nullopt;
  const std::string x = mean.inputs[0];
  // The last axis, as LayerNormalization's axis -1: written -1, or rank - 1 where the rank is known.
  const ValueInfo* vx = g.find_value_info(x);
  const int64_t rank = vx && vx->dims ? static_cast<int64_t>(vx->dims->size()) : -1;
  if ((*axes)[0] != -1 && (rank < 1 || (*axes)[0] != rank - 1)) return std::nullopt;
  const int sub = rw.sole_reader_op(mean.outputs[0], "Sub");
  if (sub < 0 || rw.node(sub).inputs.size() != 2 || rw.node(sub).inputs[0] != x) return std::nullopt;
  const std::string d = rw.node(sub).outputs[0];
  if (!rw.is_private(d) || rw.readers(d).size() != 2) return std::nullopt;
  int pow = -1, div = -1;
  for (int r : rw.readers(d)) {
    if (is_onnx_op(rw.node(r), "Pow") && rw.node(r).inputs[0] == d) pow = r;
    if (is_onnx_op(rw.node(r), "Div") && rw.node(r).inputs[0] == d) div = r;
  }
  if (pow < 0 || div < 0 || !is_scalar_close_to(g, rw.node(pow).input(1), 2.f, 1e-5f)) return std::nullopt;
  const int var = rw.sole_reader(rw.node(pow).outputs[0]);
  if (var < 0 || reduce_mean_axes(g, rw.node(var)) != axes) return std::nullopt;
  const int eps_add = rw.sole_reader_op(rw.node(var).outputs[0], "Add");
  if (eps_add < 0) return std::nullopt;
  const std::optional<float> eps = scalar_constant(g, other_input(rw.node(eps_add), rw.node(var).outputs[0]));
  if (!eps || !(*eps >= 0.f)) return std::nullopt;
  const int sqrt = rw.sole_reader_op(rw.node(eps_add).outputs[0], "Sqrt");
  if (sqrt < 0 || rw.sole_reader_op(rw.node(sqrt).outputs[0], "Div") != div ||
      rw.node(div).inputs[1] != rw.node(sqrt).outputs[0])
    return std::nullopt;
  // Then Mul(scale) and Add(bias), 1-D constants over the last axis.
  const std::string normed = rw.node(div).outputs[0];
  const int mul = rw.sole_reader_op(normed, "Mul");
  if (mul < 0) return std::nullopt;
  const std::string scale = other_input(rw.node(mul), normed);
  const Tensor* st = g.initializer(scale);
  if (!st || st->rank() != 1 || st->dtype() != DType::kFloat32) return std::nullopt;
  const int add = rw.sole_reader_op(rw.node(mul).outputs[0], "Add");
  const std::string bias = add < 0 ? "" : other_input(rw.node(add), rw.node(mul).outputs[0]);
  const Tensor* bt = bias.empty() ? nullptr : g.initializer(bias);
  const bool with_bias = bt && bt->rank() == 1 && bt->dtype() == DType::kFloat32 && bt->numel() == st->numel();
  LayerNormMerge m;
  m.gone = {id, sub, pow, var, eps_add, sqrt, div};
  if (with_bias) m.gone.push_back(mul);
  m.last = with_bias ? add : mul;
  Node& ln = m.layer_norm;
  ln.op_type = "LayerNormalization";
  ln.name = rw.node(m.last).name;
  ln.inputs = {x, scale};
  if (with_bias) ln.inputs.push_back(bias);
  ln.outputs = rw.node(m.last).outputs;
  ln.attrs["axis"] = int64_t{-1};
  ln.attrs["epsilon"] = *eps;
  return m;
}

void merge_layernorm_at(Rewriter& rw, const LayerNormMerge& m) {
  for (int k : m.gone) rw.remove(k);
  rw.replace(m.last, m.layer_norm);
}

Rule layernorm_rule() { return make_rule<LayerNormMerge>("merge_layernorm", select_layernorm, merge_layernorm_at); }

// --- Add(x, Mul(x, gate)) -> Mul(x, Add(gate, 1)) ----------------------------------------------
struct ResidualGate {
  int add = -1, mul = -1;
  std::string x, gated, gate;  // gated = x * gate
};

std::optional<ResidualGate> select_residual_gate(const Rewriter& rw, int id) {
  const Graph& g = rw.graph();
  const Node& add = rw.node(id);
  if (!is_onnx_op(add, "Add") || add.inputs.size() != 2 || add.outputs.size() != 1 || has_execution_attrs(add) ||
      !add.attrs.empty())
    return std::nullopt;
  for (size_t side = 0; side < 2; ++side) {
    const std::string &x = add.inputs[1 - side], &gated = add.inputs[side];
    const int m = rw.producer(gated);
    if (m < 0 || rw.sole_reader(gated) < 0) continue;
    const Node& mul = rw.node(m);
    if (!is_onnx_op(mul, "Mul") || mul.inputs.size() != 2 || has_execution_attrs(mul) || !mul.attrs.empty()) continue;
    const int xi = mul.inputs[0] == x ? 0 : mul.inputs[1] == x ? 1 : -1;
    if (xi < 0 || mul.inputs[static_cast<size_t>(1 - xi)] == x) continue;
    const std::string& gate = mul.inputs[static_cast<size_t>(1 - xi)];
    const ValueInfo* gate_info = g.find_value_info(gate);
    if (!gate_info || gate_info->dtype != DType::kFloat32) continue;
    return ResidualGate{id, m, x, gated, gate};
  }
  return std::nullopt;
}

void merge_residual_gate_at(Rewriter& rw, const ResidualGate& m) {
  Graph& g = rw.graph();
  const std::optional<std::vector<Dim>> gate_dims = g.find_value_info(m.gate)->dims;
  // x * (gate + 1) has the shape of x + x * gate (a scalar 1 broadcasts to nothing larger).
  Tensor one(DType::kFloat32, {});
  one.data<float>()[0] = 1.f;
  const std::string one_name = g.unique_value_name(m.gate + "_one");
  g.initializers[one_name] = std::move(one);
  Node plus_one;
  plus_one.op_type = "Add";
  plus_one.name = (rw.node(m.mul).name.empty() ? m.gated : rw.node(m.mul).name) + "_gate_plus_one";
  plus_one.inputs = {m.gate, one_name};
  plus_one.outputs = {g.unique_value_name(m.gate + "_plus_one")};
  g.value_info[plus_one.outputs[0]] = ValueInfo{plus_one.outputs[0], DType::kFloat32, gate_dims};
  Node scaled = rw.node(m.mul);
  scaled.name = rw.node(m.add).name;
  scaled.inputs = {m.x, plus_one.outputs[0]};
  scaled.outputs = rw.node(m.add).outputs;
  // Both at the Add's place (x and the gate exist there); the old Mul (before it) goes.
  rw.insert_before(m.add, std::move(plus_one));
  rw.remove(m.mul);
  rw.replace(m.add, std::move(scaled));
}

Rule residual_gate_rule() {
  return make_rule<ResidualGate>("merge_residual_gate", select_residual_gate, merge_residual_gate_at);
}

}  // namespace

namespace {
// Value name -> index of the node writing it.
std::unordered_map<std::string, size_t> producer_indices(const Graph& g) {
  std::unordered_map<std::string, size_t> producer;
  for (size_t i = 0; i < g.nodes.size(); ++i)
    for (const auto& o : g.nodes[i].outputs)
      if (!o.empty()) producer[o] = i;
  return producer;
}
}  // namespace

int hoist_shape_computations(Graph& g) {
  // Ops that stay cheap on shape-sized integer vectors (not ConstantOfShape, Expand, Tile, Range:
  // they make tensors of the size a shape names).
  static const std::unordered_set<std::string> kCheap = {
      "Gather", "Concat", "Unsqueeze", "Squeeze", "Cast", "Slice", "Reshape", "Identity", "Add", "Sub", "Mul",
      "Div", "Floor", "Ceil", "Neg", "Abs", "Min", "Max", "Equal", "Less", "Greater", "Not", "Where", "Mod",
      "ReduceProd", "ReduceSum", "ReduceMin", "ReduceMax"};
  const size_t n = g.nodes.size();
  const std::unordered_map<std::string, size_t> producer = producer_indices(g);
  // Graph order is topological: a node's inputs are classified before it.
  std::vector<bool> shape_node(n, false);
  for (size_t i = 0; i < n; ++i) {
    const Node& node = g.nodes[i];
    if (node.domain.empty() && (node.op_type == "Shape" || node.op_type == "Size")) {
      shape_node[i] = true;
      continue;
    }
    if (!node.domain.empty() || !kCheap.count(node.op_type) || !node.captured.empty()) continue;
    shape_node[i] = std::all_of(node.inputs.begin(), node.inputs.end(), [&](const std::string& in) {
      if (in.empty() || g.is_initializer(in)) return true;
      const auto it = producer.find(in);
      return it != producer.end() && it->second < i && shape_node[it->second];
    });
  }
  return schedule_early(g, shape_node);
}

int schedule_early(Graph& g, const std::vector<bool>& early) {
  const size_t n = g.nodes.size();
  SQ_CHECK(early.size() == n, ErrorKind::kInternal, "schedule_early: one flag per node expected");
  const std::unordered_map<std::string, size_t> producer = producer_indices(g);
  // Kahn's order: a ready early node first, otherwise the earliest ready node in the old order
  // (which alone reproduces the old order).
  std::vector<size_t> waiting(n, 0);
  std::vector<std::vector<size_t>> readers(n);
  for (size_t i = 0; i < n; ++i) {
    std::unordered_set<size_t> from;
    for (const auto& in : g.nodes[i].inputs) {
      const auto it = producer.find(in);
      if (!in.empty() && it != producer.end() && it->second != i && from.insert(it->second).second)
        readers[it->second].push_back(i);
    }
    waiting[i] = from.size();
  }
  std::set<std::pair<bool, size_t>> ready;  // (not early, old index)
  for (size_t i = 0; i < n; ++i)
    if (waiting[i] == 0) ready.insert({!early[i], i});
  std::vector<size_t> order;
  order.reserve(n);
  while (!ready.empty()) {
    const size_t i = ready.begin()->second;
    ready.erase(ready.begin());
    order.push_back(i);
    for (size_t r : readers[i])
      if (--waiting[r] == 0) ready.insert({!early[r], r});
  }
  if (order.size() != n) return 0;  // not a DAG: leave it to the checks that name the cycle
  int moved = 0;
  std::vector<Node> nodes;
  nodes.reserve(n);
  for (size_t k = 0; k < n; ++k) {
    if (order[k] != k) ++moved;
    nodes.push_back(std::move(g.nodes[order[k]]));
  }
  g.nodes = std::move(nodes);
  return moved;
}

int constants_to_initializers(Graph& g) { return run_rule_alone(g, constants_rule()); }
int neutral_elementwise_to_identity(Graph& g) { return run_rule_alone(g, neutral_mul_rule()); }
int remove_identity_ops(Graph& g) { return run_rule_alone(g, identity_rule()); }
int fold_batchnorm_into_conv(Graph& g) { return run_rule_alone(g, batchnorm_rule()); }
int fold_affine_into_conv(Graph& g) { return run_rule_alone(g, affine_rule()); }

int merge_hardswish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  return total(apply_rules(g, {decomposed_hardswish_rule("merge_decomposed_hardswish", accept, false),
                               hardswish_rule(accept)}));
}

int spell_hardswish_as_gate(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  return run_rule_alone(g, decomposed_hardswish_rule("spell_hardswish_as_gate", accept, true));
}

int merge_swish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  return run_rule_alone(g, swish_rule(accept));
}

int merge_layernorm(Graph& g, const std::set<std::string>& keep) { return run_rule_alone(g, layernorm_rule(), keep); }

int merge_residual_gate(Graph& g, const std::set<std::string>& keep) { return run_rule_alone(g, residual_gate_rule(), keep); }

std::vector<Rule> cleanup_rules() {
  return {constants_rule(), neutral_mul_rule(), identity_rule(), quantized_lstm_rule()};
}

std::vector<Rule> conv_folding_rules() { return {batchnorm_rule(), affine_rule()}; }

std::vector<Rule> execution_merge_rules() {
  return {decomposed_hardswish_rule("merge_decomposed_hardswish", nullptr, false), hardswish_rule(nullptr),
          swish_rule(nullptr), layernorm_rule(), residual_gate_rule()};
}

void bind_input_shapes(Graph& g, const std::map<std::string, Shape>& shapes) {
  for (const auto& [name, shape] : shapes) {
    ValueInfo* info = nullptr;
    for (auto& in : g.inputs)
      if (in.name == name) info = &in;
    if (!info) continue;  // an intermediate value fed by the caller: not a graph input
    if (info->dims) {
      const auto& dims = *info->dims;
      bool ok = dims.size() == shape.size();
      for (size_t k = 0; ok && k < dims.size(); ++k) ok = !dims[k].known() || dims[k].value == shape[k];
      if (!ok) {
        std::string declared = "[";
        for (size_t k = 0; k < dims.size(); ++k)
          declared += (k ? "x" : "") + (dims[k].known() ? std::to_string(dims[k].value)
                                                        : (dims[k].param.empty() ? "?" : dims[k].param));
        declared += "]";
        const bool unbatched = shape.size() == dims.size() + 1;  // the session drops a leading 1 itself
        fail(ErrorKind::kInvalidArgument,
             "input '" + name + "' has shape " + shape_str(shape) + ", the model expects " + declared +
                 (unbatched ? " (one sample without a batch dimension: use batch size 1)" : ""));
      }
    }
    std::vector<Dim> dims;
    for (int64_t d : shape) dims.push_back(Dim{d, ""});
    info->dims = dims;
  }
  g.value_info.clear();
  for (auto& o : g.outputs) o.dims.reset();
  try {
    infer_shapes_onnx(g);
  } catch (const Error&) {
    // Shapes are an optimisation (folding Shape chains); kernels compute shapes at run time anyway.
  }
}


std::vector<int> match_erf_gelu(const GraphIndex& ix, const std::string& y, std::string& out) {
  const Graph& g = ix.graph();
  auto private_value = [&](const std::string& v) { return ix.sole_reader(v) >= 0; };
  const auto readers = ix.readers(y);
  if (!ix.is_private(y) || readers.size() != 2) return {};
  int div = readers[0], mul = readers[1];
  if (ix.node(div).op_type != "Div") std::swap(div, mul);
  const ir::Node &dn = ix.node(div), &mn = ix.node(mul);
  if (dn.op_type != "Div" || dn.inputs.size() != 2 || dn.inputs[0] != y ||
      !is_scalar_close_to(g, dn.inputs[1], std::sqrt(2.f), 1e-4f) || mn.op_type != "Mul" || !private_value(dn.outputs[0]))
    return {};
  const int erf = ix.sole_reader(dn.outputs[0]);
  const Node& en = ix.node(erf);
  if (en.op_type != "Erf" || !private_value(en.outputs[0])) return {};
  const int one = ix.sole_reader(en.outputs[0]);
  const Node& on = ix.node(one);
  if (on.op_type != "Add" || !is_scalar_close_to(g, other_input(on, en.outputs[0]), 1.f, 1e-4f) ||
      !private_value(on.outputs[0]) || ix.sole_reader(on.outputs[0]) != mul || other_input(mn, on.outputs[0]) != y ||
      !private_value(mn.outputs[0]))
    return {};
  const int half = ix.sole_reader(mn.outputs[0]);
  const Node& hn = ix.node(half);
  if (hn.op_type != "Mul" || !is_scalar_close_to(g, other_input(hn, mn.outputs[0]), 0.5f, 1e-4f)) return {};
  for (int n : {div, mul, erf, one, half})
    if (!ix.node(n).domain.empty()) return {};
  out = hn.outputs[0];
  return {div, erf, one, mul, half};
}

std::vector<int> match_erf_gelu(const Graph& g, const std::string& y, const std::set<std::string>& keep,
                                std::string& out) {
  return match_erf_gelu(GraphIndex(g, keep), y, out);
}

}  // namespace slimquant::ir
