#pragma once
// The exact integer arithmetic behind the ONNX integer ops (integer_ops.cpp: MatMulInteger,
// ConvInteger, QLinearMatMul, QLinearConv):
//
//     acc[i, j] = sum_l (a[i, l] - z_a) * (b[l, j] - z_b)                      (int32, wraps mod 2^32)
//     y[i, j]   = saturate(round_half_even(float(acc[i, j] + bias) * M) + z_y)   M = s_a * s_b / s_y
//
// Operands are 8-bit values with their zero points already subtracted, widened to int16 (range
// [-255, 255]): every product fits 17 bits, so the pair sums of pmaddwd (which compilers emit for
// these loops) cannot saturate. oneDNN 2.6's u8 x s8 path on CPUs without VNNI sums pairs in 16 bits
// (vpmaddubsw) and is not exact for full-range weights; this is, for every 8-bit input. Sums are
// kept in uint32, so wrap-around (which the ONNX spec allows for 32-bit accumulation) is defined
// behaviour and equals the int32 two's complement result.
// The requantization matches ONNX Runtime's MLAS (float multiplier, ties to even) bit for bit.
#include <cstdint>

namespace slimquant::runtime::integer {

// out[i * out_row_stride + j * out_col_stride] = sum_l a[i * lda + l] * b[j * ldb + l]
// for i < rows, j < cols: both operands hold the reduction dim contiguously ("A times B^T").
void gemm_s16_nt(const int16_t* a, int64_t lda, int64_t rows, const int16_t* b, int64_t ldb, int64_t cols,
                 int64_t depth, int32_t* out, int64_t out_row_stride, int64_t out_col_stride);

// out[i * ldo + j] = sum_l a[i * lda + l] * bt[l * ldbt + j] for i < rows, j < cols: b stored with
// the reduction as its rows ("A times B"). For short reductions (depthwise convolutions), where the
// dot form of gemm_s16_nt would spend most of its time reducing vectors to scalars.
void gemm_s16_nn(const int16_t* a, int64_t lda, int64_t rows, const int16_t* bt, int64_t ldbt, int64_t cols,
                 int64_t depth, int32_t* out, int64_t ldo);

// dst[i] = int16(src[i]) - zero_point for n 8-bit values (Q: uint8_t or int8_t).
template <typename Q>
void widen(const Q* src, int64_t n, int32_t zero_point, int16_t* dst);

// y[i] = saturate(round_half_even(float(acc[i] + bias) * multiplier) + zero_point), Y: uint8_t or int8_t.
template <typename Y>
void requantize(const int32_t* acc, int64_t n, int32_t bias, float multiplier, int32_t zero_point, Y* y);
// The same with one multiplier per element (per-column scales) and no bias.
template <typename Y>
void requantize(const int32_t* acc, int64_t n, const float* multipliers, int32_t zero_point, Y* y);

}  // namespace slimquant::runtime::integer
