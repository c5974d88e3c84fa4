#pragma once
// Kernel interface. A kernel is created once per node of a compiled plan (typed attributes parsed,
// weights reordered there: everything that depends only on attributes and constants), then run()
// many times. Kernels compute their output shapes from their inputs' shapes in run().
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "slimquant/core/tensor.h"
#include "slimquant/ir/graph.h"

namespace slimquant::runtime {

// What a kernel factory may look at.
struct KernelInit {
  const ir::Node& node;
  int64_t opset;  // default-domain opset of the model (ops changed semantics across opsets)
  // Constant value of input i (initializer or folded constant), or nullptr if computed at run time.
  std::function<const Tensor*(size_t)> constant_input;
};

class KernelContext {
 public:
  KernelContext(const ir::Node& node, std::vector<const Tensor*> inputs, std::vector<Tensor>& outputs,
                std::function<Tensor(DType, const Shape&)> allocator)
      : node_(node), inputs_(std::move(inputs)), outputs_(outputs), allocator_(std::move(allocator)) {}

  const ir::Node& node() const { return node_; }
  size_t num_inputs() const { return inputs_.size(); }
  bool has_input(size_t i) const { return i < inputs_.size() && inputs_[i] != nullptr; }
  // Required input; throws kInvalidModel naming the node if missing.
  const Tensor& input(size_t i) const;
  const Tensor* optional_input(size_t i) const { return has_input(i) ? inputs_[i] : nullptr; }
  size_t num_outputs() const { return outputs_.size(); }
  // Allocates output i (reusing a free buffer of the session when one fits). Contents are
  // unspecified (not zeroed) when a buffer is reused.
  Tensor& allocate_output(size_t i, DType dtype, const Shape& shape);
  // Sets output i to an existing tensor (e.g. a view sharing an input's storage for Reshape).
  void set_output(size_t i, Tensor t) { outputs_.at(i) = std::move(t); }
  bool output_wanted(size_t i) const { return i < outputs_.size(); }

 private:
  const ir::Node& node_;
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor>& outputs_;
  std::function<Tensor(DType, const Shape&)> allocator_;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run(KernelContext& ctx) = 0;
};

using KernelFactory = std::function<std::unique_ptr<Kernel>(const KernelInit&)>;

// Op type -> factory. Filled explicitly by register_all_kernels() (no static self-registration:
// the linker drops it from static libraries).
class KernelRegistry {
 public:
  static const KernelRegistry& instance();
  void add(const std::string& op_type, KernelFactory factory, const std::string& domain = "");
  const KernelFactory* find(const std::string& op_type, const std::string& domain = "") const;
  std::vector<std::string> op_types() const;  // default domain, sorted

 private:
  std::map<std::pair<std::string, std::string>, KernelFactory> factories_;
};

// Helper for the common case: a kernel that is just a function of the context.
class FunctionKernel : public Kernel {
 public:
  explicit FunctionKernel(std::function<void(KernelContext&)> fn) : fn_(std::move(fn)) {}
  void run(KernelContext& ctx) override { fn_(ctx); }

 private:
  std::function<void(KernelContext&)> fn_;
};

}  // namespace slimquant::runtime
