#include "runtime/fused_ops/fused_activation.h"

namespace slimquant::runtime::fused_ops {

FusedActivation FusedActivation::parse(const ir::Node& n) {
  FusedActivation f;
  f.op = n.attr_string(kOp, "");
  f.alpha = n.attr_float(kAlpha, 0.f);
  f.beta = n.attr_float(kBeta, 0.f);
  f.post_scale = n.attr_float(kPostScale, 1.f);
  f.post_shift = n.attr_float(kPostShift, 0.f);
  return f;
}

void FusedActivation::write(ir::Node& n) const {
  for (const char* k : {kOp, kAlpha, kBeta, kPostScale, kPostShift}) n.attrs.erase(k);
  if (op.empty()) return;
  n.attrs[kOp] = op;
  n.attrs[kAlpha] = alpha;
  n.attrs[kBeta] = beta;
  if (post_scale != 1.f) n.attrs[kPostScale] = post_scale;
  if (post_shift != 0.f) n.attrs[kPostShift] = post_shift;
}

}  // namespace slimquant::runtime::fused_ops
