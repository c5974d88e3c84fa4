#pragma once
// Kernel interface. A kernel is created once per node of a compiled plan (typed attributes parsed,
// weights reordered there: everything that depends only on attributes and constants), then run()
// many times. Kernels compute their output shapes from their inputs' shapes in run().
#include <cstdint>
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
  // Whether float convolutions may take Winograd's algorithm (SessionOptions::winograd).
  bool winograd = true;
};

// Physical layout of a value exchanged between layout-aware kernels inside one compiled plan (a
// oneDNN blocked format, defined in runtime/kernels/dnnl/dnnl_common.h). Null means plain row-major,
// which is all that non-aware kernels, hooks and callers ever see: the plan only lets a value stay
// blocked when every reader is layout-aware, and converts it for hooks.
struct Layout;
using LayoutPtr = std::shared_ptr<const Layout>;

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
  Tensor& output(size_t i) { return outputs_.at(i); }
  bool output_wanted(size_t i) const { return i < outputs_.size(); }

  // Layouts (only layout-aware kernels look at them). Input i's layout, or null when plain.
  const Layout* input_layout(size_t i) const {
    return input_layouts_ && i < input_layouts_->size() ? (*input_layouts_)[i].get() : nullptr;
  }
  // Whether output i may be written in a non-plain layout (every reader is layout-aware).
  bool output_layout_allowed(size_t i) const { return i < 32 && (blocked_outputs_ >> i & 1u); }
  // Whether float32 output i may be written as DType::kFloat16 (KernelLayouts::float16_outputs), in
  // a layout the kernel declares with set_output_layout.
  bool output_float16_allowed(size_t i) const { return i < 32 && (float16_outputs_ >> i & 1u); }
  void allow_float16_outputs(uint32_t mask) { float16_outputs_ = mask; }
  // Declares output i's data to be in `layout` (only when output_layout_allowed(i)).
  void set_output_layout(size_t i, LayoutPtr layout) {
    if (output_layouts_ && i < output_layouts_->size()) (*output_layouts_)[i] = std::move(layout);
  }
  // Whether the kernel may write its output into input i's buffer (the plan found nothing else
  // holds it and the value is dead after this step).
  bool input_donated(size_t i) const { return i < 32 && (donated_inputs_ >> i & 1u); }
  void donate_inputs(uint32_t mask) { donated_inputs_ = mask; }
  void bind_layouts(const std::vector<LayoutPtr>* inputs, std::vector<LayoutPtr>* outputs, uint32_t blocked_outputs) {
    input_layouts_ = inputs;
    output_layouts_ = outputs;
    blocked_outputs_ = blocked_outputs;
  }

 private:
  const ir::Node& node_;
  std::vector<const Tensor*> inputs_;
  std::vector<Tensor>& outputs_;
  std::function<Tensor(DType, const Shape&)> allocator_;
  const std::vector<LayoutPtr>* input_layouts_ = nullptr;
  std::vector<LayoutPtr>* output_layouts_ = nullptr;
  uint32_t blocked_outputs_ = 0;
  uint32_t float16_outputs_ = 0;
  uint32_t donated_inputs_ = 0;
};

class Kernel {
 public:
  virtual ~Kernel() = default;
  virtual void run(KernelContext& ctx) = 0;
};

using KernelFactory = std::function<std::unique_ptr<Kernel>(const KernelInit&)>;

// The memory layouts a kernel reads and writes besides plain row-major tensors, declared when it is
// registered. A session plans its layouts from these declarations alone.
struct KernelLayouts {
  enum class Role {
    kPlain,        // every input must be plain (converted if needed), outputs are plain
    kAware,        // reads blocked inputs at the positions in blocked_inputs and may write blocked outputs
    kPassthrough,  // elementwise without broadcasting (scalars aside): works on raw element order, so
                   // the output takes the common layout of the inputs (the session decides)
    kChannelBlocked,  // reads rank-4 channel-blocked inputs (acdb, aBcd16b) when they share one blocking
                      // and writes its outputs in it (the kernel decides, and falls back to plain for
                      // cases it does not cover)
  };
  Role role = Role::kPlain;
  uint32_t blocked_inputs = 0;  // kAware: bit k set when input k may arrive in a blocked layout
  // kChannelBlocked: reads blocked inputs even where its output must be plain (a per-channel summary,
  // or an op whose plain output is as cheap to write from blocked input).
  bool reads_blocked_for_plain_output = false;
  // kChannelBlocked: first tries passthrough (raw element order), as plain elementwise arithmetic can
  // (unless the node needs each element's position: kernels/elementwise/channel_blocked.h).
  bool tries_passthrough = false;
  // Bit k: output k (float32) may be stored as DType::kFloat16 where the plan allows it
  // (KernelContext::output_float16_allowed): it stays blocked, is neither returned nor observed, and
  // every reader takes float16 there.
  uint32_t float16_outputs = 0;
  // Bit k: input k may arrive as DType::kFloat16 when the node's result is quantized (a folded
  // QuantizeLinear), whose steps are far coarser than half precision's 2^-11. The kernel reads it on
  // every path it may take (widen_float16).
  uint32_t float16_inputs = 0;
};

// The producers a kernel can read through (input prologues) and the consumers it can apply before
// writing its output (output epilogues), declared when it is registered, as oneDNN's post-ops and
// ncnn's per-layer support flags are. One generic rule per kind (runtime/fusions/declared_folds.h)
// folds a matching producer or consumer into any node whose kernel accepts it and records the fold
// in execution-only `slimquant.` attributes, which the kernel reads when it is created.
enum class Fold : uint8_t {
  // Input prologues: the kernel reads, at an input position it declares, ...
  kDequantizedInput,  // the 8-bit codes of a per-tensor u8/s8 DequantizeLinear, dequantizing as it goes
  kScaledInput,       // x of x * s, s per (n, c) or scalar: the factor becomes one more input (one per node)
  kUpsampledInput,    // the source of a nearest integer-factor Resize (one per node)
  kTransposedInput,   // the input of a Transpose, read through its permutation (a strided view)
  // Output epilogues, in the order they apply (a node takes none after one of a later stage):
  kActivation,      // one fused_ops::Activation of those declared
  kPostAffine,      // a scalar Mul / Add after that activation
  kPostClamp,       // a Max / Min with a scalar after those (TensorFlow's maximum(leaky_relu(x), c))
  kTensorQuantize,  // a per-tensor u8/s8 QuantizeLinear: the kernel writes the codes
  kChannelQuantize,  // a per-channel u8/s8 QuantizeLinear
  kTransposedOutput  // a Transpose: the kernel writes its result permuted
};

struct KernelFolds {
  // Prologues: bit k set when input k may be read through the prologue.
  uint32_t dequantized_inputs = 0, scaled_inputs = 0, upsampled_inputs = 0, transposed_inputs = 0;
  // Epilogues. activations: bit a set when fused_ops::Activation a may follow.
  uint32_t activations = 0;
  bool post_affine = false, post_clamp = false, tensor_quantize = false, channel_quantize = false;
  bool transposed_output = false;
  // Refuses, for this node, a fold the declaration allows (a oneDNN limitation, an integer kernel
  // whose output is already 8-bit, a pair of prologues on one input the kernel does not combine).
  // input: the prologue's input position, -1 for the node as a whole. Null: the declaration decides.
  bool (*refuses)(const ir::Node& node, Fold fold, int input) = nullptr;

  bool declares(Fold fold) const;
  uint32_t prologue_inputs(Fold prologue) const;  // the mask above (0 for an epilogue)
  // Declared, and not refused for this node (at this input, for a prologue).
  bool accepts(const ir::Node& node, Fold fold) const { return declares(fold) && !(refuses && refuses(node, fold, -1)); }
  bool accepts_at(const ir::Node& node, Fold prologue, size_t input) const {
    return input < 32 && (prologue_inputs(prologue) >> input & 1u) &&
           !(refuses && refuses(node, prologue, static_cast<int>(input)));
  }
  // Accepts the prologue for the node and at every input reading `value` (one at least): what a
  // value's producer needs from each of its readers to fold into all of them.
  bool accepts_every_read(const ir::Node& node, Fold prologue, const std::string& value) const;
};

// Op type -> factory, layouts and folds. Filled explicitly by register_all_kernels() (no static
// self-registration: the linker drops it from static libraries).
class KernelRegistry {
 public:
  static const KernelRegistry& instance();
  void add(const std::string& op_type, KernelFactory factory, const std::string& domain = "",
           KernelLayouts layouts = {}, KernelFolds folds = {});
  const KernelFactory* find(const std::string& op_type, const std::string& domain = "") const;
  // What the op's kernel declared (plain for an op without a kernel).
  const KernelLayouts& layouts(const std::string& op_type, const std::string& domain = "") const;
  // What it folds (nothing for an op without a kernel).
  const KernelFolds& folds(const std::string& op_type, const std::string& domain = "") const;
  std::vector<std::string> op_types() const;  // default domain, sorted

 private:
  struct Entry {
    KernelFactory factory;
    KernelLayouts layouts;
    KernelFolds folds;
  };
  const Entry* entry(const std::string& op_type, const std::string& domain) const;
  std::map<std::pair<std::string, std::string>, Entry> entries_;
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
