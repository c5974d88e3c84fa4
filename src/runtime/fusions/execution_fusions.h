#pragma once
// The execution fusions: rewrites that only the session runs, after shapes are bound and constants
// folded (their results are not exportable ONNX: fused activations, residual sums, folded
// quantization, oneDNN's Gelu). One ordered rule list; Plan applies it in one call.
#include <set>
#include <string>
#include <vector>

#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime {

// The rules, in the order they run. keep: values a caller observes (never fused away).
std::vector<ir::Rule> execution_fusion_rules();

// The activation fold alone (rule "fuse_activation"): an activation that alone reads a Conv /
// ConvTranspose / Gemm output (or a scalar Mul after a MatMul) becomes that node's
// fused_ops::FusedActivation. Returns the nodes that took one.
int fuse_activations(ir::Graph& g, const std::set<std::string>& keep = {});

// Runs execution_fusion_rules() on g; returns the count per rule.
ir::RuleCounts apply_execution_fusions(ir::Graph& g, const std::set<std::string>& keep);

}  // namespace slimquant::runtime
