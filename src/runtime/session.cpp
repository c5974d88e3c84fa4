#include "slimquant/runtime/session.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <deque>
#include <optional>
#include <sstream>
#include <unordered_map>
#include <unordered_set>

#include "runtime/kernels/dnnl_common.h"
#include "runtime/kernels/dnnl_kernels.h"
#include "runtime/fused_ops/residual_conv.h"
#include "runtime/fusions/execution_fusions.h"
#include "slimquant/ir/passes.h"
#include "slimquant/runtime/kernel.h"
#include "slimquant/runtime/optimize.h"

namespace slimquant::runtime {

// Reuses storage whose only owner is the pool (no live tensor, no caller holding an output).
class BufferPool {
 public:
  Tensor allocate(DType dtype, const Shape& shape) {
    const size_t bytes = checked_tensor_bytes(dtype, shape, "a value");
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

std::shared_ptr<BufferPool> make_shared_buffer_pool() { return std::make_shared<BufferPool>(); }

namespace {

const std::set<std::string> kNondeterministicOps = {"RandomNormal", "RandomUniform", "RandomNormalLike",
                                                    "RandomUniformLike", "Multinomial", "Bernoulli"};

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

// True when a blocked layout keeps every sample (slice along axis 0) contiguous and unpadded, at
// the place the plain layout has it: each sample's elements are then only permuted.
bool samples_stay_contiguous(const Layout& layout) {
  const dnnl_memory_desc_t& d = layout.desc.data;
  if (d.format_kind != dnnl_blocked || d.ndims < 1 || d.offset0 != 0) return false;
  int64_t per_sample = 1;
  for (int i = 0; i < d.ndims; ++i) {
    if (d.padded_dims[i] != d.dims[i] || d.padded_offsets[i] != 0) return false;
    if (i > 0) per_sample *= d.dims[i];
  }
  for (int k = 0; k < d.format_desc.blocking.inner_nblks; ++k)
    if (d.format_desc.blocking.inner_idxs[k] == 0) return false;
  return d.format_desc.blocking.strides[0] == per_sample;
}

// How a step treats non-plain (blocked) layouts.
enum class LayoutRole {
  kPlain,        // every input must be plain (converted if needed), outputs are plain
  kAware,        // the kernel reads blocked inputs at some positions and may write blocked outputs
  kPassthrough,  // elementwise without broadcasting (scalars aside): the kernel works on raw element
                 // order, so the output takes the common layout of the inputs (the session decides)
};
LayoutRole layout_role(const ir::Node& n) {
  if (n.domain.empty() && n.op_type == "Conv") return LayoutRole::kAware;
  if (n.domain == ir::kSlimquantDomain && n.op_type == "QConv") return LayoutRole::kAware;
  if (n.domain.empty() && (n.op_type == "MaxPool" || n.op_type == "AveragePool")) return LayoutRole::kAware;
  static const std::set<std::string> kElementwise = {"Add", "Sub", "Mul", "Div", "Relu", "Clip",
                                                      "QuantizeLinear", "DequantizeLinear"};
  if (n.domain.empty() && kElementwise.count(n.op_type)) return LayoutRole::kPassthrough;
  if (n.domain == dnnl_kernels::kGeluDomain && n.op_type == "Gelu") return LayoutRole::kPassthrough;
  return LayoutRole::kPlain;
}
// Input positions an aware kernel reads in any layout (X, and the fused residual addend).
bool aware_input(const ir::Node&, size_t input) { return input == fused_ops::kConvX || input == fused_ops::kConvAddend; }

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
    try {
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
    } catch (const Error& e) {
      throw Error(e.kind(), with_node_context(node, e.what()));
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
  // A folded graph output stays reachable as an initializer; so do folded values in options.keep.
  std::map<std::string, Tensor> kept_values;
  for (const auto& name : options.keep)
    if (const Tensor* t = g.initializer(name)) kept_values.emplace(name, *t);
  g.remove_unused_initializers();
  for (auto& [name, t] : kept_values) g.initializers.emplace(name, std::move(t));
  return folded;
}

void optimize_graph(ir::Graph& g, const FoldOptions& options) {
  ir::apply_rules(g, ir::cleanup_rules());
  fold_constants(g, options);
  // Until stable: a BatchNorm can follow an Add that folds first (DBNet's head:
  // ConvTranspose -> Add(bias) -> BatchNormalization).
  ir::apply_rules(g, ir::conv_folding_rules(), {}, /*until_stable=*/true);
  g.remove_dead_nodes();
}

void check_supported(const ir::Graph& graph) {
  for (const auto& n : graph.nodes) {
    for (const auto& [key, value] : n.attrs)  // If's branches
      if (const auto* branch = std::get_if<std::shared_ptr<const ir::Graph>>(&value)) {
        try {
          check_supported(**branch);
        } catch (const Error& e) {
          fail(e.kind(), n.describe() + " " + key + ": " + e.what());
        }
      }
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
       const std::vector<std::string>& observed, const SessionOptions& options)
      : graph_(base), wanted_(wanted) {
    std::map<std::string, Shape> shapes;
    for (const auto& [name, t] : feeds) shapes[name] = t.shape();
    ir::bind_input_shapes(graph_, shapes);
    // Fed intermediates replace their producers: drop those nodes before folding.
    std::set<std::string> fed;
    for (const auto& [name, t] : feeds) fed.insert(name);
    std::set<std::string> keep(fed.begin(), fed.end());
    keep.insert(wanted.begin(), wanted.end());
    keep.insert(observed.begin(), observed.end());
    FoldOptions fold;
    fold.keep = keep;
    fold_constants(graph_, fold);
    if (options.fuse_activations) apply_execution_fusions(graph_, keep);

    // Slots: one per value name.
    auto slot_of = [&](const std::string& name) {
      auto [it, inserted] = slots_.emplace(name, static_cast<int>(slots_.size()));
      return it->second;
    };
    for (const auto& [name, t] : graph_.initializers) constants_.push_back({slot_of(name), t});
    for (const auto& name : fed) feed_slots_.push_back({name, slot_of(name)});
    // Observed values that folded to constants for these input shapes (e.g. a class token Expand-ed
    // to the batch) are still shown to the hook on every run: calibration must see them.
    for (const auto& name : observed)
      if (graph_.is_initializer(name) && !base.is_initializer(name) && !fed.count(name))
        observed_constants_.push_back({name, slot_of(name)});

    // Nodes needed: walk back from the wanted values, stopping at fed values and constants.
    std::unordered_set<std::string> needed(wanted.begin(), wanted.end());
    needed.insert(observed.begin(), observed.end());
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
    // Values that may stay in a blocked layout: written by an aware or passthrough step, read only
    // where blocked is accepted, not returned. A passthrough step accepts blocked inputs only when
    // its output may stay blocked, so walk the steps backwards (readers come after writers). Hooks
    // get plain copies (see run()).
    std::vector<bool> plain_only(slots_.size(), false);
    for (int p : pinned) plain_only[p] = true;
    for (auto it = steps_.rbegin(); it != steps_.rend(); ++it) {
      Step& step = *it;
      step.role = options.blocked_layouts ? layout_role(*step.node) : LayoutRole::kPlain;
      if (step.role != LayoutRole::kPlain)
        for (size_t k = 0; k < step.outputs.size() && k < 32; ++k)
          if (step.outputs[k] >= 0 && !plain_only[step.outputs[k]]) step.blocked_outputs |= 1u << k;
      for (size_t k = 0; k < step.inputs.size(); ++k) {
        const bool accepts = (step.role == LayoutRole::kAware && aware_input(*step.node, k)) ||
                             (step.role == LayoutRole::kPassthrough && step.blocked_outputs != 0);
        if (step.inputs[k] >= 0 && !accepts) plain_only[step.inputs[k]] = true;
      }
    }
    // A fused residual addend (Conv input 3) that dies at its Conv and was written by another
    // aware step (so its buffer comes from the pool) may become the Conv's output buffer.
    std::vector<int> producer_role(slots_.size(), -1);
    for (const auto& step : steps_)
      for (int o : step.outputs)
        if (o >= 0) producer_role[o] = static_cast<int>(step.role);
    for (auto& step : steps_) {
      if (step.role != LayoutRole::kAware || step.inputs.size() < 4 || step.inputs[3] < 0) continue;
      const int addend = step.inputs[3];
      const bool dies_here = std::count(step.release.begin(), step.release.end(), addend) > 0;
      const bool read_once = std::count(step.inputs.begin(), step.inputs.end(), addend) == 1;
      step.donate_addend = dies_here && read_once && producer_role[addend] == static_cast<int>(LayoutRole::kAware);
    }
    for (const auto& w : wanted_) wanted_slots_.push_back(slot_of(w));
    slot_names_.resize(slots_.size());
    for (const auto& [name, s] : slots_) slot_names_[s] = name;
  }

  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& feeds, const ValueHook& hook,
                                    bool hook_any_layout, BufferPool& pool) {
    ++runs_;
    std::vector<Tensor> values(slots_.size());
    std::vector<LayoutPtr> layouts(slots_.size());
    for (const auto& [slot, t] : constants_) values[slot] = t;
    for (const auto& [name, slot] : feed_slots_) {
      values[slot] = feeds.at(name);
      if (hook) hook(name, values[slot]);
    }
    if (hook)
      for (const auto& [name, slot] : observed_constants_) hook(name, values[slot]);
    auto allocator = [&pool](DType t, const Shape& s) { return pool.allocate(t, s); };
    std::vector<const Tensor*> inputs;
    std::vector<Tensor> outputs;
    std::vector<LayoutPtr> in_layouts, out_layouts;
    for (auto& step : steps_) {
      inputs.clear();
      for (int in : step.inputs) inputs.push_back(in >= 0 && values[in].defined() ? &values[in] : nullptr);
      outputs.assign(step.outputs.size(), Tensor());
      LayoutPtr passthrough;  // the layout a passthrough step's output inherits
      if (step.role == LayoutRole::kAware) {
        in_layouts.clear();
        for (size_t k = 0; k < step.inputs.size(); ++k) {
          const int in = step.inputs[k];
          const bool accepted = aware_input(*step.node, k);
          if (in >= 0 && layouts[in] && !accepted) inputs[k] = plain_copy(values[in], layouts[in], pool);
          in_layouts.push_back(in >= 0 && accepted ? layouts[in] : nullptr);
        }
        out_layouts.assign(step.outputs.size(), nullptr);
      } else {
        if (step.role == LayoutRole::kPassthrough) passthrough = common_layout(step, values, layouts);
        if (!passthrough)
          for (size_t k = 0; k < step.inputs.size(); ++k)
            if (const int in = step.inputs[k]; in >= 0 && layouts[in])
              inputs[k] = plain_copy(values[in], layouts[in], pool);
      }
      KernelContext ctx(*step.node, inputs, outputs, allocator);
      if (step.role == LayoutRole::kAware) {
        ctx.bind_layouts(&in_layouts, &out_layouts, step.blocked_outputs);
        // Only the pool and this value hold the addend's buffer: nobody can observe the overwrite.
        if (step.donate_addend && inputs[3] == &values[step.inputs[3]] && values[step.inputs[3]].storage().use_count() == 2)
          ctx.donate_inputs(1u << 3);
      }
      const auto t0 = profile_ ? std::chrono::steady_clock::now() : std::chrono::steady_clock::time_point();
      try {
        step.kernel->run(ctx);
        // The first run creates primitives (JIT): leave it out.
        if (profile_ && runs_ > 1) {
          const double dt = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
          step.seconds += dt;
          step.min_seconds = std::min(step.min_seconds, dt);
        }
      } catch (const Error& e) {
        throw Error(e.kind(), with_node_context(*step.node, e.what()));
      } catch (const std::exception& e) {
        throw Error(ErrorKind::kInternal, with_node_context(*step.node, e.what()));
      }
      for (size_t k = 0; k < step.outputs.size(); ++k) {
        const int slot = step.outputs[k];
        if (slot < 0) continue;
        values[slot] = std::move(outputs[k]);
        if (step.role == LayoutRole::kAware)
          layouts[slot] = (step.blocked_outputs >> k & 1u) ? out_layouts[k] : nullptr;
        else if (passthrough && values[slot].defined())
          layouts[slot] = dnnl_kernels::retyped_layout(*passthrough, values[slot].dtype());
        if (hook && values[slot].defined())
          hook(slot_names_[slot], !layouts[slot] || (hook_any_layout && samples_stay_contiguous(*layouts[slot]))
                                      ? values[slot]
                                      : dnnl_kernels::to_plain(values[slot], *layouts[slot]));
      }
      for (int r : step.release) {
        values[r] = Tensor();
        layouts[r] = nullptr;
      }
      converted_.clear();
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
    LayoutRole role = LayoutRole::kPlain;
    uint32_t blocked_outputs = 0;  // bit k: output k may be left in a blocked layout
    bool donate_addend = false;    // input 3 may become the output buffer (see the constructor)
    double seconds = 0;            // accumulated under SLIMQUANT_PROFILE
    double min_seconds = 1e30;     // fastest run (a shared machine's preemptions only add time)
  };
  // A plain copy of a blocked value for a reader that needs plain; kept until the step is done.
  const Tensor* plain_copy(const Tensor& t, const LayoutPtr& layout, BufferPool& pool) {
    converted_.push_back(pool.allocate(t.dtype(), t.shape()));
    dnnl_kernels::reorder_to_plain(t, *layout, converted_.back());
    return &converted_.back();
  }
  // The layout shared by a passthrough step's data inputs (all with one shape, besides
  // single-element scalars of no higher rank), or null when they are plain, differ, broadcast, or
  // the output must be plain.
  static LayoutPtr common_layout(const Step& step, const std::vector<Tensor>& values,
                                 const std::vector<LayoutPtr>& layouts) {
    if (!(step.blocked_outputs & 1u)) return nullptr;
    LayoutPtr common;
    const Shape* shape = nullptr;
    size_t max_scalar_rank = 0;
    for (int in : step.inputs) {
      if (in < 0 || !values[in].defined()) continue;
      const Tensor& t = values[in];
      if (t.numel() == 1 && !layouts[in]) {
        max_scalar_rank = std::max(max_scalar_rank, t.rank());
        continue;
      }
      if (!layouts[in]) return nullptr;
      if (!shape) {
        shape = &t.shape();
        common = layouts[in];
      } else if (t.shape() != *shape || !dnnl_kernels::same_blocking(*layouts[in], *common)) {
        return nullptr;
      }
    }
    if (!shape || max_scalar_rank > shape->size()) return nullptr;
    return common;
  }

  // SLIMQUANT_PROFILE=1: per-node wall time, printed to stderr when the plan is dropped (a
  // benchmarking aid; the clock reads cost ~50 ns per node).
  const bool profile_ = [] {
    const char* v = std::getenv("SLIMQUANT_PROFILE");
    return v && *v && *v != '0';
  }();
  size_t runs_ = 0;
  std::deque<Tensor> converted_;  // plain copies made for the current step (stable addresses)

 public:
  ~Plan() {
    if (!profile_ || runs_ < 2) return;
    const size_t timed = runs_ - 1;
    double total = 0, total_min = 0;
    for (const auto& s : steps_) total += s.seconds, total_min += s.min_seconds;
    std::fprintf(stderr, "plan profile: %zu runs after the first, kernels %.4f ms per run (mean), %.4f ms (sum of "
                 "per-node minima); per node: mean, min, share of mean\n", timed, 1e3 * total / timed, 1e3 * total_min);
    for (const auto& s : steps_)
      std::fprintf(stderr, "  %8.4f ms %8.4f ms %5.1f%%  %s%s%s\n", 1e3 * s.seconds / timed, 1e3 * s.min_seconds,
                   100 * s.seconds / total,
                   s.node->describe().c_str(), s.blocked_outputs ? " [may block]" : "",
                   s.node->inputs.size() > 3 && s.node->op_type == "Conv" ? " [+sum]" : "");
  }

 private:
  ir::Graph graph_;
  std::vector<std::string> wanted_;
  std::unordered_map<std::string, int> slots_;
  std::vector<std::string> slot_names_;
  std::vector<std::pair<int, Tensor>> constants_;
  std::vector<std::pair<std::string, int>> feed_slots_;
  std::vector<std::pair<std::string, int>> observed_constants_;
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

std::map<std::string, Tensor> Session::run(const std::map<std::string, Tensor>& batch_feeds,
                                           const RunOptions& options) {
  // A model that takes one sample without a batch dimension (torchvision's detection models:
  // image [3, H, W]) gets a data set's batch of one with the leading 1 dropped.
  std::map<std::string, Tensor> unbatched;
  for (const auto& [name, t] : batch_feeds)
    for (const auto& in : graph_.inputs)
      if (in.name == name && in.dims && t.defined() && t.rank() == in.dims->size() + 1 && t.dim(0) == 1) {
        if (unbatched.empty()) unbatched = batch_feeds;
        unbatched[name] = t.reshaped(Shape(t.shape().begin() + 1, t.shape().end()));
      }
  const std::map<std::string, Tensor>& feeds = unbatched.empty() ? batch_feeds : unbatched;
  std::vector<std::string> wanted = options.outputs;
  if (wanted.empty())
    for (const auto& o : graph_.outputs) wanted.push_back(o.name);

  // Validate feeds against the model's interface before compiling anything (an undeclared feed
  // must name an intermediate value, which it then replaces).
  for (const auto& [name, t] : feeds) {
    const ir::ValueInfo* declared = nullptr;
    for (const auto& in : graph_.inputs)
      if (in.name == name) declared = &in;
    if (!declared && graph_.producer(name) < 0) {
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
  key << '|';
  for (const auto& o : options.observe) key << o << ';';

  auto it = std::find_if(plans_.begin(), plans_.end(), [&](const auto& e) { return e->key == key.str(); });
  if (it == plans_.end()) {
    auto entry = std::make_unique<PlanEntry>();
    entry->key = key.str();
    entry->plan = std::make_unique<Plan>(graph_, feeds, wanted, options.observe, options_);
    entry->pool = options_.buffer_pool ? options_.buffer_pool
                  : plans_.empty() ? std::make_shared<BufferPool>() : plans_.back()->pool;
    if (plans_.size() >= options_.max_cached_plans) plans_.erase(plans_.begin());
    plans_.push_back(std::move(entry));
    it = plans_.end() - 1;
  } else if (it != plans_.end() - 1) {
    std::rotate(it, it + 1, plans_.end());
    it = plans_.end() - 1;
  }
  if (options_.num_threads > 0) omp_set_num_threads(options_.num_threads);
  return (*it)->plan->run(feeds, options.on_value, options.observe_in_any_layout, *(*it)->pool);
}

std::vector<std::string> Session::input_names() const {
  std::vector<std::string> names;
  for (const auto& in : graph_.inputs) names.push_back(in.name);
  return names;
}

Tensor Session::run_single(const Tensor& input) {
  SQ_CHECK(graph_.inputs.size() == 1, ErrorKind::kInvalidArgument,
           "run_single needs a model with one input, this one has " + std::to_string(graph_.inputs.size()));
  auto out = run({{graph_.inputs[0].name, input}});
  return out.at(graph_.outputs.at(0).name);
}

}  // namespace slimquant::runtime
