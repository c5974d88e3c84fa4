#pragma once
// DynamicQuantizeLinear's parameters, shared by its kernel (integer_ops.cpp) and the fused
// dynamically quantized MatMul (dynamic_matmul.cpp), so both quantize x to the same codes:
//   y_scale = (max(0, max x) - min(0, min x)) / 255 (1 for an all-zero x, as ONNX Runtime),
//   y_zero_point = saturate(round_half_even(-min / y_scale)); NaNs are skipped.
#include <cstdint>

namespace slimquant::runtime::integer {

struct DynamicQuantParams {
  float scale = 1.f;
  uint8_t zero_point = 0;
};
DynamicQuantParams dynamic_quant_params(const float* x, int64_t count);
// The same from a range already taken: lo = min(0, min x), hi = max(0, max x), NaNs skipped (a
// producer's pass that computed it, fused_ops/dynamic_matmul.h's x_range).
DynamicQuantParams dynamic_quant_params_from_range(float lo, float hi);

}  // namespace slimquant::runtime::integer

#include <memory>

#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {
// The fused dynamically quantized MatMul's kernel (fused_ops/dynamic_matmul.h).
std::unique_ptr<Kernel> make_dynamic_matmul(const KernelInit& init);
std::unique_ptr<Kernel> make_dynamic_conv(const KernelInit& init);
}  // namespace slimquant::runtime
