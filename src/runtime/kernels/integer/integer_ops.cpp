// The default-domain integer ops that ONNX Runtime's quantizer writes (QOperator format and dynamic
// quantization), so a peer's INT8 model runs, evaluates and benchmarks next to slimquant's own:
//
//   DynamicQuantizeLinear (11)  x f32 -> y u8, y_scale, y_zero_point     (range widened to hold 0)
//   MatMulInteger (10)          y s32 = (A - z_A) @ (B - z_B)              numpy-style batching
//   ConvInteger (10)            y s32 = conv(x - z_x, w - z_w)             every Conv attribute
//   QLinearMatMul (10)          y q8  = requant((a - z_a) @ (b - z_b))
//   QLinearConv (10)            y q8  = requant(conv(x - z_x, w - z_w) + B)
//
//   requant(acc) = saturate(round_half_even(float(acc) * M) + z_y),   M = s_x * s_w[c] / s_y   (float32)
//
// which is ONNX Runtime's (MLAS) formula; the accumulation is exact int32 (integer_gemm.h).
// Zero points and scales: per tensor; w's per output channel; A's / a's per row and B's / b's per
// column, optionally also per batch ([..., M, 1] / [..., 1, N]). Every 8-bit signedness mix works.
// Convolutions build patch tiles (x - z_x as int16, padding = 0: im2row for long reductions,
// im2col for short ones such as depthwise) and multiply them with the packed weights.
#include <omp.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/integer/dynamic_quantize.h"
#include "runtime/kernels/integer/integer_gemm.h"
#include "runtime/fused_ops/dynamic_matmul.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {
namespace {

using dnnl_kernels::WindowAttrs;

// ---------------------------------------------------------------------------------------------
// Input checks and parameter reading (messages name the node).

bool is_8bit(DType t) { return t == DType::kUInt8 || t == DType::kInt8; }

// Calls f(Q{}) with Q the C++ type of an 8-bit dtype (checked by the caller).
template <typename F>
decltype(auto) dispatch_8bit(DType t, F&& f) {
  if (t == DType::kUInt8) return f(uint8_t{});
  return f(int8_t{});
}

void require_8bit(const ir::Node& node, const Tensor& t, const char* what) {
  SQ_CHECK(is_8bit(t.dtype()), ErrorKind::kInvalidModel,
           node.describe() + ": " + what + " must be uint8 or int8, got " + dtype_name(t.dtype()));
}

// A zero point's values (absent: 0); its dtype must be the one of the tensor it belongs to.
std::vector<int32_t> zero_point_values(const ir::Node& node, const Tensor* zp, DType quantized, const char* what) {
  if (!zp) return {0};
  SQ_CHECK(zp->dtype() == quantized, ErrorKind::kInvalidModel,
           node.describe() + ": " + what + " is " + dtype_name(zp->dtype()) + " but the tensor it belongs to is " +
               dtype_name(quantized));
  SQ_CHECK(zp->numel() > 0, ErrorKind::kInvalidArgument, node.describe() + ": " + what + " is empty");
  std::vector<int32_t> v;
  for (int64_t z : zp->to_int64_vector()) v.push_back(static_cast<int32_t>(z));
  return v;
}

std::vector<float> scale_values(const ir::Node& node, const Tensor& s, const char* what) {
  SQ_CHECK(s.dtype() == DType::kFloat32, ErrorKind::kInvalidModel,
           node.describe() + ": " + what + " must be float32, got " + dtype_name(s.dtype()));
  SQ_CHECK(s.numel() > 0, ErrorKind::kInvalidArgument, node.describe() + ": " + what + " is empty");
  return {s.values<float>().begin(), s.values<float>().end()};
}

// Per-tensor parameters (x's and y's of QLinearConv, y's of QLinearMatMul).
void require_one_value(const ir::Node& node, const Tensor& t, const char* what) {
  SQ_CHECK(t.numel() == 1, ErrorKind::kInvalidArgument,
           node.describe() + ": " + what + " must hold one value (per-tensor quantization), got shape " +
               shape_str(t.shape()));
}

// One value, or one per output channel.
void require_per_channel(const ir::Node& node, size_t count, int64_t channels, const Shape& shape, const char* what) {
  SQ_CHECK(count == 1 || static_cast<int64_t>(count) == channels, ErrorKind::kInvalidArgument,
           node.describe() + ": " + what + " has shape " + shape_str(shape) + "; expected one value or one per " +
               "output channel (" + std::to_string(channels) + ")");
}

// Work (multiply-adds) below which forking a thread team costs more than it saves.
constexpr int64_t kParallelWork = int64_t{1} << 21;

// fn(begin, end) over disjoint chunks of [0, units), on several threads when the work is large.
template <typename Fn>
void parallel_units(int64_t units, int64_t work, Fn&& fn) {
  const int threads = work >= kParallelWork ? static_cast<int>(std::min<int64_t>(omp_get_max_threads(), units)) : 1;
  if (threads <= 1) {
    if (units > 0) fn(int64_t{0}, units);
    return;
  }
#pragma omp parallel num_threads(threads)
  {
    const int64_t t = omp_get_thread_num(), nt = omp_get_num_threads();
    const int64_t begin = units * t / nt, end = units * (t + 1) / nt;
    if (begin < end) fn(begin, end);
  }
}

// ---------------------------------------------------------------------------------------------
// Convolution (ConvInteger, QLinearConv).

struct ConvAttrs {
  WindowAttrs window;
  int64_t group = 1;

  static ConvAttrs parse(const ir::Node& node) {
    ConvAttrs a{WindowAttrs::parse(node), node.attr_int("group", 1)};
    SQ_CHECK(a.group >= 1, ErrorKind::kInvalidModel,
             node.describe() + ": group must be >= 1, got " + std::to_string(a.group));
    return a;
  }
};

// Spatial vectors padded to 3 dims (leading 1s, 0 pads) so one loop nest covers 1-D, 2-D and 3-D.
using Dims3 = std::array<int64_t, 3>;

struct ConvGeometry {
  int64_t batch = 0, in_channels = 0, out_channels = 0, group = 1;
  Dims3 in{1, 1, 1}, out{1, 1, 1}, kernel{1, 1, 1}, stride{1, 1, 1}, dilation{1, 1, 1}, pad{0, 0, 0};
  int64_t depth = 0;  // products per output: in_channels / group * kernel volume
  Shape out_shape;

  int64_t in_size() const { return in[0] * in[1] * in[2]; }
  int64_t pixels() const { return out[0] * out[1] * out[2]; }
  int64_t in_per_group() const { return in_channels / group; }
  int64_t out_per_group() const { return out_channels / group; }
};

ConvGeometry conv_geometry(const ir::Node& node, const ConvAttrs& a, const Shape& x, const Shape& w) {
  SQ_CHECK(x.size() >= 3, ErrorKind::kInvalidArgument,
           node.describe() + ": x must be [N, C, spatial...], got shape " + shape_str(x));
  SQ_CHECK(x.size() <= 5, ErrorKind::kUnsupported,
           node.describe() + ": " + std::to_string(x.size() - 2) + " spatial dims are not supported (1 to 3)");
  SQ_CHECK(w.size() == x.size(), ErrorKind::kInvalidArgument,
           node.describe() + ": w has shape " + shape_str(w) + ", expected rank " + std::to_string(x.size()) +
               " like x " + shape_str(x));
  const size_t spatial = x.size() - 2;
  const Shape w_spatial(w.begin() + 2, w.end());
  WindowAttrs window = a.window;
  if (window.kernel.empty()) window.kernel = w_spatial;
  SQ_CHECK(window.kernel == w_spatial, ErrorKind::kInvalidArgument,
           node.describe() + ": kernel_shape " + shape_str(window.kernel) + " differs from the weight's spatial dims " +
               shape_str(w_spatial));
  window = window.resolved(node, spatial);

  ConvGeometry g;
  g.batch = x[0];
  g.in_channels = x[1];
  g.out_channels = w[0];
  g.group = a.group;
  SQ_CHECK(g.in_channels == w[1] * g.group, ErrorKind::kInvalidArgument,
           node.describe() + ": x has " + std::to_string(g.in_channels) + " channels but w " + shape_str(w) +
               " with group " + std::to_string(g.group) + " expects " + std::to_string(w[1] * g.group));
  SQ_CHECK(g.out_channels % g.group == 0, ErrorKind::kInvalidArgument,
           node.describe() + ": " + std::to_string(g.out_channels) + " output channels are not divisible by group " +
               std::to_string(g.group));
  const Shape in_spatial(x.begin() + 2, x.end());
  const dnnl_kernels::WindowGeometry wg = dnnl_kernels::forward_geometry(node, window, in_spatial, false);
  const size_t offset = 3 - spatial;
  g.out_shape = {g.batch, g.out_channels};
  for (size_t i = 0; i < spatial; ++i) {
    g.in[offset + i] = in_spatial[i];
    g.out[offset + i] = wg.out[i];
    g.kernel[offset + i] = window.kernel[i];
    g.stride[offset + i] = window.strides[i];
    g.dilation[offset + i] = window.dilations[i];
    g.pad[offset + i] = wg.pad_begin[i];
    g.out_shape.push_back(wg.out[i]);
  }
  g.depth = w[1] * g.kernel[0] * g.kernel[1] * g.kernel[2];
  return g;
}

// w - z_w[m] as int16, [M, depth]: ONNX's weight layout already is output channel major.
std::vector<int16_t> pack_conv_weights(const ir::Node& node, const Tensor& w, const Tensor* w_zero_point) {
  require_8bit(node, w, "w");
  SQ_CHECK(w.rank() >= 3, ErrorKind::kInvalidArgument,
           node.describe() + ": w must be [M, C / group, kernel...], got shape " + shape_str(w.shape()));
  const std::vector<int32_t> zp = zero_point_values(node, w_zero_point, w.dtype(), "w_zero_point");
  const int64_t channels = w.dim(0);
  require_per_channel(node, zp.size(), channels, w_zero_point ? w_zero_point->shape() : Shape{}, "w_zero_point");
  std::vector<int16_t> packed(static_cast<size_t>(w.numel()));
  const int64_t depth = channels > 0 ? w.numel() / channels : 0;
  dispatch_8bit(w.dtype(), [&](auto tag) {
    using Q = decltype(tag);
    for (int64_t m = 0; m < channels; ++m)
      integer::widen(w.data<Q>() + m * depth, depth, zp[zp.size() == 1 ? 0 : m], packed.data() + m * depth);
  });
  return packed;
}

// Both patch builders walk the tile [p0, p0 + count) one output row (fixed od, oh) at a time:
// fn(od, oh, ow_begin, ow_end, t) with t the tile position of (od, oh, ow_begin).
template <typename Fn>
void for_each_output_row(const ConvGeometry& g, int64_t p0, int64_t count, Fn&& fn) {
  for (int64_t p = p0, end = p0 + count; p < end;) {
    const int64_t ow = p % g.out[2], row = p / g.out[2];
    const int64_t ow_end = std::min(g.out[2], ow + (end - p));
    fn(row / g.out[1], row % g.out[1], ow, ow_end, p - p0);
    p += ow_end - ow;
  }
}

// Input row offsets (within one channel) of the kernel's (kd, kh) taps for output row (od, oh),
// or -1 where the tap lies in the padding.
void tap_rows(const ConvGeometry& g, int64_t od, int64_t oh, std::vector<int64_t>& rows) {
  rows.clear();
  for (int64_t kd = 0; kd < g.kernel[0]; ++kd) {
    const int64_t id = od * g.stride[0] - g.pad[0] + kd * g.dilation[0];
    for (int64_t kh = 0; kh < g.kernel[1]; ++kh) {
      const int64_t ih = oh * g.stride[1] - g.pad[1] + kh * g.dilation[1];
      const bool inside = id >= 0 && id < g.in[0] && ih >= 0 && ih < g.in[1];
      rows.push_back(inside ? (id * g.in[1] + ih) * g.in[2] : -1);
    }
  }
}

// Patch rows for the dot form: patch[t, :] holds the window of output pixel p0 + t of one image
// and group (channel-major, then kernel positions, like the weights) as x - z_x; padding is 0.
// KW: the kernel width when it is a common one (the copy unrolls), 0 for any.
template <int KW, typename X>
void im2row(const ConvGeometry& g, const X* x_group, int32_t x_zero_point, int64_t p0, int64_t count,
            int16_t* patch) {
  const int16_t zx = static_cast<int16_t>(x_zero_point);
  const int64_t kw_count = KW > 0 ? KW : g.kernel[2], dil = g.dilation[2], in_w = g.in[2];
  const int64_t in_size = g.in_size(), channels = g.in_per_group();
  std::vector<int64_t> rows;
  for_each_output_row(g, p0, count, [&](int64_t od, int64_t oh, int64_t ow_begin, int64_t ow_end, int64_t t0) {
    tap_rows(g, od, oh, rows);
    int16_t* dst = patch + t0 * g.depth;
    for (int64_t ow = ow_begin; ow < ow_end; ++ow) {
      const int64_t w0 = ow * g.stride[2] - g.pad[2];
      const bool interior = w0 >= 0 && w0 + (kw_count - 1) * dil < in_w;
      for (int64_t c = 0; c < channels; ++c) {
        const X* xc = x_group + c * in_size;
        for (const int64_t r : rows) {
          if (r < 0) {
            std::fill(dst, dst + kw_count, int16_t{0});
          } else if (interior) {
            const X* src = xc + r + w0;
            for (int64_t kw = 0; kw < kw_count; ++kw) dst[kw] = static_cast<int16_t>(int16_t{src[kw * dil]} - zx);
          } else {
            for (int64_t kw = 0; kw < kw_count; ++kw) {
              const int64_t iw = w0 + kw * dil;
              dst[kw] = iw >= 0 && iw < in_w ? static_cast<int16_t>(int16_t{xc[r + iw]} - zx) : int16_t{0};
            }
          }
          dst += kw_count;
        }
      }
    }
  });
}

// Patch columns for the transposed form (short reductions): cols[l, t] = patch[t, l], built one
// kernel tap at a time along output rows (contiguous copies for stride 1).
template <typename X>
void im2col(const ConvGeometry& g, const X* x_group, int32_t x_zero_point, int64_t p0, int64_t count,
            int16_t* cols) {
  const int16_t zx = static_cast<int16_t>(x_zero_point);
  const int64_t stride = g.stride[2], in_w = g.in[2], in_size = g.in_size(), channels = g.in_per_group();
  std::vector<int64_t> rows;
  for_each_output_row(g, p0, count, [&](int64_t od, int64_t oh, int64_t ow_begin, int64_t ow_end, int64_t t0) {
    tap_rows(g, od, oh, rows);
    int64_t l = 0;
    for (int64_t c = 0; c < channels; ++c)
      for (const int64_t r : rows)
        for (int64_t kw = 0; kw < g.kernel[2]; ++kw, ++l) {
          int16_t* dst = cols + l * count + t0;  // dst[ow - ow_begin]
          if (r < 0) {
            std::fill(dst, dst + (ow_end - ow_begin), int16_t{0});
            continue;
          }
          // iw = ow * stride + offset lies inside [0, in_w) for ow in [lo, hi).
          const int64_t offset = kw * g.dilation[2] - g.pad[2];
          const int64_t lo = std::clamp<int64_t>(offset >= 0 ? 0 : (-offset + stride - 1) / stride, ow_begin, ow_end);
          const int64_t hi =
              std::clamp<int64_t>(in_w - 1 - offset < 0 ? 0 : (in_w - 1 - offset) / stride + 1, lo, ow_end);
          std::fill(dst, dst + (lo - ow_begin), int16_t{0});
          const X* src = x_group + c * in_size + r + lo * stride + offset;  // iw of ow = lo
          int16_t* out = dst + (lo - ow_begin);
          if (stride == 1) {
            for (int64_t i = 0; i < hi - lo; ++i) out[i] = static_cast<int16_t>(int16_t{src[i]} - zx);
          } else {
            for (int64_t i = 0; i < hi - lo; ++i) out[i] = static_cast<int16_t>(int16_t{src[i * stride]} - zx);
          }
          std::fill(dst + (hi - ow_begin), dst + (ow_end - ow_begin), int16_t{0});
        }
  });
}

template <typename X>
void build_patch_rows(const ConvGeometry& g, const X* x_group, int32_t zx, int64_t p0, int64_t count, int16_t* patch) {
  switch (g.kernel[2]) {
    case 1: return im2row<1>(g, x_group, zx, p0, count, patch);
    case 3: return im2row<3>(g, x_group, zx, p0, count, patch);
    case 5: return im2row<5>(g, x_group, zx, p0, count, patch);
    case 7: return im2row<7>(g, x_group, zx, p0, count, patch);
    default: return im2row<0>(g, x_group, zx, p0, count, patch);
  }
}

// Patch tile size: about 128 KiB of int16, so the tile stays in L2 while all weights pass by.
constexpr int64_t kPatchElements = 64 * 1024;
constexpr int64_t kMinTilePixels = 8;
// Below this reduction length (depthwise and other tiny kernels) the transposed form is faster.
constexpr int64_t kMinDotDepth = 16;

// Integer convolution of x (X: uint8_t / int8_t) with the packed weights: calls
// store(n, m, p0, count, acc) with acc[t] = the int32 sum of output channel m at pixel p0 + t of
// image n, for every output (from several threads when the work is large).
template <typename X, typename Store>
void conv_accumulate(const ConvGeometry& g, const X* x, int32_t x_zero_point, const int16_t* w, Store&& store) {
  const int64_t depth = g.depth, pixels = g.pixels(), cg = g.in_per_group(), mg = g.out_per_group();
  if (g.batch == 0 || pixels == 0 || mg == 0) return;
  const int64_t tile = std::min(pixels, std::max(kMinTilePixels, kPatchElements / std::max<int64_t>(depth, 1)));
  const int64_t tiles = (pixels + tile - 1) / tile;
  const bool dot_form = depth >= kMinDotDepth;
  parallel_units(g.batch * g.group * tiles, g.batch * g.out_channels * pixels * depth, [&](int64_t u0, int64_t u1) {
    std::vector<int16_t> patch(static_cast<size_t>(tile * depth));  // [tile, depth], or [depth, tile]
    std::vector<int32_t> acc(static_cast<size_t>(mg * tile));
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t n = u / (g.group * tiles), group = (u / tiles) % g.group, p0 = (u % tiles) * tile;
      const int64_t count = std::min(tile, pixels - p0);
      const X* x_group = x + (n * g.in_channels + group * cg) * g.in_size();
      const int16_t* wg = w + group * mg * depth;
      if (dot_form) {
        build_patch_rows(g, x_group, x_zero_point, p0, count, patch.data());
        integer::gemm_s16_nt(wg, depth, mg, patch.data(), depth, count, depth, acc.data(), count, 1);
      } else {
        im2col(g, x_group, x_zero_point, p0, count, patch.data());
        integer::gemm_s16_nn(wg, depth, mg, patch.data(), count, count, depth, acc.data(), count);
      }
      for (int64_t m = 0; m < mg; ++m) store(n, group * mg + m, p0, count, acc.data() + m * count);
    }
  });
}

// An integer GEMM operand (conv weights, MatMul's B) packed once when it and its zero point are
// constants, else on every run.
class PackedOperand {
 public:
  using Pack = std::vector<int16_t> (*)(const ir::Node&, const Tensor& value, const Tensor* zero_point);
  PackedOperand(const KernelInit& init, size_t index, size_t zero_point_index, Pack pack)
      : index_(index), zero_point_index_(zero_point_index), pack_(pack) {
    const Tensor* value = init.constant_input(index);
    const bool zero_point_constant =
        init.node.input(zero_point_index).empty() || init.constant_input(zero_point_index) != nullptr;
    if (value && zero_point_constant) {
      packed_ = pack_(init.node, *value, init.constant_input(zero_point_index));
      constant_ = true;
    }
  }
  const int16_t* get(const ir::Node& node, const KernelContext& ctx) {
    if (!constant_) packed_ = pack_(node, ctx.input(index_), ctx.optional_input(zero_point_index_));
    return packed_.data();
  }

 private:
  size_t index_, zero_point_index_;
  Pack pack_;
  bool constant_ = false;
  std::vector<int16_t> packed_;
};

class ConvIntegerKernel final : public Kernel {
 public:
  enum Input : size_t { kX, kW, kXZeroPoint, kWZeroPoint };

  explicit ConvIntegerKernel(const KernelInit& init)
      : node_(init.node), attrs_(ConvAttrs::parse(init.node)), weights_(init, kW, kWZeroPoint, pack_conv_weights) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    const Tensor& w = ctx.input(kW);
    require_8bit(node_, x, "x");
    require_8bit(node_, w, "w");
    const Tensor* x_zp = ctx.optional_input(kXZeroPoint);
    const std::vector<int32_t> zx = zero_point_values(node_, x_zp, x.dtype(), "x_zero_point");
    if (x_zp) require_one_value(node_, *x_zp, "x_zero_point");
    const ConvGeometry g = conv_geometry(node_, attrs_, x.shape(), w.shape());
    const int16_t* packed = weights_.get(node_, ctx);
    int32_t* y = ctx.allocate_output(0, DType::kInt32, g.out_shape).data<int32_t>();
    const int64_t pixels = g.pixels();
    dispatch_8bit(x.dtype(), [&](auto tag) {
      using X = decltype(tag);
      conv_accumulate(g, x.data<X>(), zx[0], packed,
                      [&](int64_t n, int64_t m, int64_t p0, int64_t count, const int32_t* acc) {
                        std::copy(acc, acc + count, y + (n * g.out_channels + m) * pixels + p0);
                      });
    });
  }

 private:
  const ir::Node& node_;
  ConvAttrs attrs_;
  PackedOperand weights_;
};

class QLinearConvKernel final : public Kernel {
 public:
  enum Input : size_t { kX, kXScale, kXZeroPoint, kW, kWScale, kWZeroPoint, kYScale, kYZeroPoint, kBias };

  explicit QLinearConvKernel(const KernelInit& init)
      : node_(init.node), attrs_(ConvAttrs::parse(init.node)), weights_(init, kW, kWZeroPoint, pack_conv_weights) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    const Tensor& w = ctx.input(kW);
    const Tensor& x_zp = ctx.input(kXZeroPoint);
    const Tensor& y_zp = ctx.input(kYZeroPoint);
    require_8bit(node_, x, "x");
    require_8bit(node_, w, "w");
    require_8bit(node_, y_zp, "y_zero_point");
    const int32_t zx = zero_point_values(node_, &x_zp, x.dtype(), "x_zero_point")[0];
    const int32_t zy = zero_point_values(node_, &y_zp, y_zp.dtype(), "y_zero_point")[0];
    const float x_scale = scale_values(node_, ctx.input(kXScale), "x_scale")[0];
    const float y_scale = scale_values(node_, ctx.input(kYScale), "y_scale")[0];
    require_one_value(node_, ctx.input(kXScale), "x_scale");
    require_one_value(node_, x_zp, "x_zero_point");
    require_one_value(node_, ctx.input(kYScale), "y_scale");
    require_one_value(node_, y_zp, "y_zero_point");
    const ConvGeometry g = conv_geometry(node_, attrs_, x.shape(), w.shape());
    const std::vector<float> w_scale = scale_values(node_, ctx.input(kWScale), "w_scale");
    require_per_channel(node_, w_scale.size(), g.out_channels, ctx.input(kWScale).shape(), "w_scale");

    std::vector<float> multiplier(static_cast<size_t>(g.out_channels));
    for (int64_t m = 0; m < g.out_channels; ++m)
      multiplier[m] = x_scale * w_scale[w_scale.size() == 1 ? 0 : m] / y_scale;  // MLAS's order
    std::vector<int32_t> bias(static_cast<size_t>(g.out_channels), 0);
    if (const Tensor* b = ctx.optional_input(kBias)) {
      SQ_CHECK(b->dtype() == DType::kInt32, ErrorKind::kInvalidModel,
               node_.describe() + ": bias B must be int32, got " + dtype_name(b->dtype()));
      SQ_CHECK(b->numel() == g.out_channels, ErrorKind::kInvalidArgument,
               node_.describe() + ": bias B has shape " + shape_str(b->shape()) + ", expected [" +
                   std::to_string(g.out_channels) + "]");
      std::copy(b->data<int32_t>(), b->data<int32_t>() + g.out_channels, bias.begin());
    }

    const int16_t* packed = weights_.get(node_, ctx);
    Tensor& y = ctx.allocate_output(0, y_zp.dtype(), g.out_shape);
    const int64_t pixels = g.pixels();
    dispatch_8bit(x.dtype(), [&](auto xtag) {
      using X = decltype(xtag);
      dispatch_8bit(y.dtype(), [&](auto ytag) {
        using Y = decltype(ytag);
        Y* yd = y.data<Y>();
        conv_accumulate(g, x.data<X>(), zx, packed,
                        [&](int64_t n, int64_t m, int64_t p0, int64_t count, const int32_t* acc) {
                          integer::requantize(acc, count, bias[m], multiplier[m], zy,
                                              yd + (n * g.out_channels + m) * pixels + p0);
                        });
      });
    });
  }

 private:
  const ir::Node& node_;
  ConvAttrs attrs_;
  PackedOperand weights_;
};

// ---------------------------------------------------------------------------------------------
// Matrix product (MatMulInteger, QLinearMatMul).

// numpy.matmul shapes: a 1-D A is a row [1, K], a 1-D B a column [K, 1] (their dim is dropped from
// the output); the batch dims broadcast.
struct MatMulGeometry {
  Shape a_batch, b_batch, batch;
  int64_t m = 1, k = 1, n = 1;
  Shape out_shape;
  std::vector<int64_t> a_index, b_index;  // per output batch: the batch of A and of B it reads

  int64_t batches() const { return static_cast<int64_t>(a_index.size()); }
};

// For each flat index of `out`, the flat index of `operand` (right-aligned; size-1 dims repeat).
std::vector<int64_t> broadcast_index(const Shape& operand, const Shape& out) {
  const size_t offset = out.size() - operand.size();
  std::vector<int64_t> index(static_cast<size_t>(shape_numel(out)));
  for (size_t flat = 0; flat < index.size(); ++flat) {
    int64_t rest = static_cast<int64_t>(flat), source = 0, stride = 1;
    for (size_t d = out.size(); d-- > 0;) {
      const int64_t i = rest % out[d];
      rest /= out[d];
      if (d >= offset) {
        const int64_t extent = operand[d - offset];
        if (extent != 1) source += i * stride;
        stride *= extent;
      }
    }
    index[flat] = source;
  }
  return index;
}

// The operand's [batch..., rows, cols] view (1-D promoted as numpy does).
Shape matmul_view(const Shape& s, bool is_a) {
  if (s.size() != 1) return s;
  return is_a ? Shape{1, s[0]} : Shape{s[0], 1};
}

MatMulGeometry matmul_geometry(const ir::Node& node, const Shape& a_shape, const Shape& b_shape) {
  SQ_CHECK(!a_shape.empty() && !b_shape.empty(), ErrorKind::kInvalidArgument,
           node.describe() + ": inputs must have rank >= 1, got " + shape_str(a_shape) + " and " + shape_str(b_shape));
  const Shape a = matmul_view(a_shape, true), b = matmul_view(b_shape, false);
  MatMulGeometry g;
  g.m = a[a.size() - 2];
  g.k = a[a.size() - 1];
  g.n = b[b.size() - 1];
  SQ_CHECK(b[b.size() - 2] == g.k, ErrorKind::kInvalidArgument,
           node.describe() + ": cannot multiply " + shape_str(a_shape) + " by " + shape_str(b_shape) +
               " (inner dims differ)");
  g.a_batch.assign(a.begin(), a.end() - 2);
  g.b_batch.assign(b.begin(), b.end() - 2);
  const size_t rank = std::max(g.a_batch.size(), g.b_batch.size());
  g.batch.assign(rank, 1);
  for (size_t d = 0; d < rank; ++d) {
    const int64_t da = d + g.a_batch.size() >= rank ? g.a_batch[d + g.a_batch.size() - rank] : 1;
    const int64_t db = d + g.b_batch.size() >= rank ? g.b_batch[d + g.b_batch.size() - rank] : 1;
    SQ_CHECK(da == db || da == 1 || db == 1, ErrorKind::kInvalidArgument,
             node.describe() + ": batch dims of " + shape_str(a_shape) + " and " + shape_str(b_shape) +
                 " do not broadcast");
    g.batch[d] = da == 1 ? db : da;
  }
  g.out_shape = g.batch;
  if (a_shape.size() > 1) g.out_shape.push_back(g.m);
  if (b_shape.size() > 1) g.out_shape.push_back(g.n);
  g.a_index = broadcast_index(g.a_batch, g.batch);
  g.b_index = broadcast_index(g.b_batch, g.batch);
  return g;
}

// A zero point or scale of one MatMul operand: one value (per tensor), or one per row of A / per
// column of B, given as [len] or with the operand's batch dims, [..., len, 1] / [..., 1, len]
// (dims of 1 broadcast). Returns one value, or operand batches * len values, batch-major.
template <typename T>
std::vector<T> expand_operand_param(const ir::Node& node, const std::vector<T>& values, const Shape& shape,
                                    const Shape& operand_batch, int64_t len, bool per_row, const char* what) {
  if (values.size() == 1) return values;
  Shape target = operand_batch;
  target.push_back(per_row ? len : 1);
  target.push_back(per_row ? 1 : len);
  Shape p = shape;
  if (p.size() == 1) p = per_row ? Shape{p[0], 1} : Shape{1, p[0]};
  bool fits = p.size() >= 2 && p.size() <= target.size();
  const size_t offset = target.size() - std::min(p.size(), target.size());
  for (size_t d = 0; fits && d < p.size(); ++d) fits = p[d] == target[offset + d] || p[d] == 1;
  SQ_CHECK(fits, ErrorKind::kInvalidArgument,
           node.describe() + ": " + what + " has shape " + shape_str(shape) + "; expected one value, " +
               std::to_string(len) + " values (one per " + (per_row ? "row of A" : "column of B") +
               ") or a shape that broadcasts to " + shape_str(target));
  const std::vector<int64_t> index = broadcast_index(p, target);
  std::vector<T> expanded(index.size());
  for (size_t i = 0; i < index.size(); ++i) expanded[i] = values[static_cast<size_t>(index[i])];
  return expanded;
}

// A's rows as int16 minus their zero point: [A batches][m][k].
std::vector<int16_t> widen_matmul_a(const ir::Node& node, const Tensor& a, const Tensor* a_zp,
                                    const MatMulGeometry& g) {
  const std::vector<int32_t> zp = expand_operand_param(
      node, zero_point_values(node, a_zp, a.dtype(), "a_zero_point"), a_zp ? a_zp->shape() : Shape{}, g.a_batch, g.m,
      true, "a_zero_point");
  std::vector<int16_t> widened(static_cast<size_t>(a.numel()));
  const int64_t rows = g.k > 0 ? a.numel() / g.k : 0;
  dispatch_8bit(a.dtype(), [&](auto tag) {
    using Q = decltype(tag);
    for (int64_t r = 0; r < rows; ++r)
      integer::widen(a.data<Q>() + r * g.k, g.k, zp[zp.size() == 1 ? 0 : r], widened.data() + r * g.k);
  });
  return widened;
}

// B transposed to columns, as int16 minus their zero point: [B batches][n][k].
std::vector<int16_t> pack_matmul_b(const ir::Node& node, const Tensor& b, const Tensor* b_zp) {
  require_8bit(node, b, "B");
  SQ_CHECK(b.rank() >= 1, ErrorKind::kInvalidArgument, node.describe() + ": B must have rank >= 1");
  const Shape view = matmul_view(b.shape(), false);
  const int64_t k = view[view.size() - 2], n = view[view.size() - 1];
  const Shape batch(view.begin(), view.end() - 2);
  const std::vector<int32_t> zp = expand_operand_param(
      node, zero_point_values(node, b_zp, b.dtype(), "b_zero_point"), b_zp ? b_zp->shape() : Shape{}, batch, n, false,
      "b_zero_point");
  std::vector<int16_t> packed(static_cast<size_t>(b.numel()));
  const int64_t batches = shape_numel(batch);
  dispatch_8bit(b.dtype(), [&](auto tag) {
    using Q = decltype(tag);
    for (int64_t bb = 0; bb < batches; ++bb) {
      const Q* src = b.data<Q>() + bb * k * n;
      int16_t* dst = packed.data() + bb * n * k;
      for (int64_t l = 0; l < k; ++l)
        for (int64_t j = 0; j < n; ++j)
          dst[j * k + l] = static_cast<int16_t>(int32_t{src[l * n + j]} - zp[zp.size() == 1 ? 0 : bb * n + j]);
    }
  });
  return packed;
}

// acc[ob][i][j] (out batch, row, column) = the int32 products of the widened operands.
void matmul_accumulate(const MatMulGeometry& g, const int16_t* a, const int16_t* bt, int32_t* acc) {
  const int64_t m = g.m, k = g.k, n = g.n;
  // The longer side runs in blocks of 4 through the dot kernel (a single-row A would otherwise
  // leave 3 of its 4 row slots empty).
  const bool a_rows = m >= 4 || m >= n;
  const int64_t rows = a_rows ? m : n;
  constexpr int64_t kRowBlock = 64;
  const int64_t row_blocks = (rows + kRowBlock - 1) / kRowBlock;
  parallel_units(g.batches() * row_blocks, g.batches() * m * n * k, [&](int64_t u0, int64_t u1) {
    for (int64_t u = u0; u < u1; ++u) {
      const int64_t ob = u / row_blocks, r0 = (u % row_blocks) * kRowBlock, r1 = std::min(rows, r0 + kRowBlock);
      const int16_t* ab = a + g.a_index[ob] * m * k;
      const int16_t* bb = bt + g.b_index[ob] * n * k;
      int32_t* out = acc + ob * m * n;
      if (a_rows) integer::gemm_s16_nt(ab + r0 * k, k, r1 - r0, bb, k, n, k, out + r0 * n, n, 1);
      else integer::gemm_s16_nt(bb + r0 * k, k, r1 - r0, ab, k, m, k, out + r0, 1, n);
    }
  });
}

class MatMulIntegerKernel final : public Kernel {
 public:
  enum Input : size_t { kA, kB, kAZeroPoint, kBZeroPoint };

  explicit MatMulIntegerKernel(const KernelInit& init) : node_(init.node), weights_(init, kB, kBZeroPoint, pack_matmul_b) {}

  void run(KernelContext& ctx) override {
    const Tensor& a = ctx.input(kA);
    const Tensor& b = ctx.input(kB);
    require_8bit(node_, a, "A");
    require_8bit(node_, b, "B");
    const MatMulGeometry g = matmul_geometry(node_, a.shape(), b.shape());
    const std::vector<int16_t> a16 = widen_matmul_a(node_, a, ctx.optional_input(kAZeroPoint), g);
    const int16_t* bt = weights_.get(node_, ctx);
    Tensor& y = ctx.allocate_output(0, DType::kInt32, g.out_shape);
    matmul_accumulate(g, a16.data(), bt, y.data<int32_t>());
  }

 private:
  const ir::Node& node_;
  PackedOperand weights_;
};

class QLinearMatMulKernel final : public Kernel {
 public:
  enum Input : size_t { kA, kAScale, kAZeroPoint, kB, kBScale, kBZeroPoint, kYScale, kYZeroPoint };

  explicit QLinearMatMulKernel(const KernelInit& init) : node_(init.node), weights_(init, kB, kBZeroPoint, pack_matmul_b) {}

  void run(KernelContext& ctx) override {
    const Tensor& a = ctx.input(kA);
    const Tensor& b = ctx.input(kB);
    const Tensor& y_zp = ctx.input(kYZeroPoint);
    require_8bit(node_, a, "a");
    require_8bit(node_, b, "b");
    require_8bit(node_, y_zp, "y_zero_point");
    const MatMulGeometry g = matmul_geometry(node_, a.shape(), b.shape());
    const Tensor& a_scale_t = ctx.input(kAScale);
    const Tensor& b_scale_t = ctx.input(kBScale);
    const std::vector<float> a_scale = expand_operand_param(node_, scale_values(node_, a_scale_t, "a_scale"),
                                                            a_scale_t.shape(), g.a_batch, g.m, true, "a_scale");
    const std::vector<float> b_scale = expand_operand_param(node_, scale_values(node_, b_scale_t, "b_scale"),
                                                            b_scale_t.shape(), g.b_batch, g.n, false, "b_scale");
    require_one_value(node_, ctx.input(kYScale), "y_scale");
    require_one_value(node_, y_zp, "y_zero_point");
    const float y_scale = scale_values(node_, ctx.input(kYScale), "y_scale")[0];
    const int32_t zy = zero_point_values(node_, &y_zp, y_zp.dtype(), "y_zero_point")[0];

    const std::vector<int16_t> a16 = widen_matmul_a(node_, a, &ctx.input(kAZeroPoint), g);
    const int16_t* bt = weights_.get(node_, ctx);
    std::vector<int32_t> acc(static_cast<size_t>(g.batches() * g.m * g.n));
    matmul_accumulate(g, a16.data(), bt, acc.data());

    Tensor& y = ctx.allocate_output(0, y_zp.dtype(), g.out_shape);
    std::vector<float> multipliers(b_scale.size() == 1 ? 0 : static_cast<size_t>(g.n));
    dispatch_8bit(y.dtype(), [&](auto tag) {
      using Y = decltype(tag);
      for (int64_t ob = 0; ob < g.batches(); ++ob)
        for (int64_t i = 0; i < g.m; ++i) {
          const int64_t row = ob * g.m + i;
          const float sa = a_scale[a_scale.size() == 1 ? 0 : g.a_index[ob] * g.m + i];
          Y* out = y.data<Y>() + row * g.n;
          if (b_scale.size() == 1) {
            integer::requantize(acc.data() + row * g.n, g.n, 0, sa * b_scale[0] / y_scale, zy, out);
            continue;
          }
          const float* sb = b_scale.data() + g.b_index[ob] * g.n;
          for (int64_t j = 0; j < g.n; ++j) multipliers[j] = sa * sb[j] / y_scale;  // MLAS's order
          integer::requantize(acc.data() + row * g.n, g.n, multipliers.data(), zy, out);
        }
    });
  }

 private:
  const ir::Node& node_;
  PackedOperand weights_;
};

// ---------------------------------------------------------------------------------------------
// DynamicQuantizeLinear.

// y_scale = (max(0, max x) - min(0, min x)) / 255, y_zero_point = saturate(round(-min / y_scale)),
// y = QuantizeLinear(x, y_scale, y_zero_point): ties to even throughout. An all-zero x (empty
// range) gets y_scale 1 as in ONNX Runtime (the ONNX reference gives 1/255; y and the zero point
// are 0 either way).
class DynamicQuantizeLinearKernel final : public Kernel {
 public:
  explicit DynamicQuantizeLinearKernel(const KernelInit& init) : node_(init.node) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    SQ_CHECK(x.dtype() == DType::kFloat32, ErrorKind::kInvalidModel,
             node_.describe() + ": x must be float32, got " + dtype_name(x.dtype()));
    const integer::DynamicQuantParams p = integer::dynamic_quant_params(x.data<float>(), x.numel());
    const float scale = p.scale;
    const uint8_t zero_point = p.zero_point;
    const Tensor scale_t = Tensor::scalar(scale);
    const Tensor zero_point_t = Tensor::scalar(static_cast<uint8_t>(zero_point));
    Tensor& y = ctx.allocate_output(0, DType::kUInt8, x.shape());
    quantize_linear(x, scale_t, &zero_point_t, 0, y, node_.describe());
    if (ctx.num_outputs() > 1) ctx.allocate_output(1, DType::kFloat32, {}).data<float>()[0] = scale;
    if (ctx.num_outputs() > 2)
      ctx.allocate_output(2, DType::kUInt8, {}).data<uint8_t>()[0] = static_cast<uint8_t>(zero_point);
  }

 private:
  const ir::Node& node_;
};

template <class K>
KernelFactory factory() {
  return [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<K>(init); };
}

}  // namespace

void register_integer_kernels(KernelRegistry& r) {
  r.add(fused_ops::kDynamicMatMul, make_dynamic_matmul, fused_ops::kDynamicMatMulDomain);
  r.add(fused_ops::kDynamicConv, make_dynamic_conv, fused_ops::kDynamicMatMulDomain);
  r.add("DynamicQuantizeLinear", factory<DynamicQuantizeLinearKernel>());
  r.add("MatMulInteger", factory<MatMulIntegerKernel>());
  r.add("ConvInteger", factory<ConvIntegerKernel>());
  r.add("QLinearMatMul", factory<QLinearMatMulKernel>());
  r.add("QLinearConv", factory<QLinearConvKernel>());
}

}  // namespace slimquant::runtime
