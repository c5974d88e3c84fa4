// Session: caches one compiled Plan per feed signature. A Plan is built as a list of named steps
// (session_internal.h lists the files each comes from) and runs its steps over a slot table.
#include "slimquant/runtime/session.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <optional>
#include <sstream>
#include <unordered_set>

#include "runtime/fusions/execution_fusions.h"
#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/session_internal.h"
#include "slimquant/ir/passes.h"
#include "slimquant/runtime/kernel.h"
#include "slimquant/runtime/optimize.h"

namespace slimquant::runtime {

namespace {

// SLIMQUANT_PROFILE=1: per-node wall time, printed to stderr when the plan is dropped (a
// benchmarking aid; the clock reads cost ~50 ns per node).
bool profiling_enabled() {
  const char* v = std::getenv("SLIMQUANT_PROFILE");
  return v && *v && *v != '0';
}

void print_profile(const std::vector<plan::Step>& steps, size_t timed_runs) {
  double total = 0, total_min = 0;
  for (const auto& s : steps) total += s.seconds, total_min += s.min_seconds;
  std::fprintf(stderr, "plan profile: %zu runs after the first, kernels %.4f ms per run (mean), %.4f ms (sum of "
               "per-node minima); per node: mean, min, share of mean\n", timed_runs, 1e3 * total / timed_runs,
               1e3 * total_min);
  for (const auto& s : steps)
    std::fprintf(stderr, "  %8.4f ms %8.4f ms %5.1f%%  %s%s%s\n", 1e3 * s.seconds / timed_runs, 1e3 * s.min_seconds,
                 100 * s.seconds / total, s.node->describe().c_str(), s.blocked_outputs ? " [may block]" : "",
                 s.node->inputs.size() > fused_ops::kConvAddend && s.node->op_type == "Conv" ? " [+sum]" : "");
}

}  // namespace

// A graph compiled for one set of feed shapes and requested outputs.
class Plan {
 public:
  Plan(const ir::Graph& base, const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& wanted,
       const std::vector<std::string>& observed, const SessionOptions& options)
      : graph_(base), wanted_(wanted) {
    std::set<std::string> fed;
    for (const auto& [name, t] : feeds) fed.insert(name);
    std::set<std::string> keep(fed.begin(), fed.end());
    keep.insert(wanted.begin(), wanted.end());
    keep.insert(observed.begin(), observed.end());
    bind_shapes_and_fold(feeds, keep);
    if (options.fuse_activations) apply_execution_fusions(graph_, keep);
    assign_input_slots(base, fed, observed);
    steps_ = plan::create_steps(graph_, plan::nodes_to_run(graph_, fed, wanted, observed), slots_);
    const std::unordered_set<int> pinned = pinned_slots();
    plan::schedule_releases(steps_, slots_.size(), pinned);
    plan::plan_layouts(steps_, slots_.size(), pinned, options.blocked_layouts);
    for (const auto& w : wanted_) wanted_slots_.push_back(slots_.slot_of(w));
    slot_names_ = slots_.names();
  }

  ~Plan() {
    if (profile_ && runs_ >= 2) print_profile(steps_, runs_ - 1);
  }

  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& feeds, const ValueHook& hook,
                                    bool hook_any_layout, BufferPool& pool) {
    ++runs_;
    plan::SlotValues slots = initial_values(feeds, hook);
    plan::StepIo io;
    for (auto& step : steps_) run_step(step, slots, io, hook, hook_any_layout, pool);
    std::map<std::string, Tensor> result;
    for (size_t k = 0; k < wanted_.size(); ++k) {
      Tensor& t = slots.values[wanted_slots_[k]];
      if (!t.defined()) fail(ErrorKind::kInternal, "output '" + wanted_[k] + "' was not produced");
      result[wanted_[k]] = t;
    }
    return result;
  }

 private:
  // Binds the feeds' shapes and folds what became constant. Fed intermediates replace their
  // producers (the folding drops those nodes); values in `keep` stay available when they fold.
  void bind_shapes_and_fold(const std::map<std::string, Tensor>& feeds, const std::set<std::string>& keep) {
    std::map<std::string, Shape> shapes;
    for (const auto& [name, t] : feeds) shapes[name] = t.shape();
    ir::bind_input_shapes(graph_, shapes);
    FoldOptions fold;
    fold.keep = keep;
    fold_constants(graph_, fold);
  }

  // Slots of the constants, the feeds and the observed values that folded to constants.
  void assign_input_slots(const ir::Graph& base, const std::set<std::string>& fed,
                          const std::vector<std::string>& observed) {
    for (const auto& [name, t] : graph_.initializers) constants_.push_back({slots_.slot_of(name), t});
    for (const auto& name : fed) feed_slots_.push_back({name, slots_.slot_of(name)});
    // Observed values that folded to constants for these input shapes (e.g. a class token Expand-ed
    // to the batch) are still shown to the hook on every run: calibration must see them.
    for (const auto& name : observed)
      if (graph_.is_initializer(name) && !base.is_initializer(name) && !fed.count(name))
        observed_constants_.push_back({name, slots_.slot_of(name)});
  }

  // Slots never released (and never blocked): constants and wanted values.
  std::unordered_set<int> pinned_slots() {
    std::unordered_set<int> pinned;
    for (const auto& c : constants_) pinned.insert(c.first);
    for (const auto& w : wanted_) pinned.insert(slots_.slot_of(w));
    return pinned;
  }

  // A run's value table holding the constants and feeds (shown to the hook).
  plan::SlotValues initial_values(const std::map<std::string, Tensor>& feeds, const ValueHook& hook) const {
    plan::SlotValues slots{std::vector<Tensor>(slot_names_.size()), std::vector<LayoutPtr>(slot_names_.size())};
    for (const auto& [slot, t] : constants_) slots.values[slot] = t;
    for (const auto& [name, slot] : feed_slots_) {
      slots.values[slot] = feeds.at(name);
      if (hook) hook(name, slots.values[slot]);
    }
    if (hook)
      for (const auto& [name, slot] : observed_constants_) hook(name, slots.values[slot]);
    return slots;
  }

  void run_step(plan::Step& step, plan::SlotValues& slots, plan::StepIo& io, const ValueHook& hook,
                bool hook_any_layout, BufferPool& pool) {
    plan::bind_step_inputs(step, slots, io, plain_copies_, pool);
    KernelContext ctx(*step.node, io.inputs, io.outputs,
                      [&pool](DType t, const Shape& s) { return pool.allocate(t, s); });
    if (io.channel_blocked) ctx.bind_layouts(&io.in_layouts, &io.out_layouts, step.blocked_outputs);
    if (step.role == plan::LayoutRole::kAware) {
      ctx.bind_layouts(&io.in_layouts, &io.out_layouts, step.blocked_outputs);
      // Only the pool and this value hold the addend's buffer: nobody can observe the overwrite.
      constexpr size_t kAddend = fused_ops::kConvAddend;
      if (step.donate_addend && io.inputs[kAddend] == &slots.values[step.inputs[kAddend]] &&
          slots.values[step.inputs[kAddend]].storage().use_count() == 2)
        ctx.donate_inputs(1u << kAddend);
    }
    run_kernel(step, ctx);
    for (size_t k = 0; k < step.outputs.size(); ++k) {
      const int slot = step.outputs[k];
      if (slot < 0) continue;
      plan::store_step_output(step, k, slot, io, slots);
      if (hook && slots.values[slot].defined()) show_to_hook(hook, hook_any_layout, slot, slots);
    }
    for (int r : step.release) {
      slots.values[r] = Tensor();
      slots.layouts[r] = nullptr;
    }
    plain_copies_.clear();
  }

  // Runs the step's kernel (timed under SLIMQUANT_PROFILE), naming the node in any error.
  void run_kernel(plan::Step& step, KernelContext& ctx) const {
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
  }

  // Hooks see plain values, or per-sample permutations when they accept any layout.
  void show_to_hook(const ValueHook& hook, bool hook_any_layout, int slot, const plan::SlotValues& slots) const {
    const Tensor& value = slots.values[slot];
    const LayoutPtr& layout = slots.layouts[slot];
    hook(slot_names_[slot], !layout || (hook_any_layout && plan::samples_stay_contiguous(*layout))
                                ? value
                                : dnnl_kernels::to_plain(value, *layout));
  }

  const bool profile_ = profiling_enabled();
  size_t runs_ = 0;
  plan::PlainCopies plain_copies_;  // for the current step
  ir::Graph graph_;
  std::vector<std::string> wanted_;
  plan::SlotTable slots_;
  std::vector<std::string> slot_names_;
  std::vector<std::pair<int, Tensor>> constants_;
  std::vector<std::pair<std::string, int>> feed_slots_;
  std::vector<std::pair<std::string, int>> observed_constants_;
  std::vector<int> wanted_slots_;
  std::vector<plan::Step> steps_;
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

namespace {

// A model that takes one sample without a batch dimension (torchvision's detection models:
// image [3, H, W]) gets a data set's batch of one with the leading 1 dropped. Empty when no feed
// needs that.
std::map<std::string, Tensor> without_batch_of_one(const ir::Graph& graph,
                                                   const std::map<std::string, Tensor>& batch_feeds) {
  std::map<std::string, Tensor> unbatched;
  for (const auto& [name, t] : batch_feeds)
    for (const auto& in : graph.inputs)
      if (in.name == name && in.dims && t.defined() && t.rank() == in.dims->size() + 1 && t.dim(0) == 1) {
        if (unbatched.empty()) unbatched = batch_feeds;
        unbatched[name] = t.reshaped(Shape(t.shape().begin() + 1, t.shape().end()));
      }
  return unbatched;
}

// Validates feeds against the model's interface before compiling anything (an undeclared feed
// must name an intermediate value, which it then replaces).
void check_feeds(const ir::Graph& graph, const std::map<std::string, Tensor>& feeds) {
  for (const auto& [name, t] : feeds) {
    const ir::ValueInfo* declared = nullptr;
    for (const auto& in : graph.inputs)
      if (in.name == name) declared = &in;
    if (!declared && graph.producer(name) < 0) {
      std::string names;
      for (const auto& in : graph.inputs) names += (names.empty() ? "'" : ", '") + in.name + "'";
      fail(ErrorKind::kInvalidArgument, "unknown input '" + name + "'; the model's inputs are " + names);
    }
    if (!t.defined()) fail(ErrorKind::kInvalidArgument, "input '" + name + "' is an empty tensor");
    if (declared && declared->dtype != DType::kUndefined && declared->dtype != t.dtype())
      fail(ErrorKind::kInvalidArgument, "input '" + name + "' has dtype " + dtype_name(t.dtype()) +
                                            ", the model expects " + dtype_name(declared->dtype));
  }
}

// What a compiled plan depends on: feed names, dtypes and shapes, wanted and observed values.
std::string plan_key(const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& wanted,
                     const std::vector<std::string>& observed) {
  std::ostringstream key;
  for (const auto& [name, t] : feeds) key << name << ':' << static_cast<int>(t.dtype()) << shape_str(t.shape()) << ';';
  key << '|';
  for (const auto& w : wanted) key << w << ';';
  key << '|';
  for (const auto& o : observed) key << o << ';';
  return key.str();
}

}  // namespace

std::map<std::string, Tensor> Session::run(const std::map<std::string, Tensor>& batch_feeds,
                                           const RunOptions& options) {
  const std::map<std::string, Tensor> unbatched = without_batch_of_one(graph_, batch_feeds);
  const std::map<std::string, Tensor>& feeds = unbatched.empty() ? batch_feeds : unbatched;
  std::vector<std::string> wanted = options.outputs;
  if (wanted.empty())
    for (const auto& o : graph_.outputs) wanted.push_back(o.name);
  check_feeds(graph_, feeds);
  const std::string key = plan_key(feeds, wanted, options.observe);

  auto it = std::find_if(plans_.begin(), plans_.end(), [&](const auto& e) { return e->key == key; });
  if (it == plans_.end()) {
    auto entry = std::make_unique<PlanEntry>();
    entry->key = key;
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
