#pragma once
// One registration function per kernel family; registry.cpp calls each once.
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {
void register_elementwise_kernels(KernelRegistry& r);  // kernels/elementwise/: arithmetic, reduce, cast, Q/DQ
void register_dnnl_kernels(KernelRegistry& r);         // kernels/dnnl/: conv, gemm, pooling, ...
void register_shape_kernels(KernelRegistry& r);        // kernels/shape/shape_*.cpp: reshape, slice, ...
void register_int8_kernels(KernelRegistry& r);         // kernels/integer/int8_*.cpp: QConv, QGemm, QMatMul (com.slimquant)
void register_recurrent_kernels(KernelRegistry& r);    // kernels/recurrent/recurrent.cpp: LSTM, GRU, RNN
void register_index_kernels(KernelRegistry& r);        // kernels/shape/index_register.cpp: TopK, NonZero, ScatterND, ...
void register_detection_kernels(KernelRegistry& r);    // kernels/detection/detection.cpp, grid_sample.cpp: NMS, RoiAlign, GridSample
void register_misc_math_kernels(KernelRegistry& r);    // kernels/math/misc_math_register.cpp: InstanceNorm, LRN, MVN, Hardmax, CumSum, Einsum
void register_control_flow_kernels(KernelRegistry& r);  // kernels/recurrent/control_flow.cpp: If, Loop, Scan, Optional*
void register_sequence_kernels(KernelRegistry& r);      // kernels/recurrent/sequence.cpp: Sequence*, ConcatFromSequence, SplitToSequence
void register_integer_kernels(KernelRegistry& r);       // kernels/integer/integer_ops.cpp: QLinearConv, QLinearMatMul, ConvInteger, MatMulInteger, DynamicQuantizeLinear
}  // namespace slimquant::runtime
