#include "slimquant/runtime/session.h"

#include <omp.h>

#include <algorithm>
#include <deque>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "slimquant/ir/passes.h"
#include "slimquant/runtime/kernel.h"
#include "slimquant/runtime/optimize.h"

namespace slimquant::runtime {

namespace {

const std::set<std::string> kNondeterministicOps = {"RandomNormal", "RandomUniform", "RandomNormalLike",
                                                    "RandomUniformLike", "Multinomial", "Bernoulli"};

// Reuses storage whose only owner is the pool (no live tensor, no caller holding an output).
class BufferPool {
 public:
  Tensor allocate(DType dtype, const Shape& shape) {
    const size_t bytes = static_cast<size_t>(shape_numel(shape)) * dtype_size(dtype);
    Entry* best = nullptr;
    for (auto& e : entries_)
      if (e.storage.use_count() == 1 && e.capacity >= bytes && (!best || e.capacity < best->capacity)) best = &e;
    // Don't hand a huge buffer to a tiny tensor: it would pin memory a later large value needs.
    if (best && best->capacity > 4 * bytes + 4096) best = nullptr;
    if (!best) {
      entries_.push_back({allocate_storage(bytes), bytes});
      best = &entries_.back();
    }
    return Tensor(dtype, shape, best->storage, best->capacity);
  }

 private:
  struct Entry {
    std::shared_ptr<std::byte[]> storage;
    size_t capacity;
  };
  std::deque<Entry> entries_;
};

Tensor run_kernel_once(const ir::Node& node, int64_t opset, const std::vector<const Tensor*>& inputs) {
  const KernelFactory* factory = KernelRegistry::instance().find(node.op_type, node.domain);
  if (!factory) fail(ErrorKind::kUnsupported, "unsupported op " + node.op_type + " (node '" + node.name + "')");
  KernelInit init{node, opset, [&](size_t i) { return i < inputs.size() ? inputs[i] : nullptr; }};
  auto kernel = (*factory)(init);
  std::vector<Tensor> outputs(node.outputs.size());
  KernelContext ctx(node, inputs, outputs, [](DType t, const Shape& s) { return Tensor(t, s); });
  kernel->run(ctx);
  return outputs.empty() ? Tensor() : outputs[0];
}

std::string with_node_context(const ir::Node& node, const std::string& message) {
  const std::string prefix = node.describe();
  if (message.find(prefix) != std::string::npos) return message;
  return prefix + ": " + message;
}

}  // namespace

int fold_constants(ir::Graph& g, const FoldOptions& options) {
  int folded = 0;
  std::vector<ir::Node> kept;
  kept.reserve(g.nodes.size());
  for (auto& node : g.nodes) {
    bool foldable = node.domain.empty() && !kNondeterministicOps.count(node.op_type) &&
                    !(options.keep_dequantize_linear && node.op_type == "DequantizeLinear") &&
                    KernelRegistry::instance().find(node.op_type) != nullptr && !node.outputs.empty();
    std::vector<Tensor> results;
    if (foldable && (node.op_type == "Shape" || node.op_type == "Size") && !node.inputs.empty()) {
      const std::string& x = node.inputs[0];
      Shape shape;
      bool known = false;
      if (const Tensor* t = g.initializer(x)) {
        shape = t->shape();
        known = true;
      } else if (const ir::ValueInfo* vi = g.find_value_info(x); vi && vi->fully_known()) {
        shape = vi->shape();
        known = true;
      }
      if (known) {
        // Evaluate on a zero-filled stand-in: Shape/Size only look at the shape.
        Tensor stand_in(DType::kUInt8, shape);
        results.push_back(run_kernel_once(node, g.opset, {&stand_in}));
      }
    } else if (foldable && node.op_type != "Constant" && !node.inputs.empty()) {
      std::vector<const Tensor*> inputs;
      bool all_constant = true;
      for (const auto& in : node.inputs) {
        if (in.empty()) {
          inputs.push_back(nullptr);
          continue;
        }
        const Tensor* t = g.initializer(in);
        if (!t) {
          all_constant = false;
          break;
        }
        inputs.push_back(t);
      }
      if (all_constant) {
        const KernelFactory* factory = KernelRegistry::instance().find(node.op_type);
        KernelInit init{node, g.opset, [&](size_t i) { return i < inputs.size() ? inputs[i] : nullptr; }};
        auto kernel = (*factory)(init);
        std::vector<Tensor> outputs(node.outputs.size());
        KernelContext ctx(node, inputs, outputs, [](DType t, const Shape& s) { return Tensor(t, s); });
        kernel->run(ctx);
        results = std::move(outputs);
      }
    }
    size_t bytes = 0;
    bool complete = !results.empty();
    for (size_t i = 0; i < results.size(); ++i) {
      if (!node.outputs[i].empty() && !results[i].defined()) complete = false;
      bytes += results[i].defined() ? results[i].nbytes() : 0;
    }
    if (!complete || bytes > options.max_folded_bytes) {
      kept.push_back(std::move(node));
      continue;
    }
    for (size_t i = 0; i < results.size(); ++i)
      if (!node.outputs[i].empty()) g.initializers[node.outputs[i]] = results[i].clone();
    ++folded;
  }
  g.nodes = std::move(kept);
  // A folded graph output stays reachable as an initializer; nothing else to fix up.
  g.remove_unused_initializers();
  return folded;
}

void optimize_graph(ir::Graph& g, const FoldOptions& options) {
  ir::constants_to_initializers(g);
  ir::remove_identity_ops(g);
  fold_constants(g, options);
  ir::fold_batchnorm_into_conv(g);
  g.remove_dead_nodes();
}

void check_supported(const ir::Graph& graph) {
  for (const auto& n : graph.nodes) {
    if (KernelRegistry::instance().find(n.op_type, n.domain)) continue;
    std::string op = n.domain.empty() ? n.op_type : n.domain + "::" + n.op_type;
    fail(ErrorKind::kUnsupported, "unsupported op " + op + " in node '" + (n.name.empty() ? n.outputs.at(0) : n.name) +
                                      "': slimquant has no kernel for it");
  }
}

// A graph compiled for one set of feed shapes and requested outputs.
class Plan {
 public:
  Plan(const ir::Graph& base, const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& wanted,
       const SessionOptions& options)
      : graph_(base), wanted_(wanted) {
    std::map<std::string, Shape> shapes;
    for (const auto& [name, t] : feeds) shapes[name] = t.shape();
    ir::bind_input_shapes(graph_, shapes);
    // Fed intermediates replace their producers: drop those nodes before folding.
    std::set<std::string> fed;
    for (const auto& [name, t] : feeds) fed.insert(name);
    std::set<std::string> keep(fed.begin(), fed.end());
    keep.insert(wanted.begin(), wanted.end());
    fold_constants(graph_);
    if (options.fuse_activations) ir::fuse_activations(graph_, keep);

    // Slots: one per value name.
    auto slot_of = [&](const std::string& name) {
      auto [it, inserted] = slots_.emplace(name, static_cast<int>(slots_.size()));
      return it->second;
    };
    for (const auto& [name, t] : graph_.initializers) constants_.push_back({slot_of(name), t});
    for (const auto& name : fed) feed_slots_.push_back({name, slot_of(name)});

    // Nodes needed: walk back from the wanted values, stopping at fed values and constants.
    std::unordered_set<std::string> needed(wanted.begin(), wanted.end());
    std::vector<bool> run_node(graph_.nodes.size(), false);
    for (int i = static_cast<int>(graph_.nodes.size()) - 1; i >= 0; --i) {
      const auto& n = graph_.nodes[i];
      bool produces_needed = false, all_fed = true;
      for (const auto& o : n.outputs) {
        if (o.empty()) continue;
        if (needed.count(o) && !fed.count(o) && !graph_.is_initializer(o)) produces_needed = true;
        if (!fed.count(o)) all_fed = false;
      }
      if (!produces_needed || all_fed) continue;
      run_node[i] = true;
      for (const auto& in : n.inputs)
        if (!in.empty()) needed.insert(in);
    }
    // Every needed value must come from somewhere.
    std::unordered_set<std::string> available(fed.begin(), fed.end());
    for (const auto& [name, t] : graph_.initializers) available.insert(name);
    for (size_t i = 0; i < graph_.nodes.size(); ++i)
      if (run_node[i])
        for (const auto& o : graph_.nodes[i].outputs) available.insert(o);
    for (const auto& v : needed)
      if (!v.empty() && !available.count(v)) {
        bool is_input = std::any_of(graph_.inputs.begin(), graph_.inputs.end(),
                                    [&](const ir::ValueInfo& i) { return i.name == v; });
        fail(ErrorKind::kInvalidArgument, is_input ? "missing input '" + v + "'"
                                                   : "value '" + v + "' is needed but neither fed nor computable "
                                                     "from the fed values");
      }

    for (size_t i = 0; i < graph_.nodes.size(); ++i) {
      if (!run_node[i]) continue;
      const ir::Node& node = graph_.nodes[i];
      const KernelFactory* factory = KernelRegistry::instance().find(node.op_type, node.domain);
      if (!factory) check_supported(graph_);  // throws with the node named
      Step step{&node, nullptr, {}, {}, {}};
      for (const auto& in : node.inputs) step.inputs.push_back(in.empty() ? -1 : slot_of(in));
      for (const auto& o : node.outputs) step.outputs.push_back(o.empty() ? -1 : slot_of(o));
      KernelInit init{node, graph_.opset, [&](size_t k) -> const Tensor* {
                        return k < node.inputs.size() ? graph_.initializer(node.inputs[k]) : nullptr;
                      }};
      try {
        step.kernel = (*factory)(init);
      } catch (const Error& e) {
        throw Error(e.kind(), with_node_context(node, e.what()));
      }
      steps_.push_back(std::move(step));
    }
    // Release each intermediate after its last reader (wanted values and constants stay).
    std::vector<int> last_use(slots_.size(), -1);
    for (size_t s = 0; s < steps_.size(); ++s)
      for (int in : steps_[s].inputs)
        if (in >= 0) last_use[in] = static_cast<int>(s);
    std::unordered_set<int> pinned;
    for (const auto& c : constants_) pinned.insert(c.first);
    for (const auto& w : wanted_) pinned.insert(slot_of(w));
    for (size_t s = 0; s < steps_.size(); ++s) {
      for (int in : steps_[s].inputs)
        if (in >= 0 && last_use[in] == static_cast<int>(s) && !pinned.count(in)) steps_[s].release.push_back(in);
      // Outputs nobody reads (e.g. an unused optional output) are released right away.
      for (int o : steps_[s].outputs)
        if (o >= 0 && last_use[o] < static_cast<int>(s) && !pinned.count(o)) steps_[s].release.push_back(o);
    }
    for (const auto& w : wanted_) wanted_slots_.push_back(slot_of(w));
    slot_names_.resize(slots_.size());
    for (const auto& [name, s] : slots_) slot_names_[s] = name;
  }

  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& feeds, const ValueHook& hook,
                                    BufferPool& pool) {
    std::vector<Tensor> values(slots_.size());
    for (const auto& [slot, t] : constants_) values[slot] = t;
    for (const auto& [name, slot] : feed_slots_) {
      values[slot] = feeds.at(name);
      if (hook) hook(name, values[slot]);
    }
    auto allocator = [&pool](DType t, const Shape& s) { return pool.allocate(t, s); };
    std::vector<const Tensor*> inputs;
    std::vector<Tensor> outputs;
    for (auto& step : steps_) {
      inputs.clear();
      for (int in : step.inputs) inputs.push_back(in >= 0 && values[in].defined() ? &values[in] : nullptr);
      outputs.assign(step.outputs.size(), Tensor());
      KernelContext ctx(*step.node, inputs, outputs, allocator);
      try {
        step.kernel->run(ctx);
      } catch (const Error& e) {
        throw Error(e.kind(), with_node_context(*step.node, e.what()));
      } catch (const std::exception& e) {
        throw Error(ErrorKind::kInternal, with_node_context(*step.node, e.what()));
      }
      for (size_t k = 0; k < step.outputs.size(); ++k) {
        if (step.outputs[k] < 0) continue;
        values[step.outputs[k]] = std::move(outputs[k]);
        if (hook && values[step.outputs[k]].defined()) hook(slot_names_[step.outputs[k]], values[step.outputs[k]]);
      }
      for (int r : step.release) values[r] = Tensor();
    }
    std::map<std::string, Tensor> result;
    for (size_t k = 0; k < wanted_.size(); ++k) {
      Tensor& t = values[wanted_slots_[k]];
      if (!t.defined()) fail(ErrorKind::kInternal, "output '" + wanted_[k] + "' was not produced");
      result[wanted_[k]] = t;
    }
    return result;
  }

 private:
  struct Step {
    const ir::Node* node;
    std::unique_ptr<Kernel> kernel;
    std::vector<int> inputs, outputs, release;
  };
  ir::Graph graph_;
  std::vector<std::string> wanted_;
  std::unordered_map<std::string, int> slots_;
  std::vector<std::string> slot_names_;
  std::vector<std::pair<int, Tensor>> constants_;
  std::vector<std::pair<std::string, int>> feed_slots_;
  std::vector<int> wanted_slots_;
  std::vector<Step> steps_;
};

struct Session::PlanEntry {
  std::string key;
  std::unique_ptr<Plan> plan;
  std::shared_ptr<BufferPool> pool;
};

Session::Session(ir::Graph graph, SessionOptions options) : graph_(std::move(graph)), options_(options) {
  if (options_.optimize) optimize_graph(graph_);
  check_supported(graph_);
}

Session::~Session() = default;
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

std::map<std::string, Tensor> Session::run(const std::map<std::string, Tensor>& feeds, const RunOptions& options) {
  std::vector<std::string> wanted = options.outputs;
  if (wanted.empty())
    for (const auto& o : graph_.outputs) wanted.push_back(o.name);

  // Validate feeds against the model's interface before compiling anything.
  std::unordered_set<std::string> produced;
  for (const auto& n : graph_.nodes) produced.insert(n.outputs.begin(), n.outputs.end());
  for (const auto& [name, t] : feeds) {
    const ir::ValueInfo* declared = nullptr;
    for (const auto& in : graph_.inputs)
      if (in.name == name) declared = &in;
    if (!declared && !produced.count(name)) {
      std::string names;
      for (const auto& in : graph_.inputs) names += (names.empty() ? "'" : ", '") + in.name + "'";
      fail(ErrorKind::kInvalidArgument, "unknown input '" + name + "'; the model's inputs are " + names);
    }
    if (!t.defined()) fail(ErrorKind::kInvalidArgument, "input '" + name + "' is an empty tensor");
    if (declared && declared->dtype != DType::kUndefined && declared->dtype != t.dtype())
      fail(ErrorKind::kInvalidArgument, "input '" + name + "' has dtype " + dtype_name(t.dtype()) +
                                            ", the model expects " + dtype_name(declared->dtype));
  }
  std::ostringstream key;
  for (const auto& [name, t] : feeds) key << name << ':' << static_cast<int>(t.dtype()) << shape_str(t.shape()) << ';';
  key << '|';
  for (const auto& w : wanted) key << w << ';';

  auto it = std::find_if(plans_.begin(), plans_.end(), [&](const auto& e) { return e->key == key.str(); });
  if (it == plans_.end()) {
    auto entry = std::make_unique<PlanEntry>();
    entry->key = key.str();
    entry->plan = std::make_unique<Plan>(graph_, feeds, wanted, options_);
    entry->pool = plans_.empty() ? std::make_shared<BufferPool>() : plans_.back()->pool;
    if (plans_.size() >= options_.max_cached_plans) plans_.erase(plans_.begin());
    plans_.push_back(std::move(entry));
    it = plans_.end() - 1;
  } else if (it != plans_.end() - 1) {
    std::rotate(it, it + 1, plans_.end());
    it = plans_.end() - 1;
  }
  if (options_.num_threads > 0) omp_set_num_threads(options_.num_threads);
  return (*it)->plan->run(feeds, options.on_value, *(*it)->pool);
}

Tensor Session::run_single(const Tensor& input) {
  SQ_CHECK(graph_.inputs.size() == 1, ErrorKind::kInvalidArgument,
           "run_single needs a model with one input, this one has " + std::to_string(graph_.inputs.size()));
  auto out = run({{graph_.inputs[0].name, input}});
  return out.at(graph_.outputs.at(0).name);
}

}  // namespace slimquant::runtime
