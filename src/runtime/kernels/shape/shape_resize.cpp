// Resize (opsets 10, 11, 13, 18/19 where the new attributes keep their defaults) and the deprecated
// Upsample (opsets 7, 9).
//
// Per axis, every output coordinate is mapped back to the input by the coordinate transformation
// mode and turned into taps (input indices, clamped to the edge) and weights: 1 tap for nearest,
// 2 for linear, 4 for cubic. Nearest is a pure gather (any dtype, rows shared when upsampling).
// Linear and cubic are separable: one 1-D pass per resized axis, innermost axis first, which is
// the order ONNX's reference implementation combines them in.
#include <algorithm>
#include <cmath>
#include <limits>

#include "runtime/kernels/cpu_clones.h"
#include "runtime/kernels/elementwise/channel_blocked.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

enum class Mode { kNearest, kLinear, kCubic };
enum class Coord {
  kHalfPixel,
  kHalfPixelSymmetric,
  kAsymmetric,
  kPytorchHalfPixel,
  kTfHalfPixelForNN,
  kAlignCorners,
  kTfCropAndResize
};
// kSimple: Resize-10 / Upsample rounding (floor when upsampling, ceil when downsampling).
enum class Nearest { kSimple, kRoundPreferFloor, kRoundPreferCeil, kFloor, kCeil };

struct ResizeAttrs {
  Mode mode = Mode::kNearest;
  Coord coord = Coord::kAsymmetric;
  Nearest nearest = Nearest::kSimple;
  float cubic_a = -0.75f;
  bool exclude_outside = false;
  float extrapolation = 0.f;
};

// One axis: for each output index, `taps` input indices and weights, or an extrapolation flag.
struct AxisPlan {
  int64_t in = 0, out = 0;
  int taps = 1;
  bool identity = false;
  std::vector<int64_t> idx;  // out * taps
  std::vector<float> w;      // out * taps (unused for nearest)
  std::vector<uint8_t> extrap;
};

// x_resized -> x_original. len_resized is in * scale, which ONNX's reference keeps fractional when
// the output size was derived from scales (align_corners over 4 * 0.6 = 2.4, not 2); with sizes
// given it is the exact output size. half_pixel_symmetric compares it with the integer size.
float original_coordinate(Coord c, float x, float scale, float len_resized, int64_t len_out, int64_t len_in,
                          float roi_lo, float roi_hi) {
  const float lr = len_resized, li = static_cast<float>(len_in);
  switch (c) {
    case Coord::kHalfPixel: return (x + 0.5f) / scale - 0.5f;
    case Coord::kHalfPixelSymmetric: {
      const float adjustment = static_cast<float>(len_out) / lr;
      const float center = li / 2;
      return center * (1 - adjustment) + (x + 0.5f) / scale - 0.5f;
    }
    case Coord::kAsymmetric: return x / scale;
    case Coord::kPytorchHalfPixel: return lr > 1 ? (x + 0.5f) / scale - 0.5f : 0.f;
    case Coord::kTfHalfPixelForNN: return (x + 0.5f) / scale;
    case Coord::kAlignCorners: return lr == 1 ? 0.f : x * (li - 1) / (lr - 1);
    case Coord::kTfCropAndResize:
      return lr > 1 ? roi_lo * (li - 1) + x * (roi_hi - roi_lo) * (li - 1) / (lr - 1)
                    : 0.5f * (roi_lo + roi_hi) * (li - 1);
  }
  return x;
}

int64_t nearest_index(Nearest n, float x, float scale) {
  switch (n) {
    case Nearest::kSimple: return static_cast<int64_t>(scale < 1.f ? std::ceil(x) : x);
    case Nearest::kRoundPreferCeil: return static_cast<int64_t>(std::round(x));  // halves round away from 0
    case Nearest::kFloor: return static_cast<int64_t>(std::floor(x));
    case Nearest::kCeil: return static_cast<int64_t>(std::ceil(x));
    case Nearest::kRoundPreferFloor:
      if (x == std::floor(x) + 0.5f) return static_cast<int64_t>(std::floor(x));
      return static_cast<int64_t>(std::round(x));
  }
  return 0;
}

// Keys' cubic convolution weights for the 4 taps at offsets -1, 0, 1, 2 from floor(x), t = x - floor(x).
void cubic_weights(float t, float a, float* w) {
  auto near = [a](float d) { return ((a + 2) * d - (a + 3)) * d * d + 1; };            // |d| <= 1
  auto far = [a](float d) { return ((a * d - 5 * a) * d + 8 * a) * d - 4 * a; };       // 1 < |d| < 2
  w[0] = far(t + 1);
  w[1] = near(t);
  w[2] = near(1 - t);
  w[3] = far(2 - t);
}

AxisPlan plan_axis(const ResizeAttrs& a, int64_t in, int64_t out, float scale, float len_resized, float roi_lo,
                   float roi_hi) {
  AxisPlan p;
  p.in = in;
  p.out = out;
  p.taps = a.mode == Mode::kNearest ? 1 : a.mode == Mode::kLinear ? 2 : 4;
  p.idx.resize(static_cast<size_t>(out * p.taps));
  p.w.resize(static_cast<size_t>(out * p.taps));
  p.extrap.assign(static_cast<size_t>(out), 0);
  bool identity = in == out;
  const int64_t last = in - 1;
  for (int64_t o = 0; o < out; ++o) {
    const float x = original_coordinate(a.coord, static_cast<float>(o), scale, len_resized, out, in, roi_lo, roi_hi);
    int64_t* ix = &p.idx[static_cast<size_t>(o * p.taps)];
    float* w = &p.w[static_cast<size_t>(o * p.taps)];
    if (a.coord == Coord::kTfCropAndResize && (x < 0.f || x > static_cast<float>(last))) {
      p.extrap[static_cast<size_t>(o)] = 1;
      identity = false;
      std::fill(ix, ix + p.taps, 0);
      std::fill(w, w + p.taps, 0.f);
      continue;
    }
    if (a.mode == Mode::kNearest) {
      ix[0] = std::clamp<int64_t>(nearest_index(a.nearest, x, scale), 0, last);
      w[0] = 1.f;
      identity = identity && ix[0] == o;
      continue;
    }
    const float fl = std::floor(x);
    const float t = x - fl;
    const int64_t x0 = static_cast<int64_t>(fl);
    identity = identity && t == 0.f && x0 == o;
    if (a.mode == Mode::kLinear) {
      ix[0] = std::clamp<int64_t>(x0, 0, last);
      ix[1] = std::clamp<int64_t>(x0 + 1, 0, last);
      w[0] = 1.f - t;
      w[1] = t;
      continue;
    }
    cubic_weights(t, a.cubic_a, w);
    float sum = 0.f;
    for (int k = 0; k < 4; ++k) {
      const int64_t pos = x0 - 1 + k;
      if (a.exclude_outside && (pos < 0 || pos > last)) w[k] = 0.f;
      sum += w[k];
      ix[k] = std::clamp<int64_t>(pos, 0, last);
    }
    if (a.exclude_outside && sum != 0.f)
      for (int k = 0; k < 4; ++k) w[k] /= sum;
  }
  p.identity = identity;
  return p;
}

// One separable pass of linear/cubic interpolation along an axis: [outer, in, inner] -> [outer, out, inner].
// TAPS is 2 (linear) or 4 (cubic), fixed so the tap loops unroll and the row loops vectorize.
template <int TAPS, typename C>
void interp_pass(const C* src, C* dst, int64_t outer, int64_t inner, const AxisPlan& p, C extrap) {
  const bool any_extrap = std::find(p.extrap.begin(), p.extrap.end(), 1) != p.extrap.end();
  if (inner == 1 && !any_extrap) {
    // Innermost axis: a weighted gather per output element; weights converted once per pass.
    const std::vector<C> wc(p.w.begin(), p.w.end());
    const int64_t* ix = p.idx.data();
    parallel_chunks(outer, outer * p.out * TAPS * static_cast<int64_t>(sizeof(C)), [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) {
        const C* s = src + o * p.in;
        C* d = dst + o * p.out;
        for (int64_t j = 0; j < p.out; ++j) {
          const C* w = &wc[static_cast<size_t>(j * TAPS)];
          const int64_t* k = ix + j * TAPS;
          C acc = w[0] * s[k[0]];
          for (int t = 1; t < TAPS; ++t) acc += w[t] * s[k[t]];
          d[j] = acc;
        }
      }
    });
    return;
  }
  const int64_t bytes = outer * p.out * inner * TAPS * static_cast<int64_t>(sizeof(C));
  parallel_chunks(outer, bytes, [&](int64_t o0, int64_t o1) {
  for (int64_t o = o0; o < o1; ++o) {
    const C* s = src + o * p.in * inner;
    C* d = dst + o * p.out * inner;
    for (int64_t j = 0; j < p.out; ++j) {
      C* dr = d + j * inner;
      if (any_extrap && p.extrap[static_cast<size_t>(j)]) {
        std::fill(dr, dr + inner, extrap);
        continue;
      }
      const int64_t* ix = &p.idx[static_cast<size_t>(j * TAPS)];
      const float* wf = &p.w[static_cast<size_t>(j * TAPS)];
      C w[TAPS];
      const C* rows[TAPS];
      for (int t = 0; t < TAPS; ++t) {
        w[t] = static_cast<C>(wf[t]);
        rows[t] = s + ix[t] * inner;
      }
      // Whole rows at a time: contiguous inner loops (a single element on the innermost axis).
      for (int64_t i = 0; i < inner; ++i) {
        C acc = w[0] * rows[0][i];
        for (int t = 1; t < TAPS; ++t) acc += w[t] * rows[t][i];
        dr[i] = acc;
      }
    }
  }
  });
}

// Nearest: a gather through the per-axis index maps, one output row (last axis) at a time. A row
// whose source row equals the previous row's (upsampling along an outer axis) is a memcpy of the
// row just written.
template <size_t N>
void nearest_rows(const std::byte* src, std::byte* dst, const std::vector<AxisPlan>& plans,
                  const std::vector<int64_t>& in_strides, const std::byte* extrap, size_t es) {
  const size_t r = plans.size();
  const AxisPlan& last = plans[r - 1];
  const int64_t row_len = last.out, e = static_cast<int64_t>(es);
  const int64_t row_bytes = row_len * e;
  int64_t rows = 1;
  for (size_t d = 0; d + 1 < r; ++d) rows *= plans[d].out;
  const bool last_extrap = std::find(last.extrap.begin(), last.extrap.end(), 1) != last.extrap.end();
  parallel_chunks(rows, rows * row_bytes, [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> idx(r, 0);
    int64_t rem = r0;
    for (size_t d = r - 1; d-- > 0;) {
      idx[d] = rem % plans[d].out;
      rem /= plans[d].out;
    }
    int64_t prev = -2;  // source offset of the previous row, -1: extrapolated row
    for (int64_t row = r0; row < r1; ++row) {
      int64_t off = 0;
      for (size_t d = 0; d + 1 < r && off >= 0; ++d) {
        const size_t i = static_cast<size_t>(idx[d]);
        off = plans[d].extrap[i] ? -1 : off + plans[d].idx[i] * in_strides[d];
      }
      std::byte* out = dst + row * row_bytes;
      if (off == prev && row > r0) {
        std::memcpy(out, out - row_bytes, static_cast<size_t>(row_bytes));
      } else if (off < 0) {
        fill_elems(out, extrap, es, row_len);
      } else {
        // Locals, not captures: byte stores may alias anything whose address escaped, which would
        // force reloads of captured values on every element.
        const std::byte* in = src + off * e;
        const int64_t* m = last.idx.data();
        const int64_t n = row_len, step = e;
        const size_t size = es;
        if (!last_extrap) {
          for (int64_t o = 0; o < n; ++o) copy_elem<N>(out + o * step, in + m[o] * step, size);
        } else {
          const uint8_t* ex = last.extrap.data();
          for (int64_t o = 0; o < n; ++o) copy_elem<N>(out + o * step, ex[o] ? extrap : in + m[o] * step, size);
        }
      }
      prev = off;
      for (size_t d = r - 1; d-- > 0;) {
        if (++idx[d] < plans[d].out) break;
        idx[d] = 0;
      }
    }
  });
}

template <typename T>
T saturate_round(double v) {
  if constexpr (std::is_floating_point_v<T>) {
    return static_cast<T>(v);
  } else {
    const double r = std::nearbyint(v);
    if (r <= static_cast<double>(std::numeric_limits<T>::lowest())) return std::numeric_limits<T>::lowest();
    if (r >= static_cast<double>(std::numeric_limits<T>::max())) return std::numeric_limits<T>::max();
    return static_cast<T>(r);
  }
}

// Without contraction into fused multiply-adds (which the AVX2 / AVX-512 clones would do): the same
// bits as the plain path's passes, compiled for the baseline.
#pragma GCC push_options
#pragma GCC optimize("fp-contract=off")
// One input row of `lanes`-wide pixels interpolated along W: out[ow][l] = wl in[left][l] + wr
// in[right][l], the taps and weights of pw (two per output column).
SQ_AVX512_AVX2_CLONES void bilinear_row_along_w(const float* __restrict in, const int64_t* idx, const float* w,
                                                int64_t out_w, int64_t lanes, float* __restrict out) {
  for (int64_t ow = 0; ow < out_w; ++ow) {
    const float* left = in + idx[2 * ow] * lanes;
    const float* right = in + idx[2 * ow + 1] * lanes;
    const float wl = w[2 * ow], wr = w[2 * ow + 1];
    float* o = out + ow * lanes;
    for (int64_t l = 0; l < lanes; ++l) o[l] = wl * left[l] + wr * right[l];
  }
}

// out[i] = wt top[i] + wb bottom[i]: two W-interpolated rows blended along H.
SQ_AVX512_AVX2_CLONES void blend_rows(const float* __restrict top, const float* __restrict bottom, float wt, float wb,
                                      int64_t n, float* __restrict out) {
  for (int64_t i = 0; i < n; ++i) out[i] = wt * top[i] + wb * bottom[i];
}
#pragma GCC pop_options

class ResizeKernel : public Kernel {
 public:
  // `upsample`: the deprecated Upsample op (scales as attribute before opset 9, input 1 after).
  ResizeKernel(const KernelInit& init, bool upsample) : opset_(init.opset), quantize_(folded_quantize(init.node)) {
    const ir::Node& node = init.node;
    const std::string where = node.describe();
    const std::string mode = node.attr_string("mode", "nearest");
    if (mode == "nearest") a_.mode = Mode::kNearest;
    else if (mode == "linear" || mode == "bilinear") a_.mode = Mode::kLinear;
    else if (mode == "cubic" && !upsample && opset_ >= 11) a_.mode = Mode::kCubic;
    else fail(ErrorKind::kInvalidModel, where + ": unknown mode '" + mode + "'");

    if (upsample || opset_ < 11) {
      // Upsample and Resize-10: asymmetric coordinates, legacy nearest rounding; scales only.
      a_.coord = Coord::kAsymmetric;
      a_.nearest = Nearest::kSimple;
      if (upsample && opset_ < 9) scales_attr_ = node.attr_floats("scales");
      else scales_input_ = 1;
      return;
    }
    const std::string coord = node.attr_string("coordinate_transformation_mode", "half_pixel");
    if (coord == "half_pixel") a_.coord = Coord::kHalfPixel;
    else if (coord == "half_pixel_symmetric") a_.coord = Coord::kHalfPixelSymmetric;
    else if (coord == "asymmetric") a_.coord = Coord::kAsymmetric;
    else if (coord == "pytorch_half_pixel") a_.coord = Coord::kPytorchHalfPixel;
    else if (coord == "tf_half_pixel_for_nn") a_.coord = Coord::kTfHalfPixelForNN;
    else if (coord == "align_corners") a_.coord = Coord::kAlignCorners;
    else if (coord == "tf_crop_and_resize") a_.coord = Coord::kTfCropAndResize;
    else fail(ErrorKind::kInvalidModel, where + ": unknown coordinate_transformation_mode '" + coord + "'");
    const std::string nearest = node.attr_string("nearest_mode", "round_prefer_floor");
    if (nearest == "round_prefer_floor") a_.nearest = Nearest::kRoundPreferFloor;
    else if (nearest == "round_prefer_ceil") a_.nearest = Nearest::kRoundPreferCeil;
    else if (nearest == "floor") a_.nearest = Nearest::kFloor;
    else if (nearest == "ceil") a_.nearest = Nearest::kCeil;
    else fail(ErrorKind::kInvalidModel, where + ": unknown nearest_mode '" + nearest + "'");
    a_.cubic_a = node.attr_float("cubic_coeff_a", -0.75f);
    a_.exclude_outside = node.attr_int("exclude_outside", 0) != 0;
    a_.extrapolation = node.attr_float("extrapolation_value", 0.f);
    // Opset 18 additions, supported only at their defaults.
    if (node.attr_int("antialias", 0) != 0)
      fail(ErrorKind::kUnsupported, where + ": antialias=1 is not supported");
    if (node.has_attr("axes")) fail(ErrorKind::kUnsupported, where + ": the axes attribute is not supported");
    if (node.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch")
      fail(ErrorKind::kUnsupported, where + ": keep_aspect_ratio_policy other than 'stretch' is not supported");
    roi_input_ = 1;
    scales_input_ = 2;
    sizes_input_ = 3;
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    Tensor x = ctx.input(0);
    const size_t r = x.rank();

    std::vector<float> scales = scales_attr_;
    if (scales_input_ > 0 && ctx.has_input(scales_input_)) scales = ctx.input(scales_input_).to_float_vector();
    std::vector<int64_t> sizes;
    if (sizes_input_ > 0 && ctx.has_input(sizes_input_)) sizes = read_ints(ctx.input(sizes_input_), node, "sizes");
    std::vector<float> roi;
    if (a_.coord == Coord::kTfCropAndResize && roi_input_ > 0 && ctx.has_input(roi_input_))
      roi = ctx.input(roi_input_).to_float_vector();
    if (!roi.empty() && roi.size() != 2 * r)
      fail(ErrorKind::kInvalidModel, node.describe() + ": roi has " + std::to_string(roi.size()) +
                                         " values, need 2 x rank = " + std::to_string(2 * r));
    if (scales.empty() == sizes.empty())
      fail(ErrorKind::kInvalidModel, node.describe() + ": exactly one of scales and sizes must be given");
    if ((!scales.empty() && scales.size() != r) || (!sizes.empty() && sizes.size() != r))
      fail(ErrorKind::kInvalidModel, node.describe() + ": scales/sizes need one value per dim of " +
                                         shape_str(x.shape()));

    Shape out_shape(r);
    std::vector<float> axis_scale(r);
    for (size_t d = 0; d < r; ++d) {
      const float lo = roi.empty() ? 0.f : roi[d], hi = roi.empty() ? 1.f : roi[d + r];
      if (!sizes.empty()) {
        out_shape[d] = sizes[d];
        if (sizes[d] < 0 || (x.dim(d) == 0 && sizes[d] != 0))
          fail(ErrorKind::kInvalidArgument, node.describe() + ": size " + std::to_string(sizes[d]) +
                                                " invalid for axis " + std::to_string(d) + " of " + shape_str(x.shape()));
        axis_scale[d] = x.dim(d) == 0 ? 1.f : static_cast<float>(sizes[d]) / static_cast<float>(x.dim(d));
      } else {
        if (!(scales[d] > 0.f))
          fail(ErrorKind::kInvalidArgument, node.describe() + ": scale " + std::to_string(scales[d]) +
                                                " on axis " + std::to_string(d) + " must be positive");
        axis_scale[d] = scales[d];
        // The roi factor only differs from 1 for tf_crop_and_resize.
        const float size = std::floor(static_cast<float>(x.dim(d)) * (hi - lo) * scales[d]);
        // Converting an out-of-range float is undefined: huge scales (or a NaN roi) stop here.
        if (!(size >= 0.f && size < 9.2e18f))
          fail(ErrorKind::kInvalidArgument, node.describe() + ": scale " + std::to_string(scales[d]) + " on axis " +
                                                std::to_string(d) + " of " + shape_str(x.shape()) +
                                                " gives no valid output size");
        out_shape[d] = static_cast<int64_t>(size);
      }
    }
    // The per-axis plans below are sized by the output: check it before building them.
    checked_tensor_bytes(x.dtype(), out_shape, node.describe() + ": output");
    std::vector<AxisPlan> plans(r);
    bool identity = true;
    for (size_t d = 0; d < r; ++d) {
      const float lo = roi.empty() ? 0.f : roi[d], hi = roi.empty() ? 1.f : roi[d + r];
      const float len_resized = sizes.empty() ? axis_scale[d] * static_cast<float>(x.dim(d))
                                              : static_cast<float>(out_shape[d]);
      plans[d] = plan_axis(a_, x.dim(d), out_shape[d], axis_scale[d], len_resized, lo, hi);
      identity = identity && plans[d].identity;
    }
    // A channel-blocked x (a channel-blocked step) resized by nearest along N, H, W, or bilinearly
    // along H and W, keeps its layout; other cases read a plain copy.
    if (const Layout* layout = ctx.input_layout(0)) {
      const std::optional<channel_blocked::Blocking> blocking = channel_blocked::blocking_of(*layout);
      if (blocking && r == 4 && a_.mode == Mode::kLinear && x.dtype() == DType::kFloat32 && plans[0].identity &&
          plans[1].identity && !extrapolates(plans[2]) && !extrapolates(plans[3]) && ctx.output_layout_allowed(0)) {
        const DType y_type = quantize_ ? quantize_->dtype : x.dtype();
        if (LayoutPtr out_layout = channel_blocked::blocked_layout(*blocking, out_shape, y_type)) {
          Tensor& y = ctx.allocate_output(0, y_type, out_shape);
          if (y.numel() > 0)
            run_bilinear_blocked(x, y, plans[2], plans[3], channel_blocked::View(x.shape(), *blocking));
          ctx.set_output_layout(0, std::move(out_layout));
          return;
        }
      }
      if (quantize_ && gathers_codes(x, plans)) {
        // QuantizeLinear commutes with the gather: the input's codes (fewer values when
        // upsampling), gathered in its layout.
        if (blocking && r == 4 && plans[1].identity && ctx.output_layout_allowed(0)) {
          LayoutPtr in_codes = channel_blocked::blocked_layout(*blocking, x.shape(), quantize_->dtype);
          LayoutPtr out_codes = channel_blocked::blocked_layout(*blocking, out_shape, quantize_->dtype);
          if (in_codes && out_codes) {
            const Tensor codes = quantized(x);
            if (identity) {
              ctx.set_output(0, codes);
              ctx.set_output_layout(0, std::move(in_codes));
              return;
            }
            Tensor& y = ctx.allocate_output(0, codes.dtype(), out_shape);
            if (y.numel() > 0) run_nearest_blocked(codes, y, plans, channel_blocked::View(x.shape(), *blocking));
            ctx.set_output_layout(0, std::move(out_codes));
            return;
          }
        }
      }
      if (quantize_) x = channel_blocked::plain_input(ctx, 0);  // below: plain, then quantized
    }
    if (quantize_) {
      run_then_quantize(ctx, x, out_shape, plans, identity);
      return;
    }
    if (const Layout* layout = ctx.input_layout(0)) {
      const std::optional<channel_blocked::Blocking> blocking = channel_blocked::blocking_of(*layout);
      if (blocking && r == 4 && a_.mode == Mode::kNearest && plans[1].identity && ctx.output_layout_allowed(0)) {
        if (identity) {
          ctx.set_output(0, x);
          ctx.set_output_layout(0, std::make_shared<const Layout>(*layout));
          return;
        }
        if (LayoutPtr out_layout = channel_blocked::blocked_layout(*blocking, out_shape, x.dtype())) {
          Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
          if (y.numel() > 0) run_nearest_blocked(x, y, plans, channel_blocked::View(x.shape(), *blocking));
          ctx.set_output_layout(0, std::move(out_layout));
          return;
        }
      }
      x = channel_blocked::plain_input(ctx, 0);
    }
    if (identity) {  // every output coordinate lands on its own input element: a view
      ctx.set_output(0, x);
      return;
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    if (y.numel() == 0) return;
    if (a_.mode == Mode::kNearest) run_nearest(x, y, plans);
    else run_interpolated(node, x, y, plans);
  }

 private:
  // Whether a folded QuantizeLinear may come before the resize: nearest copies values, except an
  // extrapolated one (tf_crop_and_resize), which is the float extrapolation_value.
  bool gathers_codes(const Tensor& x, const std::vector<AxisPlan>& plans) const {
    return a_.mode == Mode::kNearest && x.dtype() == DType::kFloat32 &&
           std::none_of(plans.begin(), plans.end(), [](const AxisPlan& p) { return extrapolates(p); });
  }

  // x's codes under the folded QuantizeLinear, element by element in x's own layout.
  Tensor quantized(const Tensor& x) const {
    Tensor codes(quantize_->dtype, x.shape());
    quantize_floats(x.data<float>(), x.numel(), quantize_->scale[0], quantize_->zero_point[0], codes.dtype(), codes.raw());
    return codes;
  }

  // With a folded QuantizeLinear, where the blocked bilinear pass does not apply: the result
  // (plain), then its codes.
  void run_then_quantize(KernelContext& ctx, const Tensor& x, const Shape& out_shape,
                         const std::vector<AxisPlan>& plans, bool identity) const {
    if (gathers_codes(x, plans)) {  // codes first, then the gather (as above)
      const Tensor codes = quantized(x);
      if (identity) {
        ctx.set_output(0, codes);
        return;
      }
      Tensor& y = ctx.allocate_output(0, codes.dtype(), out_shape);
      if (y.numel() > 0) run_nearest(codes, y, plans);
      return;
    }
    Tensor resized = identity ? x : Tensor(x.dtype(), out_shape);
    if (!identity && resized.numel() > 0) {
      if (a_.mode == Mode::kNearest) run_nearest(x, resized, plans);
      else run_interpolated(ctx.node(), x, resized, plans);
    }
    Tensor& y = ctx.allocate_output(0, quantize_->dtype, out_shape);
    if (x.dtype() == DType::kFloat32) {
      quantize_floats(resized.data<float>(), y.numel(), quantize_->scale[0], quantize_->zero_point[0], y.dtype(), y.raw());
      return;
    }
    // An int32 Resize (QuantizeLinear reads float32 or int32): the QuantizeLinear's own arithmetic.
    Tensor zero_point(quantize_->dtype, {});
    if (quantize_->dtype == DType::kUInt8) zero_point.data<uint8_t>()[0] = static_cast<uint8_t>(quantize_->zero_point[0]);
    else zero_point.data<int8_t>()[0] = static_cast<int8_t>(quantize_->zero_point[0]);
    quantize_linear(resized, Tensor::scalar<float>(quantize_->scale[0]), &zero_point, 1, y, ctx.node().describe());
  }

  void run_nearest(const Tensor& x, Tensor& y, const std::vector<AxisPlan>& plans) const {
    const size_t es = dtype_size(x.dtype());
    std::vector<std::byte> extrap(es);
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T v = static_cast<T>(a_.extrapolation);
      std::memcpy(extrap.data(), &v, es);
    });
    const std::vector<int64_t> in_strides = contiguous_strides(x.shape());
    dispatch_elem_size(es, [&](auto sz) {
      nearest_rows<decltype(sz)::value>(static_cast<const std::byte*>(x.raw()), static_cast<std::byte*>(y.raw()),
                                        plans, in_strides, extrap.data(), es);
    });
  }

  // Nearest over channel-blocked data: [N, C/B, H, W] elements of B lanes each, gathered like
  // plain elements (the channel-block axis maps to itself).
  void run_nearest_blocked(const Tensor& x, Tensor& y, const std::vector<AxisPlan>& plans,
                           const channel_blocked::View& v) const {
    const size_t es = dtype_size(x.dtype()) * static_cast<size_t>(v.block);
    std::vector<std::byte> extrap(es);
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T value = static_cast<T>(a_.extrapolation);
      for (int64_t l = 0; l < v.block; ++l) std::memcpy(extrap.data() + l * sizeof(T), &value, sizeof(T));
    });
    AxisPlan blocks;
    blocks.in = blocks.out = v.blocks();
    blocks.identity = true;
    for (int64_t i = 0; i < v.blocks(); ++i) blocks.idx.push_back(i);
    blocks.w.assign(static_cast<size_t>(v.blocks()), 1.f);
    blocks.extrap.assign(static_cast<size_t>(v.blocks()), 0);
    const std::vector<AxisPlan> view_plans = {plans[0], blocks, plans[2], plans[3]};
    const std::vector<int64_t> in_strides = contiguous_strides({v.n, v.blocks(), v.height, v.width});
    dispatch_elem_size(es, [&](auto sz) {
      nearest_rows<decltype(sz)::value>(static_cast<const std::byte*>(x.raw()), static_cast<std::byte*>(y.raw()),
                                        view_plans, in_strides, extrap.data(), es);
    });
  }

  static bool extrapolates(const AxisPlan& p) { return std::find(p.extrap.begin(), p.extrap.end(), 1) != p.extrap.end(); }

  // Bilinear over channel-blocked data, in the input's layout (the plain path reorders the whole map
  // to NCHW, gathers along W element by element and reorders back: at 1024x1024 most of a U-Net
  // decoder's upsampling time). Separable, as the passes sum: each input row a plane's output rows
  // read is interpolated along W once into a buffer (each is read by about two output rows when
  // upsampling by 2), then pairs of those rows blend along H. With a folded QuantizeLinear the
  // output row is quantized from a buffer that stays in cache: the float32 map never goes to memory.
  void run_bilinear_blocked(const Tensor& x, Tensor& y, const AxisPlan& ph, const AxisPlan& pw,
                            const channel_blocked::View& v) const {
    const int64_t lanes = v.block, out_h = ph.out, out_w = pw.out;
    const float* src = x.data<float>();
    const int64_t in_plane = v.plane_elements(), out_plane = out_h * out_w * lanes;
    const int64_t planes = v.n * v.blocks();
    const int64_t row_values = out_w * lanes;
    parallel_chunks(planes * out_h, planes * out_plane * static_cast<int64_t>(sizeof(float)), [&](int64_t r0, int64_t r1) {
      // Two W-interpolated input rows, keyed by (plane, input row).
      std::vector<float> rows[2] = {std::vector<float>(static_cast<size_t>(row_values)),
                                    std::vector<float>(static_cast<size_t>(row_values))};
      int64_t key[2] = {-1, -1};
      int next = 0;
      auto along_w = [&](int64_t plane, int64_t in_row, int avoid) -> const float* {
        const int64_t k = plane * v.height + in_row;
        for (int i = 0; i < 2; ++i)
          if (key[i] == k) return rows[i].data();
        const int slot = next == avoid ? 1 - next : next;
        next = 1 - slot;
        key[slot] = k;
        bilinear_row_along_w(src + plane * in_plane + in_row * v.width * lanes, pw.idx.data(), pw.w.data(), out_w, lanes,
                             rows[slot].data());
        return rows[slot].data();
      };
      std::vector<float> out_row(quantize_ ? static_cast<size_t>(row_values) : 0);
      for (int64_t row = r0; row < r1; ++row) {
        const int64_t plane = row / out_h, oh = row % out_h;
        const float* top = along_w(plane, ph.idx[static_cast<size_t>(2 * oh)], -1);
        const int top_slot = top == rows[0].data() ? 0 : 1;
        const float* bottom = along_w(plane, ph.idx[static_cast<size_t>(2 * oh + 1)], top_slot);
        const int64_t first = plane * out_plane + oh * row_values;
        float* out = quantize_ ? out_row.data() : y.data<float>() + first;
        blend_rows(top, bottom, ph.w[static_cast<size_t>(2 * oh)], ph.w[static_cast<size_t>(2 * oh + 1)], row_values, out);
        if (quantize_)
          quantize_floats(out, row_values, quantize_->scale[0], quantize_->zero_point[0], y.dtype(),
                          static_cast<uint8_t*>(y.raw()) + first);
      }
    });
  }

  void run_interpolated(const ir::Node& node, const Tensor& x, Tensor& y, const std::vector<AxisPlan>& plans) const {
    if (x.dtype() == DType::kBool)
      fail(ErrorKind::kUnsupported, node.describe() + ": linear/cubic resize of bool data is not defined");
    if (x.dtype() == DType::kFloat64) interpolate<double, double>(x, y, plans);
    else
      dispatch_dtype(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        if constexpr (!std::is_same_v<T, bool> && !std::is_same_v<T, double>) interpolate<T, float>(x, y, plans);
      });
  }

  // Data of type T interpolated in compute type C (float, or double for double data); integer
  // outputs are rounded to nearest and saturated.
  template <typename T, typename C>
  void interpolate(const Tensor& x, Tensor& y, const std::vector<AxisPlan>& plans) const {
    const size_t r = plans.size();
    std::vector<size_t> axes;  // resized axes, innermost first
    for (size_t d = r; d-- > 0;)
      if (!plans[d].identity) axes.push_back(d);
    const C extrap = static_cast<C>(a_.extrapolation);
    const int64_t n_in = x.numel();
    // Stage buffers: the input in C (unless T is C), and ping-pong buffers between passes.
    std::vector<C> in_buf, buf_a, buf_b;
    const C* cur;
    if constexpr (std::is_same_v<T, C>) {
      cur = x.data<T>();
    } else {
      in_buf.assign(x.data<T>(), x.data<T>() + n_in);
      cur = in_buf.data();
    }
    Shape cur_shape = x.shape();
    if (axes.empty()) {  // nothing moves (scale 1 everywhere)
      T* out = y.data<T>();
      for (int64_t i = 0; i < n_in; ++i) out[i] = saturate_round<T>(static_cast<double>(cur[i]));
      return;
    }
    for (size_t k = 0; k < axes.size(); ++k) {
      const size_t d = axes[k];
      int64_t outer = 1, inner = 1;
      for (size_t e = 0; e < r; ++e) {
        if (e < d) outer *= cur_shape[e];
        if (e > d) inner *= cur_shape[e];
      }
      cur_shape[d] = plans[d].out;
      const bool last_pass = k + 1 == axes.size();
      C* dst = nullptr;
      if constexpr (std::is_same_v<T, C>) {
        if (last_pass) dst = y.data<C>();  // the last pass writes the output directly
      }
      if (!dst) {
        // Alternate buffers so a pass never writes the buffer it reads.
        std::vector<C>& buf = (k % 2 == 0) ? buf_a : buf_b;
        buf.resize(static_cast<size_t>(shape_numel(cur_shape)));
        dst = buf.data();
      }
      if (plans[d].taps == 2) interp_pass<2, C>(cur, dst, outer, inner, plans[d], extrap);
      else interp_pass<4, C>(cur, dst, outer, inner, plans[d], extrap);
      cur = dst;
    }
    if constexpr (!std::is_same_v<T, C>) {
      T* out = y.data<T>();
      const int64_t n = y.numel();
      for (int64_t i = 0; i < n; ++i) out[i] = saturate_round<T>(static_cast<double>(cur[i]));
    }
  }

  int64_t opset_;
  ResizeAttrs a_;
  // The QuantizeLinear the plan folded after the output (Fold::kTensorQuantize): y is its codes.
  std::optional<FoldedQuantize> quantize_;
  std::vector<float> scales_attr_;
  size_t roi_input_ = 0, scales_input_ = 0, sizes_input_ = 0;  // 0: not an input of this version
};

}  // namespace

std::unique_ptr<Kernel> make_resize(const KernelInit& init) { return std::make_unique<ResizeKernel>(init, false); }
std::unique_ptr<Kernel> make_upsample(const KernelInit& init) { return std::make_unique<ResizeKernel>(init, true); }

}  // namespace slimquant::runtime::shape
