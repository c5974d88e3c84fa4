#include "runtime/fused_ops/fused_activation.h"

#include <cmath>

#include "runtime/fused_ops/gelu_erf.h"
#include "slimquant/core/error.h"
#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime::fused_ops {

const char* activation_name(Activation a) {
  switch (a) {
    case Activation::kNone: return "";
    case Activation::kRelu: return "Relu";
    case Activation::kClip: return "Clip";
    case Activation::kLeakyRelu: return "LeakyRelu";
    case Activation::kSigmoid: return "Sigmoid";
    case Activation::kTanh: return "Tanh";
    case Activation::kHardSigmoid: return "HardSigmoid";
    case Activation::kHardSwish: return "HardSwish";
    case Activation::kElu: return "Elu";
    case Activation::kSwish: return "Swish";
    case Activation::kGelu: return "Gelu";
    case Activation::kScale: return "Scale";
  }
  return "";
}

std::optional<Activation> activation_from_name(const std::string& name) {
  for (Activation a : {Activation::kNone, Activation::kRelu, Activation::kClip, Activation::kLeakyRelu,
                       Activation::kSigmoid, Activation::kTanh, Activation::kHardSigmoid, Activation::kHardSwish,
                       Activation::kElu, Activation::kSwish, Activation::kGelu, Activation::kScale})
    if (name == activation_name(a)) return a;
  return std::nullopt;
}

FusedActivation FusedActivation::parse(const ir::Node& n) {
  FusedActivation f;
  const std::string name = n.attr_string(kOp, "");
  const std::optional<Activation> kind = activation_from_name(name);
  SQ_CHECK(kind.has_value(), ErrorKind::kUnsupported,
           n.describe() + ": fused activation '" + name + "' is none slimquant applies (Relu, Clip, LeakyRelu, "
                          "Sigmoid, Tanh, HardSigmoid, HardSwish, Elu, Swish, Gelu, Scale)");
  f.kind = *kind;
  f.alpha = n.attr_float(kAlpha, 0.f);
  f.beta = n.attr_float(kBeta, 0.f);
  f.post_scale = n.attr_float(kPostScale, 1.f);
  f.post_shift = n.attr_float(kPostShift, 0.f);
  f.post_min = n.attr_float(kPostMin, -INFINITY);
  f.post_max = n.attr_float(kPostMax, INFINITY);
  return f;
}

void FusedActivation::write(ir::Node& n) const {
  for (const char* k : {kOp, kAlpha, kBeta, kPostScale, kPostShift, kPostMin, kPostMax}) n.attrs.erase(k);
  if (empty()) return;
  n.attrs[kOp] = std::string(name());
  n.attrs[kAlpha] = alpha;
  n.attrs[kBeta] = beta;
  if (post_scale != 1.f) n.attrs[kPostScale] = post_scale;
  if (post_shift != 0.f) n.attrs[kPostShift] = post_shift;
  if (post_min != -INFINITY) n.attrs[kPostMin] = post_min;
  if (post_max != INFINITY) n.attrs[kPostMax] = post_max;
}

std::optional<FusedActivation> read_activation_node(const ir::Graph& g, const ir::Node& n) {
  FusedActivation f;
  const bool onnx = n.domain.empty() || n.domain == "ai.onnx";
  if (n.op_type == "Swish" && n.domain == ir::kSlimquantDomain) {
    f.kind = Activation::kSwish;
    f.alpha = n.attr_float("alpha", 1.f);
    return f;
  }
  if (n.op_type == "Gelu" && (n.domain == dnnl_kernels::kGeluDomain ||
                              (onnx && n.attr_string("approximate", "none") == "none"))) {
    f.kind = Activation::kGelu;
    return f;
  }
  if (!onnx) return std::nullopt;
  const std::optional<Activation> kind = activation_from_name(n.op_type);
  if (!kind || *kind == Activation::kNone || *kind == Activation::kSwish || *kind == Activation::kGelu ||
      *kind == Activation::kScale)
    return std::nullopt;  // Swish and Gelu: only the forms above; Scale is no ONNX op
  f.kind = *kind;
  switch (f.kind) {
    case Activation::kLeakyRelu: f.alpha = n.attr_float("alpha", 0.01f); break;
    case Activation::kElu: f.alpha = n.attr_float("alpha", 1.f); break;
    case Activation::kHardSigmoid:
      f.alpha = n.attr_float("alpha", 0.2f);
      f.beta = n.attr_float("beta", 0.5f);
      break;
    case Activation::kClip: {
      f.alpha = -INFINITY;
      f.beta = INFINITY;
      if (g.opset < 11) {
        f.alpha = n.attr_float("min", -INFINITY);
        f.beta = n.attr_float("max", INFINITY);
        break;
      }
      for (size_t i : {size_t{1}, size_t{2}}) {
        const std::string& bound = n.input(i);
        if (bound.empty()) continue;
        const Tensor* t = g.initializer(bound);
        if (!t || t->numel() != 1) return std::nullopt;  // bounds computed at run time
        (i == 1 ? f.alpha : f.beta) = t->to_float_vector()[0];
      }
      break;
    }
    default: break;
  }
  return f;
}

}  // namespace slimquant::runtime::fused_ops
