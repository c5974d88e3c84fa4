// Softmax and LogSoftmax on oneDNN's softmax_v2_forward (softmax_accurate / softmax_log, both
// subtract the row maximum first, so large inputs do not overflow). On CPUs with AVX-512, Softmax
// over contiguous rows (the normalised axis innermost: attention scores, classifier outputs) runs
// on softmax_rows_avx512 below instead: oneDNN 2.6's kernel took 1.7x ONNX Runtime's time on
// ViT-B/16's rows of 197 (4.1 against 2.4 ms a run).
//
// Opsets 1-12: the input is coerced to 2-D [prod(dims < axis), prod(dims >= axis)] and normalised
// along the second dim (axis default 1). Opset 13+: normalised along `axis` alone (default -1).
// Either way X is viewed as [outer, n, inner] (same bytes), which also keeps the rank within
// oneDNN's limit.
#include <immintrin.h>

#include <algorithm>
#include <cstdlib>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/elementwise/avx512_exp.h"
#include "runtime/kernels/elementwise/gelu_avx512.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports once they are inlined here (as in int8_depthwise.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// exp(x) for x <= 0 (x - row maximum): below the normal range 0; NaN stays NaN.
__attribute__((target("avx512f"))) inline __m512 exp_nonpositive_avx512(__m512 x) {
  const __mmask16 underflow = _mm512_cmp_ps_mask(x, _mm512_set1_ps(ew::kExpLowest), _CMP_LT_OQ);
  return _mm512_maskz_mov_ps(static_cast<__mmask16>(~underflow), ew::exp_in_range_avx512(x));
}

// Rows of n <= 16 V values, R at a time, each row held in V registers from its load to its store
// (masked lanes read as -inf, whose exponential is 0). In rows this short the two horizontal
// reductions' latency dominates; R independent rows overlap theirs. Attention at ViT-small sizes
// (rows of 50): 0.19 -> 0.14 ms for [32, 4, 50, 50] (four rows at a time; two: 0.15 ms).
template <int V, int R>
__attribute__((target("avx512f"))) inline void softmax_short_rows(const float* x, float* y, int64_t n,
                                                                  __mmask16 last) {
  __m512 v[R][V], m[R], sum[R];
  for (int r = 0; r < R; ++r) {
    const float* row = x + r * n;
    for (int j = 0; j + 1 < V; ++j) v[r][j] = _mm512_loadu_ps(row + 16 * j);
    v[r][V - 1] = _mm512_mask_loadu_ps(_mm512_set1_ps(-__builtin_inff()), last, row + 16 * (V - 1));
    __m512 hi = v[r][0];
    for (int j = 1; j < V; ++j) hi = _mm512_max_ps(hi, v[r][j]);
    m[r] = _mm512_set1_ps(_mm512_reduce_max_ps(hi));
  }
  for (int r = 0; r < R; ++r) {
    sum[r] = _mm512_setzero_ps();
    for (int j = 0; j < V; ++j) {
      v[r][j] = exp_nonpositive_avx512(_mm512_sub_ps(v[r][j], m[r]));
      sum[r] = _mm512_add_ps(sum[r], v[r][j]);
    }
    sum[r] = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum[r]));
  }
  for (int r = 0; r < R; ++r) {
    float* row = y + r * n;
    for (int j = 0; j + 1 < V; ++j) _mm512_storeu_ps(row + 16 * j, _mm512_mul_ps(v[r][j], sum[r]));
    _mm512_mask_storeu_ps(row + 16 * (V - 1), last, _mm512_mul_ps(v[r][V - 1], sum[r]));
  }
}

template <int V>
__attribute__((target("avx512f"))) void softmax_short_rows(const float* x, float* y, int64_t rows, int64_t n) {
  constexpr int kRows = 4;
  const auto last = static_cast<__mmask16>(0xffffu >> (16 * V - n));
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows) softmax_short_rows<V, kRows>(x + r * n, y + r * n, n, last);
  for (; r < rows; ++r) softmax_short_rows<V, 1>(x + r * n, y + r * n, n, last);
}

// y = exp(x - max x) / sum exp(x - max x) per row of n contiguous values. Rows of up to 64 values
// stay in registers (above); longer ones take three passes over the row while it is in L1 (the
// maximum; the exponentials, stored, and their sum; one multiply by the reciprocal of the sum), the
// row's last partial vector under a mask. A NaN in a row makes the row NaN (through its
// exponential and the sum), as the ONNX definition does.
__attribute__((target("avx512f"))) void softmax_rows_avx512(const float* x, float* y, int64_t rows, int64_t n) {
  switch ((n + 15) / 16) {
    case 1: return softmax_short_rows<1>(x, y, rows, n);
    case 2: return softmax_short_rows<2>(x, y, rows, n);
    case 3: return softmax_short_rows<3>(x, y, rows, n);
    case 4: return softmax_short_rows<4>(x, y, rows, n);
    default: break;
  }
  const int64_t full = n / 16 * 16;
  const auto tail = static_cast<__mmask16>((1u << (n - full)) - 1u);
  for (int64_t r = 0; r < rows; ++r, x += n, y += n) {
    __m512 hi = _mm512_set1_ps(-__builtin_inff());
    for (int64_t i = 0; i < full; i += 16) hi = _mm512_max_ps(hi, _mm512_loadu_ps(x + i));
    if (tail) hi = _mm512_mask_max_ps(hi, tail, hi, _mm512_maskz_loadu_ps(tail, x + full));
    const __m512 m = _mm512_set1_ps(_mm512_reduce_max_ps(hi));
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += 16) {
      const __m512 e = exp_nonpositive_avx512(_mm512_sub_ps(_mm512_loadu_ps(x + i), m));
      _mm512_storeu_ps(y + i, e);
      sum = _mm512_add_ps(sum, e);
    }
    if (tail) {
      const __m512 e = exp_nonpositive_avx512(_mm512_sub_ps(_mm512_maskz_loadu_ps(tail, x + full), m));
      _mm512_mask_storeu_ps(y + full, tail, e);
      sum = _mm512_mask_add_ps(sum, tail, sum, e);
    }
    const __m512 inverse = _mm512_set1_ps(1.f / _mm512_reduce_add_ps(sum));
    for (int64_t i = 0; i < full; i += 16) _mm512_storeu_ps(y + i, _mm512_mul_ps(_mm512_loadu_ps(y + i), inverse));
    if (tail) _mm512_mask_storeu_ps(y + full, tail, _mm512_mul_ps(_mm512_maskz_loadu_ps(tail, y + full), inverse));
  }
}

#pragma GCC diagnostic pop

// The own rows kernel where the CPU has AVX-512 (SLIMQUANT_SOFTMAX=dnnl keeps oneDNN's, to compare).
bool own_softmax_rows() {
  static const bool on = [] {
    const char* v = std::getenv("SLIMQUANT_SOFTMAX");
    return __builtin_cpu_supports("avx512f") && !(v && std::string(v) == "dnnl");
  }();
  return on;
}

struct SoftmaxPlan {
  int64_t rows = 0, n = 0;  // rows > 0: softmax_rows_avx512 over [rows, n], no primitive
  dnnl::softmax_v2_forward prim;
  memory src, dst, scratchpad;  // bound once, pointed at each call's data
  std::unordered_map<int, memory> args;
};

class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(const KernelInit& init, bool log)
      : node_(init.node), log_(log), coerce_2d_(init.opset < 13),
        axis_(node_.attr_int("axis", init.opset < 13 ? 1 : -1)), quantize_(folded_quantize(init.node)) {
    reject_fused_activation(node_);
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_float32(node_, x, "input");
    SoftmaxPlan& p = plans_.get({&x.shape()}, [&] { return make_plan(x.shape()); });
    Tensor& y = ctx.allocate_output(0, quantize_ ? quantize_->dtype : DType::kFloat32, x.shape());
    if (y.numel() == 0) return;
    if (quantize_) {
      run_quantized(p, x, y);
      return;
    }
    if (p.rows > 0) {
      softmax_rows_avx512(x.data<float>(), y.data<float>(), p.rows, p.n);
      return;
    }
    run_primitive(p, x.raw(), y.raw());
  }

 private:
  SoftmaxPlan make_plan(const Shape& xs) const {
    const int64_t rank = static_cast<int64_t>(xs.size());
    // A scalar is a one-element row.
    const int64_t axis = rank == 0 ? 0 : normalize_axis(axis_, rank, node_.describe() + " axis");
    int64_t outer = 1, n = 1, inner = 1;
    for (int64_t i = 0; i < rank; ++i) {
      if (i < axis) outer *= xs[i];
      else if (i == axis || coerce_2d_) n *= xs[i];
      else inner *= xs[i];
    }
    SoftmaxPlan p;
    if (inner == 1 && !log_ && own_softmax_rows()) {
      p.rows = outer;
      p.n = n;
      return p;
    }
    // inner == 1 is the common case (last axis); a 2-D view lets oneDNN use its vectorised kernel.
    const memory::desc data = inner == 1 ? memory::desc({outer, n}, dt::f32, memory::format_tag::ab)
                                         : memory::desc({outer, n, inner}, dt::f32, memory::format_tag::abc);
    const auto alg = log_ ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate;
    using sm = dnnl::softmax_v2_forward;
    auto pd = make_pd(node_, "this softmax", [&] {
      return sm::primitive_desc(sm::desc(dnnl::prop_kind::forward_inference, alg, data, data, 1), base_attr(),
                                dnnl_engine());
    });
    p.prim = sm(pd);
    p.src = unbound_memory(data);
    p.dst = unbound_memory(data);
    p.scratchpad = unbound_memory(pd.scratchpad_desc());
    p.args = {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_DST, p.dst}, {DNNL_ARG_SCRATCHPAD, p.scratchpad}};
    return p;
  }

  void run_primitive(SoftmaxPlan& p, const void* x, void* y) {
    p.src.set_data_handle(const_cast<void*>(x));
    p.dst.set_data_handle(y);
    bind_scratchpad(p.scratchpad);
    execute(p.prim, p.args);
  }

  // With the QuantizeLinear after it folded in (Fold::kTensorQuantize: attention probabilities
  // read by an integer MatMul): rows are computed into a buffer that stays in cache, a few thousand
  // values at a time, and quantized from there (quantize_floats: the QuantizeLinear's arithmetic).
  void run_quantized(SoftmaxPlan& p, const Tensor& x, Tensor& y) {
    auto* out = static_cast<std::byte*>(y.raw());
    if (p.rows == 0) {  // oneDNN's primitive: the whole tensor, then one quantizing pass
      buffer_.resize(static_cast<size_t>(x.numel()));
      run_primitive(p, x.raw(), buffer_.data());
      quantize_floats(buffer_.data(), x.numel(), quantize_->scale[0], quantize_->zero_point[0], quantize_->dtype, out);
      return;
    }
    constexpr int64_t kChunk = 4096;  // values per quantized span (16 KiB of floats)
    const int64_t rows_per_chunk = std::max<int64_t>(1, kChunk / p.n);
    buffer_.resize(static_cast<size_t>(std::min(p.rows, rows_per_chunk) * p.n));
    for (int64_t r = 0; r < p.rows; r += rows_per_chunk) {
      const int64_t rows = std::min(rows_per_chunk, p.rows - r);
      softmax_rows_avx512(x.data<float>() + r * p.n, buffer_.data(), rows, p.n);
      quantize_floats(buffer_.data(), rows * p.n, quantize_->scale[0], quantize_->zero_point[0], quantize_->dtype,
                      out + r * p.n);
    }
  }

  const ir::Node node_;
  const bool log_;
  const bool coerce_2d_;
  const int64_t axis_;
  const std::optional<FoldedQuantize> quantize_;  // a QuantizeLinear the plan folded into this Softmax
  std::vector<float> buffer_;                       // the float rows before quantize_
  ShapeCache<SoftmaxPlan> plans_;
};

}  // namespace

namespace {

// Gelu (erf form) over any float32 tensor: one pass in place of the exported Div/Erf/Add/Mul/Mul
// chain, our AVX-512 one where the CPU has it (ew::gelu_pass_available()), else oneDNN's JIT
// eltwise. The element order does not matter, so the tensor is viewed as 1-D.
class GeluErfKernel final : public Kernel {
 public:
  explicit GeluErfKernel(const KernelInit& init) : node_(init.node) { reject_fused_activation(node_); }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_float32(node_, x, "input");
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
    // Output 1 (execution only, fused_ops/dynamic_matmul.h's x_range): y's range for a dynamically
    // quantized reader, {min(0, min y), max(0, max y)}, NaNs skipped.
    float* range = ctx.num_outputs() > 1 ? ctx.allocate_output(1, DType::kFloat32, {2}).data<float>() : nullptr;
    if (range) range[0] = range[1] = 0.f;
    if (y.numel() == 0) return;
    if (ew::gelu_pass_available()) {  // the function the INT8 MatMul's fused GELU computes, and faster
      if (range) ew::gelu_with_range_avx512(x.data<float>(), y.data<float>(), x.numel(), range[0], range[1]);
      else ew::gelu_affine_avx512(x.data<float>(), y.data<float>(), x.numel(), 1.f, 0.f);
      return;
    }
    const Shape flat = {x.numel()};
    Plan& p = plans_.get({&flat}, [&] {
      Plan q;
      const memory::desc d = plain_desc(flat);
      using ef = dnnl::eltwise_forward;
      q.prim = ef(make_pd(node_, "gelu", [&] {
        return ef::primitive_desc(ef::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_gelu_erf, d),
                                  base_attr(), dnnl_engine());
      }));
      q.src = unbound_memory(d);
      q.dst = unbound_memory(d);
      q.args = {{DNNL_ARG_SRC, q.src}, {DNNL_ARG_DST, q.dst}};
      return q;
    });
    p.src.set_data_handle(const_cast<void*>(x.raw()));
    p.dst.set_data_handle(y.raw());
    execute(p.prim, p.args);
    if (range)
      for (const float v : y.values<float>()) {  // v < lo is false for NaN: skipped
        range[0] = v < range[0] ? v : range[0];
        range[1] = range[1] < v ? v : range[1];
      }
  }

 private:
  struct Plan {
    dnnl::eltwise_forward prim;
    memory src, dst;
    std::unordered_map<int, memory> args;
  };
  const ir::Node node_;
  ShapeCache<Plan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_gelu_erf(const KernelInit& init) { return std::make_unique<GeluErfKernel>(init); }

std::unique_ptr<Kernel> make_softmax(const KernelInit& init) { return std::make_unique<SoftmaxKernel>(init, false); }
std::unique_ptr<Kernel> make_log_softmax(const KernelInit& init) {
  return std::make_unique<SoftmaxKernel>(init, true);
}

}  // namespace slimquant::runtime::dnnl_kernels
