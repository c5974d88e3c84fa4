#pragma once
// The one activation vocabulary of the runtime, and the contract between the execution fusions
// (runtime/fusions) and the float kernels that apply an activation in their epilogue: Conv,
// ConvTranspose, Gemm, MatMul (oneDNN post-ops) and the elementwise kernels. INT8 lowering and the
// integer kernels (kernels/integer/int8_common.h) name activations with the same enum. A fusion
// writes an activation as node attributes (its name, as activation_name spells it); each kernel
// parses it once when it is created. Never exported: execution fusions run inside a session's plan.
#include <cmath>
#include <optional>
#include <string>

#include "slimquant/ir/graph.h"

namespace slimquant::runtime::fused_ops {

// kScale: y * alpha, a scalar Mul after a MatMul (attention's 1/sqrt(d) after Q K^T).
enum class Activation { kNone, kRelu, kClip, kLeakyRelu, kSigmoid, kTanh, kHardSigmoid, kHardSwish, kElu, kSwish, kGelu, kScale };

// The ONNX op name ("" for kNone, "Scale" for kScale) and back (nullopt for a name that is none of them).
const char* activation_name(Activation a);
std::optional<Activation> activation_from_name(const std::string& name);

struct FusedActivation {
  // Attribute names (the ir::kExecutionAttrPrefix family, which model passes leave alone).
  static constexpr const char* kOp = "slimquant.activation";
  static constexpr const char* kAlpha = "slimquant.activation_alpha";
  static constexpr const char* kBeta = "slimquant.activation_beta";
  static constexpr const char* kPostScale = "slimquant.activation_post_scale";
  static constexpr const char* kPostShift = "slimquant.activation_post_shift";
  static constexpr const char* kPostMin = "slimquant.activation_post_min";
  static constexpr const char* kPostMax = "slimquant.activation_post_max";

  Activation kind = Activation::kNone;
  // LeakyRelu, Elu, Swish, Scale: alpha; HardSigmoid: alpha, beta; Clip: [alpha, beta] = [min, max].
  float alpha = 0.f, beta = 0.f;
  // y = act(x) * post_scale + post_shift: a scalar Mul / Add after the activation (PPLCNetV3's
  // learnable affine block after each hard-swish), one more linear post-op.
  float post_scale = 1.f, post_shift = 0.f;
  // Then y = min(max(y, post_min), post_max): a Max / Min with a scalar after them (TensorFlow
  // exports' maximum(leaky_relu(x), -0.4): openWakeWord's speech embedding).
  float post_min = -INFINITY, post_max = INFINITY;

  bool empty() const { return kind == Activation::kNone; }
  bool has_post_affine() const { return post_scale != 1.f || post_shift != 0.f; }
  bool has_post_clamp() const { return post_min != -INFINITY || post_max != INFINITY; }
  const char* name() const { return activation_name(kind); }
  // The activation node n carries (empty when none); kUnsupported naming n for an unknown name.
  static FusedActivation parse(const ir::Node& n);
  // Writes this activation onto n (removes the attributes when empty).
  void write(ir::Node& n) const;
};

// The activation a model's node computes, with its parameters: Relu, Clip (constant bounds),
// LeakyRelu, Sigmoid, Tanh, HardSigmoid, HardSwish, Elu, slimquant's Swish (ir::merge_swish), and
// GELU in its exact form (ONNX's Gelu, or the erf chain the session fused into one node). nullopt
// for any other node. Both the INT8 lowering and the execution fusions read activations here; each
// then takes the kinds its kernels apply.
std::optional<FusedActivation> read_activation_node(const ir::Graph& g, const ir::Node& n);

}  // namespace slimquant::runtime::fused_ops
