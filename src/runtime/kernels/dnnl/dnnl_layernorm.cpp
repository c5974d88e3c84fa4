// LayerNormalization (opset 17) on oneDNN's layer_normalization_forward.
//
// X is normalised over dims [axis, rank): viewed as [outer, inner] with inner = prod(X.shape[axis:])
// (same bytes), Y = (X - mean) / sqrt(var + epsilon) * Scale + B. oneDNN normalises the last dim
// with per-element scale/shift of that length, so Scale and B are broadcast to X.shape[axis:] first
// when they are smaller (once when constant). The optional Mean and InvStdDev outputs have shape
// X.shape[:axis] + [1] * (rank - axis); asking for them runs the primitive in training mode, which
// writes the statistics. Without them, on CPUs with AVX-512, the rows run on layer_norm_rows_avx512
// below instead: oneDNN 2.6's kernel took 0.038 ms for ViT-small's [1600, 64] rows at batch 32.
#include <immintrin.h>

#include <cmath>
#include <cstdlib>
#include <string>

#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*() (see avx512_exp.h).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// Rows of n <= 16 V values, R at a time, each held in V registers from its load to its store
// (masked lanes read as 0 and kept 0 after the mean is taken out). The mean, then the mean square
// deviation from it (two passes, as the definition), then y = (x - mean) * (1 / sqrt(var + eps)) *
// scale + bias; R independent rows overlap their reductions' latency.
template <int V, int R>
__attribute__((target("avx512f"))) inline void layer_norm_short_rows(const float* x, const float* scale,
                                                                     const float* bias, float* y, int64_t n,
                                                                     __mmask16 last, float epsilon) {
  const float inv_n = 1.f / static_cast<float>(n);
  __m512 v[R][V], inv_std[R];
  for (int r = 0; r < R; ++r) {
    const float* row = x + r * n;
    for (int j = 0; j + 1 < V; ++j) v[r][j] = _mm512_loadu_ps(row + 16 * j);
    v[r][V - 1] = _mm512_maskz_loadu_ps(last, row + 16 * (V - 1));
    __m512 sum = v[r][0];
    for (int j = 1; j < V; ++j) sum = _mm512_add_ps(sum, v[r][j]);
    const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(sum) * inv_n);
    for (int j = 0; j + 1 < V; ++j) v[r][j] = _mm512_sub_ps(v[r][j], mean);
    v[r][V - 1] = _mm512_maskz_sub_ps(last, v[r][V - 1], mean);
  }
  for (int r = 0; r < R; ++r) {
    __m512 squares = _mm512_mul_ps(v[r][0], v[r][0]);
    for (int j = 1; j < V; ++j) squares = _mm512_fmadd_ps(v[r][j], v[r][j], squares);
    inv_std[r] = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(squares) * inv_n + epsilon));
  }
  for (int r = 0; r < R; ++r) {
    float* row = y + r * n;
    for (int j = 0; j < V; ++j) {
      const __mmask16 lanes = j + 1 < V ? static_cast<__mmask16>(0xffff) : last;
      const __m512 s = _mm512_maskz_loadu_ps(lanes, scale + 16 * j);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(lanes, bias + 16 * j) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(row + 16 * j, lanes, _mm512_fmadd_ps(_mm512_mul_ps(v[r][j], inv_std[r]), s, b));
    }
  }
}

template <int V>
__attribute__((target("avx512f"))) void layer_norm_short_rows(const float* x, const float* scale, const float* bias,
                                                              float* y, int64_t rows, int64_t n, float epsilon) {
  constexpr int kRows = 4;
  const auto last = static_cast<__mmask16>(0xffffu >> (16 * V - n));
  int64_t r = 0;
  for (; r + kRows <= rows; r += kRows)
    layer_norm_short_rows<V, kRows>(x + r * n, scale, bias, y + r * n, n, last, epsilon);
  for (; r < rows; ++r) layer_norm_short_rows<V, 1>(x + r * n, scale, bias, y + r * n, n, last, epsilon);
}

// y = (x - mean) / sqrt(var + epsilon) * scale + bias per row of n contiguous values (bias may be
// null). Rows of up to 64 values stay in registers (above); longer ones take three passes over the
// row while it is in L1, the last partial vector under a mask.
__attribute__((target("avx512f"))) void layer_norm_rows_avx512(const float* x, const float* scale, const float* bias,
                                                               float* y, int64_t rows, int64_t n, float epsilon) {
  switch ((n + 15) / 16) {
    case 1: return layer_norm_short_rows<1>(x, scale, bias, y, rows, n, epsilon);
    case 2: return layer_norm_short_rows<2>(x, scale, bias, y, rows, n, epsilon);
    case 3: return layer_norm_short_rows<3>(x, scale, bias, y, rows, n, epsilon);
    case 4: return layer_norm_short_rows<4>(x, scale, bias, y, rows, n, epsilon);
    default: break;
  }
  const int64_t full = n / 16 * 16;
  const auto tail = static_cast<__mmask16>((1u << (n - full)) - 1u);
  const float inv_n = 1.f / static_cast<float>(n);
  for (int64_t r = 0; r < rows; ++r, x += n, y += n) {
    __m512 sum = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += 16) sum = _mm512_add_ps(sum, _mm512_loadu_ps(x + i));
    if (tail) sum = _mm512_add_ps(sum, _mm512_maskz_loadu_ps(tail, x + full));
    const __m512 mean = _mm512_set1_ps(_mm512_reduce_add_ps(sum) * inv_n);
    __m512 squares = _mm512_setzero_ps();
    for (int64_t i = 0; i < full; i += 16) {
      const __m512 d = _mm512_sub_ps(_mm512_loadu_ps(x + i), mean);
      squares = _mm512_fmadd_ps(d, d, squares);
    }
    if (tail) {
      const __m512 d = _mm512_maskz_sub_ps(tail, _mm512_maskz_loadu_ps(tail, x + full), mean);
      squares = _mm512_fmadd_ps(d, d, squares);
    }
    const __m512 inv_std = _mm512_set1_ps(1.f / std::sqrt(_mm512_reduce_add_ps(squares) * inv_n + epsilon));
    for (int64_t i = 0; i < n; i += 16) {
      const __mmask16 lanes = i < full ? static_cast<__mmask16>(0xffff) : tail;
      const __m512 d = _mm512_sub_ps(_mm512_maskz_loadu_ps(lanes, x + i), mean);
      const __m512 b = bias ? _mm512_maskz_loadu_ps(lanes, bias + i) : _mm512_setzero_ps();
      _mm512_mask_storeu_ps(y + i, lanes, _mm512_fmadd_ps(_mm512_mul_ps(d, inv_std), _mm512_maskz_loadu_ps(lanes, scale + i), b));
    }
  }
}

#pragma GCC diagnostic pop

// The own rows kernel where the CPU has AVX-512 (SLIMQUANT_LAYERNORM=dnnl keeps oneDNN's, to compare).
bool own_layer_norm_rows() {
  static const bool on = [] {
    const char* v = std::getenv("SLIMQUANT_LAYERNORM");
    return __builtin_cpu_supports("avx512f") && !(v && std::string(v) == "dnnl");
  }();
  return on;
}

struct LayerNormPlan {
  dnnl::layer_normalization_forward prim;
  memory::desc channel;
  // Bound once, pointed at each call's data.
  memory src, dst, scale, shift, mean, variance, scratchpad;
  std::unordered_map<int, memory> args;
  int64_t outer = 1, inner = 1;
  Shape stat_shape;
  bool with_stats = false;
};

// src broadcast (numpy rules, unidirectional) to `target`, written densely to dst.
void broadcast_into(const Tensor& src, const Shape& target, float* dst, const ir::Node& node, const char* what) {
  const Shape& s = src.shape();
  if (s.size() > target.size())
    fail(ErrorKind::kInvalidArgument, node.describe() + ": " + what + " of shape " + shape_str(s) +
                                          " does not broadcast to the normalized shape " + shape_str(target));
  const size_t off = target.size() - s.size();
  std::vector<int64_t> src_strides(target.size(), 0);
  const std::vector<int64_t> dense = contiguous_strides(s);
  for (size_t i = 0; i < s.size(); ++i) {
    if (s[i] != 1 && s[i] != target[off + i])
      fail(ErrorKind::kInvalidArgument, node.describe() + ": " + what + " of shape " + shape_str(s) +
                                            " does not broadcast to the normalized shape " + shape_str(target));
    src_strides[off + i] = s[i] == 1 ? 0 : dense[i];
  }
  const float* in = src.data<float>();
  const int64_t total = shape_numel(target);
  std::vector<int64_t> idx(target.size(), 0);
  for (int64_t o = 0; o < total; ++o) {
    int64_t pos = 0;
    for (size_t d = 0; d < target.size(); ++d) pos += idx[d] * src_strides[d];
    dst[o] = in[pos];
    for (size_t d = target.size(); d-- > 0;) {
      if (++idx[d] < target[d]) break;
      idx[d] = 0;
    }
  }
}

class LayerNormKernel final : public Kernel {
  enum LayerNormInput : size_t { kX = 0, kScale = 1, kBias = 2 };
  enum LayerNormOutput : size_t { kY = 0, kMean = 1, kInvStdDev = 2 };
 public:
  explicit LayerNormKernel(const KernelInit& init) : node_(init.node) {
    reject_fused_activation(node_);
    axis_ = node_.attr_int("axis", -1);
    epsilon_ = node_.attr_float("epsilon", 1e-5f);
    for (size_t i : {kScale, kBias})
      if (node_.inputs.size() > i && !node_.inputs[i].empty())
        if (const Tensor* t = init.constant_input(i)) constant_[i] = *t;
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    require_float32(node_, x, "input X");
    const Tensor& scale = constant_[kScale].defined() ? constant_[kScale] : ctx.input(kScale);
    const Tensor* bias = constant_[kBias].defined() ? &constant_[kBias] : ctx.optional_input(kBias);
    require_float32(node_, scale, "Scale");
    if (bias) require_float32(node_, *bias, "B");
    const bool want_stats = output_requested(ctx, kMean) || output_requested(ctx, kInvStdDev);
    LayerNormPlan& p = plans_.get({&x.shape(), &scale.shape(), bias ? &bias->shape() : nullptr},
                                  [&] { return make_plan(x.shape(), bias != nullptr, want_stats); }, want_stats);
    Tensor& y = ctx.allocate_output(kY, DType::kFloat32, x.shape());
    if (y.numel() == 0) return;

    const Shape normalized(x.shape().begin() + axis_index(x), x.shape().end());
    if (!p.with_stats && own_layer_norm_rows()) {
      const float* s = static_cast<const float*>(channel_data(p, kScale, scale, normalized, DnnlScratch::kWeights));
      const float* b =
          bias ? static_cast<const float*>(channel_data(p, kBias, *bias, normalized, DnnlScratch::kAux)) : nullptr;
      layer_norm_rows_avx512(x.data<float>(), s, b, y.data<float>(), p.outer, p.inner, epsilon_);
      return;
    }
    p.src.set_data_handle(const_cast<void*>(x.raw()));
    p.dst.set_data_handle(y.raw());
    p.scale.set_data_handle(channel_data(p, kScale, scale, normalized, DnnlScratch::kWeights));
    if (bias) p.shift.set_data_handle(channel_data(p, kBias, *bias, normalized, DnnlScratch::kAux));
    float* var = nullptr;
    if (p.with_stats) {
      float* mean = output_requested(ctx, kMean)
                        ? ctx.allocate_output(kMean, DType::kFloat32, p.stat_shape).data<float>()
                        : static_cast<float*>(dnnl_scratch(DnnlScratch::kSrc, p.outer * sizeof(float)));
      // The variance lands in the InvStdDev output (or scratch) and is inverted in place below.
      var = output_requested(ctx, kInvStdDev)
                ? ctx.allocate_output(kInvStdDev, DType::kFloat32, p.stat_shape).data<float>()
                : static_cast<float*>(dnnl_scratch(DnnlScratch::kDst, p.outer * sizeof(float)));
      p.mean.set_data_handle(mean);
      p.variance.set_data_handle(var);
    }
    bind_scratchpad(p.scratchpad);
    execute(p.prim, p.args);
    if (p.with_stats)
      for (int64_t i = 0; i < p.outer; ++i) var[i] = 1.f / std::sqrt(var[i] + epsilon_);
  }

 private:
  int64_t axis_index(const Tensor& x) const { return normalize_axis(axis_, x.rank(), node_.describe() + " axis"); }

  // Scale or B as a dense [inner] vector: the tensor itself when it already has that many
  // elements, otherwise broadcast (cached for a constant, into scratch for a runtime input).
  void* channel_data(const LayerNormPlan& p, size_t input, const Tensor& t, const Shape& normalized,
                     DnnlScratch slot) {
    if (t.numel() == p.inner) return const_cast<void*>(t.raw());
    Tensor& cached = expanded_[input];
    if (constant_[input].defined()) {
      if (!cached.defined() || cached.numel() != p.inner) {
        cached = Tensor(DType::kFloat32, {p.inner});
        broadcast_into(t, normalized, cached.data<float>(), node_, input == kScale ? "Scale" : "B");
      }
      return cached.raw();
    }
    auto* buf = static_cast<float*>(dnnl_scratch(slot, p.inner * sizeof(float)));
    broadcast_into(t, normalized, buf, node_, input == kScale ? "Scale" : "B");
    return buf;
  }

  LayerNormPlan make_plan(const Shape& xs, bool with_bias, bool with_stats) const {
    const int64_t rank = static_cast<int64_t>(xs.size());
    if (rank == 0)
      fail(ErrorKind::kInvalidArgument, node_.describe() + ": input X must have rank >= 1");
    const int64_t axis = normalize_axis(axis_, rank, node_.describe() + " axis");
    LayerNormPlan p;
    for (int64_t i = 0; i < rank; ++i) (i < axis ? p.outer : p.inner) *= xs[i];
    p.stat_shape = Shape(xs.begin(), xs.begin() + axis);
    p.stat_shape.resize(xs.size(), 1);
    p.with_stats = with_stats;
    const memory::desc data({p.outer, p.inner}, dt::f32, memory::format_tag::ab);
    const memory::desc stat({p.outer}, dt::f32, memory::format_tag::a);
    p.channel = memory::desc({p.inner}, dt::f32, memory::format_tag::a);
    auto flags = dnnl::normalization_flags::use_scale;
    if (with_bias) flags = flags | dnnl::normalization_flags::use_shift;
    const auto pk = with_stats ? dnnl::prop_kind::forward_training : dnnl::prop_kind::forward_inference;
    using ln = dnnl::layer_normalization_forward;
    auto pd = make_pd(node_, "this layer normalization", [&] {
      return ln::primitive_desc(ln::desc(pk, data, stat, epsilon_, flags), base_attr(), dnnl_engine());
    });
    p.prim = ln(pd);
    p.src = unbound_memory(data);
    p.dst = unbound_memory(data);
    p.scale = unbound_memory(p.channel);
    p.scratchpad = unbound_memory(pd.scratchpad_desc());
    p.args = {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_DST, p.dst}, {DNNL_ARG_SCALE, p.scale},
              {DNNL_ARG_SCRATCHPAD, p.scratchpad}};
    if (with_bias) {
      p.shift = unbound_memory(p.channel);
      p.args.emplace(DNNL_ARG_SHIFT, p.shift);
    }
    if (with_stats) {
      p.mean = unbound_memory(stat);
      p.variance = unbound_memory(stat);
      p.args.emplace(DNNL_ARG_MEAN, p.mean);
      p.args.emplace(DNNL_ARG_VARIANCE, p.variance);
    }
    return p;
  }

  const ir::Node node_;
  int64_t axis_ = -1;
  float epsilon_ = 1e-5f;
  Tensor constant_[3];  // constant Scale / B (index by input)
  Tensor expanded_[3];  // their broadcast to the normalized shape
  ShapeCache<LayerNormPlan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_layer_normalization(const KernelInit& init) {
  return std::make_unique<LayerNormKernel>(init);
}

}  // namespace slimquant::runtime::dnnl_kernels
