// Session: caches one compiled Plan per feed signature. A Plan is built as a list of named steps
// (session_internal.h lists the files each comes from) and runs its steps over a slot table.
#include "slimquant/runtime/session.h"

#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <limits>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <unordered_set>

#include "runtime/fusions/execution_fusions.h"
#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/session_internal.h"
#include "slimquant/core/tensor_slices.h"
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
    std::fprintf(stderr, "  %8.4f ms %8.4f ms %5.1f%%  %s%s%s%s\n", 1e3 * s.seconds / timed_runs, 1e3 * s.min_seconds,
                 100 * s.seconds / total, s.node->describe().c_str(), s.blocked_outputs ? " [may block]" : "",
                 s.float16_outputs ? " [may float16]" : "",
                 s.node->inputs.size() > fused_ops::kConvAddend && s.node->op_type == "Conv" ? " [+sum]" : "");
}

}  // namespace

// A graph compiled for one set of feed shapes and requested outputs.
class Plan {
 public:
  Plan(const ir::Graph& base, const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& wanted,
       const std::vector<std::string>& observed, bool observed_plain, bool hooked, const SessionOptions& options)
      : graph_(base), wanted_(wanted) {
    std::set<std::string> fed;
    for (const auto& [name, t] : feeds) fed.insert(name);
    std::set<std::string> keep(fed.begin(), fed.end());
    keep.insert(wanted.begin(), wanted.end());
    keep.insert(observed.begin(), observed.end());
    // Sizes ONNX's shape inference lost (past a Reshape to a computed target) that do not depend
    // on the batch: attention's Slice bounds and head counts become constants. Proved on the model
    // with its batch size a symbol (bound, it would be a number the proof cannot tell from any
    // other), and not with fed intermediates: the proof follows the graph from its inputs.
    const bool inputs_only = std::all_of(feeds.begin(), feeds.end(), [&](const auto& f) {
      return std::any_of(base.inputs.begin(), base.inputs.end(), [&](const ir::ValueInfo& in) { return in.name == f.first; });
    });
    const std::map<std::string, Tensor> sizes =
        inputs_only ? batch_invariant_sizes(base, input_batch_axes(base.inputs)) : std::map<std::string, Tensor>{};
    bind_shapes_and_fold(feeds, keep, sizes);
    if (options.fuse_activations) apply_execution_fusions(graph_, keep);
    assign_input_slots(base, fed, observed);
    steps_ = plan::create_steps(graph_, plan::nodes_to_run(graph_, fed, wanted, observed), slots_, options.winograd);
    const std::unordered_set<int> pinned = pinned_slots();
    plan::schedule_releases(steps_, slots_.size(), pinned);
    std::unordered_set<int> plain = pinned;  // constants and outputs
    if (observed_plain)
      for (const auto& o : observed) plain.insert(slots_.slot_of(o));
    // A hook sees every value as float32 computes it: no float16 storage in a hooked plan.
    plan::plan_layouts(steps_, slots_.size(), plain, options.blocked_layouts,
                       options.float16_storage && !hooked && observed.empty());
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
      if (!t.defined() && !graph_.optional_values.count(wanted_[k]))  // an empty optional is undefined
        fail(ErrorKind::kInternal, "output '" + wanted_[k] + "' was not produced");
      result[wanted_[k]] = t;
    }
    return result;
  }

 private:
  // Binds the feeds' shapes and folds what became constant. Fed intermediates replace their
  // producers (the folding drops those nodes); values in `keep` stay available when they fold.
  // sizes: values known before binding (fold_batch_invariant_sizes), folded after it too.
  void bind_shapes_and_fold(const std::map<std::string, Tensor>& feeds, const std::set<std::string>& keep,
                            const std::map<std::string, Tensor>& sizes) {
    std::map<std::string, Shape> shapes;
    for (const auto& [name, t] : feeds)
      if (t.defined() && !t.is_sequence()) shapes[name] = t.shape();  // a sequence's elements have their own
    ir::bind_input_shapes(graph_, shapes);
    FoldOptions fold;
    fold.keep = keep;
    fold_constants(graph_, fold);
    fold_known_values(graph_, sizes, fold);
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
      if (hook && !slots.values[slot].is_sequence()) hook(name, slots.values[slot]);
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
      ctx.allow_float16_outputs(step.float16_outputs);
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
      // Sequences are not shown: observers and statistics take tensors (a sequence looks empty).
      if (hook && slots.values[slot].defined() && !slots.values[slot].is_sequence())
        show_to_hook(hook, hook_any_layout, slot, slots);
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
    if (value.dtype() == DType::kFloat16)
      fail(ErrorKind::kInternal, "'" + slot_names_[slot] + "' is stored as float16 in a plan with a value hook");
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
  if (options_.split_batches) {  // proved on the ONNX ops, before the rewrites fuse them
    SampleIndependence samples = options_.sample_independence
                                     ? *options_.sample_independence
                                     : analyze_sample_independence(graph_, input_batch_axes(graph_.inputs));
    samples_independent_ = samples.independent;
    samples_dependence_ = std::move(samples.reason);
    sample_output_axes_ = std::move(samples.output_axes);
  } else {
    samples_dependence_ = "batches are not split (split_batches is off)";
  }
  if (options_.optimize) optimize_graph(graph_);
  check_supported(graph_);
  input_axes_ = input_batch_axes(graph_.inputs);
}

Session::~Session() = default;
void Session::release_plans() { plans_.clear(); }
Session::Session(Session&&) noexcept = default;
Session& Session::operator=(Session&&) noexcept = default;

namespace {

// Whether `t`, fed to input `name`, has one axis more than the input declares: a model of one
// sample (torchvision's detection models: image [3, H, W]) given a batch [N, 3, H, W].
bool fed_with_one_axis_more(const ir::Graph& graph, const std::string& name, const Tensor& t) {
  for (const auto& in : graph.inputs)
    if (in.name == name && in.dims && t.defined() && !t.is_sequence() && t.rank() == in.dims->size() + 1) return true;
  return false;
}

// Such a model gets a batch of one with the leading 1 dropped. Empty when no feed needs that.
std::map<std::string, Tensor> without_batch_of_one(const ir::Graph& graph,
                                                   const std::map<std::string, Tensor>& batch_feeds) {
  std::map<std::string, Tensor> unbatched;
  for (const auto& [name, t] : batch_feeds)
    if (fed_with_one_axis_more(graph, name, t) && t.dim(0) == 1) {
      if (unbatched.empty()) unbatched = batch_feeds;
      unbatched[name] = t.reshaped(Shape(t.shape().begin() + 1, t.shape().end()));
    }
  return unbatched;
}

// The first input fed with one axis more than it declares, or nullptr.
const std::string* input_fed_without_batch_axis(const ir::Graph& graph, const std::map<std::string, Tensor>& feeds) {
  for (const auto& [name, t] : feeds)
    if (fed_with_one_axis_more(graph, name, t)) return &name;
  return nullptr;
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
    if (!t.defined() && !graph.optional_values.count(name))
      fail(ErrorKind::kInvalidArgument, "input '" + name + "' is an empty tensor");
    if (t.defined() && graph.sequence_values.count(name) && !t.is_sequence())
      fail(ErrorKind::kInvalidArgument, "input '" + name + "' is a sequence of tensors, got a tensor of shape " +
                                            shape_str(t.shape()));
    if (declared && declared->dtype != DType::kUndefined && t.defined() && declared->dtype != t.dtype())
      fail(ErrorKind::kInvalidArgument, "input '" + name + "' has dtype " + dtype_name(t.dtype()) +
                                            ", the model expects " + dtype_name(declared->dtype));
  }
}

// What a compiled plan depends on: feed names, dtypes and shapes, wanted and observed values, and
// whether a hook sees the values (float16 storage).
std::string plan_key(const std::map<std::string, Tensor>& feeds, const std::vector<std::string>& wanted,
                     const std::vector<std::string>& observed, bool observed_plain, bool hooked) {
  std::ostringstream key;
  for (const auto& [name, t] : feeds)
    key << name << ':' << static_cast<int>(t.dtype()) << (t.is_sequence() ? "seq" : shape_str(t.shape())) << ';';
  key << '|';
  for (const auto& w : wanted) key << w << ';';
  key << '|';
  for (const auto& o : observed) key << o << ';';
  if (observed_plain) key << "|plain";
  if (hooked) key << "|hooked";
  return key.str();
}

}  // namespace

size_t batch_axis_of(const BatchAxes& axes, const std::string& name) {
  const auto it = axes.find(name);
  return it == axes.end() ? 0 : it->second;
}

namespace {

// The batch dimension every feed shares (each on its batch axis; the first axis of a feed with one
// more than its input declares), or -1: a feed of rank 0 or feeds that differ.
int64_t shared_batch(const ir::Graph& graph, const std::map<std::string, Tensor>& feeds, const BatchAxes& axes) {
  int64_t batch = -1;
  for (const auto& [name, t] : feeds) {
    if (t.defined() && !t.is_sequence() && t.rank() == 0) {
      // A scalar fed to a scalar input is the same for every row; elsewhere it is no batch.
      const bool scalar_input = std::any_of(graph.inputs.begin(), graph.inputs.end(), [&](const ir::ValueInfo& in) {
        return in.name == name && in.dims && in.dims->empty();
      });
      if (scalar_input) continue;
      return -1;
    }
    const size_t axis = fed_with_one_axis_more(graph, name, t) ? 0 : batch_axis_of(axes, name);
    if (!t.defined() || t.is_sequence() || axis >= t.rank() || (batch >= 0 && t.dim(axis) != batch)) return -1;
    batch = t.dim(axis);
  }
  return batch;
}

}  // namespace

ir::Dim batch_dimension(const std::vector<ir::ValueInfo>& inputs) {
  const ir::ValueInfo* fixed = nullptr;
  for (const auto& in : inputs) {
    if (!in.dims || in.dims->empty()) continue;
    if (!in.dims->front().known()) return in.dims->front();
    if (!fixed) fixed = &in;
  }
  return fixed ? fixed->dims->front() : ir::Dim{};
}

std::optional<size_t> declared_batch_axis(const ir::ValueInfo& value, const ir::Dim& batch) {
  if (!value.dims || value.dims->empty()) return std::nullopt;
  const std::vector<ir::Dim>& dims = *value.dims;
  // The one axis that `is_batch` picks, or nullopt when none or several do.
  auto only_axis = [&](auto&& is_batch) -> std::optional<size_t> {
    std::optional<size_t> found;
    for (size_t axis = 0; axis < dims.size(); ++axis) {
      if (!is_batch(dims[axis])) continue;
      if (found) return std::nullopt;
      found = axis;
    }
    return found;
  };
  if (!batch.known() && !batch.param.empty())
    if (auto named = only_axis([&](const ir::Dim& d) { return !d.known() && d.param == batch.param; })) return named;
  if (!dims.front().known()) return std::nullopt;
  if (batch.known()) {
    if (dims.front().value == batch.value) return 0;
    return only_axis([&](const ir::Dim& d) { return d.known() && d.value == batch.value; });
  }
  // A first axis fixed at 1 may still be a batch of one; fixed at more, it is something else.
  if (dims.front().value <= 1) return std::nullopt;
  return only_axis([](const ir::Dim& d) { return !d.known(); });
}

BatchAxes input_batch_axes(const std::vector<ir::ValueInfo>& inputs) {
  const ir::Dim batch = batch_dimension(inputs);
  BatchAxes axes;
  for (const auto& in : inputs)
    if (const std::optional<size_t> axis = declared_batch_axis(in, batch); axis && *axis != 0) axes[in.name] = *axis;
  return axes;
}

int64_t batch_rows(const std::map<std::string, Tensor>& feeds, const BatchAxes& axes) {
  for (const auto& [name, t] : feeds) {
    if (!t.defined() || t.is_sequence() || t.rank() == 0) continue;
    const size_t axis = batch_axis_of(axes, name);
    return t.dim(axis < t.rank() ? axis : 0);
  }
  return 0;
}

int64_t declared_batch(const ir::Graph& graph, const std::map<std::string, Tensor>& feeds) {
  const BatchAxes axes = input_batch_axes(graph.inputs);
  int64_t declared = 0;
  for (const auto& in : graph.inputs) {
    const auto fed = feeds.find(in.name);
    if (fed == feeds.end() || !in.dims || in.dims->empty()) continue;
    const ir::Dim& batch = (*in.dims)[batch_axis_of(axes, in.name)];
    if (fed->second.rank() != in.dims->size() || !batch.known()) return 0;
    if (declared != 0 && declared != batch.value) return 0;
    declared = batch.value;
  }
  return declared;
}

std::map<std::string, Tensor> feed_rows(const std::map<std::string, Tensor>& feeds, int64_t first, int64_t count,
                                        const BatchAxes& axes) {
  std::map<std::string, Tensor> part;
  for (const auto& [name, t] : feeds) {
    if (t.defined() && !t.is_sequence() && t.rank() == 0) {  // a scalar input: the same for every row
      part.emplace(name, t);
      continue;
    }
    const size_t axis = batch_axis_of(axes, name);
    SQ_CHECK(axis < t.rank() && first >= 0 && count >= 0 && first + count <= t.dim(axis), ErrorKind::kInvalidArgument,
             "feed '" + name + "' of shape " + shape_str(t.shape()) + " has no rows " + std::to_string(first) + ".." +
                 std::to_string(first + count) + (axis ? " along its batch axis " + std::to_string(axis) : ""));
    part.emplace(name, slice_along(t, axis, first, count));
  }
  return part;
}

bool is_shape_error(const Error& e) {
  return e.kind() == ErrorKind::kInvalidArgument || e.kind() == ErrorKind::kInvalidModel;
}

void print_batch_limit(int64_t limit, const std::string& why, const std::string& then) {
  char head[96];
  std::snprintf(head, sizeof head, "slimquant: the model takes at most %lld sample%s per run (",
                static_cast<long long>(limit), limit == 1 ? "" : "s");
  const std::string line = head + why + "): larger batches are run in parts of " + std::to_string(limit) +
                           (then.empty() ? "" : ", " + then);
  // Once per process: a job's stages (calibration, recovery, evaluations) each open a session on
  // the same model and would each say it again.
  static std::mutex mutex;
  static std::set<std::string> said;
  std::lock_guard<std::mutex> lock(mutex);
  if (said.insert(line).second) std::fprintf(stderr, "%s\n", line.c_str());
}

void Session::limit_batch(int64_t limit, const std::string& why) {
  batch_limit_ = limit;
  print_batch_limit(limit, why);
}

bool Session::takes_batch(const std::map<std::string, Tensor>& feeds, const RunOptions& options, int64_t batch) {
  if (batches_taken_.count(batch)) return true;
  RunOptions plain;  // no hooks: a failing try must not have shown observers half a batch
  plain.outputs = options.outputs;
  const int64_t tried = std::min<int64_t>(batch, 2);  // a graph that breaks at 6 breaks at 2
  try {
    run_whole(feed_rows(feeds, 0, tried, input_axes_), plain);
  } catch (const Error& e) {
    if (!is_shape_error(e)) throw;
    try {
      run_whole(feed_rows(feeds, 0, 1, input_axes_), plain);
    } catch (const Error&) {
      return true;  // not a matter of batch size: the whole batch's run reports it
    }
    limit_batch(1, "it fails at batch " + std::to_string(tried) + ": " + e.what());
    return false;
  }
  if (tried == batch) batches_taken_.insert(batch);
  return true;
}

namespace {

// feed_rows for the session's own parts: rows along a first batch axis that start on a 64-byte
// boundary are views of the caller's feeds (a part's run only reads its feeds), not copies; a part
// of 8 images of 224x224 is 4.8 MB that a copy would fault in and write each time.
std::map<std::string, Tensor> part_rows(const std::map<std::string, Tensor>& feeds, int64_t first, int64_t count,
                                        const BatchAxes& axes) {
  std::map<std::string, Tensor> part, copied;
  for (const auto& [name, fed] : feeds) {
    const bool rows_first = batch_axis_of(axes, name) == 0 && fed.defined() && !fed.is_sequence() &&
                            fed.rank() > 0 && fed.dim(0) > 0 && first + count <= fed.dim(0) && fed.storage();
    const size_t offset =
        rows_first ? static_cast<size_t>(first) * (fed.nbytes() / static_cast<size_t>(fed.dim(0))) : 1;
    if (!rows_first || offset % 64 != 0) {
      copied.emplace(name, fed);
      continue;
    }
    Shape shape = fed.shape();
    shape[0] = count;
    const std::shared_ptr<std::byte[]> rows(fed.storage(), fed.storage().get() + offset);
    part.emplace(name, Tensor(fed.dtype(), std::move(shape), rows, fed.capacity_bytes() - offset));
  }
  for (auto& [name, t] : feed_rows(copied, first, count, axes)) part.emplace(name, std::move(t));
  return part;
}

}  // namespace

std::map<std::string, Tensor> Session::run_in_parts(const std::map<std::string, Tensor>& feeds,
                                                    const RunOptions& options, int64_t batch, int64_t part) {
  std::vector<std::map<std::string, Tensor>> parts = run_parts(feeds, options, batch, part);
  if (!options.outputs_needed) return {};
  return join_parts(parts, feeds, batch, part);
}

std::vector<std::map<std::string, Tensor>> Session::run_parts(const std::map<std::string, Tensor>& feeds,
                                                              const RunOptions& options, int64_t batch, int64_t part) {
  // A feed with one axis more than its input declares has its samples along that first axis.
  BatchAxes axes = input_axes_;
  for (const auto& [name, t] : feeds)
    if (fed_with_one_axis_more(graph_, name, t)) axes.erase(name);
  std::vector<std::map<std::string, Tensor>> parts;
  for (int64_t first = 0; first < batch; first += part)
    parts.push_back(run_whole(part_rows(feeds, first, std::min(part, batch - first), axes), options));
  return parts;
}

std::map<std::string, Tensor> Session::join_parts(const std::vector<std::map<std::string, Tensor>>& parts,
                                                  const std::map<std::string, Tensor>& feeds, int64_t batch,
                                                  int64_t part) const {
  const ir::Dim batch_dim = batch_dimension(graph_.inputs);
  BatchAxes output_axes;
  for (const auto& [name, t] : parts.front()) {
    std::optional<size_t> axis;
    for (const auto& out : graph_.outputs)
      if (out.name == name) axis = declared_batch_axis(out, batch_dim);
    // Undeclared: an output shaped like a fed input whose batch is not first (a recurrent state
    // out, next to the state in) has its batch where that input has it.
    for (const auto& [input, input_axis] : input_axes_) {
      const auto fed = feeds.find(input);
      if (axis || fed == feeds.end() || fed->second.rank() != t.rank() || input_axis >= t.rank()) continue;
      Shape first_part = fed->second.shape();
      first_part[input_axis] = std::min(part, batch);
      if (first_part == t.shape()) axis = input_axis;
    }
    if (axis && *axis != 0) output_axes[name] = *axis;
  }
  return join_rows(parts, batch, part, output_axes);
}

std::map<std::string, Tensor> join_rows(const std::vector<std::map<std::string, Tensor>>& parts, int64_t batch,
                                        int64_t part, const BatchAxes& axes) {
  std::map<std::string, Tensor> joined;
  for (const auto& [name, first] : parts.front()) {
    const size_t axis = batch_axis_of(axes, name);
    std::vector<Tensor> pieces;
    bool rows_per_sample = true, same_shapes = true;
    for (size_t k = 0; k < parts.size(); ++k) {
      const Tensor& t = parts[k].at(name);
      const int64_t expected = std::min(part, batch - static_cast<int64_t>(k) * part);
      bool one_row_per_sample = t.rank() > axis && t.dim(axis) == expected && t.dtype() == first.dtype() &&
                                t.rank() == first.rank();
      for (size_t d = 0; one_row_per_sample && d < t.rank(); ++d)
        one_row_per_sample = d == axis || t.dim(d) == first.dim(d);
      rows_per_sample = rows_per_sample && one_row_per_sample;
      same_shapes = same_shapes && t.dtype() == first.dtype() && t.shape() == first.shape();
      pieces.push_back(t);
    }
    if (rows_per_sample) {
      joined.emplace(name, concat_along(pieces, axis));
      continue;
    }
    // Run one sample at a time, an output with no batch axis (a detector's boxes after its
    // selection, [300x4] for its one image) is that sample's: stacked, one row per sample.
    if (part == 1 && same_shapes && !first.is_sequence()) {
      Shape stacked_shape{1};
      stacked_shape.insert(stacked_shape.end(), first.shape().begin(), first.shape().end());
      for (Tensor& t : pieces) t = t.reshaped(stacked_shape);
      joined.emplace(name, concat_along(pieces, 0));
      continue;
    }
    const Tensor* other = &first;
    for (const Tensor& t : pieces)
      if (t.shape() != first.shape()) other = &t;
    fail(ErrorKind::kInvalidArgument,
         part == 1 && other != &first
             ? "the model takes one sample per run, and its output '" + name + "' is " + shape_str(first.shape()) +
                   " for one sample and " + shape_str(other->shape()) +
                   " for another: outputs whose size depends on the data have no batch; run one sample at a time"
             : "the model takes at most " + std::to_string(part) + " samples per run, and its output '" + name +
                   "' is " + shape_str(first.shape()) + " for " + std::to_string(std::min(part, batch)) +
                   " samples, not one row per sample: a batch of " + std::to_string(batch) +
                   " cannot be run in parts");
  }
  return joined;
}

namespace {

// The live values (outputs aside) of the samples one part runs, per thread: past a few times a
// core's L2, every memory-bound pass (activations, quantization, residual adds) streams from L3 or
// memory, and a sample costs more in a batch of 32 than in a few; much smaller parts pay each
// run's fixed costs more often. 16 MB: measured on parts of 2 to 8 (docs/performance.md, "Large
// batches in parts").
constexpr size_t kPartLiveBytes = size_t{16} << 20;

// Samples per part for the live values: as many as keep them within the budget (a power of two,
// at least one).
int64_t samples_in_budget(size_t live_bytes_per_sample, int threads) {
  const size_t per_sample = std::max<size_t>(live_bytes_per_sample, 1);
  const size_t budget = kPartLiveBytes * static_cast<size_t>(std::max(threads, 1));  // each core its own L2
  int64_t part = 1;
  while (static_cast<size_t>(part * 2) * per_sample <= budget) part *= 2;
  return part;
}

// `part` doubled until a sample's share of the weights streamed per part is below its own live
// values: weight-heavy models such as ResNet-18 FP32 gain from larger parts. Compute-heavy ones
// with large weights (ViT-B/16: 87 MB of INT8 weights, 17.5 G multiply-adds a sample) do not,
// which live bytes cannot tell: the session times both sizes (Session::speed_part).
int64_t samples_amortizing_weights(int64_t part, size_t live_bytes_per_sample, size_t weight_bytes) {
  const size_t per_sample = std::max<size_t>(live_bytes_per_sample, 1);
  while (weight_bytes / static_cast<size_t>(part) > per_sample) part *= 2;
  return part;
}

}  // namespace

std::pair<int64_t, PartChoice*> Session::speed_part(const std::map<std::string, Tensor>& feeds,
                                                   const RunOptions& options, int64_t batch) {
  const std::pair<int64_t, PartChoice*> whole{batch, nullptr};
  // Hooks and observed values see a batch whole; feeds of intermediate values, or fewer inputs,
  // are not the model the proof was made on.
  if (!samples_independent_ || batch < 2 || options.on_value || !options.observe.empty() ||
      feeds.size() != graph_.inputs.size())
    return whole;
  for (const auto& o : options.outputs)
    if (!graph_.is_graph_output(o)) return whole;
  std::string key;
  for (const auto& in : graph_.inputs) {
    const auto fed = feeds.find(in.name);
    if (fed == feeds.end() || !fed->second.defined() || fed->second.is_sequence() ||
        fed_with_one_axis_more(graph_, in.name, fed->second))
      return whole;
    Shape one = fed->second.shape();
    const size_t axis = batch_axis_of(input_axes_, in.name);
    if (in.dims && axis < in.dims->size() && (*in.dims)[axis].known()) return whole;  // a fixed batch
    if (axis < one.size()) one[axis] = 1;
    key += in.name + shape_str(one) + dtype_name(fed->second.dtype()) + ";";
  }
  // SLIMQUANT_SAMPLES_PER_PART: a fixed part size (0: whole batches), for measuring the choice.
  static const int64_t forced = [] {
    const char* v = std::getenv("SLIMQUANT_SAMPLES_PER_PART");
    return v ? std::atoll(v) : int64_t{-1};
  }();
  if (forced == 0) return whole;
  if (forced > 0) return {std::min(forced, batch), nullptr};
  if (options_.samples_per_part > 0) return {std::min(options_.samples_per_part, batch), nullptr};
  auto it = speed_parts_.find(key);
  if (it == speed_parts_.end()) {
    // One sample run once on a pool of its own measures the peak of its live values.
    BufferPool probe;
    probe.track_peak();
    RunOptions plain;
    plain.outputs = options.outputs;
    PartChoice choice{std::numeric_limits<int64_t>::max()};  // whole batches, unless the probe says otherwise
    const size_t plans_before = plans_.size();
    try {
      size_t output_bytes = 0;  // copied into the joined outputs either way: not a part's to keep
      for (const auto& [name, t] : run_whole(feed_rows(feeds, 0, 1, input_axes_), plain, &probe))
        output_bytes += t.nbytes();
      const size_t working = probe.peak_bytes() - std::min(probe.peak_bytes(), output_bytes);
      const int64_t in_budget =
          samples_in_budget(working, options_.num_threads > 0 ? options_.num_threads : omp_get_max_threads());
      choice.part = samples_amortizing_weights(in_budget, working, graph_.parameter_bytes());
      if (choice.part != in_budget) choice.candidate = in_budget;
      if (profiling_enabled())
        std::fprintf(stderr, "parts: live %zu bytes per sample (outputs %zu), weights %zu: %lld per part%s\n",
                     probe.peak_bytes(), output_bytes, graph_.parameter_bytes(), static_cast<long long>(choice.part),
                     choice.candidate ? (", then " + std::to_string(choice.candidate) + " timed against it").c_str()
                                      : "");
    } catch (const Error& e) {
      if (!is_shape_error(e)) throw;  // the whole batch's run names the shapes the caller fed
    }
    // The probe's plan (most recently used: last), unless parts of one sample will use it.
    if (choice.part != 1 && choice.candidate != 1 && plans_.size() > plans_before) plans_.pop_back();
    it = speed_parts_.emplace(key, choice).first;
  }
  PartChoice& choice = it->second;
  return {choice.next(batch), choice.choosing(batch) ? &choice : nullptr};
}

bool PartChoice::choosing(int64_t batch) const {
  return candidate != 0 && std::min(part, batch) != std::min(candidate, batch);
}

int64_t PartChoice::next(int64_t batch) const {
  return std::min(choosing(batch) && runs % 2 == 1 ? candidate : part, batch);
}

void PartChoice::note(int64_t batch, double seconds) {
  if (!choosing(batch)) return;
  const int step = runs++;
  if (step < 2) return;
  const double per_sample = seconds / static_cast<double>(batch);
  double& fastest = step % 2 ? candidate_seconds : part_seconds;
  fastest = step < 4 ? per_sample : std::min(fastest, per_sample);
  if (runs < kChoosingRuns) return;
  if (profiling_enabled())
    std::fprintf(stderr, "parts: %lld per part %.3f ms a sample, %lld per part %.3f ms\n", static_cast<long long>(part),
                 part_seconds * 1e3, static_cast<long long>(candidate), candidate_seconds * 1e3);
  if (candidate_seconds < kClearlyFaster * part_seconds) part = candidate;
  candidate = 0;
}

bool Session::choosing_part_size() const {
  return std::any_of(speed_parts_.begin(), speed_parts_.end(), [](const auto& kv) { return kv.second.settling(); });
}

int64_t Session::splittable_batch(const std::map<std::string, Tensor>& feeds) const {
  return options_.split_batches ? shared_batch(graph_, feeds, input_axes_) : -1;
}

bool Session::runs_whole(const std::map<std::string, Tensor>& feeds) const {
  const int64_t batch = splittable_batch(feeds);
  if (batch <= 1) return true;
  if (batch_limit_ > 0) return batch <= batch_limit_;
  return batches_taken_.count(batch) > 0;
}

std::map<std::string, Tensor> Session::run_speed_parts(const std::map<std::string, Tensor>& feeds,
                                                       const RunOptions& options, int64_t batch, int64_t part) {
  // Each part's outputs go into the whole batch's as soon as it ends, so that the next part
  // reuses its buffers (holding them all and joining at the end faulted in fresh memory for
  // every part: PP-OCR rec's outputs are 1 MB a sample).
  std::map<std::string, Tensor> joined;
  for (int64_t first = 0; first < batch; first += part) {
    const int64_t count = std::min(part, batch - first);
    const std::map<std::string, Tensor> out = run_whole(part_rows(feeds, first, count, input_axes_), options);
    if (!options.outputs_needed) continue;
    for (const auto& [name, t] : out) {
      const size_t axis = batch_axis_of(sample_output_axes_, name);
      SQ_CHECK(axis < t.rank() && t.dim(axis) == count, ErrorKind::kInternal,
               "output '" + name + "' of a part of " + std::to_string(count) + " samples is " + shape_str(t.shape()) +
                   ", not one entry per sample along axis " + std::to_string(axis));
      if (first == 0) {
        Shape shape = t.shape();
        shape[axis] = batch;
        joined.emplace(name, Tensor(t.dtype(), std::move(shape)));
      }
      copy_along(t, joined.at(name), axis, first);
    }
  }
  return joined;
}

std::map<std::string, Tensor> Session::run(const std::map<std::string, Tensor>& feeds, const RunOptions& options) {
  const int64_t batch = splittable_batch(feeds);
  if (batch <= 1) return run_whole(feeds, options);
  if (const std::string* one_sample = input_fed_without_batch_axis(graph_, feeds)) {
    // Not a limit learned for the session: fed as declared, the first axis is not a batch.
    print_batch_limit(1, "its input '" + *one_sample + "' is one sample, without a batch axis");
    return run_in_parts(feeds, options, batch, 1);
  }
  if (batch_limit_ == 0) {
    const int64_t declared = declared_batch(graph_, feeds);
    if (declared > 0 && declared < batch && batch % declared == 0)
      limit_batch(declared, "its inputs declare batch " + std::to_string(declared));
  }
  if (batch_limit_ > 0 && batch > batch_limit_) {
    if (batch % batch_limit_ != 0) return run_whole(feeds, options);  // its shape error names the batch
    return run_in_parts(feeds, options, batch, batch_limit_);
  }
  if (const auto [part, choosing] = speed_part(feeds, options, batch); part < batch || choosing) {
    const auto start = std::chrono::steady_clock::now();
    std::map<std::string, Tensor> out =
        part < batch ? run_speed_parts(feeds, options, batch, part) : run_whole(feeds, options);
    if (choosing) choosing->note(batch, std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count());
    return out;
  }
  // With hooks, a size not seen yet is tried first without them (see takes_batch).
  if (batch_limit_ == 0 && options.on_value && !takes_batch(feeds, options, batch))
    return run_in_parts(feeds, options, batch, batch_limit_);
  try {
    auto out = run_whole(feeds, options);
    batches_taken_.insert(batch);
    return out;
  } catch (const Error& e) {
    // Taken at 2, refused at this size: without hooks nothing was observed, try one at a time.
    if (!is_shape_error(e) || options.on_value || batch_limit_ != 0) throw;
    std::vector<std::map<std::string, Tensor>> parts;
    try {
      parts = run_parts(feeds, options, batch, 1);
    } catch (const Error&) {
      throw e;  // not a matter of batch size
    }
    limit_batch(1, "it fails at batch " + std::to_string(batch) + ": " + e.what());
    if (!options.outputs_needed) return {};
    return join_parts(parts, feeds, batch, 1);
  }
}

std::map<std::string, Tensor> Session::run_whole(const std::map<std::string, Tensor>& batch_feeds,
                                                 const RunOptions& options, BufferPool* pool) {
  const std::map<std::string, Tensor> unbatched = without_batch_of_one(graph_, batch_feeds);
  const std::map<std::string, Tensor>& feeds = unbatched.empty() ? batch_feeds : unbatched;
  std::vector<std::string> wanted = options.outputs;
  if (wanted.empty())
    for (const auto& o : graph_.outputs) wanted.push_back(o.name);
  check_feeds(graph_, feeds);
  const bool hooked = static_cast<bool>(options.on_value);
  const std::string key = plan_key(feeds, wanted, options.observe, options.observed_plain, hooked);

  auto it = std::find_if(plans_.begin(), plans_.end(), [&](const auto& e) { return e->key == key; });
  if (it == plans_.end()) {
    auto entry = std::make_unique<PlanEntry>();
    entry->key = key;
    entry->plan = std::make_unique<Plan>(graph_, feeds, wanted, options.observe, options.observed_plain, hooked, options_);
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
  return (*it)->plan->run(feeds, options.on_value, options.observe_in_any_layout, pool ? *pool : *(*it)->pool);
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
