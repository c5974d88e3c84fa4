// Layout planning: which values may stay in the blocked layout oneDNN computes in (only where every
// reader accepts it), when a residual addend's buffer may become its Conv's output, and, at run
// time, the plain copies and inherited layouts each step needs.
#include <algorithm>

#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/elementwise/float16_storage.h"
#include "runtime/session_internal.h"
#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime::plan {

const KernelLayouts& declared_layouts(const ir::Node& n) {
  return KernelRegistry::instance().layouts(n.op_type, n.domain);
}

bool aware_input(const ir::Node& n, size_t input) {
  return input < 32 && (declared_layouts(n).blocked_inputs >> input & 1u);
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

namespace {

// A channel-blocked op that reads blocked inputs whatever its readers take (its kernel converts other
// blocked inputs to plain itself).
bool reads_blocked_for_plain_output(const ir::Node& n) { return declared_layouts(n).reads_blocked_for_plain_output; }

// Whether an op of the channel-blocked role may first try passthrough (raw element order): when its
// kernel declares it, unless a folded per-channel Q or nearest upsampling needs each element's position.
bool may_pass_through(const ir::Node& n) {
  return declared_layouts(n).tries_passthrough && !n.attrs.count(kFoldedQuantizeChannelScale) &&
         !n.attrs.count(ew::kNearestUpsampledInput);
}

// Values that may stay in a blocked layout: written by an aware or passthrough step, read only
// where blocked is accepted, not returned. A passthrough step accepts blocked inputs only when its
// output may stay blocked, so walk the steps backwards (readers come after writers). Hooks get
// plain copies (see Plan::run).
void mark_blocked_outputs(std::vector<Step>& steps, size_t slot_count, const std::unordered_set<int>& plain,
                          bool blocked_layouts) {
  std::vector<bool> plain_only(slot_count, false);
  for (int p : plain) plain_only[p] = true;
  for (auto it = steps.rbegin(); it != steps.rend(); ++it) {
    Step& step = *it;
    step.role = blocked_layouts ? declared_layouts(*step.node).role : LayoutRole::kPlain;
    if (step.role != LayoutRole::kPlain)
      for (size_t k = 0; k < step.outputs.size() && k < 32; ++k)
        if (step.outputs[k] >= 0 && !plain_only[step.outputs[k]]) step.blocked_outputs |= 1u << k;
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      const bool accepts = (step.role == LayoutRole::kAware && aware_input(*step.node, k)) ||
                           (step.role == LayoutRole::kPassthrough && step.blocked_outputs != 0) ||
                           (step.role == LayoutRole::kChannelBlocked &&
                            (step.blocked_outputs != 0 || reads_blocked_for_plain_output(*step.node)));
      if (step.inputs[k] >= 0 && !accepts) plain_only[step.inputs[k]] = true;
    }
  }
}

// A fused residual addend that dies at its Conv and was written by another aware step (so its
// buffer comes from the pool) may become the Conv's output buffer.
void mark_addend_donations(std::vector<Step>& steps, size_t slot_count) {
  std::vector<int> producer_role(slot_count, -1);
  for (const auto& step : steps)
    for (int o : step.outputs)
      if (o >= 0) producer_role[o] = static_cast<int>(step.role);
  for (auto& step : steps) {
    if (step.role != LayoutRole::kAware || step.inputs.size() <= fused_ops::kConvAddend ||
        step.inputs[fused_ops::kConvAddend] < 0)
      continue;
    const int addend = step.inputs[fused_ops::kConvAddend];
    const bool dies_here = std::count(step.release.begin(), step.release.end(), addend) > 0;
    const bool read_once = std::count(step.inputs.begin(), step.inputs.end(), addend) == 1;
    step.donate_addend = dies_here && read_once && producer_role[addend] == static_cast<int>(LayoutRole::kAware);
  }
}

// The layout shared by a passthrough step's data inputs (all with one shape, besides
// single-element scalars of no higher rank), or null when they are plain, differ, broadcast, or
// the output must be plain.
LayoutPtr common_layout(const Step& step, const SlotValues& slots) {
  if (!(step.blocked_outputs & 1u)) return nullptr;
  LayoutPtr common;
  const Shape* shape = nullptr;
  size_t max_scalar_rank = 0;
  for (int in : step.inputs) {
    if (in < 0 || !slots.values[in].defined()) continue;
    const Tensor& t = slots.values[in];
    if (t.numel() == 1 && !slots.layouts[in]) {
      max_scalar_rank = std::max(max_scalar_rank, t.rank());
      continue;
    }
    if (!slots.layouts[in]) return nullptr;
    if (!shape) {
      shape = &t.shape();
      common = slots.layouts[in];
    } else if (t.shape() != *shape || !dnnl_kernels::same_blocking(*slots.layouts[in], *common)) {
      return nullptr;
    }
  }
  if (!shape || max_scalar_rank > shape->size()) return nullptr;
  return common;
}

// Outputs stored as float16 (KernelLayouts::float16_outputs): offered by their producer, left
// blocked, not plain, and read at least once, only at inputs declaring float16 of nodes whose result
// is quantized.
void mark_float16_outputs(std::vector<Step>& steps, size_t slot_count, const std::unordered_set<int>& plain) {
  std::vector<int> readers(slot_count, 0);
  std::vector<bool> refused(slot_count, false);
  for (const auto& step : steps) {
    const ir::Node& n = *step.node;
    const bool quantized = n.attrs.count(kFoldedQuantizeScale) || n.attrs.count(kFoldedQuantizeChannelScale);
    const uint32_t accepted = quantized ? declared_layouts(n).float16_inputs : 0u;
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      const int in = step.inputs[k];
      if (in < 0) continue;
      ++readers[in];
      if (k >= 32 || !(accepted >> k & 1u)) refused[in] = true;
    }
  }
  for (auto& step : steps) {
    const uint32_t offered = declared_layouts(*step.node).float16_outputs & step.blocked_outputs;
    for (size_t k = 0; k < step.outputs.size() && k < 32; ++k) {
      const int out = step.outputs[k];
      if ((offered >> k & 1u) && out >= 0 && !plain.count(out) && readers[out] > 0 && !refused[out])
        step.float16_outputs |= 1u << k;
    }
  }
}

}  // namespace

void plan_layouts(std::vector<Step>& steps, size_t slot_count, const std::unordered_set<int>& plain,
                  bool blocked_layouts, bool float16_storage) {
  mark_blocked_outputs(steps, slot_count, plain, blocked_layouts);
  mark_addend_donations(steps, slot_count);
  if (blocked_layouts && float16_storage) mark_float16_outputs(steps, slot_count, plain);
}

const Tensor* PlainCopies::make(const Tensor& t, const LayoutPtr& layout, BufferPool& pool) {
  if (t.dtype() == DType::kFloat16) {  // plain float32 (only kernels declaring float16 inputs read it)
    copies_.push_back(dnnl_kernels::to_plain(as_float32(t), *dnnl_kernels::retyped_layout(*layout, DType::kFloat32)));
    return &copies_.back();
  }
  copies_.push_back(pool.allocate(t.dtype(), t.shape()));
  dnnl_kernels::reorder_to_plain(t, *layout, copies_.back());
  return &copies_.back();
}

void bind_step_inputs(const Step& step, const SlotValues& slots, StepIo& io, PlainCopies& copies, BufferPool& pool) {
  io.inputs.clear();
  for (int in : step.inputs) io.inputs.push_back(in >= 0 && slots.values[in].defined() ? &slots.values[in] : nullptr);
  io.outputs.assign(step.outputs.size(), Tensor());
  io.passthrough = nullptr;
  io.channel_blocked = false;
  if (step.role == LayoutRole::kAware) {
    io.in_layouts.clear();
    for (size_t k = 0; k < step.inputs.size(); ++k) {
      const int in = step.inputs[k];
      const bool accepted = aware_input(*step.node, k);
      if (in >= 0 && slots.layouts[in] && !accepted) io.inputs[k] = copies.make(slots.values[in], slots.layouts[in], pool);
      io.in_layouts.push_back(in >= 0 && accepted ? slots.layouts[in] : nullptr);
    }
    io.out_layouts.assign(step.outputs.size(), nullptr);
    return;
  }
  if (step.role == LayoutRole::kPassthrough || (step.role == LayoutRole::kChannelBlocked && may_pass_through(*step.node)))
    io.passthrough = common_layout(step, slots);
  if (step.role == LayoutRole::kChannelBlocked && !io.passthrough &&
      ((step.blocked_outputs & 1u) || reads_blocked_for_plain_output(*step.node))) {
    // The kernel sees every input's layout (it reads the channel-blocked ones or converts them)
    // and declares its output's.
    io.in_layouts.clear();
    for (int in : step.inputs) io.in_layouts.push_back(in >= 0 ? slots.layouts[in] : nullptr);
    io.out_layouts.assign(step.outputs.size(), nullptr);
    io.channel_blocked = true;
    return;
  }
  if (!io.passthrough)
    for (size_t k = 0; k < step.inputs.size(); ++k)
      if (const int in = step.inputs[k]; in >= 0 && slots.layouts[in])
        io.inputs[k] = copies.make(slots.values[in], slots.layouts[in], pool);
}

void store_step_output(const Step& step, size_t k, int slot, StepIo& io, SlotValues& slots) {
  slots.values[slot] = std::move(io.outputs[k]);
  if (step.role == LayoutRole::kAware || io.channel_blocked)
    slots.layouts[slot] = (step.blocked_outputs >> k & 1u) ? io.out_layouts[k] : nullptr;
  else if (io.passthrough && slots.values[slot].defined())
    slots.layouts[slot] = dnnl_kernels::retyped_layout(*io.passthrough, slots.values[slot].dtype());
}

}  // namespace slimquant::runtime::plan
