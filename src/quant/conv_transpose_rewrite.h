#pragma once
// Lowering rewrites that give a quantized ConvTranspose the integer convolution kernels.
//
// A ConvTranspose whose kernel equals its strides (DBNet's and U-Net's 2x upsampling heads) writes
// each output pixel from exactly one input pixel:
//   y[n, m, h*s+i, w*s+j] = sum_c x[n, c, h, w] * W[c, m, i, j] + b[m]
// which is a 1x1 convolution with s*s*M output channels, W'[(i*s+j)*M + m, c] = W[c, m, i, j],
// followed by DepthToSpace(blocksize s, DCR): the same products and sums, element for element.
// The 1x1 convolution lowers to a QConv like any other; its activation and output QuantizeLinear
// commute above the DepthToSpace (a permutation), so the QConv writes the 8-bit codes and the
// DepthToSpace moves bytes.
#include "slimquant/ir/rewrite.h"

namespace slimquant::quant {

// DequantizeLinear(x) and DequantizeLinear(s8 constant W) -> ConvTranspose (2-D, group 1, kernel ==
// strides with equal height and width, no dilation, padding, output_padding or output_shape; an
// optional float32 bias) becomes Conv(1x1) -> DepthToSpace(DCR).
ir::Rule conv_transpose_as_pointwise_conv_rule();

// DepthToSpace -> elementwise activation (its sole reader) -> QuantizeLinear becomes activation ->
// DepthToSpace -> QuantizeLinear (the Q then moves up too: lowering's commute_quantize_upward).
ir::Rule commute_activation_above_depth_to_space_rule();

}  // namespace slimquant::quant
