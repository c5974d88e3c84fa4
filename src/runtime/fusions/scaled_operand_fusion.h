#pragma once
// Execution-only plan fusion (one rule of execution_fusion_rules()).
#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime {

// Add / Sub reading Mul(x, s), a per-channel or scalar scaling of a rank-4 x ([N|1, C|1, 1, 1] or
// one element) that it alone reads, reads x and s instead and scales x as it goes (attribute
// ew::kScaledInput; s becomes input 2). The squeeze-excitation gate times the FPN's top-down sum
// (PP-OCRv4 det: x * (1 + gate) + upsampled coarser level) is then one pass over the map instead
// of a Mul writing a full float32 map for the Add to read back. Shapes must be known, x must have
// the Add's output shape, and the Mul's result must not be kept. Rule
// "fold_scaling_into_elementwise"; it counts the Mul nodes folded.
ir::Rule scaled_operand_fusion_rule();

}  // namespace slimquant::runtime
