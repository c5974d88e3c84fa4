// TrainGraph: the float graph as a list of TrainOps (graph nodes and inserted quanters), run
// forward with values kept by name and backward in reverse order, gradients accumulated by name.
#include "slimquant/train/train_graph.h"

#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <set>

#include "slimquant/ir/passes.h"
#include "slimquant/runtime/optimize.h"
#include "train/op_base.h"
#include "train/tensor_ops.h"

namespace slimquant::train {

struct TrainGraph::Impl {
  // One op of the training graph. A member type, not file-local: Impl is visible outside this file.
  struct Entry {
    std::string name;
    std::vector<std::string> inputs, outputs;
    std::unique_ptr<TrainOp> op;
    int node = -1;  // index into graph.nodes; -1 for inserted ops
  };

  ~Impl() {
    if (profile.empty()) return;
    // SLIMQUANT_TRAIN_PROFILE=1: seconds per op type, forward and backward, on stderr.
    std::fprintf(stderr, "train profile (s): op forward backward\n");
    for (const auto& [op, t] : profile) std::fprintf(stderr, "  %-22s %8.3f %8.3f\n", op.c_str(), t.first, t.second);
  }
  const bool profiling = std::getenv("SLIMQUANT_TRAIN_PROFILE") != nullptr;
  std::map<std::string, std::pair<double, double>> profile;
  std::string op_type(const Entry& e) const { return e.node >= 0 ? graph.nodes[e.node].op_type : "(inserted)"; }

  ir::Graph graph;
  TrainGraphOptions options;
  std::vector<Entry> entries;
  std::vector<std::unique_ptr<Parameter>> params;  // graph parameters, in first-use order
  std::map<std::string, Parameter*> param_by_name;
  bool trained_forward = false;
  bool requires_grad_dirty = true;
  std::vector<bool> entry_needs_backward;
  std::set<std::string> used_names;

  // Which values carry a gradient back to some parameter: a parameter, or an output of an op
  // that has parameters or reads such a value. Tells each op which input gradients to compute.
  void update_requires_grad() {
    std::set<std::string> rg;
    for (const auto& p : params) rg.insert(p->name);
    entry_needs_backward.assign(entries.size(), false);
    for (size_t i = 0; i < entries.size(); ++i) {
      Entry& e = entries[i];
      std::vector<bool> needed(e.inputs.size());
      bool any = !e.op->parameters().empty();
      for (size_t k = 0; k < e.inputs.size(); ++k) {
        needed[k] = !e.inputs[k].empty() && rg.count(e.inputs[k]) != 0;
        any = any || needed[k];
      }
      e.op->set_input_requires_grad(needed);
      entry_needs_backward[i] = any;
      if (any)
        for (const auto& o : e.outputs) rg.insert(o);
    }
    requires_grad_dirty = false;
  }
};

TrainGraph::TrainGraph(const ir::Graph& float_graph, TrainGraphOptions options) : impl_(std::make_unique<Impl>()) {
  Impl& m = *impl_;
  m.options = options;
  m.graph = float_graph;
  ir::Graph& g = m.graph;
  // The Session's construction pipeline, with BatchNorm folding optional.
  ir::constants_to_initializers(g);
  ir::remove_identity_ops(g);
  runtime::fold_constants(g);
  if (options.fold_batchnorm) ir::fold_batchnorm_into_conv(g);
  g.remove_dead_nodes();
  g.remove_unused_initializers();

  // torch exports Linear on 3-D inputs as MatMul + Add(bias): the Add's 1-D float initializer is
  // the MatMul's bias and trains like a Gemm bias.
  std::set<std::pair<size_t, size_t>> matmul_bias;  // (node, input)
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    if (n.op_type != "Add" || n.inputs.size() != 2) continue;
    for (size_t k = 0; k < 2; ++k) {
      const Tensor* b = g.initializer(n.inputs[k]);
      const int prod = g.producer(n.inputs[1 - k]);
      if (!b || b->dtype() != DType::kFloat32 || b->rank() != 1 || prod < 0 || g.nodes[prod].op_type != "MatMul")
        continue;
      const ir::Node& mm = g.nodes[prod];
      const bool weight = std::any_of(mm.inputs.begin(), mm.inputs.end(), [&](const std::string& v) {
        const Tensor* t = g.initializer(v);
        return t && t->dtype() == DType::kFloat32;
      });
      if (weight) matmul_bias.insert({i, k});
    }
  }

  for (const auto& [name, t] : g.initializers) m.used_names.insert(name);
  for (const auto& v : g.inputs) m.used_names.insert(v.name);
  std::set<std::string> depends_on_parameters;
  for (size_t i = 0; i < g.nodes.size(); ++i) {
    const ir::Node& n = g.nodes[i];
    for (size_t k = 0; k < n.inputs.size(); ++k) {
      const std::string& in = n.inputs[k];
      const bool slot = trainable_input(n.op_type, k, options.fold_batchnorm) || matmul_bias.count({i, k});
      if (in.empty() || !slot || m.param_by_name.count(in)) continue;
      const Tensor* t = g.initializer(in);
      if (!t || t->dtype() != DType::kFloat32) continue;
      auto p = std::make_unique<Parameter>();
      p->name = in;
      p->value = t->clone();
      p->zero_grad();
      m.param_by_name[in] = p.get();
      m.params.push_back(std::move(p));
    }
    const bool gradient_path = std::any_of(n.inputs.begin(), n.inputs.end(), [&](const std::string& in) {
      return m.param_by_name.count(in) || depends_on_parameters.count(in);
    });
    Impl::Entry e;
    e.name = n.name.empty() ? n.outputs.at(0) : n.name;
    e.inputs = n.inputs;
    e.outputs = n.outputs;
    e.node = static_cast<int>(i);
    e.op = make_train_op(n, g, gradient_path);
    // Shapes, indices and comparisons carry no gradient, whatever they were computed from.
    if (gradient_path && !dynamic_cast<const detail::NoGradOp*>(e.op.get()))
      depends_on_parameters.insert(n.outputs.begin(), n.outputs.end());
    for (const auto& o : n.outputs) m.used_names.insert(o);
    m.entries.push_back(std::move(e));
  }
}

TrainGraph::~TrainGraph() = default;
TrainGraph::TrainGraph(TrainGraph&&) noexcept = default;
TrainGraph& TrainGraph::operator=(TrainGraph&&) noexcept = default;

void TrainGraph::insert_on_tensor(const std::string& tensor, std::unique_ptr<TrainOp> op, std::string op_name) {
  Impl& m = *impl_;
  SQ_CHECK(op != nullptr, ErrorKind::kInvalidArgument, "insert_on_tensor '" + op_name + "': op is null");
  int producer = -1;
  for (size_t i = 0; i < m.entries.size(); ++i)
    if (std::find(m.entries[i].outputs.begin(), m.entries[i].outputs.end(), tensor) != m.entries[i].outputs.end())
      producer = static_cast<int>(i);
  const bool known = producer >= 0 || m.graph.is_initializer(tensor) ||
                     std::any_of(m.graph.inputs.begin(), m.graph.inputs.end(),
                                 [&](const ir::ValueInfo& v) { return v.name == tensor; });
  SQ_CHECK(known, ErrorKind::kInvalidArgument,
           "insert_on_tensor '" + op_name + "': no value named '" + tensor + "' in the graph");
  std::string out = tensor + "/" + op_name;
  for (int k = 1; m.used_names.count(out); ++k) out = tensor + "/" + op_name + "_" + std::to_string(k);
  m.used_names.insert(out);
  // Readers now read the inserted op's output. Node ops are rebuilt so that none keeps the old
  // value as a prepacked constant.
  for (Impl::Entry& e : m.entries) {
    bool reads = false;
    for (auto& in : e.inputs)
      if (in == tensor) {
        in = out;
        reads = true;
      }
    if (reads && e.node >= 0) {
      ir::Node n = m.graph.nodes[e.node];
      n.inputs = e.inputs;
      e.op = make_train_op(n, m.graph);
    }
  }
  Impl::Entry e;
  e.name = std::move(op_name);
  e.inputs = {tensor};
  e.outputs = {out};
  e.op = std::move(op);
  m.entries.insert(m.entries.begin() + (producer + 1), std::move(e));
  m.requires_grad_dirty = true;
  m.trained_forward = false;
}

std::map<std::string, Tensor> TrainGraph::forward(const std::map<std::string, Tensor>& feeds, bool training,
                                                  const std::vector<std::string>& extra_outputs) {
  Impl& m = *impl_;
  if (training && m.requires_grad_dirty) m.update_requires_grad();
  std::map<std::string, Tensor> values;
  for (const auto& [name, t] : m.graph.initializers) values[name] = t;
  for (const auto& p : m.params) values[p->name] = p->value;
  for (const auto& v : m.graph.inputs) {
    auto it = feeds.find(v.name);
    SQ_CHECK(it != feeds.end(), ErrorKind::kInvalidArgument, "TrainGraph::forward: graph input '" + v.name + "' is not fed");
    values[v.name] = it->second;
  }
  for (const auto& [name, t] : feeds)
    SQ_CHECK(values.count(name), ErrorKind::kInvalidArgument,
             "TrainGraph::forward: feed '" + name + "' is not a graph input");
  std::vector<Tensor> ins;
  for (Impl::Entry& e : m.entries) {
    ins.clear();
    for (const auto& in : e.inputs) {
      if (in.empty()) {
        ins.emplace_back();
        continue;
      }
      auto it = values.find(in);
      SQ_CHECK(it != values.end(), ErrorKind::kInternal, "TrainGraph: '" + e.name + "' reads '" + in + "' before it is computed");
      ins.push_back(it->second);
    }
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Tensor> outs = e.op->forward(ins, training);
    if (m.profiling)
      m.profile[m.op_type(e)].first += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    SQ_CHECK(outs.size() >= e.outputs.size() || e.node >= 0, ErrorKind::kInternal,
             "TrainGraph: op '" + e.name + "' returned " + std::to_string(outs.size()) + " outputs");
    for (size_t k = 0; k < e.outputs.size() && k < outs.size(); ++k)
      if (!e.outputs[k].empty()) values[e.outputs[k]] = std::move(outs[k]);
  }
  std::map<std::string, Tensor> result;
  for (const auto& o : m.graph.outputs) result[o.name] = values.at(o.name);
  for (const auto& name : extra_outputs) {
    auto it = values.find(name);
    SQ_CHECK(it != values.end(), ErrorKind::kInvalidArgument,
             "TrainGraph::forward: requested output '" + name + "' is not a value of the graph");
    result[name] = it->second;
  }
  m.trained_forward = training;
  return result;
}

void TrainGraph::backward(const std::map<std::string, Tensor>& output_grads) {
  Impl& m = *impl_;
  SQ_CHECK(m.trained_forward, ErrorKind::kInvalidArgument,
           "TrainGraph::backward: needs a forward(training=true) right before it");
  m.trained_forward = false;  // ops release what they saved
  std::map<std::string, Tensor> grads;
  for (const auto& [name, g] : output_grads) {
    SQ_CHECK(g.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument,
             "TrainGraph::backward: gradient for '" + name + "' must be float32");
    const bool computed = std::any_of(m.entries.begin(), m.entries.end(), [&](const Impl::Entry& e) {
      return std::find(e.outputs.begin(), e.outputs.end(), name) != e.outputs.end();
    });
    SQ_CHECK(computed, ErrorKind::kInvalidArgument,
             "TrainGraph::backward: '" + name + "' is not a value computed by the graph");
    grads[name] = g;
  }
  for (size_t i = m.entries.size(); i-- > 0;) {
    Impl::Entry& e = m.entries[i];
    if (!m.entry_needs_backward[i]) continue;
    std::vector<Tensor> gy(e.outputs.size());
    bool any = false;
    for (size_t k = 0; k < e.outputs.size(); ++k) {
      auto it = grads.find(e.outputs[k]);
      if (it == grads.end()) continue;
      gy[k] = std::move(it->second);
      grads.erase(it);
      any = true;
    }
    if (!any) continue;  // nothing reached this op: its inputs and parameters get no gradient
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Tensor> gx = e.op->backward(gy);
    if (m.profiling)
      m.profile[m.op_type(e)].second += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    for (size_t k = 0; k < e.inputs.size() && k < gx.size(); ++k) {
      if (e.inputs[k].empty() || !gx[k].defined()) continue;
      Tensor& acc = grads[e.inputs[k]];
      acc = detail::add_grads(acc, gx[k]);
    }
  }
  for (auto& p : m.params) {
    auto it = grads.find(p->name);
    if (it == grads.end()) continue;
    if (!p->grad.defined() || p->grad.shape() != p->value.shape()) p->zero_grad();
    detail::add_into(p->grad, it->second);
  }
}

std::vector<Parameter*> TrainGraph::parameters() {
  std::vector<Parameter*> r;
  for (auto& p : impl_->params) r.push_back(p.get());
  for (auto& e : impl_->entries)
    if (e.node < 0)
      for (Parameter* p : e.op->parameters()) r.push_back(p);
  return r;
}

Parameter* TrainGraph::parameter(const std::string& name) {
  if (auto it = impl_->param_by_name.find(name); it != impl_->param_by_name.end()) return it->second;
  for (auto& e : impl_->entries)
    if (e.node < 0)
      for (Parameter* p : e.op->parameters())
        if (p->name == name) return p;
  return nullptr;
}

ir::Graph TrainGraph::float_graph_with_parameters() const {
  ir::Graph g = impl_->graph;
  for (const auto& p : impl_->params) g.initializers[p->name] = p->value.clone();
  return g;
}

const ir::Graph& TrainGraph::graph() const { return impl_->graph; }

}  // namespace slimquant::train
