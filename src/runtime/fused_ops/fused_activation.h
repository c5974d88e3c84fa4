#pragma once
// Contract between the execution fusions (runtime/fusions) and the float kernels that apply an
// activation in their epilogue: Conv, ConvTranspose, Gemm, MatMul (oneDNN post-ops) and the
// elementwise kernels. The fusion writes it as node attributes; each kernel parses it once when it
// is created. Never exported: execution fusions run inside a session's plan only.
#include <string>

#include "slimquant/ir/graph.h"

namespace slimquant::runtime::fused_ops {

struct FusedActivation {
  // Attribute names (the ir::kExecutionAttrPrefix family, which model passes leave alone).
  static constexpr const char* kOp = "slimquant.activation";
  static constexpr const char* kAlpha = "slimquant.activation_alpha";
  static constexpr const char* kBeta = "slimquant.activation_beta";
  static constexpr const char* kPostScale = "slimquant.activation_post_scale";
  static constexpr const char* kPostShift = "slimquant.activation_post_shift";

  std::string op;  // "", "Relu", "Clip", "LeakyRelu", "Sigmoid", "HardSwish", ..., "Scale" (y * alpha)
  float alpha = 0.f, beta = 0.f;
  // y = act(x) * post_scale + post_shift: a scalar Mul / Add after the activation (PPLCNetV3's
  // learnable affine block after each hard-swish), one more linear post-op.
  float post_scale = 1.f, post_shift = 0.f;

  bool empty() const { return op.empty(); }
  bool has_post_affine() const { return post_scale != 1.f || post_shift != 0.f; }
  // The activation node n carries (empty when none).
  static FusedActivation parse(const ir::Node& n);
  // Writes this activation onto n (removes the attributes when empty).
  void write(ir::Node& n) const;
};

}  // namespace slimquant::runtime::fused_ops
