#include "slimquant/ir/passes.h"

#include <algorithm>
#include <cmath>
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

int constants_to_initializers(Graph& g) {
  int folded = 0;
  std::vector<Node> kept;
  for (auto& n : g.nodes) {
    if (n.op_type != "Constant" || !n.domain.empty() || n.outputs.size() != 1) {
      kept.push_back(std::move(n));
      continue;
    }
    Tensor value;
    if (const Tensor* t = n.attr_tensor("value")) value = *t;
    else if (n.has_attr("value_float")) value = Tensor::scalar<float>(n.attr_float("value_float", 0));
    else if (n.has_attr("value_int")) value = Tensor::scalar<int64_t>(n.attr_int("value_int", 0));
    else if (n.has_attr("value_floats")) {
      auto v = n.attr_floats("value_floats");
      value = Tensor::from_vector<float>({static_cast<int64_t>(v.size())}, v);
    } else if (n.has_attr("value_ints")) {
      auto v = n.attr_ints("value_ints");
      value = Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v);
    } else {
      kept.push_back(std::move(n));  // string / sparse constants: left to the kernel to reject
      continue;
    }
    g.initializers[n.outputs[0]] = value;
    ++folded;
  }
  g.nodes = std::move(kept);
  return folded;
}

namespace {
void rename_value(Graph& g, const std::string& from, const std::string& to) {
  for (auto& n : g.nodes) {
    for (auto& i : n.inputs)
      if (i == from) i = to;
    for (auto& o : n.outputs)
      if (o == from) o = to;
  }
}
bool is_graph_input(const Graph& g, const std::string& v) {
  for (const auto& i : g.inputs)
    if (i.name == v) return true;
  return false;
}
}  // namespace

int neutral_elementwise_to_identity(Graph& g) {
  int replaced = 0;
  for (Node& n : g.nodes) {
    if (n.op_type != "Mul" || !n.domain.empty() || n.inputs.size() != 2 || n.outputs.size() != 1) continue;
    for (size_t side = 0; side < 2; ++side) {
      const Tensor* t = g.initializer(n.inputs[1 - side]);
      // Rank 0: the other operand's shape and type come out unchanged (no broadcast, no promotion).
      if (!t || t->rank() != 0 || t->dtype() != DType::kFloat32 || t->to_float_vector()[0] != 1.f ||
          g.is_initializer(n.inputs[side]))
        continue;
      const std::string x = n.inputs[side];
      n.op_type = "Identity";
      n.inputs = {x};
      n.attrs.clear();
      ++replaced;
      break;
    }
  }
  return replaced;
}

int remove_identity_ops(Graph& g) {
  int removed = 0;
  for (size_t i = 0; i < g.nodes.size();) {
    Node& n = g.nodes[i];
    bool removable = n.domain.empty() && (n.op_type == "Identity" || n.op_type == "Dropout") &&
                     !n.inputs.empty() && !n.outputs.empty();
    if (removable && n.op_type == "Dropout") {
      // Dropout is the identity only at inference; a mask output that someone reads needs the kernel.
      const std::string& training = n.input(2);
      if (!training.empty() && !g.is_initializer(training)) removable = false;
      if (n.outputs.size() > 1 && !n.outputs[1].empty() && !g.consumers(n.outputs[1]).empty()) removable = false;
      if (n.outputs.size() > 1 && g.is_graph_output(n.outputs[1])) removable = false;
    }
    if (!removable) {
      ++i;
      continue;
    }
    const std::string in = n.inputs[0], out = n.outputs[0];
    if (!g.is_graph_output(out)) {
      g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
      rename_value(g, out, in);
    } else if (!g.is_graph_output(in) && !is_graph_input(g, in) && !g.is_initializer(in) && g.producer(in) >= 0) {
      // The output name is part of the model's interface: keep it, drop the input's name instead.
      g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
      rename_value(g, in, out);
    } else {
      ++i;
      continue;
    }
    ++removed;
  }
  if (removed) g.topological_sort();
  return removed;
}

namespace {
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
}  // namespace

int fold_batchnorm_into_conv(Graph& g) {
  int folded = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& bn = g.nodes[i];
    if (bn.op_type != "BatchNormalization" || !bn.domain.empty() || bn.inputs.size() < 5) continue;
    if (bn.attr_int("training_mode", 0) != 0) continue;
    if (bn.outputs.size() > 1) {
      bool extra_used = false;
      for (size_t k = 1; k < bn.outputs.size(); ++k)
        if (!bn.outputs[k].empty() && (!g.consumers(bn.outputs[k]).empty() || g.is_graph_output(bn.outputs[k])))
          extra_used = true;
      if (extra_used) continue;
    }
    const std::string& x = bn.inputs[0];
    int p = g.producer(x);
    if (p < 0) continue;
    Node& conv = g.nodes[p];
    if ((conv.op_type != "Conv" && conv.op_type != "ConvTranspose") || conv.outputs.size() != 1 ||
        has_execution_attrs(conv))
      continue;
    if (g.consumers(x).size() != 1 || g.is_graph_output(x)) continue;
    const Tensor* w = g.initializer(conv.input(1));
    const Tensor* b = conv.input(2).empty() ? nullptr : g.initializer(conv.input(2));
    if (!w || w->dtype() != DType::kFloat32 || (!conv.input(2).empty() && !b) || !is_foldable_conv(conv, *w)) continue;
    const Tensor *scale = g.initializer(bn.inputs[1]), *shift = g.initializer(bn.inputs[2]),
                 *mean = g.initializer(bn.inputs[3]), *var = g.initializer(bn.inputs[4]);
    if (!scale || !shift || !mean || !var) continue;
    const int64_t cout = output_channels(conv, *w);
    if (b && (b->dtype() != DType::kFloat32 || b->numel() != cout)) continue;
    if (scale->numel() != cout || shift->numel() != cout || mean->numel() != cout || var->numel() != cout) continue;
    const float eps = bn.attr_float("epsilon", 1e-5f);
    auto sc = scale->to_float_vector(), sh = shift->to_float_vector(), mu = mean->to_float_vector(),
         vr = var->to_float_vector();
    Tensor new_w = w->clone();
    Tensor new_b(DType::kFloat32, {cout});
    std::vector<float> k(static_cast<size_t>(cout));
    for (int64_t c = 0; c < cout; ++c) {
      k[c] = sc[c] / std::sqrt(vr[c] + eps);
      const float bias = b ? b->data<float>()[c] : 0.f;
      new_b.data<float>()[c] = (bias - mu[c]) * k[c] + sh[c];
    }
    scale_weights_per_output_channel(conv, new_w, k);
    // The folded tensors replace the originals under their names where only this Conv reads them
    // (what an exported model then shows is the source's weight names); shared ones stay, and the
    // folded copies get fresh names.
    auto folded_name = [&](const std::string& original, const std::string& fresh) {
      if (!original.empty() && g.consumers(original).size() == 1 && !g.is_graph_output(original)) return original;
      return g.unique_value_name(fresh);
    };
    const std::string w_name = folded_name(conv.input(1), conv.input(1) + "_bnfolded");
    const std::string b_name =
        folded_name(conv.input(2), (conv.name.empty() ? conv.outputs[0] : conv.name) + (b ? ".bias_bnfolded" : ".bias"));
    g.initializers[w_name] = std::move(new_w);
    g.initializers[b_name] = std::move(new_b);
    conv.inputs.resize(3);
    conv.inputs[1] = w_name;
    conv.inputs[2] = b_name;
    conv.outputs[0] = bn.outputs[0];
    g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
    --i;
    ++folded;
  }
  if (folded) g.remove_unused_initializers();
  return folded;
}

int fold_affine_into_conv(Graph& g) {
  int folded = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& op = g.nodes[i];
    const bool mul = op.op_type == "Mul", add = op.op_type == "Add", sub = op.op_type == "Sub", div = op.op_type == "Div";
    if (!(mul || add || sub || div) || !op.domain.empty() || op.inputs.size() != 2 || op.outputs.size() != 1) continue;
    // The Conv's output and the constant; Sub and Div only as conv - c and conv / c.
    for (size_t side = 0; side < 2; ++side) {
      if ((sub || div) && side == 1) break;
      const std::string& y = op.inputs[side];
      const std::string& c = op.inputs[1 - side];
      const int p = g.producer(y);
      if (p < 0 || y == c || g.is_graph_output(y) || g.consumers(y).size() != 1) continue;
      Node& conv = g.nodes[static_cast<size_t>(p)];
      if ((conv.op_type != "Conv" && conv.op_type != "ConvTranspose") || conv.outputs.size() != 1 ||
          has_execution_attrs(conv))
        continue;
      const Tensor* w = g.initializer(conv.input(1));
      const Tensor* b = conv.input(2).empty() ? nullptr : g.initializer(conv.input(2));
      if (!w || w->dtype() != DType::kFloat32 || !is_foldable_conv(conv, *w) ||
          (!conv.input(2).empty() && (!b || b->dtype() != DType::kFloat32)))
        continue;
      const int64_t cout = output_channels(conv, *w);
      if (b && b->numel() != cout) continue;
      std::optional<std::vector<float>> k = per_channel_constant(g, c, cout, w->rank());
      if (!k) continue;
      if (div) {
        if (std::any_of(k->begin(), k->end(), [](float d) { return d == 0.f || !std::isfinite(d); })) break;
        for (float& d : *k) d = 1.f / d;
      }
      if (sub)
        for (float& d : *k) d = -d;
      // y * k: weights and bias scaled per output channel (any sign); y + k: bias shifted.
      Tensor new_b(DType::kFloat32, {cout});
      for (int64_t ch = 0; ch < cout; ++ch) new_b.data<float>()[ch] = b ? b->data<float>()[ch] : 0.f;
      std::optional<Tensor> new_w;
      if (mul || div) {
        new_w = w->clone();
        scale_weights_per_output_channel(conv, *new_w, *k);
        for (int64_t ch = 0; ch < cout; ++ch) new_b.data<float>()[ch] *= (*k)[static_cast<size_t>(ch)];
      } else {
        for (int64_t ch = 0; ch < cout; ++ch) new_b.data<float>()[ch] += (*k)[static_cast<size_t>(ch)];
      }
      // As in fold_batchnorm_into_conv: tensors only this Conv reads are replaced under their names.
      auto folded_name = [&](const std::string& original, const std::string& fresh) {
        if (!original.empty() && g.consumers(original).size() == 1 && !g.is_graph_output(original)) return original;
        return g.unique_value_name(fresh);
      };
      const std::string base = conv.name.empty() ? conv.outputs[0] : conv.name;
      if (new_w) {
        const std::string w_name = folded_name(conv.input(1), conv.input(1) + "_affine_folded");
        g.initializers[w_name] = std::move(*new_w);
        conv.inputs[1] = w_name;
      }
      const std::string b_name = folded_name(conv.input(2), base + (b ? ".bias_affine_folded" : ".bias"));
      g.initializers[b_name] = std::move(new_b);
      conv.inputs.resize(3);
      conv.inputs[2] = b_name;
      conv.outputs[0] = op.outputs[0];
      g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
      --i;  // the next node (a following Add reading the Conv's new output) is looked at next
      ++folded;
      break;
    }
  }
  if (folded) g.remove_unused_initializers();
  return folded;
}

std::vector<Rule> cleanup_rules() {
  return {graph_rule("constants_to_initializers", [](Graph& g, const auto&) { return constants_to_initializers(g); }),
          graph_rule("neutral_elementwise_to_identity",
                     [](Graph& g, const auto&) { return neutral_elementwise_to_identity(g); }),
          graph_rule("remove_identity_ops", [](Graph& g, const auto&) { return remove_identity_ops(g); })};
}

std::vector<Rule> conv_folding_rules() {
  return {graph_rule("fold_batchnorm_into_conv", [](Graph& g, const auto&) { return fold_batchnorm_into_conv(g); }),
          graph_rule("fold_affine_into_conv", [](Graph& g, const auto&) { return fold_affine_into_conv(g); })};
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

namespace {

// The pattern behind hard-swish and swish: a gate node reading x whose output s is read only by
// Mul(x, s). Replaces the Mul by `fused` (inputs {x}, the Mul's outputs) and drops the gate.
int merge_gated_mul(Graph& g, const std::function<bool(const Node&)>& is_gate, const Node& fused,
                    const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  int merged = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& gate = g.nodes[i];
    if (!gate.domain.empty() || gate.inputs.size() != 1 || gate.outputs.size() != 1 || !is_gate(gate)) continue;
    const std::string x = gate.inputs[0], s = gate.outputs[0];
    if (g.is_graph_output(s) || g.consumers(s).size() != 1 || !accept(x, s)) continue;
    Node& m = g.nodes[g.consumers(s)[0]];
    const bool reads_x_and_s = m.inputs.size() == 2 && ((m.inputs[0] == x && m.inputs[1] == s) || (m.inputs[0] == s && m.inputs[1] == x));
    if (m.op_type != "Mul" || !m.domain.empty() || !reads_x_and_s) continue;
    // At the Mul's place: x and everything the Mul needed are computed before it.
    Node node = fused;
    node.name = m.name;
    node.inputs = {x};
    node.outputs = m.outputs;
    m = std::move(node);
    g.nodes.erase(g.nodes.begin() + static_cast<std::ptrdiff_t>(i));
    --i;
    ++merged;
  }
  return merged;
}

// The single reader of v when it is a default-domain `op` with one output, else -1.
int sole_reader(const Graph& g, const std::string& v, const char* op) {
  if (g.is_graph_output(v) || g.consumers(v).size() != 1) return -1;
  const int c = g.consumers(v)[0];
  const Node& n = g.nodes[c];
  return n.op_type == op && n.domain.empty() && n.outputs.size() == 1 ? c : -1;
}

// paddle2onnx's hard-swish before opset 14: Div(Mul(x, Clip(Add(x, 3), 0, 6)), 6) (or the Add's
// operands swapped, or a Mul by 1/6 at the end). The whole chain becomes one HardSwish at the
// last node's place, or with as_gate the standard opset-13 spelling Mul(x, HardSigmoid(x; 1/6, 0.5)).
int merge_decomposed_hardswish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept,
                               bool as_gate) {
  int merged = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& add = g.nodes[i];
    if (add.op_type != "Add" || !add.domain.empty() || add.inputs.size() != 2 || add.outputs.size() != 1) continue;
    const int side = is_scalar_close_to(g, add.inputs[1], 3.f, 1e-5f) ? 0 : is_scalar_close_to(g, add.inputs[0], 3.f, 1e-5f) ? 1 : -1;
    if (side < 0) continue;
    const std::string x = add.inputs[static_cast<size_t>(side)];
    const int clip = sole_reader(g, add.outputs[0], "Clip");
    if (clip < 0) continue;
    const Node& c = g.nodes[clip];
    const std::optional<float> lo = g.opset < 11 ? std::optional<float>(c.attr_float("min", -1.f)) : scalar_constant(g, c.input(1));
    const std::optional<float> hi = g.opset < 11 ? std::optional<float>(c.attr_float("max", 0.f)) : scalar_constant(g, c.input(2));
    const bool bounds = lo && hi && *lo == 0.f && std::fabs(*hi - 6.f) <= 1e-5f * 6.f;
    if (!bounds) continue;
    const int mul = sole_reader(g, c.outputs[0], "Mul");
    if (mul < 0) continue;
    const Node& m = g.nodes[mul];
    if (m.inputs.size() != 2 || !((m.inputs[0] == x && m.inputs[1] == c.outputs[0]) || (m.inputs[1] == x && m.inputs[0] == c.outputs[0]))) continue;
    int scale = sole_reader(g, m.outputs[0], "Div");
    if (scale >= 0 && !(g.nodes[scale].inputs.size() == 2 && g.nodes[scale].inputs[0] == m.outputs[0] &&
                        is_scalar_close_to(g, g.nodes[scale].inputs[1], 6.f, 1e-5f)))
      scale = -1;
    if (scale < 0) {
      scale = sole_reader(g, m.outputs[0], "Mul");
      if (scale >= 0 && g.nodes[scale].inputs.size() != 2) scale = -1;
      if (scale >= 0) {
        const Node& s = g.nodes[scale];
        const std::string& k = s.inputs[0] == m.outputs[0] ? s.inputs[1] : s.inputs[0];
        if (!is_scalar_close_to(g, k, 1.f / 6.f, 1e-5f)) scale = -1;
      }
    }
    if (scale < 0 || !accept(x, add.outputs[0]) || !accept(x, c.outputs[0]) || !accept(x, m.outputs[0])) continue;
    Node node;
    node.op_type = "HardSwish";
    node.name = g.nodes[scale].name;
    node.inputs = {x};
    node.outputs = g.nodes[scale].outputs;
    Node gate;
    if (as_gate) {
      gate.op_type = "HardSigmoid";
      gate.name = node.name + "_hardsigmoid";
      gate.inputs = {x};
      gate.outputs = {g.unique_value_name(node.outputs[0] + "_hardsigmoid")};
      gate.attrs["alpha"] = 1.f / 6.f;
      gate.attrs["beta"] = 0.5f;
      node.op_type = "Mul";
      node.inputs = {x, gate.outputs[0]};
    }
    g.nodes[static_cast<size_t>(scale)] = std::move(node);
    // Erase from the back so the smaller indices stay valid (all are before the scale node).
    std::vector<int> gone{static_cast<int>(i), clip, mul};
    std::sort(gone.rbegin(), gone.rend());
    for (int k : gone) g.nodes.erase(g.nodes.begin() + k);
    if (as_gate) g.nodes.insert(g.nodes.begin() + (scale - 3), std::move(gate));
    --i;
    ++merged;
  }
  return merged;
}

}  // namespace

namespace {
// The reduction axes of a ReduceMean (attribute before opset 18, constant input from 18), or
// nullopt when they are not constant or keepdims is 0.
std::optional<std::vector<int64_t>> reduce_mean_axes(const Graph& g, const Node& n) {
  if (n.op_type != "ReduceMean" || !n.domain.empty() || n.attr_int("keepdims", 1) != 1) return std::nullopt;
  if (g.opset < 18) return n.attr_ints("axes");
  const Tensor* t = n.input(1).empty() ? nullptr : g.initializer(n.input(1));
  if (!t) return std::nullopt;
  return t->to_int64_vector();
}
}  // namespace

int merge_layernorm(Graph& g, const std::set<std::string>& keep) {
  int merged = 0;
  // v may be dropped: nobody else reads it and it is not kept.
  auto private_value = [&](const std::string& v, size_t readers) {
    return !keep.count(v) && !g.is_graph_output(v) && g.consumers(v).size() == readers;
  };
  auto one_reader = [&](const std::string& v, const char* op) { return private_value(v, 1) ? sole_reader(g, v, op) : -1; };
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& mean = g.nodes[i];
    const std::optional<std::vector<int64_t>> axes = reduce_mean_axes(g, mean);
    if (!axes || axes->size() != 1 || mean.inputs.empty() || mean.outputs.size() != 1) continue;
    const std::string x = mean.inputs[0];
    // The last axis, as LayerNormalization's axis -1: written -1, or rank - 1 where the rank is known.
    const ValueInfo* vx = g.find_value_info(x);
    const int64_t rank = vx && vx->dims ? static_cast<int64_t>(vx->dims->size()) : -1;
    if ((*axes)[0] != -1 && (rank < 1 || (*axes)[0] != rank - 1)) continue;
    const int sub = one_reader(mean.outputs[0], "Sub");
    if (sub < 0 || g.nodes[sub].inputs.size() != 2 || g.nodes[sub].inputs[0] != x) continue;
    const std::string d = g.nodes[sub].outputs[0];
    if (!private_value(d, 2)) continue;
    int pow = -1, div = -1;
    for (int r : g.consumers(d)) {
      if (g.nodes[r].op_type == "Pow" && g.nodes[r].domain.empty() && g.nodes[r].inputs[0] == d) pow = r;
      if (g.nodes[r].op_type == "Div" && g.nodes[r].domain.empty() && g.nodes[r].inputs[0] == d) div = r;
    }
    if (pow < 0 || div < 0 || !is_scalar_close_to(g, g.nodes[pow].input(1), 2.f, 1e-5f)) continue;
    const int var = private_value(g.nodes[pow].outputs[0], 1) ? g.consumers(g.nodes[pow].outputs[0])[0] : -1;
    if (var < 0 || reduce_mean_axes(g, g.nodes[var]) != axes) continue;
    const int eps_add = one_reader(g.nodes[var].outputs[0], "Add");
    if (eps_add < 0) continue;
    const std::optional<float> eps = scalar_constant(g, other_input(g.nodes[eps_add], g.nodes[var].outputs[0]));
    if (!eps || !(*eps >= 0.f)) continue;
    const int sqrt = one_reader(g.nodes[eps_add].outputs[0], "Sqrt");
    if (sqrt < 0 || one_reader(g.nodes[sqrt].outputs[0], "Div") != div || g.nodes[div].inputs[1] != g.nodes[sqrt].outputs[0])
      continue;
    // Then Mul(scale) and Add(bias), 1-D constants over the last axis.
    const std::string normed = g.nodes[div].outputs[0];
    const int mul = one_reader(normed, "Mul");
    if (mul < 0) continue;
    const std::string scale = other_input(g.nodes[mul], normed);
    const Tensor* st = g.initializer(scale);
    if (!st || st->rank() != 1 || st->dtype() != DType::kFloat32) continue;
    const int add = one_reader(g.nodes[mul].outputs[0], "Add");
    const std::string bias = add < 0 ? "" : other_input(g.nodes[add], g.nodes[mul].outputs[0]);
    const Tensor* bt = bias.empty() ? nullptr : g.initializer(bias);
    const bool with_bias = bt && bt->rank() == 1 && bt->dtype() == DType::kFloat32 && bt->numel() == st->numel();
    const int last = with_bias ? add : mul;
    Node ln;
    ln.op_type = "LayerNormalization";
    ln.name = g.nodes[last].name;
    ln.inputs = {x, scale};
    if (with_bias) ln.inputs.push_back(bias);
    ln.outputs = g.nodes[last].outputs;
    ln.attrs["axis"] = int64_t{-1};
    ln.attrs["epsilon"] = *eps;
    g.nodes[static_cast<size_t>(last)] = std::move(ln);
    std::vector<int> gone{static_cast<int>(i), sub, pow, var, eps_add, sqrt, div};
    if (with_bias) gone.push_back(mul);
    std::sort(gone.rbegin(), gone.rend());
    for (int k : gone) g.nodes.erase(g.nodes.begin() + k);
    --i;
    ++merged;
  }
  return merged;
}

int merge_hardswish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  Node hard_swish;
  hard_swish.op_type = "HardSwish";
  return merge_decomposed_hardswish(g, accept, false) + merge_gated_mul(
      g,
      [](const Node& n) {
        return n.op_type == "HardSigmoid" && std::fabs(n.attr_float("alpha", 0.2f) - 1.f / 6.f) <= 1e-6f &&
               std::fabs(n.attr_float("beta", 0.5f) - 0.5f) <= 1e-6f;
      },
      hard_swish, accept);
}

int spell_hardswish_as_gate(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  return merge_decomposed_hardswish(g, accept, true);
}

int merge_swish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  Node swish;
  swish.op_type = "Swish";
  swish.domain = kSlimquantDomain;
  swish.attrs["alpha"] = 1.f;
  return merge_gated_mul(g, [](const Node& n) { return n.op_type == "Sigmoid"; }, swish, accept);
}

int merge_residual_gate(Graph& g, const std::set<std::string>& keep) {
  int merged = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& add = g.nodes[i];
    if (add.op_type != "Add" || !add.domain.empty() || add.inputs.size() != 2 || add.outputs.size() != 1 ||
        has_execution_attrs(add) || !add.attrs.empty())
      continue;
    for (size_t side = 0; side < 2; ++side) {
      const std::string x = add.inputs[1 - side], gated = add.inputs[side];
      const int m = g.producer(gated);
      if (m < 0 || keep.count(gated) || g.is_graph_output(gated) || g.consumers(gated).size() != 1) continue;
      const Node& mul = g.nodes[static_cast<size_t>(m)];
      if (mul.op_type != "Mul" || !mul.domain.empty() || mul.inputs.size() != 2 || has_execution_attrs(mul) ||
          !mul.attrs.empty())
        continue;
      const int xi = mul.inputs[0] == x ? 0 : mul.inputs[1] == x ? 1 : -1;
      if (xi < 0 || mul.inputs[static_cast<size_t>(1 - xi)] == x) continue;
      const std::string gate = mul.inputs[static_cast<size_t>(1 - xi)];
      const ValueInfo* gate_info = g.find_value_info(gate);
      if (!gate_info || gate_info->dtype != DType::kFloat32) continue;
      // x * (gate + 1) has the shape of x + x * gate (a scalar 1 broadcasts to nothing larger).
      Tensor one(DType::kFloat32, {});
      one.data<float>()[0] = 1.f;
      const std::string one_name = g.unique_value_name(gate + "_one");
      g.initializers[one_name] = std::move(one);
      Node plus_one;
      plus_one.op_type = "Add";
      plus_one.name = (mul.name.empty() ? gated : mul.name) + "_gate_plus_one";
      plus_one.inputs = {gate, one_name};
      plus_one.outputs = {g.unique_value_name(gate + "_plus_one")};
      g.value_info[plus_one.outputs[0]] = ValueInfo{plus_one.outputs[0], DType::kFloat32, gate_info->dims};
      Node scaled = mul;
      scaled.name = add.name;
      scaled.inputs = {x, plus_one.outputs[0]};
      scaled.outputs = add.outputs;
      // Both at the Add's place (x and the gate exist there); the old Mul (before it) goes.
      g.nodes[i] = std::move(scaled);
      g.nodes.insert(g.nodes.begin() + static_cast<std::ptrdiff_t>(i), std::move(plus_one));
      g.nodes.erase(g.nodes.begin() + m);
      ++merged;
      break;
    }
  }
  return merged;
}

}  // namespace slimquant::ir
