#pragma once
// Execution-only plan fusion (one rule of execution_fusion_rules()).
#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime {

// FPN top-down sums (PP-OCRv4 det, DBNet): Add(a, Resize(r)) with a nearest, asymmetric, floor
// Resize by constant integer factors of the last two dims of [N, C, h, w] reads r directly
// (element [n, c, y / kh, x / kw]) instead of a Resize writing the upsampled map for the Add to
// read back (attributes ew::kNearestUpsampledInput / kNearestUpsampleFactors, read by the
// elementwise kernel). The Resize result must be read by that op alone and not be kept, and both operands'
// shapes must be known. Rule "fold_nearest_upsample_into_elementwise"; it counts the Resize nodes
// folded.
ir::Rule nearest_upsample_fusion_rule();

}  // namespace slimquant::runtime
