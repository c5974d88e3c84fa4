#include "slimquant/quant/ptq.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <set>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "slimquant/core/atomic_file.h"
#include "slimquant/core/distributed.h"
#include "slimquant/core/quant_param.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/ir/passes.h"
#include "slimquant/runtime/kernel.h"
#include "slimquant/runtime/optimize.h"
#include "quant/blocked_export.h"
#include "quant/deploy_policy.h"
#include "quant/qdq_export.h"

namespace slimquant::quant {

namespace {

// Ops whose output is a re-arrangement or selection of their input's values: their output must use
// the input's scale so integer tensors can pass through them unchanged.
const std::unordered_set<std::string> kPassThroughOps = {
    "Reshape", "Transpose", "Flatten", "Squeeze", "Unsqueeze", "MaxPool", "GlobalMaxPool", "Slice",
    "Gather", "Split", "DepthToSpace", "SpaceToDepth", "Resize", "Identity", "Pad"};

// 64-bit FNV-1a as 16 hex digits: a stable identity for caches (not a security measure).
std::string fnv1a_hex(std::string_view bytes) {
  uint64_t h = 1469598103934665603ull;
  for (unsigned char c : bytes) {
    h ^= c;
    h *= 1099511628211ull;
  }
  char buf[17];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(h));
  return buf;
}

// The per-channel maxima as text lines `tensor` / `count v0 v1 ...` (hexfloat: exact).
void save_channel_abs_max(std::ostream& out, const std::map<std::string, std::vector<float>>& maxima) {
  for (const auto& [tensor, abs_max] : maxima) {
    out << tensor << '\n' << abs_max.size() << std::hexfloat;
    for (float v : abs_max) out << ' ' << v;
    out << std::defaultfloat << '\n';
  }
}

// Reads what save_channel_abs_max wrote for the same tensors; `merge` keeps the larger value of
// each channel (another rank's share of the calibration), otherwise replaces.
void load_channel_abs_max(std::istream& in, std::map<std::string, std::vector<float>>& maxima, bool merge) {
  for (auto& [tensor, abs_max] : maxima) {
    std::string stored, values;
    std::getline(in >> std::ws, stored);
    std::getline(in, values);
    std::istringstream line(values);
    size_t count = 0;
    line >> count;
    std::vector<float> read(count);
    for (float& v : read) {
      std::string word;
      line >> word;
      v = std::strtof(word.c_str(), nullptr);
    }
    SQ_CHECK(stored == tensor && !line.fail(), ErrorKind::kInvalidData, "expected the channel maxima of '" + tensor + "'");
    if (!merge || abs_max.empty()) {
      abs_max = std::move(read);
    } else if (!read.empty()) {
      SQ_CHECK(read.size() == abs_max.size(), ErrorKind::kInvalidData, "the channel counts of '" + tensor + "' differ");
      for (size_t c = 0; c < read.size(); ++c) abs_max[c] = std::max(abs_max[c], read[c]);
    }
  }
}

// max |x| per channel (axis 1) of an [N, C, ...] value, merged into `abs_max` (sized on first use).
// The observer has already refused NaN / Inf.
void observe_channel_abs_max(const Tensor& x, std::vector<float>& abs_max) {
  if (x.rank() < 2) return;
  const int64_t n = x.shape()[0], c = x.shape()[1], inner = x.numel() / std::max<int64_t>(1, n * c);
  if (abs_max.empty()) abs_max.assign(static_cast<size_t>(c), 0.f);
  SQ_CHECK(static_cast<int64_t>(abs_max.size()) == c, ErrorKind::kInvalidData,
           "the channel count changed between calibration batches (" + std::to_string(abs_max.size()) + " then " +
               std::to_string(c) + ")");
  const float* p = x.data<float>();
  for (int64_t b = 0; b < n; ++b)
    for (int64_t ch = 0; ch < c; ++ch) {
      float m = abs_max[static_cast<size_t>(ch)];
      for (int64_t i = 0; i < inner; ++i) m = std::max(m, std::fabs(p[(b * c + ch) * inner + i]));
      abs_max[static_cast<size_t>(ch)] = m;
    }
}

// Tensors quantized once for all their readers: a Conv's output (not a graph output) read by two or
// more nodes whose kernels all declare they read 8-bit codes at those inputs (KernelFolds::
// dequantized_inputs: the elementwise arithmetic and the global pools), e.g. a squeeze-excitation
// block's input, read by its pool, its gating Mul(x, gate) and the residual Add(x, x * gate) of
// PP-OCRv4 det's RSE layers (which the runtime merges into Mul(x, gate + 1)). The integer runtime then reads the Conv's 8-bit codes everywhere
// (runtime/fusions/declared_folds.h) instead of a float32 map written, pooled and read back. A
// single reader is left alone: the execution fusions take it whole (a residual Add becomes the
// convolution's sum post-op). Per value: x and its readers.
std::vector<std::pair<std::string, std::vector<int>>> code_readable_inputs(const ir::Graph& g) {
  // Readers as the runtime will run them: after its merges (paddle2onnx's x * Clip(x + 3, 0, 6) / 6
  // reads x in an Add and a Mul, but runs as one HardSwish fused into the Conv).
  ir::Graph merged = g;
  ir::apply_rules(merged, ir::execution_merge_rules(), {});
  auto distinct_readers = [](const ir::Graph& graph) {
    std::unordered_map<std::string, std::vector<int>> readers;  // in node order
    for (size_t i = 0; i < graph.nodes.size(); ++i)
      for (const std::string& in : graph.nodes[i].inputs) {
        std::vector<int>& r = readers[in];
        if (r.empty() || r.back() != static_cast<int>(i)) r.push_back(static_cast<int>(i));
      }
    return readers;
  };
  const std::unordered_map<std::string, std::vector<int>> run_readers = distinct_readers(merged);
  const std::unordered_map<std::string, std::vector<int>> model_readers = distinct_readers(g);
  const runtime::KernelRegistry& kernels = runtime::KernelRegistry::instance();
  std::set<std::string> graph_outputs;
  for (const ir::ValueInfo& o : g.outputs) graph_outputs.insert(o.name);
  std::vector<std::pair<std::string, std::vector<int>>> found;
  for (const ir::Node& conv : g.nodes) {
    if (!ir::is_onnx_op(conv, "Conv") || conv.outputs.size() != 1 || graph_outputs.count(conv.outputs[0])) continue;
    const std::string& x = conv.outputs[0];
    const auto r = run_readers.find(x);
    if (r == run_readers.end() || r->second.size() < 2) continue;
    const bool all_read_codes = std::all_of(r->second.begin(), r->second.end(), [&](int id) {
      const ir::Node& n = merged.nodes[static_cast<size_t>(id)];
      return n.outputs.size() == 1 &&
             kernels.folds(n.op_type, n.domain).accepts_every_read(n, runtime::Fold::kDequantizedInput, x);
    });
    // Quantized for every reader in the model (a merge may have joined two of them).
    if (all_read_codes) found.emplace_back(x, model_readers.at(x));
  }
  return found;
}
// A warning's list of names: the first three, then how many more.
std::string first_few(const std::vector<std::string>& names) {
  std::string out;
  for (size_t i = 0; i < std::min<size_t>(names.size(), 3); ++i) out += (i ? ", " : "") + names[i];
  if (names.size() > 3) out += " and " + std::to_string(names.size() - 3) + " more";
  return out;
}

// The graph's nodes with those of its subgraphs (recursively) added, for checks by node name.
ir::Graph with_subgraph_nodes(const ir::Graph& g) {
  ir::Graph flat;
  ir::for_each_node(g, [&](const ir::Node& n) { flat.nodes.push_back(n); });
  return flat;
}

// Names the nodes of g (and of its subgraphs) that are unnamed or whose name `taken` holds after
// `scope` ("If_25/then_branch/MatMul_3"), and adds every name to `taken`: a layer is found by its
// node's name, and exporters name nodes per graph, so a branch may repeat an outer node's name.
void name_nodes_apart(ir::Graph& g, std::set<std::string>& taken, const std::string& scope) {
  for (auto& n : g.nodes) {
    if (n.name.empty() || taken.count(n.name)) {
      const std::string base = scope + "/" + (n.name.empty() ? n.op_type : n.name);
      n.name = base;
      for (int i = 1; taken.count(n.name); ++i) n.name = base + "_" + std::to_string(i);
    }
    taken.insert(n.name);
    for (auto& [key, value] : n.attrs)
      if (auto* sub = std::get_if<std::shared_ptr<const ir::Graph>>(&value)) {
        auto copy = std::make_shared<ir::Graph>(**sub);
        name_nodes_apart(*copy, taken, n.name + "/" + key);
        value = std::shared_ptr<const ir::Graph>(std::move(copy));
      }
  }
}

bool same_tensor(const Tensor& a, const Tensor& b) {
  return a.dtype() == b.dtype() && a.shape() == b.shape() && a.nbytes() == b.nbytes() &&
         (a.nbytes() == 0 || std::memcmp(a.raw(), b.raw(), a.nbytes()) == 0);
}

}  // namespace

struct PTQ::Branch {
  std::string node;        // the If node's name
  std::string attr;        // "then_branch" or "else_branch"
  bool taken_when = true;  // the condition that runs it
  std::string condition;   // the outer value the If reads as its condition
  // Each input of the standalone body (as the body names it) and the outer value fed to it.
  std::vector<std::pair<std::string, std::string>> feeds;
  // The outer constants the body reads, copied in as its own (named as the body reads them).
  std::set<std::string> outer_constants;
  std::unique_ptr<PTQ> ptq;
};

Tensor quantize_weight_s8(const Tensor& weight, const std::vector<float>& scales, int64_t axis, int bits,
                          bool bias_correction) {
  SQ_CHECK(weight.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument, "weights to quantize must be float32");
  SQ_CHECK(bits >= 2 && bits <= 8, ErrorKind::kInvalidArgument, "weight bits must be in [2, 8]");
  const float qmax = static_cast<float>((1 << (bits - 1)) - 1);
  Tensor q(DType::kInt8, weight.shape());
  const auto& shape = weight.shape();
  const int64_t channels = weight.rank() ? shape[axis] : 1;
  SQ_CHECK(static_cast<int64_t>(scales.size()) == channels || scales.size() == 1, ErrorKind::kInternal,
           "weight scales do not match the channel count");
  int64_t inner = 1;
  for (size_t d = static_cast<size_t>(axis) + 1; d < shape.size(); ++d) inner *= shape[d];
  const float* w = weight.data<float>();
  int8_t* out = q.data<int8_t>();
  for (int64_t i = 0; i < weight.numel(); ++i) {
    const int64_t c = scales.size() == 1 ? 0 : (i / inner) % channels;
    out[i] = static_cast<int8_t>(quant_math::quantize_offset(w[i], scales[c], -qmax, qmax));  // zero point 0
  }
  if (!bias_correction) return q;
  // Per channel: mean and standard deviation of the float (w) and dequantized (d) values.
  const auto n = static_cast<size_t>(scales.size() == 1 ? 1 : channels);
  std::vector<double> sum_w(n), sum_w2(n), sum_d(n), sum_d2(n), count(n);
  auto channel_of = [&](int64_t i) { return static_cast<size_t>(scales.size() == 1 ? 0 : (i / inner) % channels); };
  for (int64_t i = 0; i < weight.numel(); ++i) {
    const size_t c = channel_of(i);
    const double d = static_cast<double>(out[i]) * scales[c];
    sum_w[c] += w[i], sum_w2[c] += static_cast<double>(w[i]) * w[i];
    sum_d[c] += d, sum_d2[c] += d * d, count[c] += 1;
  }
  std::vector<double> mean_w(n), mean_d(n), ratio(n, 1.0);
  for (size_t c = 0; c < n; ++c) {
    mean_w[c] = sum_w[c] / count[c], mean_d[c] = sum_d[c] / count[c];
    const double var_w = std::max(0.0, sum_w2[c] / count[c] - mean_w[c] * mean_w[c]);
    const double var_d = std::max(0.0, sum_d2[c] / count[c] - mean_d[c] * mean_d[c]);
    if (var_d > 0) ratio[c] = std::sqrt(var_w / var_d);
  }
  for (int64_t i = 0; i < weight.numel(); ++i) {
    const size_t c = channel_of(i);
    const double corrected = (static_cast<double>(out[i]) * scales[c] - mean_d[c]) * ratio[c] + mean_w[c];
    out[i] = static_cast<int8_t>(quant_math::saturate_round(static_cast<float>(corrected / scales[c]), -qmax, qmax));
  }
  return q;
}

PTQ::PTQ(QuantConfig config) : config_(std::move(config)) {}

PTQ::~PTQ() = default;

void PTQ::quantize(const ir::Graph& float_graph) {
  config_.validate();
  float_graph_ = float_graph;
  runtime::optimize_graph(float_graph_);
  // Per-channel QuantizeLinear/DequantizeLinear exist from opset 13.
  if (float_graph_.opset < 13) {
    ir::convert_opset(float_graph_, 13);
    runtime::optimize_graph(float_graph_);
  }
  layers_.clear();
  observers_.clear();
  channel_abs_max_.clear();
  channel_wise_conv_inputs_ = config_.channel_wise_conv_inputs;
  batches_ = 0;
  ir::name_nodes(float_graph_);
  // Only float32 values get observers: with is_full_quantize, Concat / Slice / Gather also match the
  // int64 shape arithmetic exporters emit (e.g. the `sizes` of a Resize), which stays as it is.
  ir::Graph typed = float_graph_;
  try {
    ir::infer_shapes_onnx(typed);
  } catch (const Error&) {
    // Types unknown: every activation input is taken for float, as before.
  }
  auto known_non_float = [&](const std::string& v) {
    for (const auto& in : typed.inputs)
      if (in.name == v) return in.dtype != DType::kUndefined && in.dtype != DType::kFloat32;
    const auto it = typed.value_info.find(v);
    return it != typed.value_info.end() && it->second.dtype != DType::kUndefined && it->second.dtype != DType::kFloat32;
  };
  for (const auto& node : float_graph_.nodes) {
    const OpQuantSpec* spec = config_.spec_for(node);
    if (!spec) continue;
    Layer layer;
    layer.name = node.name;
    layer.op_type = node.op_type;
    layer.mode = config_.mode_for(node);
    const QuantRule& rule = config_.rule_for(node);
    std::vector<int> act_inputs = spec->activation_inputs;
    if (act_inputs.size() == 1 && act_inputs[0] < 0) {
      act_inputs.clear();
      for (size_t i = 0; i < node.inputs.size(); ++i) act_inputs.push_back(static_cast<int>(i));
    }
    if (spec->weight_input >= 0) {
      const std::string& w = node.input(static_cast<size_t>(spec->weight_input));
      const Tensor* t = float_graph_.initializer(w);
      if (t && t->dtype() == DType::kFloat32 && t->rank() >= 1) {
        layer.weight = w;
        layer.weight_axis = spec->weight_axis ? spec->weight_axis(node, *t) : 0;
        layer.weight_observer = rule.weight;
        std::erase(act_inputs, spec->weight_input);
      } else if (node.op_type != "MatMul") {
        continue;  // Conv/Gemm with a runtime weight: no per-channel weight to quantize
      }
    }
    act_inputs = DeployPolicy::of(config_.deploy_backend).activation_inputs(float_graph_, config_, node, act_inputs);
    for (int i : act_inputs) {
      const std::string& in = node.input(static_cast<size_t>(i));
      if (in.empty() || float_graph_.is_initializer(in)) continue;  // biases, shapes, constants
      if (known_non_float(in)) continue;                                // shape arithmetic
      layer.activations.push_back(in);
      if (!observers_.count(in)) {
        observers_[in] = make_activation_observer(rule.activation, config_.observer_options);
      }
    }
    if (layer.activations.empty() && layer.weight.empty()) continue;
    // Convolution inputs also get per-channel maxima (set_channel_wise_conv_inputs).
    if (node.op_type == "Conv" && !layer.weight.empty() && float_graph_.initializer(layer.weight)->rank() >= 3 &&
        !layer.activations.empty() && layer.activations[0] == node.input(0))
      channel_abs_max_[node.input(0)];
    layers_.push_back(std::move(layer));
  }
  if (DeployPolicy::of(config_.deploy_backend).quantizes_code_readable_inputs())
    quantize_code_readable_inputs(known_non_float);
  warnings_.clear();
  if (!nested_) warnings_ = config_.unmatched_skips(with_subgraph_nodes(float_graph_));
  layer_nodes_.clear();
  for (const auto& l : layers_) layer_nodes_[l.name];
  for (size_t i = 0; i < float_graph_.nodes.size(); ++i)
    if (const auto it = layer_nodes_.find(float_graph_.nodes[i].name); it != layer_nodes_.end()) it->second = i;
  std::vector<std::string> no_dynamic_form;
  for (const auto& l : layers_)
    if (l.mode == QuantMode::kDynamic && !dynamic_applies(l)) no_dynamic_form.push_back("'" + l.name + "'");
  if (!no_dynamic_form.empty())
    warnings_.push_back(std::to_string(no_dynamic_form.size()) + " dynamic layers have no dynamic form (" +
                        first_few(no_dynamic_form) +
                        "): the dynamic mode takes MatMul, Gemm and Conv with a constant weight and a computed input; "
                        "they stay float");
  // Loop and Scan bodies run once per iteration in nested sessions: not quantized (If branches
  // are, find_branches).
  for (const auto& node : float_graph_.nodes)
    for (const auto& [key, value] : node.attrs)
      if (node.op_type != "If" && std::holds_alternative<std::shared_ptr<const ir::Graph>>(value)) {
        warnings_.push_back(node.describe() + ": its body stays float (loop bodies are not quantized)");
        break;
      }
  // Recurrent ops have no integer form in ONNX (ONNX Runtime's DynamicQuantizeLSTM is its own
  // contrib op): they stay float in every mode, said once.
  std::vector<std::string> recurrent;
  for (const auto& node : float_graph_.nodes)
    if (node.domain.empty() && (node.op_type == "LSTM" || node.op_type == "GRU" || node.op_type == "RNN"))
      recurrent.push_back(node.describe());
  if (!recurrent.empty())
    warnings_.push_back(std::to_string(recurrent.size()) + " recurrent layers stay float (" + first_few(recurrent) +
                        "): ONNX has no integer LSTM, GRU or RNN that runs everywhere");
  // GPTQ: X^T X of each 4-bit layer's input (Gemm with transA reads A transposed: rounded to nearest).
  input_gram_.clear();
  if (config_.mode == QuantMode::kWeightOnly && config_.effective_weight_bits() == 4 &&
      config_.weight_rounding == WeightRounding::kGptq)
    for (const auto& node : float_graph_.nodes) {
      const int64_t axis = blocked_weight_axis(node, float_graph_);
      const bool layer = std::any_of(layers_.begin(), layers_.end(), [&](const Layer& l) { return l.name == node.name; });
      if (axis < 0 || !layer || node.attr_int("transA", 0) || float_graph_.is_initializer(node.inputs[0])) continue;
      const int64_t k = float_graph_.initializer(node.inputs[1])->dim(axis);
      input_gram_.try_emplace(node.inputs[0], static_cast<size_t>(k * k), 0.0);
    }

  find_branches(typed);

  std::string identity = ir::serialize_onnx(float_graph_) + '\x1f' + config_.fingerprint();
  for (const auto& [tensor, obs] : observers_) identity += '\x1f' + tensor + '=' + obs->name();
  for (const auto& b : branches_) identity += '\x1f' + b->node + '/' + b->attr + '=' + b->ptq->fingerprint();
  fingerprint_ = fnv1a_hex(identity);

  // Inference settings (fusions, blocked layouts): fusions never fuse away a value listed in
  // RunOptions::observe, and observing does not change layouts (only requested outputs are forced
  // plain, and sample() requests none), so a tensor calibrates to the same scale whatever else is
  // quantized or skipped (a skip list found by the analysis reproduces its model exactly).
  session_ = std::make_unique<runtime::Session>(float_graph_);
}

void PTQ::find_branches(const ir::Graph& typed) {
  branches_.clear();
  auto dtype_of = [&](const std::string& v) {
    const ir::ValueInfo* info = typed.find_value_info(v);
    return info ? info->dtype : DType::kUndefined;
  };
  std::set<std::string> taken;
  for (const auto& node : float_graph_.nodes) taken.insert(node.name);
  for (const auto& node : float_graph_.nodes) {
    if (node.op_type != "If" || !node.domain.empty() || node.inputs.empty() || config_.is_skipped(node)) continue;
    bool quantized = false;
    for (const char* attr : {"then_branch", "else_branch"}) {
      const ir::Graph* branch_graph = node.attr_graph(attr);
      // Most branches hold no layer (a detector's "no boxes left" cases): not prepared at all.
      if (!branch_graph) continue;
      bool quantizable = false;
      ir::for_each_node(*branch_graph, [&](const ir::Node& n) { quantizable = quantizable || config_.spec_for(n); });
      if (!quantizable) continue;
      std::vector<size_t> captured;
      ir::Graph body = ir::standalone_subgraph(node, attr, captured);
      auto branch = std::make_unique<Branch>();
      const size_t own_inputs = body.inputs.size() - captured.size();
      std::vector<ir::ValueInfo> inputs(body.inputs.begin(), body.inputs.begin() + static_cast<ptrdiff_t>(own_inputs));
      for (size_t i = own_inputs; i < body.inputs.size(); ++i) {
        const std::string& outer = node.inputs[node.declared_inputs() + captured[i - own_inputs]];
        if (const Tensor* constant = float_graph_.initializer(outer)) {
          body.initializers[body.inputs[i].name] = *constant;  // a weight stays a weight in the branch
          if (outer == body.inputs[i].name) branch->outer_constants.insert(outer);
          continue;
        }
        body.inputs[i].dtype = dtype_of(outer);
        inputs.push_back(body.inputs[i]);
        branch->feeds.emplace_back(body.inputs[i].name, outer);
      }
      body.inputs = std::move(inputs);
      name_nodes_apart(body, taken, node.name + "/" + attr);
      branch->node = node.name;
      branch->attr = attr;
      branch->taken_when = std::string(attr) == "then_branch";
      branch->condition = node.inputs[0];
      branch->ptq = std::make_unique<PTQ>(config_);
      branch->ptq->nested_ = true;
      try {
        branch->ptq->quantize(body);
      } catch (const Error& e) {
        warnings_.push_back(node.describe() + " " + attr + " stays float: " + e.what());
        continue;
      }
      if (branch->ptq->all_layers().empty()) continue;
      for (const auto& w : branch->ptq->warnings()) warnings_.push_back(node.describe() + " " + attr + ": " + w);
      branches_.push_back(std::move(branch));
      quantized = true;
    }
    if (quantized) {
      Layer layer;
      layer.name = node.name;
      layer.op_type = node.op_type;
      layer.mode = config_.mode_for(node);
      layers_.push_back(std::move(layer));
    }
  }
}

bool PTQ::is_branching_layer(const std::string& name) const {
  return std::any_of(branches_.begin(), branches_.end(), [&](const auto& b) { return b->node == name; });
}

std::vector<const Layer*> PTQ::all_layers() const {
  std::vector<const Layer*> out;
  for (const auto& l : layers_)
    if (!is_branching_layer(l.name)) out.push_back(&l);
  for (const auto& b : branches_) {
    const std::vector<const Layer*> inner = b->ptq->all_layers();
    out.insert(out.end(), inner.begin(), inner.end());
  }
  return out;
}

LayerModes PTQ::leaf_layer_modes() const {
  LayerModes modes;
  for (const auto& l : layers_)
    if (!is_branching_layer(l.name)) modes[l.name] = l.mode;
  for (const auto& b : branches_) {
    const auto its_if = std::find_if(layers_.begin(), layers_.end(), [&](const Layer& l) { return l.name == b->node; });
    for (auto [name, mode] : b->ptq->leaf_layer_modes())
      modes[name] = its_if != layers_.end() && its_if->mode != QuantMode::kStatic ? its_if->mode : mode;
  }
  return modes;
}

void PTQ::set_channel_wise_conv_inputs(bool enabled) {
  channel_wise_conv_inputs_ = enabled;
  for (auto& b : branches_) b->ptq->set_channel_wise_conv_inputs(enabled);
}

void PTQ::convert_branches(ir::Graph& out, const LayerModes& if_modes) const {
  bool converted = false;
  for (const auto& b : branches_) {
    const auto mode = if_modes.find(b->node);
    const PTQ& inner = *b->ptq;
    LayerModes modes;
    if (mode != if_modes.end()) {  // the If named: all its layers
      modes = inner.layer_modes();
      if (mode->second != QuantMode::kStatic)
        for (auto& [name, m] : modes) m = mode->second;
    }
    for (const Layer* l : inner.all_layers())
      if (const auto named = if_modes.find(l->name); named != if_modes.end()) modes[l->name] = named->second;
    if (inner.samples_seen() == 0)  // never taken in calibration: nothing static has a range
      std::erase_if(modes, [](const auto& entry) { return entry.second == QuantMode::kStatic; });
    if (modes.empty()) continue;
    ir::Graph body = inner.convert_layers(modes);
    const auto node = std::find_if(out.nodes.begin(), out.nodes.end(), [&](const ir::Node& n) { return n.name == b->node; });
    if (node == out.nodes.end()) continue;
    // Back inside the If: the outer values it was fed are read from the outer scope again, the
    // outer weights copied in are dropped where unchanged, and a name the branch made that the
    // model already uses (x_s for an x quantized outside too) is renamed.
    std::erase_if(body.inputs, [&](const ir::ValueInfo& in) {
      return std::any_of(b->feeds.begin(), b->feeds.end(), [&](const auto& f) { return f.first == in.name; });
    });
    std::erase_if(body.initializers, [&](const auto& entry) {
      const Tensor* outer = b->outer_constants.count(entry.first) ? out.initializer(entry.first) : nullptr;
      return outer && same_tensor(*outer, entry.second);
    });
    for (const auto& [key, value] : body.metadata) out.metadata.try_emplace(key, value);  // the runtime reads some
    body.metadata.clear();
    node->attrs[b->attr] = std::make_shared<const ir::Graph>();  // its float body is not the outer scope
    const std::set<std::string> outer = ir::defined_names(out);
    ir::ValueNames names(out);
    names.reserve(body);
    std::map<std::string, std::string> renames;
    for (const std::string& name : ir::defined_names(body))
      if (outer.count(name)) renames[name] = names.fresh(name);
    ir::rename_values(body, renames);
    node->attrs[b->attr] = std::make_shared<const ir::Graph>(std::move(body));
    // Outer values neither branch reads any more (the float weights of a branch now quantized) are
    // no longer the If's inputs, and go when nothing else reads them.
    std::set<std::string> read;
    for (const auto& [key, value] : node->attrs)
      if (const auto* sub = std::get_if<std::shared_ptr<const ir::Graph>>(&value))
        for (size_t k : ir::captured_reads(*node, **sub)) read.insert(node->captured[k]);
    std::vector<std::string> captured, inputs(node->inputs.begin(), node->inputs.begin() + static_cast<ptrdiff_t>(node->declared_inputs()));
    for (size_t k = 0; k < node->captured.size(); ++k)
      if (read.count(node->captured[k])) {
        captured.push_back(node->captured[k]);
        inputs.push_back(node->inputs[node->declared_inputs() + k]);
      }
    node->captured = std::move(captured);
    node->inputs = std::move(inputs);
    converted = true;
  }
  if (converted) out.remove_unused_initializers();
}

void PTQ::sample(const std::map<std::string, Tensor>& feeds) {
  SQ_CHECK(session_ != nullptr, ErrorKind::kInvalidArgument, "PTQ::sample called before quantize()");
  runtime::RunOptions run;
  std::vector<std::string> wanted;
  for (const auto& [name, obs] : observers_) wanted.push_back(name);
  for (const auto& [name, gram] : input_gram_)
    if (!observers_.count(name)) wanted.push_back(name);
  // What the If branches read: their conditions and the outer values they are fed, kept per run
  // of the model (one per part when the session runs the batch in parts).
  std::set<std::string> branch_values;
  for (const auto& b : branches_) {
    branch_values.insert(b->condition);
    for (const auto& [inner, outer] : b->feeds) branch_values.insert(outer);
  }
  for (const auto& v : branch_values)
    if (std::find(wanted.begin(), wanted.end(), v) == wanted.end()) wanted.push_back(v);
  std::vector<std::map<std::string, Tensor>> branch_reads(1);
  run.observe = wanted;  // seen by the hook, then released: memory stays that of inference
  run.outputs_needed = false;
  // Every activation observer depends only on each sample's multiset of values, so blocked
  // activations could be observed in place, without a plain copy; the per-channel maxima (and a
  // branch's inputs) need the channels where the plain layout has them.
  run.observe_in_any_layout = channel_abs_max_.empty() && input_gram_.empty() && branches_.empty();
  run.on_value = [&](const std::string& name, const Tensor& value) {
    if (branch_values.count(name)) {
      if (branch_reads.back().count(name)) branch_reads.emplace_back();  // the next part's
      branch_reads.back()[name] = value.clone();
    }
    if (auto g = input_gram_.find(name); g != input_gram_.end() && value.dtype() == DType::kFloat32 && value.rank() >= 1) {
      const int64_t k = value.dim(value.rank() - 1);
      if (static_cast<size_t>(k * k) == g->second.size()) accumulate_gram(value.data<float>(), value.numel() / k, k, g->second);
    }
    auto it = observers_.find(name);
    if (it == observers_.end()) return;
    if (value.dtype() != DType::kFloat32) return;
    try {
      it->second->observe(value);
      if (auto ch = channel_abs_max_.find(name); ch != channel_abs_max_.end()) observe_channel_abs_max(value, ch->second);
    } catch (const Error& e) {
      throw Error(e.kind(), "calibration batch " + std::to_string(batches_) + ", tensor '" + name + "': " + e.what());
    }
  };
  if (wanted.empty()) return;
  session_->run(feeds, run);
  ++batches_;
  for (const auto& reads : branch_reads)
    for (auto& b : branches_) {
      const auto condition = reads.find(b->condition);
      if (condition == reads.end() || condition->second.numel() != 1 ||
          (condition->second.to_float_vector()[0] != 0.f) != b->taken_when)
        continue;
      std::map<std::string, Tensor> branch_feeds;
      for (const auto& [inner, outer] : b->feeds)
        if (const auto it = reads.find(outer); it != reads.end()) branch_feeds[inner] = it->second;
      if (branch_feeds.size() != b->feeds.size()) continue;  // an empty optional: not run here
      try {
        b->ptq->sample(branch_feeds);
      } catch (const Error& e) {
        throw Error(e.kind(), "If '" + b->node + "' " + b->attr + ": " + e.what());
      }
    }
}

void PTQ::release_calibration_buffers() {
  if (session_) session_->release_plans();
  for (auto& b : branches_) b->ptq->release_calibration_buffers();
}

void PTQ::sample(const Tensor& batch) {
  SQ_CHECK(float_graph_.inputs.size() == 1, ErrorKind::kInvalidArgument, "PTQ::sample(Tensor) needs a single-input model");
  sample({{float_graph_.inputs[0].name, batch}});
}

ir::Graph PTQ::convert_weights_only(const std::optional<std::set<std::string>>& only_layers) const {
  SQ_CHECK(session_ != nullptr, ErrorKind::kInvalidArgument, "PTQ::convert_weights_only called before quantize()");
  ir::Graph out = write_weights_only(float_graph_, only_layers);
  out.metadata["slimquant.weight_bits"] = std::to_string(config_.effective_weight_bits());
  out.metadata["slimquant.mode"] = quant_mode_name(QuantMode::kWeightOnly);
  out.metadata["slimquant.deploy_backend"] = deploy_backend_name(config_.deploy_backend);
  return out;
}

ir::Graph PTQ::write_weights_only(const ir::Graph& base, const std::optional<std::set<std::string>>& only_layers) const {
  // The layers with a weight, read as float: their activation lists emptied.
  std::vector<Layer> weighted;
  for (const auto& l : layers_)
    if (!l.weight.empty() && (!only_layers || only_layers->count(l.name))) {
      Layer w = l;
      w.activations.clear();
      weighted.push_back(std::move(w));
    }
  // 4 bits: MatMul / Gemm weights in INT4 blocks along their input features (blocked_weights.h),
  // GPTQ-rounded where calibration saw the layer's input. Other weights (Conv) stay on the 8-bit
  // per-channel grid: 4 bits per output channel of a convolution costs far more accuracy than a
  // block of 32 inputs does, and convolutions are not where weight bytes bound the time.
  const bool four_bit = config_.effective_weight_bits() == 4;
  const int64_t block_size = config_.block_size != 0 ? config_.block_size : 32;
  std::vector<BlockedLayer> blocked;
  bool any_gptq = false;
  std::vector<const Layer*> chosen;
  for (const auto& l : weighted) {
    const auto node = std::find_if(float_graph_.nodes.begin(), float_graph_.nodes.end(),
                                   [&](const ir::Node& n) { return n.name == l.name; });
    const int64_t axis = four_bit && node != float_graph_.nodes.end() ? blocked_weight_axis(*node, float_graph_) : -1;
    if (axis < 0) {
      chosen.push_back(&l);
      continue;
    }
    const Tensor& w = *float_graph_.initializer(l.weight);
    const auto gram = input_gram_.find(node->inputs[0]);
    const bool seen = gram != input_gram_.end() &&
                      std::any_of(gram->second.begin(), gram->second.end(), [](double v) { return v != 0; });
    any_gptq |= seen;
    blocked.push_back({l.name, l.weight, axis,
                       seen ? quantize_blocked_gptq(w, axis, block_size, gram->second)
                            : quantize_blocked_rtn(w, axis, block_size)});
  }
  QdqExportOptions options;  // no activation is quantized: biases stay float
  options.state_weight_zero_points = DeployPolicy::of(config_.deploy_backend).export_options().state_weight_zero_points;
  options.bias_correction = config_.bias_correction;
  auto params = [&](const Layer& l) {
    if (!four_bit) return weight_params(l);
    ObserverOptions eight = config_.observer_options;  // the layers 4 bits leave at 8
    eight.channel_axis = l.weight_axis;
    eight.weight_bits = 8;
    auto obs = make_weight_observer(l.weight_observer, eight);
    obs->observe(*float_graph_.initializer(l.weight));
    return obs->params(QuantScheme::kSymmetric);
  };
  ir::Graph out = write_qdq_graph(base, chosen, {}, params, options);
  write_blocked_weights(out, blocked, block_size);
  if (four_bit) {
    out.metadata["slimquant.block_size"] = std::to_string(block_size);
    out.metadata["slimquant.weight_rounding"] = any_gptq ? "gptq" : "rtn";
    // Read by the runtime's 4-bit MatMul (runtime/fused_ops/matmul_qb4w.h, kInt4ActivationsKey).
    if (config_.int4_activations == Int4Activations::kInt8 && !blocked.empty())
      out.metadata["slimquant.int4_activations"] = "int8";
  }
  return out;
}

namespace {
constexpr char kCacheMagic[] = "slimquant-calibration-v2";
}

void PTQ::save_calibration_state(const std::string& path, const std::string& data_identity) const {
  SQ_CHECK(session_ != nullptr, ErrorKind::kInvalidArgument, "PTQ::save_calibration_state called before quantize()");
  std::ostringstream out(std::ios::binary);
  out << kCacheMagic << '\n' << fingerprint_ << '-' << fnv1a_hex(data_identity) << '\n';
  save_state(out);
  write_file_atomic(path, out.str());
}

void PTQ::save_state(std::ostream& out) const {
  out << batches_ << '\n';
  for (const auto& [tensor, obs] : observers_) {
    out << tensor << '\n';
    obs->save_state(out);
  }
  save_channel_abs_max(out, channel_abs_max_);
  for (const auto& b : branches_) {
    out << b->node << '/' << b->attr << '\n';
    b->ptq->save_state(out);
  }
}

bool PTQ::load_calibration_state(const std::string& path, const std::string& data_identity) {
  SQ_CHECK(session_ != nullptr, ErrorKind::kInvalidArgument, "PTQ::load_calibration_state called before quantize()");
  if (!std::filesystem::exists(path)) return false;
  std::istringstream in(read_file(path), std::ios::binary);
  std::string magic, fingerprint;
  std::getline(in, magic);
  std::getline(in, fingerprint);
  SQ_CHECK(magic == kCacheMagic, ErrorKind::kInvalidData, "'" + path + "' is not a slimquant calibration cache");
  const std::string expected = fingerprint_ + '-' + fnv1a_hex(data_identity);
  SQ_CHECK(fingerprint == expected, ErrorKind::kInvalidData,
           "calibration cache '" + path + "' was written for another model, quantization config or calibration data (" +
               fingerprint + ", this run " + expected + "): delete it or use another cache_dir");
  load_state(in, path);
  return true;
}

void PTQ::load_state(std::istream& in, const std::string& path) {
  std::string batches;
  std::getline(in, batches);
  for (auto& [tensor, obs] : observers_) {
    std::string stored;
    std::getline(in, stored);
    SQ_CHECK(stored == tensor, ErrorKind::kInvalidData,
             "calibration cache '" + path + "' is corrupt: expected tensor '" + tensor + "', found '" + stored + "'");
    try {
      obs->load_state(in);
    } catch (const Error& e) {
      throw Error(e.kind(), "calibration cache '" + path + "', tensor '" + tensor + "': " + e.what());
    }
  }
  try {
    load_channel_abs_max(in, channel_abs_max_, false);
  } catch (const Error& e) {
    throw Error(e.kind(), "calibration cache '" + path + "' is corrupt: " + e.what());
  }
  for (auto& b : branches_) {
    std::string stored;
    std::getline(in, stored);
    SQ_CHECK(stored == b->node + '/' + b->attr, ErrorKind::kInvalidData,
             "calibration cache '" + path + "' is corrupt: expected If branch '" + b->node + '/' + b->attr + "', found '" +
                 stored + "'");
    b->ptq->load_state(in, path);
  }
  SQ_CHECK(!batches.empty() && std::all_of(batches.begin(), batches.end(), [](char c) { return c >= '0' && c <= '9'; }),
           ErrorKind::kInvalidData, "calibration cache '" + path + "' is corrupt: no batch count");
  batches_ = std::stoul(batches);
}

void PTQ::merge_calibration_across_ranks() {
  if (distributed::size() == 1) return;
  for (auto& b : branches_) b->ptq->merge_calibration_across_ranks();  // the same branches on every rank
  SQ_CHECK(session_ != nullptr, ErrorKind::kInvalidArgument, "PTQ::merge_calibration_across_ranks called before quantize()");
  auto serialise = [&] {
    std::ostringstream out(std::ios::binary);
    out << batches_ << '\n';
    for (const auto& [tensor, obs] : observers_) obs->save_state(out);
    save_channel_abs_max(out, channel_abs_max_);
    return out.str();
  };
  const std::vector<std::string> states = distributed::gather(serialise());
  if (distributed::is_root()) {
    for (size_t r = 1; r < states.size(); ++r) {
      std::istringstream in(states[r], std::ios::binary);
      std::string batches;
      std::getline(in, batches);
      batches_ += std::stoul(batches);
      for (auto& [tensor, obs] : observers_) {
        try {
          obs->merge_state(in);
        } catch (const Error& e) {
          throw Error(e.kind(), "merging rank " + std::to_string(r) + "'s calibration of tensor '" + tensor + "': " + e.what());
        }
      }
      load_channel_abs_max(in, channel_abs_max_, true);
    }
  }
  std::istringstream merged(distributed::broadcast(distributed::is_root() ? serialise() : std::string()), std::ios::binary);
  std::string batches;
  std::getline(merged, batches);
  batches_ = std::stoul(batches);
  for (auto& [tensor, obs] : observers_) obs->load_state(merged);
  load_channel_abs_max(merged, channel_abs_max_, false);
}

std::vector<std::string> PTQ::selectable_activation_algos() const {
  for (const auto& [tensor, obs] : observers_)
    if (obs->name() == "auto") return auto_algo_candidates();
  for (const auto& b : branches_)
    if (std::vector<std::string> inner = b->ptq->selectable_activation_algos(); !inner.empty()) return inner;
  return {};
}

void PTQ::select_activation_algo(const std::string& algo) {
  for (auto& [tensor, obs] : observers_) select_auto_candidate(*obs, algo);
  for (auto& b : branches_) b->ptq->select_activation_algo(algo);
  selected_activation_algo_ = algo;
}

std::vector<std::string> PTQ::observed_tensors() const {
  std::vector<std::string> out;
  for (const auto& [name, obs] : observers_) out.push_back(name);
  return out;
}

std::vector<std::string> PTQ::unobserved_layers() const {
  std::vector<std::string> out;
  if (batches_ == 0) return out;
  for (const auto& l : layers_) {
    const bool unseen = std::any_of(l.activations.begin(), l.activations.end(), [&](const std::string& t) {
      const auto it = observers_.find(t);
      return it != observers_.end() && it->second->observed_count() == 0;
    });
    if (unseen) out.push_back(l.name);
  }
  for (const auto& b : branches_) {
    if (b->ptq->samples_seen() > 0) {
      const std::vector<std::string> inner = b->ptq->unobserved_layers();
      out.insert(out.end(), inner.begin(), inner.end());
    } else {
      for (const Layer* l : b->ptq->all_layers())
        if (l->mode == QuantMode::kStatic) out.push_back(l->name);
    }
  }
  return out;
}

std::string PTQ::unobserved_layers_warning() const {
  std::vector<std::string> unseen = unobserved_layers();
  if (unseen.empty()) return "";
  // Those of branches calibration never took, said apart (and named by branch).
  std::vector<std::string> untaken_branches, untaken_layers;
  std::vector<const PTQ*> pending{this};
  while (!pending.empty()) {
    const PTQ* p = pending.back();
    pending.pop_back();
    for (const auto& b : p->branches_) {
      if (b->ptq->samples_seen() > 0) {
        pending.push_back(b->ptq.get());
        continue;
      }
      size_t count = 0;
      for (const Layer* l : b->ptq->all_layers())
        if (l->mode == QuantMode::kStatic) untaken_layers.push_back(l->name), ++count;
      if (count) untaken_branches.push_back("If '" + b->node + "' " + b->attr + ", " + std::to_string(count) + " layers");
    }
  }
  std::erase_if(unseen, [&](const std::string& name) {
    return std::find(untaken_layers.begin(), untaken_layers.end(), name) != untaken_layers.end();
  });
  std::string out;
  if (!unseen.empty())
    out = std::to_string(unseen.size()) + " layers stay float (" + first_few(unseen) +
          "): their inputs were empty in every calibration sample (values selected by the data, such as a "
          "detector's boxes, and none were selected), so they have no range";
  if (!untaken_layers.empty())
    out += std::string(out.empty() ? "" : "; ") + std::to_string(untaken_layers.size()) +
           " layers stay float in branches no calibration sample took (" + first_few(untaken_branches) +
           "): calibrate with data that runs them (an If on the sample rate: audio of each rate)";
  return out;
}

// For our runtime, inputs that every reader reads as codes are quantized for every reader (see
// code_readable_inputs), unless one of them is skipped or left in float by its rule: as
// codes they cost a quarter of the float32 traffic, for about no accuracy
// (docs/int8_execution.md). They are a Conv's output codes, so only where Conv is a quantized
// type: quantizable_op_type bounds this rule too (a list without Conv, e.g. conv2d_transpose
// alone, quantizes no pool, Mul or Add). Whether that one Conv is skipped does not matter: the
// analysis and the fallback leave a layer in float without changing the others.
void PTQ::quantize_code_readable_inputs(const std::function<bool(const std::string&)>& known_non_float) {
  for (const auto& [x, readers] : code_readable_inputs(float_graph_)) {
    if (known_non_float(x)) continue;
    if (!config_.quantizes_op_type("Conv")) continue;  // code_readable_inputs: x is a Conv's output
    bool left_float = false;
    for (int r : readers) {
      const ir::Node& reader = float_graph_.nodes[static_cast<size_t>(r)];
      left_float |= config_.is_skipped(reader) || !config_.rule_for(reader).quantize;
    }
    if (left_float) continue;
    for (int r : readers) {
      const ir::Node& node = float_graph_.nodes[static_cast<size_t>(r)];
      if (node.op_type == "GlobalAveragePool") {
        // The squeeze convolution reading the pooled vector stays float: int8 gains nothing on C
        // values, and ONNX Runtime would fuse DequantizeLinear -> pool -> its input's
        // QuantizeLinear into a QLinearGlobalAveragePool, which fails on the per-channel scale
        // precision recovery gives convolution inputs (see rewrite_channel_wise_conv_inputs).
        const std::string& pooled = node.outputs[0];
        std::erase_if(layers_, [&](const Layer& l) {
          return l.op_type == "Conv" && l.activations == std::vector<std::string>{pooled};
        });
        const bool still_read = std::any_of(layers_.begin(), layers_.end(), [&](const Layer& l) {
          return std::find(l.activations.begin(), l.activations.end(), pooled) != l.activations.end();
        });
        if (!still_read) {
          observers_.erase(pooled);
          channel_abs_max_.erase(pooled);
        }
      }
      auto it = std::find_if(layers_.begin(), layers_.end(), [&](const Layer& l) { return l.name == node.name; });
      if (it == layers_.end()) {
        Layer layer;
        layer.name = node.name;
        layer.op_type = node.op_type;
        layer.mode = config_.mode_for(node);
        layers_.push_back(std::move(layer));
        it = std::prev(layers_.end());
      }
      if (std::find(it->activations.begin(), it->activations.end(), x) == it->activations.end())
        it->activations.push_back(x);
      if (!observers_.count(x))
        observers_[x] = make_activation_observer(config_.rule_for(node).activation, config_.observer_options);
    }
  }
}

const Observer& PTQ::activation_observer(const std::string& tensor) const {
  auto it = observers_.find(tensor);
  SQ_CHECK(it != observers_.end(), ErrorKind::kInvalidArgument, "tensor '" + tensor + "' is not observed");
  return *it->second;
}

QuantScheme PTQ::activation_scheme(QuantScheme observer_default) const {
  return DeployPolicy::of(config_.deploy_backend).activation_scheme(observer_default, config_.asymmetric_activations);
}

QuantParam PTQ::activation_params(const std::string& tensor) const {
  const Observer& obs = activation_observer(tensor);
  SQ_CHECK(obs.observed_count() > 0, ErrorKind::kInvalidData,
           "tensor '" + tensor + "' was never observed: calibrate with sample() before convert()");
  return obs.params(activation_scheme(obs.default_scheme()));
}

std::unique_ptr<Observer> PTQ::weight_observer(const Layer& layer, const Tensor* weight) const {
  ObserverOptions options = config_.observer_options;
  options.channel_axis = layer.weight_axis;
  options.weight_bits = config_.effective_weight_bits();
  auto obs = make_weight_observer(layer.weight_observer, options);
  obs->observe(weight ? *weight : *float_graph_.initializer(layer.weight));
  return obs;
}

QuantParam PTQ::weight_params(const Layer& layer, const Tensor* weight) const {
  SQ_CHECK(!layer.weight.empty(), ErrorKind::kInvalidArgument, "layer '" + layer.name + "' has no weight");
  return weight_observer(layer, weight)->params(QuantScheme::kSymmetric);
}

ir::Graph PTQ::convert(const std::optional<std::set<std::string>>& only_layers) const {
  SQ_CHECK(session_ != nullptr, ErrorKind::kInvalidArgument, "PTQ::convert called before quantize()");
  return convert_layers(layer_modes(only_layers));
}

LayerModes PTQ::layer_modes(const std::optional<std::set<std::string>>& only_layers) const {
  LayerModes modes;
  for (const auto& l : layers_)
    if (!only_layers || only_layers->count(l.name)) modes[l.name] = l.mode;
  if (only_layers)  // layers inside If branches named one by one (an If named: all of its branches')
    for (const auto& b : branches_)
      for (const Layer* l : b->ptq->all_layers())
        if (only_layers->count(l->name)) modes[l->name] = l->mode;
  return modes;
}

const PTQ::Branch* PTQ::branch_holding(const std::string& layer) const {
  for (const auto& b : branches_) {
    const std::vector<const Layer*> inner = b->ptq->all_layers();
    if (std::any_of(inner.begin(), inner.end(), [&](const Layer* l) { return l->name == layer; })) return b.get();
  }
  return nullptr;
}

ir::Graph PTQ::convert_layers(const LayerModes& modes) const {
  SQ_CHECK(session_ != nullptr, ErrorKind::kInvalidArgument, "PTQ::convert_layers called before quantize()");
  std::map<QuantMode, std::set<std::string>> by_mode;
  LayerModes if_modes;
  for (const auto& [name, mode] : modes) {
    const bool own = std::any_of(layers_.begin(), layers_.end(), [&](const Layer& l) { return l.name == name; });
    SQ_CHECK(own || branch_holding(name), ErrorKind::kInvalidArgument,
             "convert_layers: '" + name + "' is not a layer of this PTQ (all_layers())");
    if (!own || is_branching_layer(name)) if_modes[name] = mode;
    else by_mode[mode].insert(name);
  }
  if (by_mode.size() <= 1) {  // one mode: that mode's own convert
    const QuantMode mode = by_mode.empty() ? (if_modes.empty() ? config_.mode : if_modes.begin()->second)
                                           : by_mode.begin()->first;
    const std::set<std::string> only = by_mode.empty() ? std::set<std::string>{} : by_mode.begin()->second;
    ir::Graph out = mode == QuantMode::kWeightOnly ? convert_weights_only(only)
                    : mode == QuantMode::kDynamic  ? convert_dynamic(only)
                                                   : convert_static(only);
    convert_branches(out, if_modes);
    return out;
  }
  const std::set<std::string>& weight_only = by_mode[QuantMode::kWeightOnly];
  const std::set<std::string>& dynamic = by_mode[QuantMode::kDynamic];
  ir::Graph out = write_dynamic(write_weights_only(convert_static(by_mode[QuantMode::kStatic]), weight_only), dynamic);
  out.metadata["slimquant.mode"] = "mixed";
  out.metadata["slimquant.weight_only_layers"] = std::to_string(weight_only.size());
  // Counted as written: a dynamic layer without the dynamic form stays float (warned at quantize()).
  const size_t written_dynamic = std::count_if(layers_.begin(), layers_.end(),
                                               [&](const Layer& l) { return dynamic.count(l.name) && dynamic_applies(l); });
  if (!dynamic.empty()) out.metadata["slimquant.dynamic_layers"] = std::to_string(written_dynamic);
  convert_branches(out, if_modes);
  return out;
}

ir::Graph PTQ::convert_static(const std::optional<std::set<std::string>>& only_layers) const {
  SQ_CHECK(batches_ > 0 || observers_.empty(), ErrorKind::kInvalidData,
           "no calibration data was fed: the calibration data set is empty");
  const DeployPolicy& policy = DeployPolicy::of(config_.deploy_backend);
  ir::Graph g = float_graph_;
  std::vector<const Layer*> chosen;
  const std::vector<std::string> unobserved = unobserved_layers();
  for (const auto& l : layers_)
    if ((!only_layers || only_layers->count(l.name)) &&
        std::find(unobserved.begin(), unobserved.end(), l.name) == unobserved.end())
      chosen.push_back(&l);

  // Activation parameters, made consistent where integer tensors must share a scale.
  std::map<std::string, QuantParam> act;
  for (const Layer* l : chosen)
    for (const auto& t : l->activations)
      if (!act.count(t)) act[t] = activation_params(t);
  for (const auto& node : g.nodes) {
    if (node.op_type == "Concat") {
      // All inputs and the output of a quantized Concat share the widest range.
      std::vector<std::string> members;
      for (const auto& in : node.inputs)
        if (act.count(in)) members.push_back(in);
      if (act.count(node.outputs[0])) members.push_back(node.outputs[0]);
      if (members.size() < 2) continue;
      float lo = 0, hi = 0;
      for (const auto& m : members) {
        ClipRange r = activation_observer(m).range();
        lo = std::min(lo, r.lo), hi = std::max(hi, r.hi);
      }
      const QuantScheme scheme =
          activation_scheme(lo < 0 ? QuantScheme::kSymmetric : QuantScheme::kUnsignedZeroPoint0);
      for (const auto& m : members) act[m] = params_from_range({lo, hi}, scheme);
    } else if (node.op_type == "Softmax" && act.count(node.outputs[0]) && policy.fixed_softmax_grid()) {
      // Probabilities: the fixed u8 grid 1/256 with zero point 0, as ONNX Runtime's quantizer
      // writes it. ORT's fused QLinearSoftmax returns 0 for large outputs when the scale is below
      // 1/256 (1.20.1 and 1.30.0: a calibrated 0.00249 turned [0.54, 0.46] into [0, 0]).
      QuantParam p;
      p.dtype = DType::kUInt8;
      p.scale = {1.f / 256.f};
      p.zero_point = {0};
      act[node.outputs[0]] = p;
    } else if (kPassThroughOps.count(node.op_type) && !node.inputs.empty() && act.count(node.inputs[0])) {
      for (const auto& o : node.outputs)
        if (act.count(o)) act[o] = act[node.inputs[0]];
    }
  }

  QdqExportOptions options = policy.export_options();
  options.bias_correction = config_.bias_correction;
  ir::Graph out =
      write_qdq_graph(float_graph_, chosen, act, [this](const Layer& l) { return weight_params(l); }, options);
  if (channel_wise_conv_inputs_) rewrite_channel_wise_conv_inputs(out, chosen, act);
  policy.finish_export(out);
  out.metadata["slimquant.weight_bits"] = std::to_string(config_.effective_weight_bits());
  out.metadata["slimquant.deploy_backend"] = deploy_backend_name(config_.deploy_backend);
  return out;
}

void PTQ::rewrite_channel_wise_conv_inputs(ir::Graph& g, const std::vector<const Layer*>& chosen,
                                           const std::map<std::string, QuantParam>& act) const {
  std::map<std::string, std::string> integers;            // conv input -> its DequantizeLinear(1) output
  std::map<std::string, std::vector<float>> scales_of;   // conv input -> s_c
  std::vector<ir::Node> added;
  for (const Layer* l : chosen) {
    if (l->op_type != "Conv" || l->weight.empty() || l->activations.empty()) continue;
    const std::string& x = l->activations[0];
    const auto stats = channel_abs_max_.find(x);
    const auto p = act.find(x);
    if (stats == channel_abs_max_.end() || stats->second.empty() || p == act.end() || p->second.scale.size() != 1 ||
        p->second.zero_point[0] != 0)
      continue;
    auto node = std::find_if(g.nodes.begin(), g.nodes.end(), [&](const ir::Node& n) { return n.name == l->name; });
    if (node == g.nodes.end()) continue;
    if (!DeployPolicy::of(config_.deploy_backend).allows_channel_wise_conv_input(g, x)) continue;
    const Tensor& w = *float_graph_.initializer(l->weight);
    const int64_t out_channels = w.shape()[0], group_in = w.shape()[1];
    const int64_t group = node->attr_int("group", 1);
    if (group <= 0 || out_channels % group != 0 || group * group_in != static_cast<int64_t>(stats->second.size())) continue;

    if (!integers.count(x)) {
      const bool u8 = p->second.dtype == DType::kUInt8;
      const float qmax = u8 ? 255.f : 127.f;
      std::vector<float> s(stats->second.size());
      for (size_t c = 0; c < s.size(); ++c)
        s[c] = stats->second[c] > 0.f && std::isfinite(stats->second[c]) ? stats->second[c] / qmax : p->second.scale[0];
      const auto channels = static_cast<int64_t>(s.size());
      const std::string scale = g.unique_value_name(x + "_cs");
      g.initializers[scale] = Tensor::from_vector<float>({channels}, s);
      const std::string zp = g.unique_value_name(x + "_czp");
      g.initializers[zp] = u8 ? Tensor(DType::kUInt8, {channels}) : Tensor(DType::kInt8, {channels});
      const std::string one = g.unique_value_name(x + "_one");
      g.initializers[one] = Tensor::scalar<float>(1.f);
      const std::string zp0 = g.unique_value_name(x + "_czp0");
      g.initializers[zp0] = u8 ? Tensor::scalar<uint8_t>(0) : Tensor::scalar<int8_t>(0);
      ir::Node q, dq;
      q.op_type = "QuantizeLinear";
      q.inputs = {x, scale, zp};
      q.outputs = {g.unique_value_name(x + "_cq")};
      q.attrs["axis"] = int64_t{1};
      g.value_info[q.outputs[0]] = {q.outputs[0], DType::kUndefined, std::nullopt};
      dq.op_type = "DequantizeLinear";
      dq.inputs = {q.outputs[0], one, zp0};
      dq.outputs = {g.unique_value_name(x + "_cdq")};
      g.value_info[dq.outputs[0]] = {dq.outputs[0], DType::kUndefined, std::nullopt};
      integers[x] = dq.outputs[0];
      scales_of[x] = std::move(s);
      added.push_back(std::move(q));
      added.push_back(std::move(dq));
    }
    // W'[o, i] = W[o, i] s_c with c = (o / (O / group)) * (C / group) + i, quantized per output channel.
    const std::vector<float>& s = scales_of[x];
    Tensor scaled = w.clone();
    const int64_t inner = w.numel() / (out_channels * group_in);
    float* pw = scaled.data<float>();
    for (int64_t o = 0; o < out_channels; ++o)
      for (int64_t i = 0; i < group_in; ++i) {
        const float sc = s[static_cast<size_t>((o / (out_channels / group)) * group_in + i)];
        for (int64_t k = 0; k < inner; ++k) pw[(o * group_in + i) * inner + k] *= sc;
      }
    const QuantParam wp = weight_params(*l, &scaled);
    const std::string wq = g.unique_value_name(l->weight + "_cq");
    g.initializers[wq] = quantize_weight_s8(scaled, wp.scale, l->weight_axis, wp.bits, config_.bias_correction);
    const std::string ws = g.unique_value_name(l->weight + "_cs");
    g.initializers[ws] = Tensor::from_vector<float>({static_cast<int64_t>(wp.scale.size())}, wp.scale);
    ir::Node dqw;
    dqw.op_type = "DequantizeLinear";
    dqw.inputs = {wq, ws};
    dqw.outputs = {g.unique_value_name(l->weight + "_cdq")};
    g.value_info[dqw.outputs[0]] = {dqw.outputs[0], DType::kUndefined, std::nullopt};
    dqw.attrs["axis"] = l->weight_axis;
    node->inputs[0] = integers[x];
    node->inputs[1] = dqw.outputs[0];
    added.push_back(std::move(dqw));
  }
  if (added.empty()) return;
  for (auto& n : added) g.nodes.push_back(std::move(n));
  g.value_info.clear();
  g.topological_sort();
  g.remove_dead_nodes();  // the per-tensor Q/DQ and weight DQ no reader needs any more
  g.validate();
  g.metadata["slimquant.channel_wise_inputs"] = std::to_string(scales_of.size());
}

}  // namespace slimquant::quant
