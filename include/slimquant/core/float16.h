#pragma once
// Whole arrays between float32 and ONNX's 16-bit float types (float16 = 10, bfloat16 = 16; the
// scalar forms are in tensor.h). Each value converts exactly as the scalar functions do (float16:
// IEEE binary16, round to nearest even, overflow to infinity, NaN kept quiet); the loops are
// branch-free integer arithmetic that the compiler vectorises, where libgcc's soft conversion of
// _Float16 (a baseline x86-64 build has no F16C) took 30-400 ns a value: the float16 forms of
// models spent more time in their output's rounding Cast than in all their convolutions.
#include <cstdint>

namespace slimquant {

// dst[i] = round_to_16bit_float(src[i], onnx_type); dst may be src.
void round_to_16bit_floats(const float* src, float* dst, int64_t count, int onnx_type);
// dst[i] = float_from_16bit(bits[i], onnx_type).
void floats_from_16bit(const uint16_t* bits, float* dst, int64_t count, int onnx_type);
// dst[i] = float_to_16bit(src[i], onnx_type).
void floats_to_16bit(const float* src, uint16_t* dst, int64_t count, int onnx_type);

}  // namespace slimquant
