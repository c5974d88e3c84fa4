#pragma once
// Differentiable execution of a float ONNX graph (the training engine QAT runs on).
//
// Forward runs the inference runtime's own kernels (so training-mode numerics are the deployed
// ones); each op keeps what its backward needs when training. Backward kernels are written here:
// oneDNN backward primitives for convolution, oneDNN matmul for Gemm/MatMul, plain loops for the
// rest. Ops without a float input (Shape chains, index arithmetic) pass through without gradient.
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "slimquant/core/tensor.h"
#include "slimquant/ir/graph.h"
#include "slimquant/train/parameter.h"

namespace slimquant::train {

// One differentiable node. forward() may keep what backward() needs (only when training).
class TrainOp {
 public:
  virtual ~TrainOp() = default;
  virtual std::vector<Tensor> forward(const std::vector<Tensor>& inputs, bool training) = 0;
  // grad_outputs: one per output (an undefined Tensor = zero grad). Returns one grad per input
  // (undefined Tensor for non-differentiable inputs, e.g. shapes/indices); accumulates into its own
  // parameters' grad.
  virtual std::vector<Tensor> backward(const std::vector<Tensor>& grad_outputs) = 0;
  virtual std::vector<Parameter*> parameters() { return {}; }
  // Optional hint TrainGraph gives once before training: which inputs need a gradient (an op may
  // then return undefined for the others, e.g. skip the first convolution's input gradient).
  virtual void set_input_requires_grad(const std::vector<bool>& needed) { (void)needed; }
};

struct TrainGraphOptions {
  // true: BatchNormalization is folded into the preceding Conv before training, so QAT trains
  // (and fake-quantizes) exactly the folded weights the deployed INT8 graph uses. false: BN stays
  // as its own op with frozen running statistics (eval-mode affine), scale and bias trainable.
  bool fold_batchnorm = true;
};

class TrainGraph {
 public:
  // From a float ONNX graph: constants folded, Identity/Dropout removed; every float initializer
  // that is a Conv/ConvTranspose/Gemm/MatMul weight or bias, or a LayerNormalization scale/bias,
  // (and BN params if not folded) becomes a Parameter (name = initializer name). So does the 1-D
  // float initializer an Add adds to the output of a MatMul with a constant weight (the bias of a
  // Linear layer as torch exports it for 3-D inputs).
  explicit TrainGraph(const ir::Graph& float_graph, TrainGraphOptions options = {});
  ~TrainGraph();
  TrainGraph(TrainGraph&&) noexcept;
  TrainGraph& operator=(TrainGraph&&) noexcept;

  // Every reader of `tensor` (an activation or a parameter/initializer name) reads op's single
  // output instead; op's single input is `tensor`. Used to put fake-quant quanters on activations
  // and weights. Graph outputs keep naming the original value.
  void insert_on_tensor(const std::string& tensor, std::unique_ptr<TrainOp> op, std::string op_name);
  // Runs the graph; returns the graph outputs (and any `extra_outputs` requested by name).
  std::map<std::string, Tensor> forward(const std::map<std::string, Tensor>& feeds, bool training,
                                        const std::vector<std::string>& extra_outputs = {});
  // After forward(training=true): backprop from gradients of outputs (by name). Accumulates into
  // Parameter::grad.
  void backward(const std::map<std::string, Tensor>& output_grads);
  std::vector<Parameter*> parameters();           // graph parameters + inserted ops' parameters
  Parameter* parameter(const std::string& name);  // nullptr if none
  // The float graph with the current parameter values written back into its initializers
  // (inserted ops not included).
  ir::Graph float_graph_with_parameters() const;
  // The optimised float graph training runs (without inserted ops).
  const ir::Graph& graph() const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// Factory used by TrainGraph; exposed for tests: a TrainOp for one ir::Node (throws kUnsupported
// naming op and node if no backward exists). Float initializers in trainable slots (see
// trainable_input) are treated as run-time inputs; other initializers as constants. A node off
// every gradient path (`gradient_path` false: no input depends on a parameter, e.g. the Shape /
// Mod / Div arithmetic of Swin's window padding) only runs forward, so any op with an inference
// kernel will do.
std::unique_ptr<TrainOp> make_train_op(const ir::Node& node, const ir::Graph& graph, bool gradient_path = true);

// Whether input `index` of a node of this op type is a trainable slot (weight/bias/scale).
bool trainable_input(const std::string& op_type, size_t index, bool fold_batchnorm = true);

}  // namespace slimquant::train
