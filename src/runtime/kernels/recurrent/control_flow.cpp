// Control flow. If runs one of two subgraphs, chosen by a boolean scalar at run time (torchvision's
// detection exports branch on "no boxes left" before NonMaxSuppression, ROI pooling on the level
// count); Loop runs its body while a trip count and a condition allow (scripted `for` / `while`
// loops), Scan once per slice of its scan inputs. Each subgraph is compiled once into its own
// Session (Subgraph), which then keeps a plan per set of input shapes: a body whose values keep
// their shapes between iterations is compiled once. Loop-carried values go from one iteration to
// the next without copies; scan outputs are joined once at the end.
// Optional values (Optional, OptionalHasElement, OptionalGetElement: scripted exports return
// Optional[Tensor] from If branches) may be undefined: an empty optional reaches a kernel as a
// missing input. Tensors and sequences (Tensor::sequence) travel through all of them alike.
#include <algorithm>
#include <iterator>
#include <limits>
#include <memory>

#include "runtime/kernels/recurrent/subgraph.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {
namespace {

bool scalar_is_true(const Tensor& t, const ir::Node& node, const char* what) {
  SQ_CHECK(t.defined() && !t.is_sequence() && t.numel() == 1, ErrorKind::kInvalidArgument,
           node.describe() + ": the " + what + " must hold one element, got shape " + shape_str(t.shape()));
  return t.to_float_vector()[0] != 0.f;
}

// Output i of a kernel set to v, which a nested session produced: an empty optional stays empty.
void forward_output(KernelContext& ctx, size_t i, const Tensor& v) {
  if (ctx.output_wanted(i)) ctx.set_output(i, v);
}

class IfKernel final : public Kernel {
 public:
  explicit IfKernel(const KernelInit& init)
      : node_(init.node), then_(node_, "then_branch", false), else_(node_, "else_branch", false) {}

  void run(KernelContext& ctx) override {
    const bool take_then = scalar_is_true(ctx.input(0), node_, "condition");
    Subgraph& branch = take_then ? then_ : else_;
    SQ_CHECK(branch.num_outputs() == ctx.num_outputs(), ErrorKind::kInvalidModel,
             node_.describe() + ": the " + (take_then ? "then" : "else") + " branch has " +
                 std::to_string(branch.num_outputs()) + " outputs, the node " + std::to_string(ctx.num_outputs()));
    const std::vector<Tensor> out = branch.run({}, ctx);
    for (size_t i = 0; i < out.size(); ++i) forward_output(ctx, i, out[i]);
  }

 private:
  const ir::Node node_;
  Subgraph then_, else_;
};

// Scan outputs of a body, one per iteration, stacked along a new axis.
void write_stacked(KernelContext& ctx, size_t output, const std::vector<Tensor>& parts, int64_t axis,
                   const ir::ValueInfo& element, const ir::Node& node) {
  if (!ctx.output_wanted(output)) return;
  if (parts.empty()) {  // no iteration ran
    ctx.allocate_output(output, element.dtype == DType::kUndefined ? DType::kFloat32 : element.dtype,
                        empty_join_shape(element));
    return;
  }
  const Shape shape = joined_shape(parts, axis, true, node.describe() + " scan output " + std::to_string(output));
  join_along_axis(parts, axis, true, ctx.allocate_output(output, parts.front().dtype(), shape));
}

// Loop (opset 11+): inputs M (trip count), cond, carried values; body (iteration number, cond,
// carried...) -> (cond, carried..., scan outputs...); outputs the final carried values, then each
// scan output's per-iteration values stacked along a new axis 0.
class LoopKernel final : public Kernel {
 public:
  explicit LoopKernel(const KernelInit& init) : node_(init.node), body_(node_, "body", true) {
    SQ_CHECK(node_.declared_inputs() >= 2, ErrorKind::kInvalidModel,
             node_.describe() + " needs its trip count and condition inputs (either may be empty)");
    carried_ = node_.declared_inputs() - 2;
    SQ_CHECK(body_.num_inputs() == 2 + carried_, ErrorKind::kInvalidModel,
             node_.describe() + ": its body takes " + std::to_string(body_.num_inputs()) + " inputs; with " +
                 std::to_string(carried_) + " carried values it must take " + std::to_string(2 + carried_) +
                 " (iteration number, condition, carried values)");
    SQ_CHECK(body_.num_outputs() >= 1 + carried_ && body_.num_outputs() - 1 == node_.outputs.size(),
             ErrorKind::kInvalidModel,
             node_.describe() + ": its body has " + std::to_string(body_.num_outputs()) +
                 " outputs; the node's " + std::to_string(node_.outputs.size()) + " outputs and " +
                 std::to_string(carried_) + " carried values need " + std::to_string(node_.outputs.size() + 1) +
                 " (condition, carried values, scan outputs)");
  }

  void run(KernelContext& ctx) override {
    const int64_t trip_count =
        ctx.has_input(0) ? ctx.input(0).to_int64_vector().at(0) : std::numeric_limits<int64_t>::max();
    bool cond = !ctx.has_input(1) || scalar_is_true(ctx.input(1), node_, "condition");
    std::vector<Tensor> carried(carried_);
    for (size_t k = 0; k < carried_; ++k)
      if (ctx.has_input(2 + k)) carried[k] = ctx.input(2 + k);
    const size_t scans = node_.outputs.size() - carried_;
    std::vector<std::vector<Tensor>> scan_parts(scans);
    for (int64_t i = 0; i < trip_count && cond; ++i) {
      std::vector<Tensor> feeds{Tensor::scalar<int64_t>(i), Tensor::scalar<bool>(cond)};
      feeds.insert(feeds.end(), std::make_move_iterator(carried.begin()), std::make_move_iterator(carried.end()));
      std::vector<Tensor> out = body_.run(std::move(feeds), ctx);
      // Even without a condition input the body's condition ends the loop: the specification
      // says it is ignored then, but ONNX Runtime honours it, and models are made to run there.
      cond = scalar_is_true(out[0], node_, "condition the body returns");
      for (size_t k = 0; k < carried_; ++k) carried[k] = std::move(out[1 + k]);
      for (size_t k = 0; k < scans; ++k) scan_parts[k].push_back(std::move(out[1 + carried_ + k]));
    }
    for (size_t k = 0; k < carried_; ++k) forward_output(ctx, k, carried[k]);
    for (size_t k = 0; k < scans; ++k)
      write_stacked(ctx, carried_ + k, scan_parts[k], 0, body_.output(1 + carried_ + k), node_);
  }

 private:
  const ir::Node node_;
  Subgraph body_;
  size_t carried_ = 0;
};

// Scan (opset 9+): N state inputs, then M scan inputs (num_scan_inputs) sliced along their scan
// axes, forwards or backwards; body (states..., slices...) -> (states..., scan slices...); outputs
// the final states, then the scan slices joined along new axes (scan_output_axes), in iteration
// order or reversed (scan_output_directions).
class ScanKernel final : public Kernel {
 public:
  explicit ScanKernel(const KernelInit& init) : node_(init.node), body_(node_, "body", true) {
    SQ_CHECK(init.opset >= 9, ErrorKind::kUnsupported,
             node_.describe() + ": Scan of opset 8 (with a batch axis and sequence_lens) is not supported");
    const int64_t scan_inputs = node_.attr_int("num_scan_inputs", -1);
    SQ_CHECK(scan_inputs >= 1 && static_cast<size_t>(scan_inputs) <= node_.declared_inputs(), ErrorKind::kInvalidModel,
             node_.describe() + ": num_scan_inputs is " + std::to_string(scan_inputs) + " for " +
                 std::to_string(node_.declared_inputs()) + " inputs");
    scan_inputs_ = static_cast<size_t>(scan_inputs);
    states_ = node_.declared_inputs() - scan_inputs_;
    SQ_CHECK(body_.num_inputs() == node_.declared_inputs(), ErrorKind::kInvalidModel,
             node_.describe() + ": its body takes " + std::to_string(body_.num_inputs()) + " inputs, the node has " +
                 std::to_string(node_.declared_inputs()) + " (states and scan inputs)");
    SQ_CHECK(body_.num_outputs() == node_.outputs.size() && body_.num_outputs() >= states_, ErrorKind::kInvalidModel,
             node_.describe() + ": its body has " + std::to_string(body_.num_outputs()) + " outputs, the node " +
                 std::to_string(node_.outputs.size()) + " (" + std::to_string(states_) + " states and the scan outputs)");
    const size_t scan_outputs = node_.outputs.size() - states_;
    input_axes_ = per_value_attr("scan_input_axes", scan_inputs_);
    input_reversed_ = per_value_attr("scan_input_directions", scan_inputs_);
    output_axes_ = per_value_attr("scan_output_axes", scan_outputs);
    output_reversed_ = per_value_attr("scan_output_directions", scan_outputs);
  }

  void run(KernelContext& ctx) override {
    std::vector<Tensor> states(states_);
    for (size_t k = 0; k < states_; ++k) states[k] = ctx.input(k);
    std::vector<int64_t> axes(scan_inputs_);
    int64_t length = -1;
    for (size_t j = 0; j < scan_inputs_; ++j) {
      const Tensor& x = ctx.input(states_ + j);
      axes[j] = normalize_axis(input_axes_[j], static_cast<int64_t>(x.rank()),
                               node_.describe() + " scan input " + std::to_string(j) + " axis");
      const int64_t extent = x.dim(static_cast<size_t>(axes[j]));
      SQ_CHECK(length < 0 || extent == length, ErrorKind::kInvalidArgument,
               node_.describe() + ": scan input " + std::to_string(j) + " has " + std::to_string(extent) +
                   " elements along its scan axis, scan input 0 has " + std::to_string(length));
      length = extent;
    }
    const size_t scan_outputs = node_.outputs.size() - states_;
    std::vector<std::vector<Tensor>> parts(scan_outputs);
    for (int64_t t = 0; t < length; ++t) {
      std::vector<Tensor> feeds = std::move(states);
      for (size_t j = 0; j < scan_inputs_; ++j) {
        const Tensor& x = ctx.input(states_ + j);
        const int64_t at = input_reversed_[j] ? length - 1 - t : t;
        Shape slice_shape = x.shape();
        slice_shape.erase(slice_shape.begin() + axes[j]);
        feeds.push_back(slice_along_axis(x, axes[j], at, 1).reshaped(slice_shape));
      }
      std::vector<Tensor> out = body_.run(std::move(feeds), ctx);
      states.assign(std::make_move_iterator(out.begin()), std::make_move_iterator(out.begin() + static_cast<std::ptrdiff_t>(states_)));
      for (size_t k = 0; k < scan_outputs; ++k) parts[k].push_back(std::move(out[states_ + k]));
    }
    for (size_t k = 0; k < states_; ++k) forward_output(ctx, k, states[k]);
    for (size_t k = 0; k < scan_outputs; ++k) {
      if (output_reversed_[k]) std::reverse(parts[k].begin(), parts[k].end());
      write_stacked(ctx, states_ + k, parts[k], output_axes_[k], body_.output(states_ + k), node_);
    }
  }

 private:
  // One value per scan input (output), 0 for each when the attribute is absent.
  std::vector<int64_t> per_value_attr(const char* name, size_t count) const {
    std::vector<int64_t> values = node_.attr_ints(name, std::vector<int64_t>(count, 0));
    SQ_CHECK(values.size() == count, ErrorKind::kInvalidModel,
             node_.describe() + ": " + name + " has " + std::to_string(values.size()) + " values for " +
                 std::to_string(count) + " scan values");
    return values;
  }

  const ir::Node node_;
  Subgraph body_;
  size_t states_ = 0, scan_inputs_ = 0;
  std::vector<int64_t> input_axes_, input_reversed_, output_axes_, output_reversed_;
};

}  // namespace

// Optional(x): x, or an empty optional without input. OptionalGetElement(x): x, which must not be
// empty (a plain tensor is its own element). OptionalHasElement(x): whether x holds a tensor.
class OptionalKernel final : public Kernel {
 public:
  explicit OptionalKernel(const KernelInit& init) : node_(init.node) {}

  void run(KernelContext& ctx) override {
    const bool present = ctx.has_input(0) && ctx.input(0).defined();
    if (node_.op_type == "OptionalHasElement") {
      ctx.allocate_output(0, DType::kBool, {}).data<bool>()[0] = present;
    } else if (present) {
      ctx.set_output(0, ctx.input(0));
    } else {
      SQ_CHECK(node_.op_type == "Optional", ErrorKind::kInvalidArgument,
               node_.describe() + ": the optional value is empty (the model's own control flow should have "
                                  "checked it with OptionalHasElement)");
      ctx.set_output(0, Tensor());
    }
  }

 private:
  const ir::Node& node_;
};

void register_control_flow_kernels(KernelRegistry& r) {
  r.add("If", [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<IfKernel>(init); });
  r.add("Loop", [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<LoopKernel>(init); });
  r.add("Scan", [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<ScanKernel>(init); });
  for (const char* op : {"Optional", "OptionalHasElement", "OptionalGetElement"})
    r.add(op, [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<OptionalKernel>(init); });
}

}  // namespace slimquant::runtime
