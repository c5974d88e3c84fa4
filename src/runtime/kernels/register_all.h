#pragma once
// One registration function per kernel family; registry.cpp calls each once.
#include <initializer_list>

#include "runtime/fused_ops/fused_activation.h"
#include "runtime/fused_ops/residual_conv.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {

// The layout declarations several kernel families share (KernelLayouts).
namespace layouts {
using Role = KernelLayouts::Role;
// Conv and QConv: x, and the fused residual addend, in oneDNN's blocked layouts.
inline constexpr KernelLayouts kConvolution{Role::kAware, 1u << fused_ops::kConvX | 1u << fused_ops::kConvAddend};
// QConv: its float32 y may be stored as float16 (the direct depthwise kernel: a squeeze-excitation's
// input, read again by the gate Mul after the pool).
inline constexpr KernelLayouts kQuantizedConvolution{kConvolution.role, kConvolution.blocked_inputs, false, false, 1u};
inline constexpr KernelLayouts kPooling{Role::kAware, 1u << 0};  // MaxPool, AveragePool: x
inline constexpr KernelLayouts kPassthrough{Role::kPassthrough};
// Elementwise arithmetic and QuantizeLinear after the convolutions (squeeze-excitation, FPN sums).
inline constexpr KernelLayouts kChannelBlockedElementwise{Role::kChannelBlocked, 0, false, true};
// Add, Sub, Mul, Div: the same, and either operand may be float16 where the result is quantized.
inline constexpr KernelLayouts kChannelBlockedArithmetic{Role::kChannelBlocked, 0, false, true, 0u, 0b11u};
inline constexpr KernelLayouts kChannelBlocked{Role::kChannelBlocked};  // Resize, Concat
// Ops whose plain output is written as cheaply from blocked input (a per-channel summary [N, C, 1, 1];
// DepthToSpace, whose channels-last input with one output channel gives plain y directly).
inline constexpr KernelLayouts kChannelBlockedToPlain{Role::kChannelBlocked, 0, true, false};
}  // namespace layouts

namespace folds {
// KernelFolds::activations for these kinds.
constexpr uint32_t activation_bits(std::initializer_list<fused_ops::Activation> kinds) {
  uint32_t bits = 0;
  for (fused_ops::Activation a : kinds) bits |= 1u << static_cast<unsigned>(a);
  return bits;
}
}  // namespace folds
void register_elementwise_kernels(KernelRegistry& r);  // kernels/elementwise/: arithmetic, reduce, cast, Q/DQ
void register_dnnl_kernels(KernelRegistry& r);         // kernels/dnnl/: conv, gemm, pooling, ...
void register_shape_kernels(KernelRegistry& r);        // kernels/shape/shape_*.cpp: reshape, slice, ...
void register_int8_kernels(KernelRegistry& r);         // kernels/integer/int8_families.cpp: QConv, QGemm, QMatMul (com.slimquant)
void register_recurrent_kernels(KernelRegistry& r);    // kernels/recurrent/recurrent.cpp: LSTM, GRU, RNN
void register_index_kernels(KernelRegistry& r);        // kernels/shape/index_register.cpp: TopK, NonZero, ScatterND, ...
void register_detection_kernels(KernelRegistry& r);    // kernels/detection/detection.cpp, grid_sample.cpp: NMS, RoiAlign, GridSample
void register_misc_math_kernels(KernelRegistry& r);    // kernels/math/misc_math_register.cpp: InstanceNorm, LRN, MVN, Hardmax, CumSum, Einsum
void register_control_flow_kernels(KernelRegistry& r);  // kernels/recurrent/control_flow.cpp: If, Loop, Scan, Optional*
void register_sequence_kernels(KernelRegistry& r);      // kernels/recurrent/sequence.cpp: Sequence*, ConcatFromSequence, SplitToSequence
void register_integer_kernels(KernelRegistry& r);       // kernels/integer/integer_ops.cpp: QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger, DynamicQuantizeLinear
}  // namespace slimquant::runtime
