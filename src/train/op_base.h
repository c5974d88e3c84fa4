#pragma once
// Base of the TrainOps made for graph nodes: forward runs the inference runtime's kernel for the
// node (identical numerics to runtime::Session), saving inputs and outputs when training; backward
// hands them to grad().
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "slimquant/runtime/kernel.h"
#include "slimquant/train/train_graph.h"

namespace slimquant::train::detail {

class KernelOp : public TrainOp {
 public:
  KernelOp(const ir::Node& node, const ir::Graph& graph);
  std::vector<Tensor> forward(const std::vector<Tensor>& inputs, bool training) override;
  std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) override;
  void set_input_requires_grad(const std::vector<bool>& needed) override { needed_ = needed; }

 protected:
  // Input gradients from the saved in_/out_ and output gradients gy (one per output, zeros where
  // the caller gave none). Only called when some output is float.
  virtual std::vector<Tensor> grad(const std::vector<Tensor>& gy) = 0;
  bool needed(size_t i) const { return i < in_.size() && in_[i].defined() && (needed_.empty() || (i < needed_.size() && needed_[i])); }
  const Tensor* input_if(size_t i) const { return i < in_.size() && in_[i].defined() ? &in_[i] : nullptr; }
  // The forward kernel on other inputs (e.g. to learn where each output element came from).
  std::vector<Tensor> run_forward_kernel(const std::vector<Tensor>& inputs) const;
  std::vector<Tensor> none() const { return std::vector<Tensor>(in_.size()); }

  const ir::Node node_;
  int64_t opset_;
  std::vector<Tensor> in_, out_;  // saved by forward(training=true), released by backward()

 private:
  std::unique_ptr<runtime::Kernel> kernel_;
  std::vector<bool> needed_;
};

// Ops whose outputs carry no gradient (Shape, comparisons, index arithmetic).
class NoGradOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>&) override { return none(); }
};

using OpMaker = std::unique_ptr<TrainOp> (*)(const ir::Node&, const ir::Graph&);
template <class Op>
std::unique_ptr<TrainOp> make(const ir::Node& n, const ir::Graph& g) {
  return std::make_unique<Op>(n, g);
}

// Registration tables, one per source file (explicit, like the runtime's registry).
void add_elementwise_ops(std::map<std::string, OpMaker>& t);
void add_shape_ops(std::map<std::string, OpMaker>& t);
void add_dnnl_ops(std::map<std::string, OpMaker>& t);
void add_norm_pool_ops(std::map<std::string, OpMaker>& t);

// Scalar float value of an optional constant-like input (Clip min/max): def when absent.
float scalar_or(const Tensor* t, float def);

}  // namespace slimquant::train::detail
