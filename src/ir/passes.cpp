#include "slimquant/ir/passes.h"

#include <algorithm>
#include <cmath>

#include "slimquant/ir/onnx_io.h"

namespace slimquant::ir {

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
    if (conv.op_type != "Conv" || !conv.domain.empty() || conv.outputs.size() != 1) continue;
    if (g.consumers(x).size() != 1 || g.is_graph_output(x)) continue;
    const Tensor* w = g.initializer(conv.input(1));
    const Tensor* b = conv.input(2).empty() ? nullptr : g.initializer(conv.input(2));
    if (!w || w->dtype() != DType::kFloat32 || (!conv.input(2).empty() && !b)) continue;
    const Tensor *scale = g.initializer(bn.inputs[1]), *shift = g.initializer(bn.inputs[2]),
                 *mean = g.initializer(bn.inputs[3]), *var = g.initializer(bn.inputs[4]);
    if (!scale || !shift || !mean || !var) continue;
    const int64_t cout = w->dim(0);
    if (scale->numel() != cout || shift->numel() != cout || mean->numel() != cout || var->numel() != cout) continue;
    const float eps = bn.attr_float("epsilon", 1e-5f);
    auto sc = scale->to_float_vector(), sh = shift->to_float_vector(), mu = mean->to_float_vector(),
         vr = var->to_float_vector();
    Tensor new_w = w->clone();
    Tensor new_b(DType::kFloat32, {cout});
    const int64_t per_channel = w->numel() / cout;
    float* wd = new_w.data<float>();
    for (int64_t c = 0; c < cout; ++c) {
      const float k = sc[c] / std::sqrt(vr[c] + eps);
      for (int64_t j = 0; j < per_channel; ++j) wd[c * per_channel + j] *= k;
      const float bias = b ? b->data<float>()[c] : 0.f;
      new_b.data<float>()[c] = (bias - mu[c]) * k + sh[c];
    }
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

int fuse_activations(Graph& g, const std::set<std::string>& keep) {
  int fused = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    Node& act = g.nodes[i];
    if (act.inputs.empty() || act.outputs.size() != 1) continue;
    FusedActivation f;
    f.op = act.op_type;
    if (act.op_type == "Swish" && act.domain == kSlimquantDomain) {
      f.alpha = act.attr_float("alpha", 1.f);
    } else if (!act.domain.empty()) {
      continue;
    } else if (act.op_type == "Relu" || act.op_type == "Sigmoid" || act.op_type == "Tanh" || act.op_type == "HardSwish") {
    } else if (act.op_type == "LeakyRelu") {
      f.alpha = act.attr_float("alpha", 0.01f);
    } else if (act.op_type == "Elu") {
      f.alpha = act.attr_float("alpha", 1.0f);
    } else if (act.op_type == "HardSigmoid") {
      f.alpha = act.attr_float("alpha", 0.2f);
      f.beta = act.attr_float("beta", 0.5f);
    } else if (act.op_type == "Mul" && act.inputs.size() == 2) {
      // A scalar factor after a MatMul (attention's 1/sqrt(d) after Q K^T): a linear post-op.
      if (scalar_constant(g, act.inputs[0])) std::swap(act.inputs[0], act.inputs[1]);  // Mul(c, y)
      const std::optional<float> c = scalar_constant(g, act.inputs[1]);
      const int p = g.producer(act.inputs[0]);
      if (!c || p < 0 || g.nodes[p].op_type != "MatMul") continue;
      f.op = "Scale";
      f.alpha = *c;
    } else if (act.op_type == "Clip") {
      f.alpha = -INFINITY;
      f.beta = INFINITY;
      if (g.opset < 11) {
        f.alpha = act.attr_float("min", -INFINITY);
        f.beta = act.attr_float("max", INFINITY);
      } else {
        const std::string &lo = act.input(1), &hi = act.input(2);
        if ((!lo.empty() && !g.is_initializer(lo)) || (!hi.empty() && !g.is_initializer(hi))) continue;
        if (!lo.empty()) f.alpha = g.initializer(lo)->to_float_vector().at(0);
        if (!hi.empty()) f.beta = g.initializer(hi)->to_float_vector().at(0);
      }
      // oneDNN refuses a clip post-op with min > max (or NaN); the Clip kernel gives max there.
      if (!(f.alpha <= f.beta)) continue;
    } else {
      continue;
    }
    const std::string& x = act.inputs[0];
    if (keep.count(x) || g.is_graph_output(x) || g.consumers(x).size() != 1) continue;
    int p = g.producer(x);
    if (p < 0) continue;
    Node& prod = g.nodes[p];
    if (!prod.domain.empty() || !prod.fused.op.empty() || prod.outputs.size() != 1) continue;
    const bool matmul_scale = f.op == "Scale";  // the only fusion into a MatMul here
    if (matmul_scale != (prod.op_type == "MatMul")) continue;
    if (!matmul_scale && prod.op_type != "Conv" && prod.op_type != "ConvTranspose" && prod.op_type != "Gemm") continue;
    prod.fused = f;
    prod.outputs[0] = act.outputs[0];
    g.nodes.erase(g.nodes.begin() + static_cast<long>(i));
    --i;
    ++fused;
  }
  return fused;
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

std::optional<float> scalar_constant(const Graph& g, const std::string& v) {
  const Tensor* t = v.empty() ? nullptr : g.initializer(v);
  if (!t || t->numel() != 1 || !dtype_is_float(t->dtype())) return std::nullopt;
  return t->to_float_vector()[0];
}

namespace {
bool is_constant_close_to(const Graph& g, const std::string& v, float want) {
  const std::optional<float> c = scalar_constant(g, v);
  return c && std::fabs(*c - want) <= 1e-4f * std::fabs(want);
}

}  // namespace

std::string other_input(const Node& n, const std::string& v) {
  if (n.inputs.size() != 2) return "";
  return n.inputs[0] == v ? n.inputs[1] : n.inputs[1] == v ? n.inputs[0] : "";
}

std::vector<int> match_erf_gelu(const Graph& g, const std::string& y, const std::set<std::string>& keep,
                                std::string& out) {
  auto private_value = [&](const std::string& v) {
    return !keep.count(v) && !g.is_graph_output(v) && g.consumers(v).size() == 1;
  };
  const auto readers = g.consumers(y);
  if (keep.count(y) || g.is_graph_output(y) || readers.size() != 2) return {};
  int div = readers[0], mul = readers[1];
  if (g.nodes[div].op_type != "Div") std::swap(div, mul);
  const ir::Node &dn = g.nodes[div], &mn = g.nodes[mul];
  if (dn.op_type != "Div" || dn.inputs.size() != 2 || dn.inputs[0] != y ||
      !is_constant_close_to(g, dn.inputs[1], std::sqrt(2.f)) || mn.op_type != "Mul" || !private_value(dn.outputs[0]))
    return {};
  const int erf = g.consumers(dn.outputs[0])[0];
  const Node& en = g.nodes[erf];
  if (en.op_type != "Erf" || !private_value(en.outputs[0])) return {};
  const int one = g.consumers(en.outputs[0])[0];
  const Node& on = g.nodes[one];
  if (on.op_type != "Add" || !is_constant_close_to(g, other_input(on, en.outputs[0]), 1.f) ||
      !private_value(on.outputs[0]) || g.consumers(on.outputs[0])[0] != mul || other_input(mn, on.outputs[0]) != y ||
      !private_value(mn.outputs[0]))
    return {};
  const int half = g.consumers(mn.outputs[0])[0];
  const Node& hn = g.nodes[half];
  if (hn.op_type != "Mul" || !is_constant_close_to(g, other_input(hn, mn.outputs[0]), 0.5f)) return {};
  for (int n : {div, mul, erf, one, half})
    if (!g.nodes[n].domain.empty()) return {};
  out = hn.outputs[0];
  return {div, erf, one, mul, half};
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

// A scalar float constant within 1e-5 (relative) of `want`.
bool is_scalar_constant(const Graph& g, const std::string& v, float want) {
  const std::optional<float> c = scalar_constant(g, v);
  return c && std::fabs(*c - want) <= 1e-5f * std::fabs(want);
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
// last node's place.
int merge_decomposed_hardswish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  int merged = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& add = g.nodes[i];
    if (add.op_type != "Add" || !add.domain.empty() || add.inputs.size() != 2 || add.outputs.size() != 1) continue;
    const int side = is_scalar_constant(g, add.inputs[1], 3.f) ? 0 : is_scalar_constant(g, add.inputs[0], 3.f) ? 1 : -1;
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
                        is_scalar_constant(g, g.nodes[scale].inputs[1], 6.f)))
      scale = -1;
    if (scale < 0) {
      scale = sole_reader(g, m.outputs[0], "Mul");
      if (scale >= 0 && g.nodes[scale].inputs.size() != 2) scale = -1;
      if (scale >= 0) {
        const Node& s = g.nodes[scale];
        const std::string& k = s.inputs[0] == m.outputs[0] ? s.inputs[1] : s.inputs[0];
        if (!is_scalar_constant(g, k, 1.f / 6.f)) scale = -1;
      }
    }
    if (scale < 0 || !accept(x, add.outputs[0]) || !accept(x, c.outputs[0]) || !accept(x, m.outputs[0])) continue;
    Node node;
    node.op_type = "HardSwish";
    node.name = g.nodes[scale].name;
    node.inputs = {x};
    node.outputs = g.nodes[scale].outputs;
    g.nodes[static_cast<size_t>(scale)] = std::move(node);
    // Erase from the back so the smaller indices stay valid.
    std::vector<int> gone{static_cast<int>(i), clip, mul};
    std::sort(gone.rbegin(), gone.rend());
    for (int k : gone) g.nodes.erase(g.nodes.begin() + k);
    --i;
    ++merged;
  }
  return merged;
}

}  // namespace

int merge_hardswish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  Node hard_swish;
  hard_swish.op_type = "HardSwish";
  return merge_decomposed_hardswish(g, accept) + merge_gated_mul(
      g,
      [](const Node& n) {
        return n.op_type == "HardSigmoid" && std::fabs(n.attr_float("alpha", 0.2f) - 1.f / 6.f) <= 1e-6f &&
               std::fabs(n.attr_float("beta", 0.5f) - 0.5f) <= 1e-6f;
      },
      hard_swish, accept);
}

int merge_swish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  Node swish;
  swish.op_type = "Swish";
  swish.domain = kSlimquantDomain;
  swish.attrs["alpha"] = 1.f;
  return merge_gated_mul(g, [](const Node& n) { return n.op_type == "Sigmoid"; }, swish, accept);
}

}  // namespace slimquant::ir
