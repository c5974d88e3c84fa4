// MatMulQb4w: float32 activations times 4-bit blockwise weights (fused_ops/matmul_qb4w.h).
//
// Hand-written because oneDNN 2.6 has no 4-bit data type (its matmul weights are s8/u8 at the
// narrowest, with integer activations): at batch 1 a MatMul is bound by the bytes of its weights,
// and reading 4 bits a weight instead of 32 is the whole gain.
//
//   y[n] = sum_k a[k] * w[n, k]  (+ bias[n]),   w[n, k] = q[n, k] * s[n, k / block]  rounded to float
//
// every path multiplies A by exactly the float weights the DequantizeLinear would produce (the
// product q * s, one rounding), in its own summation order: the result is the reference's within
// the float rounding of a K-term sum. No activation is quantized.
//
// Layout, made once at creation: per output feature n, K padded to a multiple of 32 and stored as
// unsigned nibbles u = q + 8 (padding u = 8, q = 0), each row starting on a 64-byte line:
//   - chunks of 128 inputs in 64 bytes (one cache line): input 16 p + d (p = 0..7, d = 0..15) is
//     nibble p of the chunk's 32-bit word d, i.e. byte 4 d + p / 2, low nibble when p is even. A
//     512-bit load, shifted right by 4 p, holds in each 32-bit lane's low 4 bits the codes of 16
//     consecutive inputs (lane d: input 16 p + d), which is what vpermps indexes by;
//   - the last K % 128 inputs (rounded up to 32) in groups of 32 in 16 bytes: byte j holds input j
//     in its low nibble and input 16 + j in its high one.
// The rows follow each other, so a pass over the weights reads one sequential stream (the hardware
// prefetcher's best case; the SIMD loops prefetch 3 KiB ahead as well).
//
// ISA: AVX-512F or AVX2 + FMA when the CPU has them (__builtin_cpu_supports, checked at creation;
// SLIMQUANT_QB4W_ISA caps the choice), a scalar loop otherwise. AVX-512 reads w = q * s from a
// 16-float table, the nibble table scaled by the group's scale (one multiply per 32 inputs, or per
// 64 / 128 when the block is a multiple of those), indexed by vpermps with the shifted codes (it
// reads only the index's low 4 bits): per 16 weights one shift, one permute and one FMA. AVX2
// masks the nibble, converts it to float and forms w = u * s - 8 s by FMA (u * s - 8 s = q * s
// exactly before the one rounding). Up to kGemvRows rows of A run these dot products (the packed
// weight row stays in L1 across them); more rows dequantize panels of weights to float and
// multiply with dnnl_sgemm.
//
// int8 activations (attribute int8_activations, from the model's slimquant.int4_activations =
// "int8"; up to kGemvRows rows of A): each group of 32 values of A is rounded to int8 on its own
// symmetric scale s_a = max|a| / 127, and a row's result is
//   sum_g s_w[g] s_a[g] (sum_{k in g} u_k qa_k - 8 sum_{k in g} qa_k)     (u = q + 8, exact in int32)
// which is what ONNX Runtime's MatMulNBits computes at its default accuracy level 4. A second copy
// of the weights is packed for it, per pair of groups in 32 bytes (byte j of group A: inputs j and
// 16 + j as low and high nibble; group B in bytes 16..31), so one load, two masks and two
// vpmaddubsw multiply 64 weights (u unsigned, qa signed: no saturation, 2 * 15 * 127 fits int16).
#include <dnnl.h>
#include <immintrin.h>
#include <omp.h>
// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports once they are inlined here (as in int8_depthwise.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/fused_ops/matmul_qb4w.h"
#include "runtime/kernels/elementwise/elementwise_common.h"

namespace slimquant::runtime::fused_ops {
namespace {

constexpr int64_t kGroup = 32;       // inputs per scale lookup (blocks are multiples of it)
constexpr int64_t kChunk = 128;      // inputs per 64-byte chunk
constexpr int64_t kLine = 64;        // bytes: a chunk, the row alignment
constexpr int64_t kGemvRows = 8;     // rows of A up to which the 4-bit dot products run
constexpr int64_t kPanelRows = 256;  // weight rows dequantized at a time for dnnl_sgemm
constexpr int64_t kPrefetch = 3072;  // bytes ahead of the chunk being read (1-4 KiB measure alike)
constexpr int64_t kPair = 64;        // int8 activations: inputs per pair of groups (32 bytes of codes)

// Where input k of a row is: byte offset in the row and shift of its nibble (nc: full chunks).
struct NibbleAt {
  int64_t byte;
  int shift;
};
inline NibbleAt nibble_at(int64_t k, int64_t nc) {
  if (k < nc * kChunk) {
    const int64_t i = k % kChunk;  // input 16 p + d: byte 4 d + p / 2
    return {k / kChunk * kLine + 4 * (i % 16) + i / 32, static_cast<int>(4 * ((i / 16) & 1))};
  }
  const int64_t t = k - nc * kChunk, i = t % kGroup;  // input j (low) or 16 + j (high) of byte j
  return {nc * kLine + t / kGroup * 16 + i % 16, static_cast<int>(4 * (i / 16))};
}

// Zero-initialised float / byte storage starting on a 64-byte line.
template <typename T>
class LineAligned {
 public:
  void reset(size_t n, T fill) {
    raw_.assign(n + kLine / sizeof(T), fill);
    const auto addr = reinterpret_cast<uintptr_t>(raw_.data());
    begin_ = raw_.data() + (kLine - addr % kLine) % kLine / sizeof(T);
  }
  T* data() { return begin_; }
  const T* data() const { return begin_; }

 private:
  std::vector<T> raw_;
  T* begin_ = nullptr;
};

// One weight row against one row of A (padded to kp with zeros). gb: block index of each group of
// 32 inputs; nc full chunks, then tail groups of 32.
struct RowArgs {
  const uint8_t* codes;
  const float* scales;  // the row's kb scales
  const int32_t* group_block;
  const float* a;
  int64_t nc, tail_groups;
};
using RowDot = float (*)(const RowArgs&);

float dot_scalar(const RowArgs& r) {
  float total = 0.f;
  const int64_t kp = r.nc * kChunk + r.tail_groups * kGroup;
  for (int64_t k = 0; k < kp; ++k) {
    const NibbleAt at = nibble_at(k, r.nc);
    const int q = ((r.codes[at.byte] >> at.shift) & 15) - 8;
    total += r.a[k] * (static_cast<float>(q) * r.scales[r.group_block[k / kGroup]]);
  }
  return total;
}

// 8 lanes of nibbles (already shifted down) to w = q * s: u * s - 8 s, one rounding.
__attribute__((target("avx2,fma"))) inline __m256 weights_avx2(__m256i shifted, __m256 s, __m256 minus8s) {
  const __m256 u = _mm256_cvtepi32_ps(_mm256_and_si256(shifted, _mm256_set1_epi32(15)));
  return _mm256_fmadd_ps(u, s, minus8s);
}

// Four accumulators: each chunk's 16 products then form four chains of 4 FMAs, so the FMA latency
// (4 cycles) no longer bounds the loop; with two chains of 8 it did (7 weights a cycle at best:
// 17.9 ms for the 12 x 4096 x 4096 stack on Zen 3, against 13.1 ms for ONNX Runtime's MatMulNBits).
__attribute__((target("avx2,fma"))) float dot_avx2(const RowArgs& r) {
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps(), acc2 = _mm256_setzero_ps(),
         acc3 = _mm256_setzero_ps();
  for (int64_t c = 0; c < r.nc; ++c) {
    _mm_prefetch(reinterpret_cast<const char*>(r.codes + c * kLine + kPrefetch), _MM_HINT_T0);
    // 32-bit words d = 0..7 and 8..15 of the chunk; nibble p of word d is input 16 p + d.
    const __m256i x0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.codes + c * kLine));
    const __m256i x1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.codes + c * kLine + 32));
    const float* a = r.a + c * kChunk;
    for (int g = 0; g < 4; ++g) {  // group g: nibbles p = 2 g, 2 g + 1
      const __m256 s = _mm256_set1_ps(r.scales[r.group_block[c * 4 + g]]);
      const __m256 m8s = _mm256_mul_ps(s, _mm256_set1_ps(-8.f));
      const __m128i lo = _mm_cvtsi32_si128(8 * g), hi = _mm_cvtsi32_si128(8 * g + 4);
      acc0 = _mm256_fmadd_ps(weights_avx2(_mm256_srl_epi32(x0, lo), s, m8s), _mm256_loadu_ps(a + 32 * g), acc0);
      acc1 = _mm256_fmadd_ps(weights_avx2(_mm256_srl_epi32(x1, lo), s, m8s), _mm256_loadu_ps(a + 32 * g + 8), acc1);
      acc2 = _mm256_fmadd_ps(weights_avx2(_mm256_srl_epi32(x0, hi), s, m8s), _mm256_loadu_ps(a + 32 * g + 16), acc2);
      acc3 = _mm256_fmadd_ps(weights_avx2(_mm256_srl_epi32(x1, hi), s, m8s), _mm256_loadu_ps(a + 32 * g + 24), acc3);
    }
  }
  for (int64_t t = 0; t < r.tail_groups; ++t) {
    const uint8_t* codes = r.codes + r.nc * kLine + t * 16;
    const float* a = r.a + r.nc * kChunk + t * kGroup;
    const __m256 s = _mm256_set1_ps(r.scales[r.group_block[r.nc * 4 + t]]);
    const __m256 m8s = _mm256_mul_ps(s, _mm256_set1_ps(-8.f));
    const __m256i x0 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes)));
    const __m256i x1 = _mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(codes + 8)));
    acc0 = _mm256_fmadd_ps(weights_avx2(x0, s, m8s), _mm256_loadu_ps(a), acc0);
    acc1 = _mm256_fmadd_ps(weights_avx2(x1, s, m8s), _mm256_loadu_ps(a + 8), acc1);
    acc2 = _mm256_fmadd_ps(weights_avx2(_mm256_srli_epi32(x0, 4), s, m8s), _mm256_loadu_ps(a + 16), acc2);
    acc3 = _mm256_fmadd_ps(weights_avx2(_mm256_srli_epi32(x1, 4), s, m8s), _mm256_loadu_ps(a + 24), acc3);
  }
  const __m256 total = _mm256_add_ps(_mm256_add_ps(acc0, acc1), _mm256_add_ps(acc2, acc3));
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(total), _mm256_extractf128_ps(total, 1));
  const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
}

// AVX-512: q = u - 8 for u = 0..15; scaled by a group's scale it is that group's 16 weights.
__attribute__((target("avx512f"))) inline __m512 nibble_table() {
  return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}

// kEvery: groups of 32 that share a scale table (1, 2 or 4: the block is a multiple of 32 kEvery).
template <int kEvery>
__attribute__((target("avx512f"))) float dot_avx512(const RowArgs& r) {
  const __m512 base = nibble_table();
  __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps(), acc2 = _mm512_setzero_ps(),
         acc3 = _mm512_setzero_ps();
  __m512 w = base;
  const float* s = r.scales;
  const int32_t* gb = r.group_block;
  for (int64_t c = 0; c < r.nc; ++c, gb += 4) {
    _mm_prefetch(reinterpret_cast<const char*>(r.codes + c * kLine + kPrefetch), _MM_HINT_T0);
    const __m512i x = _mm512_load_si512(r.codes + c * kLine);
    const float* a = r.a + c * kChunk;
    w = _mm512_mul_ps(base, _mm512_set1_ps(s[gb[0]]));
    acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(x, w), _mm512_load_ps(a), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), w), _mm512_load_ps(a + 16), acc1);
    if (kEvery == 1) w = _mm512_mul_ps(base, _mm512_set1_ps(s[gb[1]]));
    acc2 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 8), w), _mm512_load_ps(a + 32), acc2);
    acc3 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 12), w), _mm512_load_ps(a + 48), acc3);
    if (kEvery <= 2) w = _mm512_mul_ps(base, _mm512_set1_ps(s[gb[2]]));
    acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 16), w), _mm512_load_ps(a + 64), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 20), w), _mm512_load_ps(a + 80), acc1);
    if (kEvery == 1) w = _mm512_mul_ps(base, _mm512_set1_ps(s[gb[3]]));
    acc2 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 24), w), _mm512_load_ps(a + 96), acc2);
    acc3 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 28), w), _mm512_load_ps(a + 112), acc3);
  }
  for (int64_t t = 0; t < r.tail_groups; ++t) {
    const __m512i x =
        _mm512_cvtepu8_epi32(_mm_load_si128(reinterpret_cast<const __m128i*>(r.codes + r.nc * kLine + t * 16)));
    const float* a = r.a + r.nc * kChunk + t * kGroup;
    w = _mm512_mul_ps(base, _mm512_set1_ps(s[r.group_block[r.nc * 4 + t]]));
    acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(x, w), _mm512_loadu_ps(a), acc0);
    acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), w), _mm512_loadu_ps(a + 16), acc1);
  }
  return _mm512_reduce_add_ps(_mm512_add_ps(_mm512_add_ps(acc0, acc1), _mm512_add_ps(acc2, acc3)));
}

// ---- int8 activations ----------------------------------------------------------------------------

// One row of A rounded for the int8 path, in the codes' pair layout: per pair p of groups (A = 2 p,
// B = 2 p + 1), 64 bytes [A 0..15, B 0..15, A 16..31, B 16..31]; per pair 8 lane scales
// [s_a(A) x4, s_a(B) x4] and 8 int32 lane corrections [-8 sum qa(A), 0, 0, 0, -8 sum qa(B), 0, 0, 0].
struct Int8Row {
  const int8_t* qa;
  const float* lane_scales;
  const int32_t* lane_corrections;
};
struct Int8RowArgs {
  const uint8_t* codes;        // the weight row, pairs * 32 bytes
  const float* group_scales;   // s_w per group of 32 (pairs * 2)
  Int8Row a;
  int64_t pairs;
};
using Int8RowDot = float (*)(const Int8RowArgs&);

float dot_int8_scalar(const Int8RowArgs& r) {
  float total = 0.f;
  for (int64_t p = 0; p < r.pairs; ++p) {
    const uint8_t* codes = r.codes + p * 32;
    const int8_t* qa = r.a.qa + p * kPair;
    for (int half = 0; half < 2; ++half) {  // group A (bytes 0..15), B (16..31)
      int32_t sum = r.a.lane_corrections[p * 8 + 4 * half];
      for (int j = 0; j < 16; ++j) {
        const uint8_t byte = codes[16 * half + j];
        sum += (byte & 15) * qa[16 * half + j] + (byte >> 4) * qa[32 + 16 * half + j];
      }
      total += static_cast<float>(sum) * (r.group_scales[2 * p + half] * r.a.lane_scales[p * 8 + 4 * half]);
    }
  }
  return total;
}

// 64 weights of pair p against A's pair p: the 8 lanes' [A x4, B x4] products, scaled.
__attribute__((target("avx2,fma"))) inline __m256 pair_products_avx2(const Int8RowArgs& r, int64_t p, __m256i low4,
                                                                     __m256i ones, __m256i spread) {
  const __m256i x = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.codes + p * 32));
  const __m256i lo = _mm256_and_si256(x, low4), hi = _mm256_and_si256(_mm256_srli_epi16(x, 4), low4);
  const int8_t* qa = r.a.qa + p * kPair;
  const __m256i prod =
      _mm256_add_epi16(_mm256_maddubs_epi16(lo, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa))),
                       _mm256_maddubs_epi16(hi, _mm256_loadu_si256(reinterpret_cast<const __m256i*>(qa + 32))));
  const __m256i sums =
      _mm256_add_epi32(_mm256_madd_epi16(prod, ones),
                       _mm256_loadu_si256(reinterpret_cast<const __m256i*>(r.a.lane_corrections + p * 8)));
  const __m256 w_scales = _mm256_permutevar8x32_ps(
      _mm256_castpd_ps(_mm256_broadcast_sd(reinterpret_cast<const double*>(r.group_scales + 2 * p))), spread);
  return _mm256_mul_ps(_mm256_cvtepi32_ps(sums), _mm256_mul_ps(w_scales, _mm256_loadu_ps(r.a.lane_scales + p * 8)));
}

__attribute__((target("avx2,fma"))) float dot_int8_avx2(const Int8RowArgs& r) {
  const __m256i low4 = _mm256_set1_epi8(15), ones = _mm256_set1_epi16(1);
  const __m256i spread = _mm256_setr_epi32(0, 0, 0, 0, 1, 1, 1, 1);  // [A x4, B x4] from (A, B)
  __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
  int64_t p = 0;
  // Two pairs (128 weights, two cache lines' halves) an iteration, each into its own accumulator.
  for (; p + 2 <= r.pairs; p += 2) {
    _mm_prefetch(reinterpret_cast<const char*>(r.codes + p * 32 + kPrefetch), _MM_HINT_T0);
    acc0 = _mm256_add_ps(acc0, pair_products_avx2(r, p, low4, ones, spread));
    acc1 = _mm256_add_ps(acc1, pair_products_avx2(r, p + 1, low4, ones, spread));
  }
  if (p < r.pairs) acc0 = _mm256_add_ps(acc0, pair_products_avx2(r, p, low4, ones, spread));
  const __m256 total = _mm256_add_ps(acc0, acc1);
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(total), _mm256_extractf128_ps(total, 1));
  const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
}

// The widest ISA the CPU has, at most SLIMQUANT_QB4W_ISA (avx512, avx2 or scalar: lets the tests
// run every path on one machine).
enum class Isa { kScalar, kAvx2, kAvx512 };
Isa pick_isa() {
  const char* cap = std::getenv("SLIMQUANT_QB4W_ISA");
  const std::string limit = cap ? cap : "avx512";
  if (limit == "avx512" && __builtin_cpu_supports("avx512f")) return Isa::kAvx512;
  if (limit != "scalar" && __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) return Isa::kAvx2;
  return Isa::kScalar;
}

RowDot row_dot(Isa isa, int64_t block) {
  if (isa == Isa::kAvx512) {
    const int64_t groups = block / kGroup;
    return groups % 4 == 0 ? dot_avx512<4> : groups % 2 == 0 ? dot_avx512<2> : dot_avx512<1>;
  }
  return isa == Isa::kAvx2 ? dot_avx2 : dot_scalar;
}

// Calls fn(begin, end) over [0, n) split across threads when n * work_per_item is large.
template <typename Fn>
void parallel_rows(int64_t n, int64_t work_per_item, Fn&& fn) {
  const int nt = std::min<int64_t>(ew::threads_for(n * work_per_item), n);
  if (nt <= 1) {
    if (n > 0) fn(int64_t{0}, n);
    return;
  }
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), count = omp_get_num_threads();
    const int64_t begin = n * t / count, end = n * (t + 1) / count;
    if (begin < end) fn(begin, end);
  }
}

class MatMulQb4wKernel final : public Kernel {
 public:
  explicit MatMulQb4wKernel(const KernelInit& init)
      : node_(init.node), attrs_(MatMulQb4wAttrs::parse(init.node)), isa_(pick_isa()) {
    const Tensor* codes = init.constant_input(static_cast<size_t>(MatMulQb4wInput::kCodes));
    const Tensor* scales = init.constant_input(static_cast<size_t>(MatMulQb4wInput::kScales));
    SQ_CHECK(codes && scales && codes->dtype() == DType::kInt8 && codes->rank() == 2 &&
                 scales->dtype() == DType::kFloat32 && scales->rank() == 2,
             ErrorKind::kInvalidModel, node_.describe() + ": needs constant int8 codes and float32 scales, both 2-D");
    SQ_CHECK(attrs_.block_size > 0 && attrs_.block_size % kGroup == 0, ErrorKind::kInvalidModel,
             node_.describe() + ": block_size must be a positive multiple of 32, got " + std::to_string(attrs_.block_size));
    dot_ = row_dot(isa_, attrs_.block_size);
    const bool t = attrs_.weight_transposed;
    n_ = codes->dim(t ? 0 : 1);
    k_ = codes->dim(t ? 1 : 0);
    kp_ = (k_ + kGroup - 1) / kGroup * kGroup;
    kb_ = (k_ + attrs_.block_size - 1) / attrs_.block_size;
    nc_ = kp_ / kChunk;
    tail_groups_ = (kp_ - nc_ * kChunk) / kGroup;
    stride_ = (kp_ / 2 + kLine - 1) / kLine * kLine;
    const Shape want_scales = t ? Shape{n_, kb_} : Shape{kb_, n_};
    SQ_CHECK(scales->shape() == want_scales, ErrorKind::kInvalidModel,
             node_.describe() + ": scales " + shape_str(scales->shape()) + " do not match codes " +
                 shape_str(codes->shape()) + " with block_size " + std::to_string(attrs_.block_size));
    const int8_t* c = codes->data<int8_t>();
    const float* s = scales->data<float>();
    packed_.reset(static_cast<size_t>(n_ * stride_), 0x88);  // padding: code 0
    scales_.resize(static_cast<size_t>(n_ * kb_));
    group_block_.resize(static_cast<size_t>(kp_ / kGroup));
    for (int64_t g = 0; g < kp_ / kGroup; ++g) group_block_[static_cast<size_t>(g)] = static_cast<int32_t>(g * kGroup / attrs_.block_size);
    for (int64_t n = 0; n < n_; ++n) {
      uint8_t* row = packed_.data() + n * stride_;
      for (int64_t k = 0; k < k_; ++k) {
        const int q = t ? c[n * k_ + k] : c[k * n_ + n];
        SQ_CHECK(q >= -8 && q <= 7, ErrorKind::kInvalidModel,
                 node_.describe() + ": code " + std::to_string(q) + " is outside int4's [-8, 7]");
        const NibbleAt at = nibble_at(k, nc_);
        uint8_t& byte = row[at.byte];
        byte = static_cast<uint8_t>((byte & ~(15 << at.shift)) | ((q + 8) << at.shift));
      }
      for (int64_t b = 0; b < kb_; ++b) scales_[static_cast<size_t>(n * kb_ + b)] = t ? s[n * kb_ + b] : s[b * n_ + n];
    }
    if (attrs_.int8_activations) pack_for_int8(c, s);
    const size_t bias_slot = static_cast<size_t>(MatMulQb4wInput::kBias);
    if (init.node.inputs.size() > bias_slot && !init.node.inputs[bias_slot].empty()) {
      const Tensor* bias = init.constant_input(bias_slot);
      SQ_CHECK(bias && bias->dtype() == DType::kFloat32 && bias->numel() == n_, ErrorKind::kInvalidModel,
               node_.describe() + ": the bias must be a float32 constant of " + std::to_string(n_) + " values");
      bias_ = bias->to_float_vector();
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& a = ctx.input(static_cast<size_t>(MatMulQb4wInput::kA));
    SQ_CHECK(a.dtype() == DType::kFloat32 && a.rank() >= 1 && a.dim(a.rank() - 1) == k_, ErrorKind::kInvalidArgument,
             node_.describe() + ": input A " + shape_str(a.shape()) + " must be float32 with " + std::to_string(k_) +
                 " values in its last dimension");
    Shape out = a.shape();
    out.back() = n_;
    const int64_t m = a.numel() / std::max<int64_t>(k_, 1);
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, out);
    if (m == 0) return;
    if (k_ == 0) {
      std::fill(y.data<float>(), y.data<float>() + y.numel(), 0.f);
    } else if (m <= kGemvRows && attrs_.int8_activations) {
      gemv_int8(a.data<float>(), m, y.data<float>());
    } else if (m <= kGemvRows) {
      gemv(a.data<float>(), m, y.data<float>());
    } else {
      gemm(a.data<float>(), m, y.data<float>());
    }
    if (!bias_.empty()) {
      float* py = y.data<float>();
      for (int64_t r = 0; r < m; ++r)
        for (int64_t n = 0; n < n_; ++n) py[r * n_ + n] += bias_[static_cast<size_t>(n)];
    }
  }

 private:
  void gemv(const float* a, int64_t m, float* y) {
    rows_.reset(static_cast<size_t>(m * kp_), 0.f);  // zero-padded to kp: the padding codes meet 0
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(rows_.data() + r * kp_, a + r * k_, static_cast<size_t>(k_) * sizeof(float));
    parallel_rows(n_, kp_ * m, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        RowArgs args{packed_.data() + n * stride_, scales_.data() + n * kb_, group_block_.data(), nullptr, nc_,
                     tail_groups_};
        for (int64_t r = 0; r < m; ++r) {
          args.a = rows_.data() + r * kp_;
          y[r * n_ + n] = dot_(args);
        }
      }
    });
  }

  // The int8 path's copy of the weights (pair layout, see Int8Row) and s_w per group of 32.
  void pack_for_int8(const int8_t* c, const float* s) {
    const bool t = attrs_.weight_transposed;
    pairs_ = (k_ + kPair - 1) / kPair;
    packed_int8_.reset(static_cast<size_t>(n_ * pairs_ * 32), 0x88);  // padding: code 0
    group_scales_.assign(static_cast<size_t>(n_ * pairs_ * 2), 0.f);
    for (int64_t n = 0; n < n_; ++n) {
      uint8_t* row = packed_int8_.data() + n * pairs_ * 32;
      for (int64_t k = 0; k < k_; ++k) {
        const int q = t ? c[n * k_ + k] : c[k * n_ + n];
        const int64_t g = k / kGroup, i = k % kGroup;
        uint8_t& byte = row[g / 2 * 32 + (g % 2) * 16 + i % 16];
        const int shift = i < 16 ? 0 : 4;
        byte = static_cast<uint8_t>((byte & ~(15 << shift)) | ((q + 8) << shift));
      }
      for (int64_t g = 0; g * kGroup < k_; ++g) {
        const int64_t b = g * kGroup / attrs_.block_size;
        group_scales_[static_cast<size_t>(n * pairs_ * 2 + g)] = t ? s[n * kb_ + b] : s[b * n_ + n];
      }
    }
    int8_dot_ = isa_ == Isa::kScalar ? dot_int8_scalar : dot_int8_avx2;
  }

  // Rounds row r of A (k values) into the pair layout.
  void round_row_to_int8(const float* a, int8_t* qa, float* lane_scales, int32_t* lane_corrections) const {
    std::memset(qa, 0, static_cast<size_t>(pairs_ * kPair));
    for (int64_t g = 0; g < pairs_ * 2; ++g) {
      const int64_t k0 = g * kGroup, k1 = std::min(k_, k0 + kGroup);
      float amax = 0.f;
      for (int64_t k = k0; k < k1; ++k) amax = std::max(amax, std::fabs(a[k]));
      const float scale = amax / 127.f, inverse = amax > 0.f ? 127.f / amax : 0.f;
      int32_t sum = 0;
      int8_t* pair = qa + g / 2 * kPair + (g % 2) * 16;
      for (int64_t k = k0; k < k1; ++k) {
        const int64_t i = k - k0;
        const auto v = static_cast<int8_t>(std::clamp(std::nearbyint(a[k] * inverse), -127.f, 127.f));
        pair[(i < 16 ? 0 : 32) + i % 16] = v;
        sum += v;
      }
      const int64_t lane = g / 2 * 8 + (g % 2) * 4;
      for (int l = 0; l < 4; ++l) {
        lane_scales[lane + l] = scale;
        lane_corrections[lane + l] = l == 0 ? -8 * sum : 0;
      }
    }
  }

  void gemv_int8(const float* a, int64_t m, float* y) {
    qa_.reset(static_cast<size_t>(m * pairs_ * kPair), 0);
    lane_scales_.resize(static_cast<size_t>(m * pairs_ * 8));
    lane_corrections_.resize(static_cast<size_t>(m * pairs_ * 8));
    for (int64_t r = 0; r < m; ++r)
      round_row_to_int8(a + r * k_, qa_.data() + r * pairs_ * kPair, lane_scales_.data() + r * pairs_ * 8,
                        lane_corrections_.data() + r * pairs_ * 8);
    parallel_rows(n_, pairs_ * kPair * m / 4, [&](int64_t n0, int64_t n1) {
      for (int64_t n = n0; n < n1; ++n) {
        Int8RowArgs args{packed_int8_.data() + n * pairs_ * 32, group_scales_.data() + n * pairs_ * 2, {}, pairs_};
        for (int64_t r = 0; r < m; ++r) {
          args.a = {qa_.data() + r * pairs_ * kPair, lane_scales_.data() + r * pairs_ * 8,
                    lane_corrections_.data() + r * pairs_ * 8};
          y[r * n_ + n] = int8_dot_(args);
        }
      }
    });
  }

  void gemm(const float* a, int64_t m, float* y) {
    panel_.resize(static_cast<size_t>(std::min(kPanelRows, n_) * k_));
    for (int64_t n0 = 0; n0 < n_; n0 += kPanelRows) {
      const int64_t rows = std::min(kPanelRows, n_ - n0);
      parallel_rows(rows, k_, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const uint8_t* codes = packed_.data() + (n0 + r) * stride_;
          const float* s = scales_.data() + (n0 + r) * kb_;
          float* w = panel_.data() + r * k_;
          for (int64_t k = 0; k < k_; ++k) {
            const NibbleAt at = nibble_at(k, nc_);
            const int q = ((codes[at.byte] >> at.shift) & 15) - 8;
            w[k] = static_cast<float>(q) * s[k / attrs_.block_size];
          }
        }
      });
      const dnnl_status_t st = dnnl_sgemm('N', 'T', m, rows, k_, 1.f, a, k_, panel_.data(), k_, 0.f, y + n0, n_);
      SQ_CHECK(st == dnnl_success, ErrorKind::kInternal, node_.describe() + ": dnnl_sgemm failed");
    }
  }

  const ir::Node& node_;
  MatMulQb4wAttrs attrs_;
  Isa isa_;
  RowDot dot_ = nullptr;
  int64_t n_ = 0, k_ = 0, kp_ = 0, kb_ = 0;
  int64_t nc_ = 0, tail_groups_ = 0;  // per row: full 128-input chunks, then groups of 32
  int64_t stride_ = 0;                // bytes per packed row (a multiple of 64)
  LineAligned<uint8_t> packed_;       // n x stride
  std::vector<float> scales_;         // n x kb
  std::vector<int32_t> group_block_;  // kp / 32: the block of each group of 32 inputs
  std::vector<float> bias_;
  LineAligned<float> rows_;  // per-run scratch: the rows of A, each padded to kp
  std::vector<float> panel_;
  // int8 activations (attrs_.int8_activations): the weights again, per pair of groups of 32
  int64_t pairs_ = 0;
  LineAligned<uint8_t> packed_int8_;  // n x pairs x 32 bytes
  std::vector<float> group_scales_;   // n x pairs x 2: s_w per group
  Int8RowDot int8_dot_ = nullptr;
  LineAligned<int8_t> qa_;            // per-run scratch: A rounded, m x pairs x 64
  std::vector<float> lane_scales_;
  std::vector<int32_t> lane_corrections_;
};

}  // namespace

std::unique_ptr<Kernel> make_matmul_f32_qb4w(const KernelInit& init) { return std::make_unique<MatMulQb4wKernel>(init); }

}  // namespace slimquant::runtime::fused_ops
