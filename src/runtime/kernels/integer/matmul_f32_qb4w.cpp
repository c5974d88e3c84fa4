// MatMulQb4w: float32 activations times 4-bit blockwise weights (fused_ops/matmul_qb4w.h).
//
// Hand-written because oneDNN 2.6 has no 4-bit data type (its matmul weights are s8/u8 at the
// narrowest, with integer activations): at batch 1 a MatMul is bound by the bytes of its weights,
// and reading 4 bits a weight instead of 32 is the whole gain.
//
// Layout, made once at creation: per output feature n, K padded to a multiple of 32, stored as
// unsigned nibbles u = q + 8, 16 bytes per 32 inputs: byte j holds input j in its low nibble and
// input 16 + j in its high one, so a mask (or a lookup) and a shift unpack 32 codes. For one row a
// of A:
//
//   y[n] = sum_b s[n, b] * sum_{k in b} a[k] * q[n, k]   (+ bias[n])
//
// The codes become floats in registers and are multiplied by FMA; blocks are multiples of 32
// inputs, so a group of 32 never straddles one.
// ISA: AVX-512F (four weight rows at a time) or AVX2+FMA when the CPU has them
// (__builtin_cpu_supports, checked at creation), a scalar loop otherwise. Up to kGemvRows rows of A run this loop (the packed weight row stays in
// L1 across them); more rows dequantize panels of weights to float and multiply with dnnl_sgemm.
#include <dnnl.h>
#include <immintrin.h>
#include <omp.h>
// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports once they are inlined here (as in int8_depthwise.cpp).
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "runtime/fused_ops/matmul_qb4w.h"
#include "runtime/kernels/elementwise/elementwise_common.h"

namespace slimquant::runtime::fused_ops {
namespace {

constexpr int64_t kGroup = 32;     // inputs per 16 packed bytes
constexpr int64_t kGemvRows = 8;   // rows of A up to which the 4-bit dot products run
constexpr int64_t kPanelRows = 256;  // weight rows dequantized at a time for dnnl_sgemm

using RowDot = float (*)(const uint8_t* codes, const float* scales, const float* a, int64_t kp, int64_t block);

float dot_scalar(const uint8_t* codes, const float* scales, const float* a, int64_t kp, int64_t block) {
  float total = 0.f;
  for (int64_t k0 = 0, b = 0; k0 < kp; k0 += block, ++b) {
    float acc = 0.f;
    for (int64_t k = k0; k < std::min(k0 + block, kp); k += kGroup) {
      const uint8_t* c = codes + k / 2;
      for (int j = 0; j < 16; ++j)
        acc += a[k + j] * static_cast<float>((c[j] & 15) - 8) + a[k + 16 + j] * static_cast<float>((c[j] >> 4) - 8);
    }
    total += scales[b] * acc;
  }
  return total;
}

// Nibbles to signed bytes (u - 8), widened to int32 and converted.
__attribute__((target("avx2,fma"))) float dot_avx2(const uint8_t* codes, const float* scales, const float* a,
                                                  int64_t kp, int64_t block) {
  const __m128i mask = _mm_set1_epi8(0x0F), eight = _mm_set1_epi8(8);
  __m256 total = _mm256_setzero_ps();
  for (int64_t k0 = 0, b = 0; k0 < kp; k0 += block, ++b) {
    __m256 acc0 = _mm256_setzero_ps(), acc1 = _mm256_setzero_ps();
    for (int64_t k = k0; k < std::min(k0 + block, kp); k += kGroup) {
      const __m128i bytes = _mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k / 2));
      const __m128i lo = _mm_sub_epi8(_mm_and_si128(bytes, mask), eight);
      const __m128i hi = _mm_sub_epi8(_mm_and_si128(_mm_srli_epi16(bytes, 4), mask), eight);
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(lo)), _mm256_loadu_ps(a + k), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(lo, lo))),
                             _mm256_loadu_ps(a + k + 8), acc1);
      acc0 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(hi)), _mm256_loadu_ps(a + k + 16), acc0);
      acc1 = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_cvtepi8_epi32(_mm_unpackhi_epi64(hi, hi))),
                             _mm256_loadu_ps(a + k + 24), acc1);
    }
    total = _mm256_fmadd_ps(_mm256_add_ps(acc0, acc1), _mm256_set1_ps(scales[b]), total);
  }
  const __m128 half = _mm_add_ps(_mm256_castps256_ps128(total), _mm256_extractf128_ps(total, 1));
  const __m128 quarter = _mm_add_ps(half, _mm_movehl_ps(half, half));
  return _mm_cvtss_f32(_mm_add_ss(quarter, _mm_shuffle_ps(quarter, quarter, 1)));
}

// AVX-512: the 16 bytes widened to one int32 lane each, and each lane's low nibble (then, shifted,
// its high one) looks up q = u - 8 in a 16-float table (vpermps reads only the index's low 4 bits):
// no integer-to-float conversion.
__attribute__((target("avx512f"))) inline __m512 nibble_table() {
  return _mm512_setr_ps(-8, -7, -6, -5, -4, -3, -2, -1, 0, 1, 2, 3, 4, 5, 6, 7);
}

__attribute__((target("avx512f"))) float dot_avx512(const uint8_t* codes, const float* scales, const float* a,
                                                   int64_t kp, int64_t block) {
  const __m512 table = nibble_table();
  __m512 total = _mm512_setzero_ps();
  for (int64_t k0 = 0, b = 0; k0 < kp; k0 += block, ++b) {
    __m512 acc0 = _mm512_setzero_ps(), acc1 = _mm512_setzero_ps();
    for (int64_t k = k0; k < std::min(k0 + block, kp); k += kGroup) {
      const __m512i x = _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + k / 2)));
      acc0 = _mm512_fmadd_ps(_mm512_permutexvar_ps(x, table), _mm512_loadu_ps(a + k), acc0);
      acc1 = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), table), _mm512_loadu_ps(a + k + 16), acc1);
    }
    total = _mm512_fmadd_ps(_mm512_add_ps(acc0, acc1), _mm512_set1_ps(scales[b]), total);
  }
  return _mm512_reduce_add_ps(total);
}

// Four weight rows against one row of A: each load of A feeds four rows' FMAs, and the four
// accumulator chains are independent (about 20% faster than four single rows, 4096 x 4096).
__attribute__((target("avx512f"))) void dot4_avx512(const uint8_t* codes, int64_t stride, const float* scales,
                                                   int64_t kb, const float* a, int64_t kp, int64_t block, float* out) {
  const __m512 table = nibble_table();
  __m512 total[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
  for (int64_t k0 = 0, b = 0; k0 < kp; k0 += block, ++b) {
    __m512 acc[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    for (int64_t k = k0; k < std::min(k0 + block, kp); k += kGroup) {
      const __m512 a0 = _mm512_loadu_ps(a + k), a1 = _mm512_loadu_ps(a + k + 16);
      for (int r = 0; r < 4; ++r) {
        const __m512i x =
            _mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(codes + r * stride + k / 2)));
        acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(x, table), a0, acc[r]);
        acc[r] = _mm512_fmadd_ps(_mm512_permutexvar_ps(_mm512_srli_epi32(x, 4), table), a1, acc[r]);
      }
    }
    for (int r = 0; r < 4; ++r) total[r] = _mm512_fmadd_ps(acc[r], _mm512_set1_ps(scales[r * kb + b]), total[r]);
  }
  for (int r = 0; r < 4; ++r) out[r] = _mm512_reduce_add_ps(total[r]);
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

RowDot row_dot(Isa isa) { return isa == Isa::kAvx512 ? dot_avx512 : isa == Isa::kAvx2 ? dot_avx2 : dot_scalar; }

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
      : node_(init.node),
        attrs_(MatMulQb4wAttrs::parse(init.node)),
        isa_(pick_isa()),
        dot_(row_dot(isa_)),
        four_rows_(isa_ == Isa::kAvx512) {
    const Tensor* codes = init.constant_input(static_cast<size_t>(MatMulQb4wInput::kCodes));
    const Tensor* scales = init.constant_input(static_cast<size_t>(MatMulQb4wInput::kScales));
    SQ_CHECK(codes && scales && codes->dtype() == DType::kInt8 && codes->rank() == 2 &&
                 scales->dtype() == DType::kFloat32 && scales->rank() == 2,
             ErrorKind::kInvalidModel, node_.describe() + ": needs constant int8 codes and float32 scales, both 2-D");
    SQ_CHECK(attrs_.block_size > 0 && attrs_.block_size % kGroup == 0, ErrorKind::kInvalidModel,
             node_.describe() + ": block_size must be a positive multiple of 32, got " + std::to_string(attrs_.block_size));
    const bool t = attrs_.weight_transposed;
    n_ = codes->dim(t ? 0 : 1);
    k_ = codes->dim(t ? 1 : 0);
    kp_ = (k_ + kGroup - 1) / kGroup * kGroup;
    kb_ = (k_ + attrs_.block_size - 1) / attrs_.block_size;
    const Shape want_scales = t ? Shape{n_, kb_} : Shape{kb_, n_};
    SQ_CHECK(scales->shape() == want_scales, ErrorKind::kInvalidModel,
             node_.describe() + ": scales " + shape_str(scales->shape()) + " do not match codes " +
                 shape_str(codes->shape()) + " with block_size " + std::to_string(attrs_.block_size));
    const int8_t* c = codes->data<int8_t>();
    const float* s = scales->data<float>();
    packed_.assign(static_cast<size_t>(n_ * kp_ / 2), 0x88);  // padding: code 0
    scales_.resize(static_cast<size_t>(n_ * kb_));
    for (int64_t n = 0; n < n_; ++n) {
      uint8_t* row = packed_.data() + n * kp_ / 2;
      for (int64_t k = 0; k < k_; ++k) {
        const int q = t ? c[n * k_ + k] : c[k * n_ + n];
        SQ_CHECK(q >= -8 && q <= 7, ErrorKind::kInvalidModel,
                 node_.describe() + ": code " + std::to_string(q) + " is outside int4's [-8, 7]");
        const int64_t j = k % kGroup;
        uint8_t& byte = row[(k - j) / 2 + (j & 15)];
        const auto u = static_cast<uint8_t>(q + 8);
        byte = j < 16 ? static_cast<uint8_t>((byte & 0xF0) | u) : static_cast<uint8_t>((byte & 0x0F) | (u << 4));
      }
      for (int64_t b = 0; b < kb_; ++b) scales_[static_cast<size_t>(n * kb_ + b)] = t ? s[n * kb_ + b] : s[b * n_ + n];
    }
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
    rows_.assign(static_cast<size_t>(m * kp_), 0.f);  // zero-padded to kp: the padding codes meet 0
    for (int64_t r = 0; r < m; ++r)
      std::memcpy(rows_.data() + r * kp_, a + r * k_, static_cast<size_t>(k_) * sizeof(float));
    parallel_rows(n_, kp_ * m, [&](int64_t n0, int64_t n1) {
      int64_t n = n0;
      float four[4];
      for (; four_rows_ && n + 4 <= n1; n += 4)
        for (int64_t r = 0; r < m; ++r) {
          dot4_avx512(packed_.data() + n * kp_ / 2, kp_ / 2, scales_.data() + n * kb_, kb_, rows_.data() + r * kp_, kp_,
                      attrs_.block_size, four);
          std::memcpy(y + r * n_ + n, four, sizeof(four));
        }
      for (; n < n1; ++n) {
        const uint8_t* codes = packed_.data() + n * kp_ / 2;
        const float* s = scales_.data() + n * kb_;
        for (int64_t r = 0; r < m; ++r)
          y[r * n_ + n] = dot_(codes, s, rows_.data() + r * kp_, kp_, attrs_.block_size);
      }
    });
  }

  void gemm(const float* a, int64_t m, float* y) {
    panel_.resize(static_cast<size_t>(std::min(kPanelRows, n_) * k_));
    for (int64_t n0 = 0; n0 < n_; n0 += kPanelRows) {
      const int64_t rows = std::min(kPanelRows, n_ - n0);
      parallel_rows(rows, k_, [&](int64_t r0, int64_t r1) {
        for (int64_t r = r0; r < r1; ++r) {
          const uint8_t* codes = packed_.data() + (n0 + r) * kp_ / 2;
          const float* s = scales_.data() + (n0 + r) * kb_;
          float* w = panel_.data() + r * k_;
          for (int64_t k = 0; k < k_; ++k) {
            const int64_t j = k % kGroup;
            const uint8_t byte = codes[(k - j) / 2 + (j & 15)];
            const int u = j < 16 ? (byte & 15) : (byte >> 4);
            w[k] = static_cast<float>(u - 8) * s[k / attrs_.block_size];
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
  RowDot dot_;
  bool four_rows_;  // dot4_avx512 for groups of four weight rows
  int64_t n_ = 0, k_ = 0, kp_ = 0, kb_ = 0;
  std::vector<uint8_t> packed_;  // n x kp/2
  std::vector<float> scales_;    // n x kb
  std::vector<float> bias_;
  std::vector<float> rows_, panel_;  // per-run scratch
};

}  // namespace

std::unique_ptr<Kernel> make_matmul_f32_qb4w(const KernelInit& init) { return std::make_unique<MatMulQb4wKernel>(init); }

}  // namespace slimquant::runtime::fused_ops
