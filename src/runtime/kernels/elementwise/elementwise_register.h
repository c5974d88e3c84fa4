#pragma once
// Registration entry points of the elementwise family's files; register_elementwise_kernels()
// (elementwise.cpp) calls each once.
#include "runtime/kernels/register_all.h"  // the shared layout declarations
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::ew {
void register_binary_kernels(KernelRegistry& r);    // elementwise_binary.cpp: Add ... Where
void register_unary_kernels(KernelRegistry& r);     // elementwise_unary.cpp: Relu, Exp, Clip, ...
void register_reduce_kernels(KernelRegistry& r);    // reduce.cpp: Reduce*, ArgMax, ArgMin
void register_cast_kernels(KernelRegistry& r);      // cast.cpp: Cast, CastLike
void register_quantize_kernels(KernelRegistry& r);  // quantize_linear.cpp: QuantizeLinear, DequantizeLinear
}  // namespace slimquant::runtime::ew
