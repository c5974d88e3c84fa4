#include "train/op_base.h"

#include <set>

#include "train/tensor_ops.h"

namespace slimquant::train {

namespace detail {

KernelOp::KernelOp(const ir::Node& node, const ir::Graph& graph) : node_(node), opset_(graph.opset) {
  // Kernels keep a reference to the node they were made for: give them our own copy (callers such
  // as TrainGraph::insert_on_tensor pass a temporary).
  const runtime::KernelFactory* f = runtime::KernelRegistry::instance().find(node.op_type, node.domain);
  if (!f) fail(ErrorKind::kUnsupported, node.describe() + ": slimquant has no kernel for this op");
  runtime::KernelInit init{node_, graph.opset, [&](size_t i) -> const Tensor* {
                             if (i >= node.inputs.size() || node.inputs[i].empty()) return nullptr;
                             // Trainable slots change every step: never let a kernel prepack them.
                             if (trainable_input(node.op_type, i, false)) return nullptr;
                             return graph.initializer(node.inputs[i]);
                           }};
  kernel_ = (*f)(init);
}

std::vector<Tensor> KernelOp::forward(const std::vector<Tensor>& inputs, bool training) {
  std::vector<const Tensor*> ptrs;
  ptrs.reserve(inputs.size());
  for (const Tensor& t : inputs) ptrs.push_back(t.defined() ? &t : nullptr);
  std::vector<Tensor> outputs(node_.outputs.size());
  // Kernels write every element of their outputs, so no zeroing.
  runtime::KernelContext ctx(node_, ptrs, outputs, [](DType t, const Shape& s) { return empty_tensor(t, s); });
  kernel_->run(ctx);
  if (training) {
    in_ = inputs;
    out_ = outputs;
  } else {
    in_.clear();
    out_.clear();
  }
  return outputs;
}

std::vector<Tensor> KernelOp::run_forward_kernel(const std::vector<Tensor>& inputs) const {
  std::vector<const Tensor*> ptrs;
  for (const Tensor& t : inputs) ptrs.push_back(t.defined() ? &t : nullptr);
  std::vector<Tensor> outputs(node_.outputs.size());
  runtime::KernelContext ctx(node_, ptrs, outputs, [](DType t, const Shape& s) { return empty_tensor(t, s); });
  kernel_->run(ctx);
  return outputs;
}

std::vector<Tensor> KernelOp::backward(const std::vector<Tensor>& grad_outputs) {
  if (in_.empty() && !node_.inputs.empty())
    fail(ErrorKind::kInvalidArgument, node_.describe() + ": backward() without a forward(training=true) before it");
  std::vector<Tensor> r;
  bool any_float = false, any_grad = false;
  for (size_t i = 0; i < out_.size(); ++i) {
    any_float = any_float || (out_[i].defined() && out_[i].dtype() == DType::kFloat32);
    any_grad = any_grad || (i < grad_outputs.size() && grad_outputs[i].defined());
  }
  if (!any_float || !any_grad) {
    r = none();
  } else {
    std::vector<Tensor> gy(out_.size());
    for (size_t i = 0; i < out_.size(); ++i) {
      if (i < grad_outputs.size() && grad_outputs[i].defined()) {
        SQ_CHECK(grad_outputs[i].shape() == out_[i].shape(), ErrorKind::kInvalidArgument,
                 node_.describe() + ": gradient of output '" + node_.outputs[i] + "' has shape " +
                     shape_str(grad_outputs[i].shape()) + ", the output has " + shape_str(out_[i].shape()));
        gy[i] = grad_outputs[i];
      } else if (out_[i].defined() && out_[i].dtype() == DType::kFloat32) {
        gy[i] = zeros_f32(out_[i].shape());
      }
    }
    r = grad(gy);
    r.resize(in_.size());
    // Gradients only flow into float inputs.
    for (size_t i = 0; i < in_.size(); ++i)
      if (!in_[i].defined() || in_[i].dtype() != DType::kFloat32) r[i] = Tensor();
  }
  in_.clear();
  out_.clear();
  return r;
}

float scalar_or(const Tensor* t, float def) {
  if (!t || t->numel() == 0) return def;
  return t->to_float_vector().at(0);
}

}  // namespace detail

namespace {

// Ops whose outputs are indices, shapes or booleans: forward only.
const std::set<std::string>& no_grad_ops() {
  static const std::set<std::string> s = {"Shape", "Size", "ConstantOfShape", "Equal", "Less", "LessOrEqual",
                                          "Greater", "GreaterOrEqual", "Not", "And", "Or", "Xor", "Range",
                                          "NonZero", "ArgMax", "ArgMin", "Floor", "Ceil", "Round", "Sign",
                                          "IsNaN", "IsInf", "EyeLike", "RandomNormalLike", "RandomUniformLike"};
  return s;
}

const std::map<std::string, detail::OpMaker>& op_table() {
  static const std::map<std::string, detail::OpMaker> t = [] {
    std::map<std::string, detail::OpMaker> m;
    detail::add_elementwise_ops(m);
    detail::add_shape_ops(m);
    detail::add_dnnl_ops(m);
    detail::add_norm_pool_ops(m);
    return m;
  }();
  return t;
}

}  // namespace

bool trainable_input(const std::string& op, size_t i, bool fold_batchnorm) {
  if (op == "Conv" || op == "ConvTranspose") return i == 1 || i == 2;
  if (op == "Gemm") return i == 1 || i == 2;
  if (op == "MatMul") return i <= 1;
  if (op == "LayerNormalization") return i == 1 || i == 2;
  if (op == "BatchNormalization") return !fold_batchnorm && (i == 1 || i == 2);
  return false;
}

std::unique_ptr<TrainOp> make_train_op(const ir::Node& node, const ir::Graph& graph, bool gradient_path) {
  if (!gradient_path && runtime::KernelRegistry::instance().find(node.op_type, node.domain))
    if (!op_table().count(node.op_type) || (!node.domain.empty() && node.domain != "ai.onnx"))
      return std::make_unique<detail::NoGradOp>(node, graph);
  if (!node.domain.empty() && node.domain != "ai.onnx")
    fail(ErrorKind::kUnsupported, node.describe() + " (domain " + node.domain + "): no backward (training) kernel");
  const auto& t = op_table();
  if (auto it = t.find(node.op_type); it != t.end()) return it->second(node, graph);
  if (no_grad_ops().count(node.op_type)) return std::make_unique<detail::NoGradOp>(node, graph);
  fail(ErrorKind::kUnsupported, node.describe() + ": no backward (training) kernel for op " + node.op_type);
}

}  // namespace slimquant::train
