#pragma once
// Contract between the residual-Add fusion (runtime/fusions: Add(Conv(x), r) [-> Relu | Clip]) and
// the Conv and QConv kernels that add r in their epilogue (oneDNN's sum post-op), then apply the
// Add's activation. The plan's buffer donation and layout planning read the same slots.
#include <cstddef>
#include <string>

#include "runtime/fused_ops/fused_activation.h"
#include "slimquant/core/error.h"
#include "slimquant/ir/graph.h"

namespace slimquant::runtime::fused_ops {

// Input slots of a Conv / QConv: the ONNX ones, then the fused residual addend.
enum ConvSlot : size_t { kConvX = 0, kConvW = 1, kConvBias = 2, kConvAddend = 3 };

// True when the node reads a fused residual addend.
inline bool has_residual_addend(const ir::Node& n) { return n.inputs.size() > kConvAddend && !n.inputs[kConvAddend].empty(); }

// The activation after the sum: none, Relu, or Clip with [lo, hi].
struct SumActivation {
  static constexpr const char* kOp = "slimquant.sum_activation";
  static constexpr const char* kLo = "slimquant.sum_activation_alpha";
  static constexpr const char* kHi = "slimquant.sum_activation_beta";

  Activation kind = Activation::kNone;
  float lo = 0.f, hi = 0.f;

  bool empty() const { return kind == Activation::kNone; }
  // kInvalidModel naming n for an activation other than those three.
  static SumActivation parse(const ir::Node& n) {
    const std::string name = n.attr_string(kOp, "");
    const std::optional<Activation> kind = activation_from_name(name);
    SQ_CHECK(kind == Activation::kNone || kind == Activation::kRelu || kind == Activation::kClip,
             ErrorKind::kInvalidModel, n.describe() + ": the activation after a fused sum must be Relu or Clip, got '" + name + "'");
    return {*kind, n.attr_float(kLo, 0.f), n.attr_float(kHi, 0.f)};
  }
  void write(ir::Node& n) const {
    n.attrs[kOp] = std::string(activation_name(kind));
    n.attrs[kLo] = lo;
    n.attrs[kHi] = hi;
  }
};

}  // namespace slimquant::runtime::fused_ops
