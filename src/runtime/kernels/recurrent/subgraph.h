#pragma once
// What the control-flow kernels (If, Loop, Scan) and the sequence kernels share: a node's subgraph
// compiled once into a nested Session, and the slicing and joining of tensors along an axis that
// Scan, Loop's scan outputs, SplitToSequence and ConcatFromSequence are made of.
#include <memory>
#include <string>
#include <vector>

#include "slimquant/runtime/kernel.h"
#include "slimquant/runtime/session.h"

namespace slimquant::runtime {

// A GRAPH attribute of a node as a nested Session. Its inputs are the body's own (fed by position)
// followed by the outer values the body reads (ir::Node::captured), which the plan hands the node
// as its trailing inputs; an empty optional there is fed as an undefined Tensor.
class Subgraph {
 public:
  // `loose_input_shapes`: the body's declared input shapes are dropped (Loop and Scan feed
  // carried values whose shapes may change between iterations).
  Subgraph(const ir::Node& node, const char* attr, bool loose_input_shapes);

  size_t num_inputs() const { return input_names_.size(); }
  size_t num_outputs() const { return outputs_.size(); }
  const ir::ValueInfo& output(size_t i) const { return outputs_.at(i); }

  // One run: the body's own inputs in order, then its outputs in order. The outputs are the nested
  // session's own tensors: nothing reuses a buffer while a caller holds it.
  std::vector<Tensor> run(std::vector<Tensor> own_inputs, const KernelContext& ctx);

 private:
  const ir::Node& node_;
  std::string attr_;
  std::unique_ptr<Session> session_;
  std::vector<std::string> input_names_;
  std::vector<ir::ValueInfo> outputs_;
  std::vector<std::pair<std::string, size_t>> captured_feeds_;  // body's name, the node's input index
};

// Elements [begin, begin + length) of x along `axis` (already normalised), as a new tensor.
Tensor slice_along_axis(const Tensor& x, int64_t axis, int64_t begin, int64_t length);

// `parts` concatenated along `axis`, or stacked along a new axis inserted at `axis` (`new_axis`);
// `axis` is normalised here against the result's rank. Their dtypes and other dimensions must agree
// (kInvalidArgument naming `what` otherwise). `out` is allocated by the caller from joined_shape.
Shape joined_shape(const std::vector<Tensor>& parts, int64_t axis, bool new_axis, const std::string& what);
void join_along_axis(const std::vector<Tensor>& parts, int64_t axis, bool new_axis, Tensor& out);

// The shape a join of no parts has: [0] followed by the declared element shape when known.
Shape empty_join_shape(const ir::ValueInfo& element);

}  // namespace slimquant::runtime
