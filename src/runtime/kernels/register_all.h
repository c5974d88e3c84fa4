#pragma once
// One registration function per kernel family; registry.cpp calls each once.
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {
void register_elementwise_kernels(KernelRegistry& r);  // kernels/elementwise*.cpp, reduce, cast, qdq
void register_dnnl_kernels(KernelRegistry& r);         // kernels/dnnl_*.cpp: conv, gemm, pooling, ...
void register_shape_kernels(KernelRegistry& r);        // kernels/shape_*.cpp: reshape, slice, ...
void register_int8_kernels(KernelRegistry& r);         // kernels/int8_*.cpp: QConv, QGemm, QMatMul (com.slimquant)
}  // namespace slimquant::runtime
