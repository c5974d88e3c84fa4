#include "slimquant/ir/passes.h"

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
    // Fresh initializer names: the originals may be shared with other nodes.
    std::string w_name = g.unique_value_name(conv.input(1) + "_bnfolded");
    g.initializers[w_name] = new_w;
    std::string b_name = g.unique_value_name((conv.name.empty() ? conv.outputs[0] : conv.name) + ".bias_bnfolded");
    g.initializers[b_name] = new_b;
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
    if (!act.domain.empty() || act.inputs.empty() || act.outputs.size() != 1) continue;
    FusedActivation f;
    f.op = act.op_type;
    if (act.op_type == "Relu" || act.op_type == "Sigmoid" || act.op_type == "Tanh" || act.op_type == "HardSwish") {
    } else if (act.op_type == "LeakyRelu") {
      f.alpha = act.attr_float("alpha", 0.01f);
    } else if (act.op_type == "Elu") {
      f.alpha = act.attr_float("alpha", 1.0f);
    } else if (act.op_type == "HardSigmoid") {
      f.alpha = act.attr_float("alpha", 0.2f);
      f.beta = act.attr_float("beta", 0.5f);
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
    } else {
      continue;
    }
    const std::string& x = act.inputs[0];
    if (keep.count(x) || g.is_graph_output(x) || g.consumers(x).size() != 1) continue;
    int p = g.producer(x);
    if (p < 0) continue;
    Node& prod = g.nodes[p];
    if (!prod.domain.empty() || !prod.fused.op.empty() || prod.outputs.size() != 1) continue;
    if (prod.op_type != "Conv" && prod.op_type != "ConvTranspose" && prod.op_type != "Gemm") continue;
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
        fail(ErrorKind::kInvalidArgument,
             "input '" + name + "' has shape " + shape_str(shape) + ", the model expects " + declared);
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

int merge_hardswish(Graph& g, const std::function<bool(const std::string& x, const std::string& s)>& accept) {
  int merged = 0;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const Node& hs = g.nodes[i];
    if (hs.op_type != "HardSigmoid" || !hs.domain.empty() || hs.inputs.size() != 1) continue;
    if (std::fabs(hs.attr_float("alpha", 0.2f) - 1.f / 6.f) > 1e-6f || std::fabs(hs.attr_float("beta", 0.5f) - 0.5f) > 1e-6f)
      continue;
    const std::string x = hs.inputs[0], s = hs.outputs[0];
    if (g.is_graph_output(s) || g.consumers(s).size() != 1 || !accept(x, s)) continue;
    const int mul = g.consumers(s)[0];
    Node& m = g.nodes[mul];
    const bool reads_x_and_s = m.inputs.size() == 2 && ((m.inputs[0] == x && m.inputs[1] == s) || (m.inputs[0] == s && m.inputs[1] == x));
    if (m.op_type != "Mul" || !m.domain.empty() || !reads_x_and_s) continue;
    // At the Mul's place: x and everything the Mul needed are computed before it.
    Node node;
    node.op_type = "HardSwish";
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

}  // namespace slimquant::ir
