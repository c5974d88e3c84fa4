#pragma once
// Execution-only plan fusion (called from the Plan's fusion block in session.cpp).
#include <set>
#include <string>

#include "slimquant/ir/graph.h"

namespace slimquant::runtime {

// FPN top-down sums (PP-OCRv4 det, DBNet): Add(a, Resize(r)) with a nearest, asymmetric, floor
// Resize by constant integer factors of the last two dims of [N, C, h, w] reads r directly
// (element [n, c, y / kh, x / kw]) instead of a Resize writing the upsampled map for the Add to
// read back (attributes ew::kNearestUpsampledInput / kNearestUpsampleFactors, read by the
// elementwise kernel). The Resize result must be read by that op alone and not be kept, and both operands'
// shapes must be known. Returns how many Resize nodes were folded.
int fold_nearest_upsample_into_elementwise(ir::Graph& g, const std::set<std::string>& keep);

}  // namespace slimquant::runtime
