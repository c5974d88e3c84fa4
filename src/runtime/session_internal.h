#pragma once
// The pieces a compiled plan (session.cpp) is built from, each in its own file:
//   session_buffer_pool.cpp  storage reused across steps and runs
//   session_kernels.cpp      one step (slots + kernel) per node that runs
//   session_liveness.cpp     which nodes run, and after which step each value dies
//   session_layout.cpp       which values may stay in a blocked layout, residual buffer donation,
//                            and the per-step layout conversions at run time
// Private to src/runtime.
#include <cstdint>
#include <deque>
#include <memory>
#include <set>
#include <string>
#include <unordered_map>
#include <unordered_set>
#include <vector>

#include "runtime/fused_ops/residual_conv.h"  // fused_ops::kConvAddend: the residual addend slot
#include "slimquant/ir/graph.h"
#include "slimquant/runtime/kernel.h"
#include "slimquant/runtime/session.h"

namespace slimquant::runtime {

// Reuses storage whose only owner is the pool (no live tensor, no caller holding an output).
class BufferPool {
 public:
  Tensor allocate(DType dtype, const Shape& shape);
  // Gives the buffers only the pool holds back to the allocator (see release_idle_buffers).
  void release_idle();
  // The most bytes live values held at once since track_peak() (off until then: it costs a scan
  // of the pool per allocation).
  void track_peak() { tracking_ = true; }
  size_t peak_bytes() const { return peak_; }

 private:
  struct Entry {
    std::shared_ptr<std::byte[]> storage;
    size_t capacity;
  };
  std::deque<Entry> entries_;
  bool tracking_ = false;
  size_t peak_ = 0;
};

// "<node description>: message", unless the message already names the node.
std::string with_node_context(const ir::Node& node, const std::string& message);

namespace plan {

// How a step treats non-plain (blocked) layouts: what its kernel declared (KernelLayouts).
using LayoutRole = KernelLayouts::Role;

// One node of a plan: the slots it reads and writes, its kernel, and what the planning decided.
struct Step {
  const ir::Node* node;
  std::unique_ptr<Kernel> kernel;
  std::vector<int> inputs, outputs, release;  // slots; -1 for an absent optional value
  LayoutRole role = LayoutRole::kPlain;
  uint32_t blocked_outputs = 0;  // bit k: output k may be left in a blocked layout
  bool donate_addend = false;    // the residual addend may become the output buffer (plan_layouts)
  uint32_t float16_outputs = 0;  // bit k: output k may be stored as float16 (plan_layouts)
  double seconds = 0;            // accumulated under SLIMQUANT_PROFILE
  double min_seconds = 1e30;     // fastest run (a shared machine's preemptions only add time)
};

// One slot (index into a run's value table) per value name, numbered in order of first use.
class SlotTable {
 public:
  int slot_of(const std::string& name) {
    auto [it, inserted] = slots_.emplace(name, static_cast<int>(slots_.size()));
    return it->second;
  }
  size_t size() const { return slots_.size(); }
  std::vector<std::string> names() const;  // indexed by slot

 private:
  std::unordered_map<std::string, int> slots_;
};

// --- kernel creation (session_kernels.cpp)
// A step with a created kernel (weights prepacked) for each node marked in run_node, in graph
// order; throws naming the node when it has no kernel or its kernel rejects the node.
// winograd: KernelInit::winograd for every kernel (SessionOptions::winograd).
std::vector<Step> create_steps(const ir::Graph& graph, const std::vector<bool>& run_node, SlotTable& slots,
                               bool winograd);

// --- liveness (session_liveness.cpp)
// The nodes the wanted and observed values need, walking back from them and stopping at fed
// values and constants; throws kInvalidArgument when a needed value can be neither fed nor computed.
std::vector<bool> nodes_to_run(const ir::Graph& graph, const std::set<std::string>& fed,
                               const std::vector<std::string>& wanted, const std::vector<std::string>& observed);
// Fills each step's release list: every slot not pinned (constants, wanted values) is released
// after its last reader, or right after its writer when nothing reads it.
void schedule_releases(std::vector<Step>& steps, size_t slot_count, const std::unordered_set<int>& pinned);

// --- layouts (session_layout.cpp)
// What node's kernel declared (KernelRegistry::layouts).
const KernelLayouts& declared_layouts(const ir::Node& node);
// Whether an aware kernel reads input position `input` in any layout.
bool aware_input(const ir::Node& node, size_t input);
// Sets each step's role, blocked_outputs, donate_addend and (with float16_storage: nothing is
// observed) float16_outputs. The `plain` slots stay plain and float32.
void plan_layouts(std::vector<Step>& steps, size_t slot_count, const std::unordered_set<int>& plain,
                  bool blocked_layouts, bool float16_storage);
// True when a blocked layout only permutes each sample's elements (see Plan::run's hooks).
bool samples_stay_contiguous(const Layout& layout);

// A run's values and their layouts (null: plain), indexed by slot.
struct SlotValues {
  std::vector<Tensor> values;
  std::vector<LayoutPtr> layouts;
};

// What one step passes to its kernel; reused from step to step.
struct StepIo {
  std::vector<const Tensor*> inputs;
  std::vector<Tensor> outputs;
  std::vector<LayoutPtr> in_layouts, out_layouts;
  LayoutPtr passthrough;  // the layout a passthrough step's outputs inherit (null: plain)
  bool channel_blocked = false;  // a channel-blocked step sees layouts (in_layouts) and sets its outputs'
};

// Plain copies of blocked values for readers that need plain; kept until the step is done.
class PlainCopies {
 public:
  const Tensor* make(const Tensor& t, const LayoutPtr& layout, BufferPool& pool);
  void clear() { copies_.clear(); }

 private:
  std::deque<Tensor> copies_;  // stable addresses
};

// Fills io's inputs (converting blocked values the step cannot read) and layouts for `step`.
void bind_step_inputs(const Step& step, const SlotValues& slots, StepIo& io, PlainCopies& copies, BufferPool& pool);
// Moves output k of `step` (slot `slot`) from io into slots, with the layout its kernel left it in.
void store_step_output(const Step& step, size_t k, int slot, StepIo& io, SlotValues& slots);

}  // namespace plan
}  // namespace slimquant::runtime
