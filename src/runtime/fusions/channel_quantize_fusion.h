#pragma once
// Execution-only plan fusion (one rule of execution_fusion_rules()).
#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime {

// Add / Sub / Mul / Div with a float32 result read only by a per-channel QuantizeLinear (a 1-D
// scale along one axis, e.g. the channel-wise input of the next convolution) compute and quantize
// each channel's slab while it is in cache (the elementwise kernel reads the
// folded_quantize_channel_* attributes of elementwise_qdq.h), instead of writing float32 for a
// separate pass to read back: PP-OCRv4 det's FPN sums and squeeze-excitation scalings. Values that
// are kept (hooks, outputs) block the fusion. A Concat takes such a QuantizeLinear too (PP-OCRv4
// det's head input): it quantizes every input into its place. Rule
// "fold_channel_quantize_into_elementwise"; it counts the QuantizeLinear nodes folded.
ir::Rule channel_quantize_fusion_rule();

}  // namespace slimquant::runtime
