#include <algorithm>

#include "runtime/kernels/register_all.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {

const Tensor& KernelContext::input(size_t i) const {
  if (!has_input(i))
    fail(ErrorKind::kInvalidModel, node_.describe() + ": required input " + std::to_string(i) + " is missing");
  return *inputs_[i];
}

Tensor& KernelContext::allocate_output(size_t i, DType dtype, const Shape& shape) {
  outputs_.at(i) = allocator_(dtype, shape);
  return outputs_[i];
}

const KernelRegistry& KernelRegistry::instance() {
  static const KernelRegistry registry = [] {
    KernelRegistry r;
    register_elementwise_kernels(r);
    register_dnnl_kernels(r);
    register_shape_kernels(r);
    register_int8_kernels(r);
    register_recurrent_kernels(r);
    register_index_kernels(r);
    register_detection_kernels(r);
    register_misc_math_kernels(r);
    register_integer_kernels(r);
    register_control_flow_kernels(r);
    register_sequence_kernels(r);
    return r;
  }();
  return registry;
}

uint32_t KernelFolds::prologue_inputs(Fold prologue) const {
  switch (prologue) {
    case Fold::kDequantizedInput: return dequantized_inputs;
    case Fold::kScaledInput: return scaled_inputs;
    case Fold::kUpsampledInput: return upsampled_inputs;
    case Fold::kTransposedInput: return transposed_inputs;
    default: return 0;
  }
}

bool KernelFolds::accepts_every_read(const ir::Node& node, Fold prologue, const std::string& value) const {
  if (!accepts(node, prologue)) return false;
  bool reads = false;
  for (size_t k = 0; k < node.inputs.size(); ++k) {
    if (node.inputs[k] != value) continue;
    reads = true;
    if (!accepts_at(node, prologue, k)) return false;
  }
  return reads;
}

bool KernelFolds::declares(Fold fold) const {
  switch (fold) {
    case Fold::kActivation: return activations != 0;
    case Fold::kPostAffine: return post_affine;
    case Fold::kPostClamp: return post_clamp;
    case Fold::kTensorQuantize: return tensor_quantize;
    case Fold::kChannelQuantize: return channel_quantize;
    case Fold::kTransposedOutput: return transposed_output;
    default: return prologue_inputs(fold) != 0;
  }
}

void KernelRegistry::add(const std::string& op_type, KernelFactory factory, const std::string& domain,
                         KernelLayouts layouts, KernelFolds folds) {
  entries_[{domain, op_type}] = Entry{std::move(factory), layouts, folds};
}

const KernelRegistry::Entry* KernelRegistry::entry(const std::string& op_type, const std::string& domain) const {
  auto it = entries_.find({domain == "ai.onnx" ? "" : domain, op_type});
  return it == entries_.end() ? nullptr : &it->second;
}

const KernelFactory* KernelRegistry::find(const std::string& op_type, const std::string& domain) const {
  const Entry* e = entry(op_type, domain);
  return e ? &e->factory : nullptr;
}

const KernelLayouts& KernelRegistry::layouts(const std::string& op_type, const std::string& domain) const {
  static const KernelLayouts kPlain;
  const Entry* e = entry(op_type, domain);
  return e ? e->layouts : kPlain;
}

const KernelFolds& KernelRegistry::folds(const std::string& op_type, const std::string& domain) const {
  static const KernelFolds kNone;
  const Entry* e = entry(op_type, domain);
  return e ? e->folds : kNone;
}

std::vector<std::string> KernelRegistry::op_types() const {
  std::vector<std::string> out;
  for (const auto& [key, entry] : entries_)
    if (key.first.empty()) out.push_back(key.second);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace slimquant::runtime
