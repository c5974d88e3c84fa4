#pragma once
// The execution fusions: rewrites that only the session runs, after shapes are bound and constants
// folded (their results are not exportable ONNX: fused activations, residual sums, folded
// quantization, oneDNN's Gelu). One ordered rule list; Plan applies it in one call.
#include <set>
#include <string>
#include <vector>

#include "runtime/kernels/elementwise/elementwise_common.h"
#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime {

// Add / Sub / Mul / Div of the default domain: the ops whose kernel can fold a Q, an upsampling.
inline bool is_binary_arithmetic(const ir::Node& n) {
  return n.domain.empty() && (n.op_type == "Add" || n.op_type == "Sub" || n.op_type == "Mul" || n.op_type == "Div");
}
// Its operands: two, or three when a per-channel scaling is folded in (input 2, the factor).
inline bool has_binary_operands(const ir::Node& n) {
  return n.inputs.size() == 2 || (n.inputs.size() == 3 && n.attrs.count(ew::kScaledInput));
}

// The rules, in the order they run. keep: values a caller observes (never fused away).
std::vector<ir::Rule> execution_fusion_rules();

// The activation fusion alone (rule "fuse_activation"): an activation that alone reads a Conv /
// ConvTranspose / Gemm output (or a scalar Mul after a MatMul) becomes that node's
// fused_ops::FusedActivation. Returns activations fused.
int fuse_activations(ir::Graph& g, const std::set<std::string>& keep = {});

// Runs execution_fusion_rules() on g; returns the count per rule.
ir::RuleCounts apply_execution_fusions(ir::Graph& g, const std::set<std::string>& keep);

}  // namespace slimquant::runtime
