// Pooling: MaxPool and AveragePool on oneDNN's pooling_v2_forward (1-D/2-D/3-D, strides, pads,
// auto_pad, ceil_mode, dilations for MaxPool), GlobalAveragePool and GlobalMaxPool as plain loops
// (a reduction over each contiguous H*W row needs no primitive).
//
// MaxPool's optional Indices output (flat indices into X, row-major or, with storage_order=1,
// column-major over the spatial dims) comes from a plain loop, as oneDNN's workspace is not in
// that form.
#include <algorithm>
#include <cmath>
#include <limits>
#include <optional>
#include <type_traits>

#include "runtime/kernels/elementwise/channel_blocked.h"
#include "runtime/kernels/cpu_clones.h"
#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

struct PoolPlan {
  dnnl::pooling_v2_forward prim;
  memory::desc src, dst;
  std::optional<dnnl::reorder> src_reorder, dst_reorder;
  // Bound once; src_mem/dst_mem are the user memories themselves when no reorder is needed.
  memory src_user_mem, src_mem, dst_mem, dst_user_mem, scratchpad_mem;
  std::unordered_map<int, memory> args, src_reorder_args, dst_reorder_args;
  Shape out_shape;
  WindowGeometry geometry;
  bool rescale_overhang = false;  // AveragePool count_include_pad with a ceil_mode overhang
  LayoutPtr out_layout;           // the output is left in the primitive's layout (else plain)
};

enum class PoolKind { kMax, kAverage };

struct PoolAttrs {
  WindowAttrs window;
  bool ceil_mode = false;
  bool count_include_pad = false;  // AveragePool
  bool column_major_indices = false;  // MaxPool storage_order = 1
};

// Up to 3 spatial dims seen as (D, H, W) with leading 1s, so one loop nest serves 1-D/2-D/3-D.
struct Spatial3 {
  int64_t in[3] = {1, 1, 1}, out[3] = {1, 1, 1}, k[3] = {1, 1, 1}, s[3] = {1, 1, 1}, d[3] = {1, 1, 1},
          pb[3] = {0, 0, 0}, pe_explicit[3] = {0, 0, 0};
  Spatial3(const Shape& in_shape, const Shape& out_shape, const WindowGeometry& g) {
    const size_t sp = in_shape.size() - 2, off = 3 - sp;
    for (size_t i = 0; i < sp; ++i) {
      in[off + i] = in_shape[2 + i];
      out[off + i] = out_shape[2 + i];
      k[off + i] = g.kernel[i];
      s[off + i] = g.strides[i];
      d[off + i] = g.dilations[i] + 1;
      pb[off + i] = g.pad_begin[i];
      pe_explicit[off + i] = g.explicit_pad_end[i];
    }
  }
};

template <typename T>
void max_pool_with_indices(const T* x, T* y, int64_t* indices, int64_t planes, const Spatial3& g,
                           bool column_major) {
  const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
  for (int64_t p = 0; p < planes; ++p) {
    const T* xp = x + p * in_plane;
    int64_t o = p * out_plane;
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh)
        for (int64_t ow = 0; ow < g.out[2]; ++ow, ++o) {
          T best = std::numeric_limits<T>::lowest();
          int64_t bd = -1, bh = -1, bw = -1;
          for (int64_t kd = 0; kd < g.k[0]; ++kd) {
            const int64_t id = od * g.s[0] - g.pb[0] + kd * g.d[0];
            if (id < 0 || id >= g.in[0]) continue;
            for (int64_t kh = 0; kh < g.k[1]; ++kh) {
              const int64_t ih = oh * g.s[1] - g.pb[1] + kh * g.d[1];
              if (ih < 0 || ih >= g.in[1]) continue;
              const T* row = xp + (id * g.in[1] + ih) * g.in[2];
              for (int64_t kw = 0; kw < g.k[2]; ++kw) {
                const int64_t iw = ow * g.s[2] - g.pb[2] + kw * g.d[2];
                if (iw < 0 || iw >= g.in[2]) continue;
                if (bd < 0 || row[iw] > best) {
                  best = row[iw];
                  bd = id, bh = ih, bw = iw;
                }
              }
            }
          }
          y[o] = best;
          const int64_t local = column_major ? bd + g.in[0] * (bh + g.in[1] * bw) : (bd * g.in[1] + bh) * g.in[2] + bw;
          indices[o] = p * in_plane + local;
        }
  }
}

// oneDNN's avg_include_padding divides by the full window; ONNX (as ONNX Runtime) counts the
// explicit pads but not the extra end positions ceil_mode adds. Fix the affected outputs.
void rescale_overhang(float* y, int64_t planes, const Spatial3& g) {
  std::vector<float> f[3];
  for (int i = 0; i < 3; ++i) {
    f[i].assign(g.out[i], 1.f);
    for (int64_t o = 0; o < g.out[i]; ++o) {
      const int64_t start = o * g.s[i] - g.pb[i];
      const int64_t count = std::min(start + g.k[i], g.in[i] + g.pe_explicit[i]) - start;
      if (count < g.k[i]) f[i][o] = static_cast<float>(g.k[i]) / static_cast<float>(count);
    }
  }
  const int64_t out_plane = g.out[0] * g.out[1] * g.out[2];
  for (int64_t p = 0; p < planes; ++p)
    for (int64_t od = 0; od < g.out[0]; ++od)
      for (int64_t oh = 0; oh < g.out[1]; ++oh) {
        const float fdh = f[0][od] * f[1][oh];
        float* row = y + p * out_plane + (od * g.out[1] + oh) * g.out[2];
        for (int64_t ow = 0; ow < g.out[2]; ++ow) row[ow] *= fdh * f[2][ow];
      }
}

class PoolKernel final : public Kernel {
 public:
  PoolKernel(const KernelInit& init, PoolKind kind) : node_(init.node), kind_(kind) {
    reject_fused_activation(node_);
    attrs_.window = WindowAttrs::parse(node_);
    if (attrs_.window.kernel.empty())
      fail(ErrorKind::kInvalidModel, node_.describe() + ": attribute 'kernel_shape' is required");
    attrs_.ceil_mode = node_.attr_int("ceil_mode", 0) != 0;
    attrs_.count_include_pad = node_.attr_int("count_include_pad", 0) != 0;
    attrs_.column_major_indices = node_.attr_int("storage_order", 0) != 0;
    if (kind_ == PoolKind::kAverage && !node_.attr_ints("dilations").empty()) {
      for (int64_t d : node_.attr_ints("dilations"))
        if (d != 1) fail(ErrorKind::kUnsupported, node_.describe() + ": AveragePool with dilations != 1");
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const DType t = x.dtype();
    const bool int8 = t == DType::kUInt8 || t == DType::kInt8;
    if (t != DType::kFloat32 && !(int8 && kind_ == PoolKind::kMax))
      fail(ErrorKind::kUnsupported, node_.describe() + ": input X has dtype " + dtype_name(t) +
                                        (kind_ == PoolKind::kMax ? "; only float32, uint8 and int8 are supported"
                                                                 : "; only float32 is supported"));
    const bool want_indices = kind_ == PoolKind::kMax && output_requested(ctx, 1);
    // Layout-aware: a blocked input (a Conv's output) is read as it is, and the output may stay in
    // the primitive's layout for the next aware reader, instead of two reorders each way.
    const Layout* x_layout = ctx.input_layout(0);
    const bool out_blocked = !want_indices && ctx.output_layout_allowed(0);
    const int64_t key = (static_cast<int64_t>(t) * 2 + want_indices) * 4 + (x_layout ? 1 : 0) + (out_blocked ? 2 : 0);
    PoolPlan& p = plans_.get({&x.shape()}, [&] { return make_plan(x.shape(), t, !want_indices, x_layout, out_blocked); },
                             key);
    Tensor& y = ctx.allocate_output(0, t, p.out_shape);
    if (y.numel() == 0) return;
    const Spatial3 g(x.shape(), p.out_shape, p.geometry);
    const int64_t planes = x.dim(0) * x.dim(1);
    if (want_indices) {
      const Tensor xp = x_layout ? to_plain(x, *x_layout) : x;
      Tensor& idx = ctx.allocate_output(1, DType::kInt64, p.out_shape);
      dispatch_dtype(t, [&](auto tag) {
        using T = decltype(tag);
        if constexpr (std::is_same_v<T, float> || std::is_same_v<T, uint8_t> || std::is_same_v<T, int8_t>)
          max_pool_with_indices<T>(xp.data<T>(), y.data<T>(), idx.data<int64_t>(), planes, g,
                                   attrs_.column_major_indices);
      });
      return;
    }
    dnnl::stream& s = dnnl_stream();
    p.src_user_mem.set_data_handle(const_cast<void*>(x.raw()));
    if (p.src_reorder) {
      p.src_mem.set_data_handle(dnnl_scratch(DnnlScratch::kSrc, p.src.get_size()));
      p.src_reorder->execute(s, p.src_reorder_args);
    }
    p.dst_user_mem.set_data_handle(y.raw());
    if (p.dst_reorder) p.dst_mem.set_data_handle(dnnl_scratch(DnnlScratch::kDst, p.dst.get_size()));
    bind_scratchpad(p.scratchpad_mem);
    p.prim.execute(s, p.args);
    if (p.dst_reorder) p.dst_reorder->execute(s, p.dst_reorder_args);
    s.wait();
    if (p.rescale_overhang) rescale_overhang(y.data<float>(), planes, g);
    if (p.out_layout) ctx.set_output_layout(0, p.out_layout);
  }

 private:
  PoolPlan make_plan(const Shape& xs, DType t, bool build_primitive, const Layout* x_layout, bool out_blocked) const {
    const std::string what = node_.describe();
    if (xs.size() < 3 || xs.size() > 5)
      fail(ErrorKind::kUnsupported, what + ": input X of shape " + shape_str(xs) +
                                        " (only 1-D, 2-D and 3-D pooling: rank 3 to 5)");
    const size_t sp = xs.size() - 2;
    const WindowAttrs a = attrs_.window.resolved(node_, sp);
    PoolPlan p;
    p.geometry = forward_geometry(node_, a, Shape(xs.begin() + 2, xs.end()), attrs_.ceil_mode);
    const WindowGeometry& g = p.geometry;
    p.out_shape = {xs[0], xs[1]};
    p.out_shape.insert(p.out_shape.end(), g.out.begin(), g.out.end());
    if (!build_primitive) return p;
    const dt type = to_dnnl_type(t);
    const memory::desc src_user = input_desc(x_layout, xs, type), dst_user = plain_desc(p.out_shape, type);
    // On plain NCHW oneDNN 2.6 only has a scalar reference pooling, 5-10x slower than its JIT
    // kernel on channel-blocked data even counting the two reorders (measured, 1 thread, AVX2).
    // The int8 JIT pooling wants NHWC instead (plain NCHW u8: 42 ms for a 64x111x111 max pool
    // the JIT kernel does in well under a millisecond, measured).
    const bool float_data = t == DType::kFloat32;
    using tag = memory::format_tag;
    const tag channels_last = xs.size() == 3 ? tag::acb : xs.size() == 4 ? tag::acdb : tag::acdeb;
    // A blocked input (NHWC from a brgconv, nChw16c, ...) is pooled in its own layout.
    const memory::desc src_md =
        x_layout ? x_layout->desc
                 : memory::desc(to_dnnl_dims(xs), type, float_data ? blocked_channel_tag(xs.size()) : channels_last);
    const memory::desc dst_md = memory::desc(to_dnnl_dims(p.out_shape), type, float_data ? tag::any : channels_last);
    dnnl::algorithm alg = dnnl::algorithm::pooling_max;
    if (kind_ == PoolKind::kAverage) {
      alg = attrs_.count_include_pad ? dnnl::algorithm::pooling_avg_include_padding
                                     : dnnl::algorithm::pooling_avg_exclude_padding;
      p.rescale_overhang = attrs_.count_include_pad && g.pad_end != g.explicit_pad_end;
    }
    auto pd = make_pd(node_, "this pooling", [&] {
      dnnl::pooling_v2_forward::desc d(dnnl::prop_kind::forward_inference, alg, src_md, dst_md, g.strides, g.kernel,
                                       g.dilations, g.pad_begin, g.pad_end);
      return dnnl::pooling_v2_forward::primitive_desc(d, base_attr(), dnnl_engine());
    });
    p.prim = dnnl::pooling_v2_forward(pd);
    p.src = pd.src_desc();
    p.dst = pd.dst_desc();
    // The overhang correction works on plain float data.
    p.out_layout = output_layout_for(p.dst, p.out_shape, t, out_blocked && !p.rescale_overhang);
    p.src_reorder = make_reorder(src_user, p.src);
    p.dst_reorder = make_reorder(p.dst, p.out_layout ? p.dst : dst_user);
    p.src_user_mem = unbound_memory(src_user);
    p.src_mem = p.src_reorder ? unbound_memory(p.src) : p.src_user_mem;
    p.dst_user_mem = unbound_memory(p.out_layout ? p.dst : dst_user);
    p.dst_mem = p.dst_reorder ? unbound_memory(p.dst) : p.dst_user_mem;
    p.scratchpad_mem = unbound_memory(pd.scratchpad_desc());
    p.args = {{DNNL_ARG_SRC, p.src_mem}, {DNNL_ARG_DST, p.dst_mem}, {DNNL_ARG_SCRATCHPAD, p.scratchpad_mem}};
    p.src_reorder_args = {{DNNL_ARG_FROM, p.src_user_mem}, {DNNL_ARG_TO, p.src_mem}};
    p.dst_reorder_args = {{DNNL_ARG_FROM, p.dst_mem}, {DNNL_ARG_TO, p.dst_user_mem}};
    return p;
  }

  const ir::Node node_;
  const PoolKind kind_;
  PoolAttrs attrs_;
  ShapeCache<PoolPlan> plans_;
};

// ---------------------------------------------------------------------------------------------
// Global pools: Y[n, c, 1, ...] = reduce over X[n, c, ...].

// How the global pools read an element: a float32 as it is, or an 8-bit code of a folded
// DequantizeLinear as the float it stands for, float(q - zero_point) * scale (dequantize_linear's
// arithmetic, so pooling codes gives the bits of pooling their dequantized map).
struct FloatLoad {
  float operator()(float x) const { return x; }
};
struct CodeLoad {
  float scale;
  int32_t zero_point;
  template <typename Q>
  float operator()(Q q) const {
    return static_cast<float>(static_cast<int32_t>(q) - zero_point) * scale;
  }
};

template <typename T, typename Load>
SQ_AVX512_AVX2_CLONES float row_sum(const T* x, int64_t len, Load load) {
  // Eight independent partial sums let the compiler vectorise without -ffast-math.
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= len; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] += load(x[i + j]);
  float s = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < len; ++i) s += load(x[i]);
  return s;
}

template <typename T, typename Load>
float row_max(const T* x, int64_t len, Load load) {
  float acc[8];
  std::fill(acc, acc + 8, -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= len; i += 8)
    for (int j = 0; j < 8; ++j) acc[j] = std::max(acc[j], load(x[i + j]));
  float m = *std::max_element(acc, acc + 8);
  for (; i < len; ++i) m = std::max(m, load(x[i]));
  return m;
}

// row_sum / row_max of every lane of one channel-blocked plane (pixels x lanes, lane l at
// x[i * lanes + l]), in row_sum's / row_max's order for each lane (eight partial results combined
// alike), so blocked and plain inputs give the same bits; out[l] = the result for lane l. acc:
// 8 * lanes floats of scratch. Lanes are independent, so any vector width gives the same bits.
template <typename T, typename Load>
SQ_AVX512_AVX2_CLONES void lane_sums(const T* x, int64_t pixels, int64_t lanes, PoolKind kind, Load load, float* acc,
                                     float* out) {
  const bool average = kind == PoolKind::kAverage;
  std::fill(acc, acc + 8 * lanes, average ? 0.f : -std::numeric_limits<float>::infinity());
  int64_t i = 0;
  for (; i + 8 <= pixels; i += 8)
    for (int64_t j = 0; j < 8; ++j) {
      const T* xs = x + (i + j) * lanes;
      float* a = acc + j * lanes;
      if (average)
        for (int64_t l = 0; l < lanes; ++l) a[l] += load(xs[l]);
      else
        for (int64_t l = 0; l < lanes; ++l) a[l] = std::max(a[l], load(xs[l]));
    }
  for (int64_t l = 0; l < lanes; ++l) {
    const auto at = [&](int64_t j) { return acc[j * lanes + l]; };
    float r;
    if (average) {
      r = ((at(0) + at(1)) + (at(2) + at(3))) + ((at(4) + at(5)) + (at(6) + at(7)));
    } else {
      r = at(0);  // std::max_element: the first largest
      for (int64_t j = 1; j < 8; ++j)
        if (r < at(j)) r = at(j);
    }
    out[l] = r;
  }
  for (; i < pixels; ++i) {
    const T* xs = x + i * lanes;
    if (average)
      for (int64_t l = 0; l < lanes; ++l) out[l] += load(xs[l]);
    else
      for (int64_t l = 0; l < lanes; ++l) out[l] = std::max(out[l], load(xs[l]));
  }
}

// The global pool of every plane of a channel-blocked value, into dst[n * C + c].
template <typename T, typename Load>
void pool_blocked_planes(const T* src, const channel_blocked::View& v, PoolKind kind, Load load, float* dst) {
  const float inv = 1.f / static_cast<float>(v.pixels());
  parallel_rows(v.n * v.blocks(), v.plane_elements(), [&](int64_t begin, int64_t end) {
    std::vector<float> partial(static_cast<size_t>(8 * v.block));
    for (int64_t p = begin; p < end; ++p) {
      float* out = dst + p * v.block;  // plane p's channels, in order
      lane_sums(src + p * v.plane_elements(), v.pixels(), v.block, kind, load, partial.data(), out);
      if (kind == PoolKind::kAverage)
        for (int64_t l = 0; l < v.block; ++l) out[l] *= inv;
    }
  });
}

// The global pool of `planes` plain planes of `len` elements each.
template <typename T, typename Load>
void pool_plain_planes(const T* src, int64_t planes, int64_t len, PoolKind kind, Load load, float* dst) {
  const float inv = 1.f / static_cast<float>(len);
  parallel_rows(planes, len, [&](int64_t begin, int64_t end) {
    if (kind == PoolKind::kAverage)
      for (int64_t p = begin; p < end; ++p) dst[p] = row_sum(src + p * len, len, load) * inv;
    else
      for (int64_t p = begin; p < end; ++p) dst[p] = row_max(src + p * len, len, load);
  });
}

std::unique_ptr<Kernel> make_global_pool(const KernelInit& init, PoolKind kind) {
  reject_fused_activation(init.node);
  // A folded DequantizeLinear (the quantized squeeze-excitation input): X holds its codes.
  const std::vector<FoldedDequantize> folded = folded_dequantize(init.node);
  if (folded.size() > 1 || (!folded.empty() && folded[0].input != 0))
    fail(ErrorKind::kInvalidModel, init.node.describe() + ": invalid folded DequantizeLinear attributes");
  std::optional<FoldedDequantize> dequantize;
  if (!folded.empty()) dequantize = folded[0];
  return std::make_unique<FunctionKernel>([node = init.node, kind, dequantize](KernelContext& ctx) {
    // Calls fn(data pointer, loader) for X's element type: float32, or the codes of `dequantize`.
    auto with_elements = [&](const Tensor& x, auto&& fn) {
      if (!dequantize) {
        require_float32(node, x, "input X");
        fn(x.data<float>(), FloatLoad{});
        return;
      }
      check_folded_codes(x, *dequantize, node.describe());
      const CodeLoad load{dequantize->scale, dequantize->zero_point};
      if (x.dtype() == DType::kUInt8) fn(x.data<uint8_t>(), load);
      else fn(x.data<int8_t>(), load);
    };
    // A channel-blocked X (the squeeze-excitation after a convolution) is read as it is.
    if (const Layout* layout = ctx.input_layout(0)) {
      const std::optional<channel_blocked::Blocking> blocking = channel_blocked::blocking_of(*layout);
      const Tensor& x = ctx.input(0);
      const bool readable = (x.dtype() == DType::kFloat32) != dequantize.has_value();  // floats, or codes
      if (blocking && readable && x.rank() == 4 && x.dim(2) * x.dim(3) > 0) {
        const channel_blocked::View v(x.shape(), *blocking);
        Tensor& y = ctx.allocate_output(0, DType::kFloat32, {v.n, v.channels, 1, 1});
        with_elements(x, [&](const auto* src, auto load) { pool_blocked_planes(src, v, kind, load, y.data<float>()); });
        return;
      }
    }
    const Tensor x = channel_blocked::plain_input(ctx, 0);
    if (x.rank() < 2)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": input X of shape " + shape_str(x.shape()) +
                                            " must be [N, C, ...]");
    Shape ys(x.rank(), 1);
    ys[0] = x.dim(0);
    ys[1] = x.dim(1);
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, ys);
    const int64_t planes = x.dim(0) * x.dim(1);
    if (planes == 0) return;
    const int64_t len = x.numel() / planes;
    if (len == 0)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": input X of shape " + shape_str(x.shape()) +
                                            " has an empty spatial extent");
    with_elements(x, [&](const auto* src, auto load) { pool_plain_planes(src, planes, len, kind, load, y.data<float>()); });
  });
}

}  // namespace

std::unique_ptr<Kernel> make_max_pool(const KernelInit& init) {
  return std::make_unique<PoolKernel>(init, PoolKind::kMax);
}
std::unique_ptr<Kernel> make_average_pool(const KernelInit& init) {
  return std::make_unique<PoolKernel>(init, PoolKind::kAverage);
}
std::unique_ptr<Kernel> make_global_average_pool(const KernelInit& init) {
  return make_global_pool(init, PoolKind::kAverage);
}
std::unique_ptr<Kernel> make_global_max_pool(const KernelInit& init) {
  return make_global_pool(init, PoolKind::kMax);
}

void global_average_floats(const Tensor& x, const Layout* layout, float* means) {
  const std::optional<channel_blocked::Blocking> blocking = layout ? channel_blocked::blocking_of(*layout) : std::nullopt;
  if (blocking) return pool_blocked_planes(x.data<float>(), channel_blocked::View(x.shape(), *blocking), PoolKind::kAverage,
                                           FloatLoad{}, means);
  const Tensor plain = layout ? to_plain(x, *layout) : x;
  const int64_t planes = x.dim(0) * x.dim(1);
  pool_plain_planes(plain.data<float>(), planes, x.numel() / planes, PoolKind::kAverage, FloatLoad{}, means);
}

}  // namespace slimquant::runtime::dnnl_kernels
