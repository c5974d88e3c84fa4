#pragma once
// Execution-only plan fusion (one rule of execution_fusion_rules()).
#include "slimquant/ir/rewrite.h"

namespace slimquant::runtime {

// A per-tensor DequantizeLinear (constant scale and zero point, uint8 / int8 codes) whose float32
// output is not kept and is read only by ops that can dequantize as they read is folded into all of
// them: they read the codes (attributes of elementwise_qdq.h's FoldedDequantize). Those ops: Add /
// Sub / Mul / Div at an operand other than a folded upsampling's or scaling's factor,
// GlobalAveragePool, GlobalMaxPool. The quantized squeeze-excitation input of PP-OCRv4 det's FPN (a
// u8 QConv output read by the pool and the gated FPN sum) is then read as 2.4 MB of codes instead of
// a 9.8 MB float32 map a DequantizeLinear writes. Rule "fold_dequantize_into_readers"; it counts
// the DequantizeLinear nodes folded.
ir::Rule dequantize_fusion_rule();

}  // namespace slimquant::runtime
