// Integer GEMM core and requantization (arithmetic in integer_gemm.h). Plain C++ loops written so
// that GCC and Clang vectorise them (pmaddwd dot products); the two GEMM drivers are compiled twice,
// for AVX2 and for the baseline ISA, and the loader picks one (target_clones), since the library is
// built for baseline x86-64.
#include "runtime/kernels/integer/integer_gemm.h"

#include <algorithm>
#include <limits>

#include "runtime/kernels/cpu_clones.h"
#include "slimquant/core/quant_param.h"

namespace slimquant::runtime::integer {

namespace {

// Operand bytes one column block of gemm_s16_nt may span: it stays in L2 while every row block
// streams past it.
constexpr int64_t kColumnBlockBytes = 256 * 1024;

// R x C outputs at once: R + C vector loads feed R * C multiply-adds per step (4 x 2 measured best
// with 16 vector registers).
template <int R, int C>
[[gnu::always_inline]] inline void dot_block(const int16_t* a, int64_t lda, const int16_t* b, int64_t ldb,
                                             int64_t depth, int32_t* out, int64_t out_rs, int64_t out_cs) {
  uint32_t sum[R][C] = {};
  for (int64_t l = 0; l < depth; ++l)
    for (int r = 0; r < R; ++r)
      for (int c = 0; c < C; ++c)
        sum[r][c] += static_cast<uint32_t>(int32_t{a[r * lda + l]} * int32_t{b[c * ldb + l]});
  for (int r = 0; r < R; ++r)
    for (int c = 0; c < C; ++c) out[r * out_rs + c * out_cs] = static_cast<int32_t>(sum[r][c]);
}

template <int R>
[[gnu::always_inline]] inline void dot_row_block(const int16_t* a, int64_t lda, const int16_t* b, int64_t ldb,
                                                 int64_t j0, int64_t j1, int64_t depth, int32_t* out, int64_t out_rs,
                                                 int64_t out_cs) {
  int64_t j = j0;
  for (; j + 2 <= j1; j += 2) dot_block<R, 2>(a, lda, b + j * ldb, ldb, depth, out + j * out_cs, out_rs, out_cs);
  if (j < j1) dot_block<R, 1>(a, lda, b + j * ldb, ldb, depth, out + j * out_cs, out_rs, out_cs);
}

}  // namespace

SQ_AVX2_CLONES
void gemm_s16_nt(const int16_t* a, int64_t lda, int64_t rows, const int16_t* b, int64_t ldb, int64_t cols,
                 int64_t depth, int32_t* out, int64_t out_row_stride, int64_t out_col_stride) {
  const int64_t col_block = std::max<int64_t>(2, kColumnBlockBytes / std::max<int64_t>(1, depth * 2));
  for (int64_t j0 = 0; j0 < cols; j0 += col_block) {
    const int64_t j1 = std::min(cols, j0 + col_block);
    int64_t i = 0;
    for (; i + 4 <= rows; i += 4)
      dot_row_block<4>(a + i * lda, lda, b, ldb, j0, j1, depth, out + i * out_row_stride, out_row_stride,
                       out_col_stride);
    const int64_t rest = rows - i;
    const int16_t* ai = a + i * lda;
    int32_t* oi = out + i * out_row_stride;
    if (rest == 3) dot_row_block<3>(ai, lda, b, ldb, j0, j1, depth, oi, out_row_stride, out_col_stride);
    if (rest == 2) dot_row_block<2>(ai, lda, b, ldb, j0, j1, depth, oi, out_row_stride, out_col_stride);
    if (rest == 1) dot_row_block<1>(ai, lda, b, ldb, j0, j1, depth, oi, out_row_stride, out_col_stride);
  }
}

SQ_AVX2_CLONES
void gemm_s16_nn(const int16_t* a, int64_t lda, int64_t rows, const int16_t* bt, int64_t ldbt, int64_t cols,
                 int64_t depth, int32_t* out, int64_t ldo) {
  constexpr int64_t kChunk = 512;  // outputs kept in L1 while the reduction sweeps over them
  for (int64_t i = 0; i < rows; ++i) {
    // Same-width unsigned alias of the int32 output: wrap-around is defined.
    uint32_t* o = reinterpret_cast<uint32_t*>(out + i * ldo);
    const int16_t* ai = a + i * lda;
    for (int64_t j0 = 0; j0 < cols; j0 += kChunk) {
      const int64_t n = std::min(kChunk, cols - j0);
      std::fill(o + j0, o + j0 + n, 0u);
      for (int64_t l = 0; l < depth; ++l) {
        const int32_t w = ai[l];
        const int16_t* bl = bt + l * ldbt + j0;
        for (int64_t j = 0; j < n; ++j) o[j0 + j] += static_cast<uint32_t>(w * int32_t{bl[j]});
      }
    }
  }
}

template <typename Q>
void widen(const Q* src, int64_t n, int32_t zero_point, int16_t* dst) {
  const int16_t z = static_cast<int16_t>(zero_point);
  for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<int16_t>(int16_t{src[i]} - z);
}

namespace {

// quant_math::saturate_round on v against [qmin - z, qmax - z], then + z. NaN (a zero y_scale)
// goes to lo, as in MLAS.
template <typename Y>
inline Y requantize_one(float v, float lo, float hi, int32_t zero_point) {
  return static_cast<Y>(static_cast<int32_t>(quant_math::saturate_round(v, lo, hi)) + zero_point);
}

template <typename Y>
constexpr float qmin_f() { return static_cast<float>(std::numeric_limits<Y>::min()); }
template <typename Y>
constexpr float qmax_f() { return static_cast<float>(std::numeric_limits<Y>::max()); }

}  // namespace

template <typename Y>
void requantize(const int32_t* acc, int64_t n, int32_t bias, float multiplier, int32_t zero_point, Y* y) {
  const float lo = qmin_f<Y>() - static_cast<float>(zero_point), hi = qmax_f<Y>() - static_cast<float>(zero_point);
  const uint32_t b = static_cast<uint32_t>(bias);
  for (int64_t i = 0; i < n; ++i) {
    const int32_t a = static_cast<int32_t>(static_cast<uint32_t>(acc[i]) + b);  // int32 wrap, as the accumulator
    y[i] = requantize_one<Y>(static_cast<float>(a) * multiplier, lo, hi, zero_point);
  }
}

template <typename Y>
void requantize(const int32_t* acc, int64_t n, const float* multipliers, int32_t zero_point, Y* y) {
  const float lo = qmin_f<Y>() - static_cast<float>(zero_point), hi = qmax_f<Y>() - static_cast<float>(zero_point);
  for (int64_t i = 0; i < n; ++i)
    y[i] = requantize_one<Y>(static_cast<float>(acc[i]) * multipliers[i], lo, hi, zero_point);
}

template void widen<uint8_t>(const uint8_t*, int64_t, int32_t, int16_t*);
template void widen<int8_t>(const int8_t*, int64_t, int32_t, int16_t*);
template void requantize<uint8_t>(const int32_t*, int64_t, int32_t, float, int32_t, uint8_t*);
template void requantize<int8_t>(const int32_t*, int64_t, int32_t, float, int32_t, int8_t*);
template void requantize<uint8_t>(const int32_t*, int64_t, const float*, int32_t, uint8_t*);
template void requantize<int8_t>(const int32_t*, int64_t, const float*, int32_t, int8_t*);

}  // namespace slimquant::runtime::integer
