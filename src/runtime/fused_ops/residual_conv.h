#pragma once
// Contract between the residual-Add fusion (runtime/fusions: Add(Conv(x), r) [-> Relu | Clip]) and
// the Conv and QConv kernels that add r in their epilogue (oneDNN's sum post-op), then apply the
// Add's activation. The plan's buffer donation and layout planning read the same slots.
#include <cstddef>
#include <string>

#include "slimquant/ir/graph.h"

namespace slimquant::runtime::fused_ops {

// Input slots of a Conv / QConv: the ONNX ones, then the fused residual addend.
enum ConvSlot : size_t { kConvX = 0, kConvW = 1, kConvBias = 2, kConvAddend = 3 };

// True when the node reads a fused residual addend.
inline bool has_residual_addend(const ir::Node& n) { return n.inputs.size() > kConvAddend && !n.inputs[kConvAddend].empty(); }

// The activation after the sum: "" (none), "Relu", or "Clip" with [lo, hi].
struct SumActivation {
  static constexpr const char* kOp = "slimquant.sum_activation";
  static constexpr const char* kLo = "slimquant.sum_activation_alpha";
  static constexpr const char* kHi = "slimquant.sum_activation_beta";

  std::string op;
  float lo = 0.f, hi = 0.f;

  bool empty() const { return op.empty(); }
  static SumActivation parse(const ir::Node& n) {
    return {n.attr_string(kOp, ""), n.attr_float(kLo, 0.f), n.attr_float(kHi, 0.f)};
  }
  void write(ir::Node& n) const {
    n.attrs[kOp] = op;
    n.attrs[kLo] = lo;
    n.attrs[kHi] = hi;
  }
};

}  // namespace slimquant::runtime::fused_ops
