// ConvTranspose (ONNX opsets 1, 11): 1-D/2-D/3-D transposed convolution with groups, strides,
// dilations, pads, output_padding, output_shape and auto_pad, on oneDNN's deconvolution_forward.
// A fused activation (runtime/fused_ops/fused_activation.h) runs as an eltwise post-op.
//
// Output size per spatial dim (ONNX): out = stride*(in-1) + output_padding + (k-1)*dilation + 1
// - pad_begin - pad_end. oneDNN has no output_padding: it computes out = stride*(in-1) + (k-1)*d+1
// - pl - pr, so output_padding moves into pr (possibly negative, which oneDNN accepts: the extra
// end positions receive only the bias).
//
// Upsampling layers whose kernel equals the stride (DBNet's 2x2 stride-2 head, U-Net decoders)
// write each output pixel from exactly one input pixel: one GEMM, Z[M*k, HW] = W^T X, then a
// scatter of Z into Y. oneDNN 2.6 runs those shapes (few channels, a 1-channel output) in its
// reference deconvolution, 10x slower (measured on PP-OCRv4 det). The scatter writes each output
// row once, in order, interleaving the kw rows of Z that feed it, and applies a fused activation
// (DBNet's head: ConvTranspose -> BatchNorm -> Relu, BatchNorm folded by optimize_graph) to the row
// while it is in cache. The earlier scatter (single-float stores at stride kw over the whole plane,
// one pass per kernel position) kept DBNet's 24 -> 24 channel 160x160 layer at 14-18 ms; 3.4 ms now.
//
// Other 2-D layers with constant weights and group 1 (overlapping kernels: GANs' and decoders' 4x4
// stride 2, 3x3 stride 2 with output padding) use the same GEMM, then add each kernel tap's rows of Z
// at their strided, dilated, padded output positions (col2im) over y set to the bias. oneDNN 2.6's
// deconvolution took 14-16 ms on every such layer measured (8 -> 8 channels from 64x64 up to
// 256 -> 128 from 16x16, 4x4 stride 2); this takes 0.45 ms on the first, 3-5 ms on the largest.
#include <cstring>

#include "runtime/kernels/cpu_clones.h"
#include "runtime/fused_ops/fused_activation.h"
#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/elementwise/elementwise_common.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

// One output row of the GEMM path: y[q * kw + j] = z[j][q] + bias for q < width, j < kw, where
// z[j] = z0 + j * z_stride. kw == 2 (the common 2x upsampling) has its own loop, which the
// compiler vectorizes as an interleave.
SQ_AVX512_AVX2_CLONES void scatter_row(float* y, const float* z0, int64_t z_stride, int64_t width, int64_t kw,
                                       float bias) {
  if (kw == 2) {
    const float* z1 = z0 + z_stride;
    for (int64_t q = 0; q < width; ++q) {
      y[2 * q] = z0[q] + bias;
      y[2 * q + 1] = z1[q] + bias;
    }
    return;
  }
  for (int64_t q = 0; q < width; ++q)
    for (int64_t j = 0; j < kw; ++j) y[q * kw + j] = z0[j * z_stride + q] + bias;
}

// The fused activation the GEMM path applies itself (the elementwise kernels' loops); nullopt for
// those it leaves to oneDNN's deconvolution post-ops (Gelu, Scale, a post affine map).
std::optional<ew::Activation> gemm_path_activation(const ir::Node& node) {
  const fused_ops::FusedActivation f = fused_ops::FusedActivation::parse(node);
  if (f.has_post_affine() || f.kind == fused_ops::Activation::kGelu || f.kind == fused_ops::Activation::kScale)
    return std::nullopt;
  return ew::resolve_fused_activation(node);
}


// Output size and padding per spatial dim, in ONNX's terms (pad_begin) and oneDNN's (pad_end
// holds -output_padding).
struct Geometry {
  int64_t m = 0;  // output channels
  Dims out, pad_begin, pad_end, strides, dilations;  // dilations as oneDNN counts them (d - 1)
};

struct ConvTransposeAttrs {
  WindowAttrs window;
  int64_t group = 1;
  std::vector<int64_t> output_padding;
  std::vector<int64_t> output_shape;
};

class ConvTransposeKernel final : public Kernel {
  enum ConvTransposeInput : size_t { kX = 0, kW = 1, kB = 2 };
 public:
  explicit ConvTransposeKernel(const KernelInit& init) : node_(init.node) {
    attrs_.window = WindowAttrs::parse(node_);
    attrs_.group = node_.attr_int("group", 1);
    attrs_.output_padding = node_.attr_ints("output_padding");
    attrs_.output_shape = node_.attr_ints("output_shape");
    if (attrs_.group < 1)
      fail(ErrorKind::kInvalidModel, node_.describe() + ": group must be >= 1, got " + std::to_string(attrs_.group));
    check_fused_activation(node_);
    if (const Tensor* w = init.constant_input(kW)) {
      require_float32(node_, *w, "weights W");
      if (w->rank() < 3 || w->dim(0) % attrs_.group != 0)
        fail(ErrorKind::kInvalidModel, node_.describe() + ": weights W of shape " + shape_str(w->shape()) +
                                           " must be [C, M/group, k...] with C divisible by group " +
                                           std::to_string(attrs_.group));
      const_weights_shape_ = w->shape();
      packed_weights_.set_source(*w, onnx_weights_desc(w->shape()));
      if (gemm_path_applies(*w)) {
        gemm_weights_ = *w;
        gemm_activation_ = *gemm_path_activation(node_);
        kernel_sized_ = is_kernel_sized_stride(*w);
      }
    }
    if (init.node.inputs.size() > kB && !init.node.inputs[kB].empty())
      if (const Tensor* b = init.constant_input(kB)) const_bias_ = *b;
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    require_float32(node_, x, "input X");
    const Tensor* w = packed_weights_.has_source() ? nullptr : &ctx.input(kW);
    if (w) require_float32(node_, *w, "weights W");
    const Tensor* b = const_bias_.defined() ? &const_bias_ : ctx.optional_input(kB);
    if (b) require_float32(node_, *b, "bias B");
    const Shape& ws = w ? w->shape() : const_weights_shape_;
    if (gemm_weights_.defined() && x.rank() == 4 && x.dim(1) == ws[0]) {
      if (kernel_sized_) {
        run_as_gemm(ctx, x, b);
        return;
      }
      const Geometry geo = resolve_geometry(x.shape(), ws, b ? &b->shape() : nullptr);
      if (col2im_scratch_fits(x, geo)) {
        run_as_col2im(ctx, x, b, geo);
        return;
      }
    }

    ConvLikePlan& p = plans_.get({&x.shape(), &ws, b ? &b->shape() : nullptr},
                                 [&] { return make_plan(x.shape(), ws, b ? &b->shape() : nullptr); });
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, p.out_shape);
    if (y.numel() == 0) return;
    run_conv_like(p, x, w, b, y);
  }

 private:
  // Constant 2-D weights, group 1, and a fused activation the elementwise loops apply: the GEMM
  // paths (see the header).
  bool gemm_path_applies(const Tensor& w) const {
    if (w.rank() != 4 || attrs_.group != 1) return false;
    return fused_ops::FusedActivation::parse(node_).empty() || gemm_path_activation(node_);
  }

  // Kernel == strides, no dilation, pads, output padding or output shape: every output pixel comes
  // from one input pixel.
  bool is_kernel_sized_stride(const Tensor& w) const {
    const WindowAttrs& a = attrs_.window;
    if (!attrs_.output_shape.empty()) return false;
    if (a.auto_pad != AutoPad::kNotSet && a.auto_pad != AutoPad::kValid) return false;
    for (int64_t v : attrs_.output_padding)
      if (v != 0) return false;
    for (int64_t v : a.pads)
      if (v != 0) return false;
    for (int64_t v : a.dilations)
      if (v != 1) return false;
    if (a.strides.size() != 2 || a.strides[0] != w.dim(2) || a.strides[1] != w.dim(3)) return false;
    return a.kernel.empty() || (a.kernel[0] == w.dim(2) && a.kernel[1] == w.dim(3));
  }

  // Z = W^T X_s for sample s: W is [C, M*kh*kw] row-major, X_s [C, H*W]; Z [M*kh*kw, H*W].
  void gemm_sample(const Tensor& x, int64_t s, std::vector<float>& z) const {
    const int64_t c = x.dim(1), hw = x.dim(2) * x.dim(3);
    const int64_t rows = gemm_weights_.dim(1) * gemm_weights_.dim(2) * gemm_weights_.dim(3);
    z.resize(static_cast<size_t>(rows * hw));
    const dnnl_status_t st = dnnl_sgemm('T', 'N', rows, hw, c, 1.f, gemm_weights_.data<float>(), rows,
                                        x.data<float>() + s * c * hw, hw, 0.f, z.data(), hw);
    if (st != dnnl_success)
      fail(ErrorKind::kInternal, node_.describe() + ": oneDNN sgemm failed (status " + std::to_string(st) + ")");
  }

  void run_as_gemm(KernelContext& ctx, const Tensor& x, const Tensor* b) {
    const int64_t n = x.dim(0), h = x.dim(2), wd = x.dim(3);
    const int64_t m = gemm_weights_.dim(1), kh = gemm_weights_.dim(2), kw = gemm_weights_.dim(3);
    if (b && (b->rank() != 1 || b->dim(0) != m))
      fail(ErrorKind::kInvalidArgument, node_.describe() + ": bias B of shape " + shape_str(b->shape()) + " must be [" +
                                            std::to_string(m) + "]");
    const int64_t hw = h * wd, oh = h * kh, ow = wd * kw;
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, {n, m, oh, ow});
    if (y.numel() == 0) return;
    std::vector<float>& z = gemm_scratch_;
    for (int64_t s = 0; s < n; ++s) {
      gemm_sample(x, s, z);
      float* ys = y.data<float>() + s * m * oh * ow;
      for (int64_t o = 0; o < m; ++o) {
        const float bias = b ? b->data<float>()[o] : 0.f;
        for (int64_t r = 0; r < h; ++r)
          for (int64_t i = 0; i < kh; ++i) {
            float* yr = ys + (o * oh + r * kh + i) * ow;
            scatter_row(yr, z.data() + (o * kh + i) * kw * hw + r * wd, hw, wd, kw, bias);
            if (gemm_activation_) ew::apply_activation(gemm_activation_, yr, ow);
          }
      }
    }
  }

  // Z's size (M*kh*kw rows of H*W) kept to what a deconvolution layer reasonably holds; beyond it
  // oneDNN's deconvolution runs instead.
  bool col2im_scratch_fits(const Tensor& x, const Geometry& geo) const {
    constexpr int64_t kMaxScratchBytes = int64_t{256} << 20;
    const int64_t rows = geo.m * gemm_weights_.dim(2) * gemm_weights_.dim(3);
    return rows * x.dim(2) * x.dim(3) * static_cast<int64_t>(sizeof(float)) <= kMaxScratchBytes;
  }

  // Overlapping kernels (k > stride, pads, dilations, output padding): Z = W^T X as in run_as_gemm,
  // then each of Z's rows (o, ki, kj) adds into output channel o at rows r*sh - ph + ki*dh and
  // columns q*sw - pw + kj*dw (col2im), over y first set to the bias; then the activation. oneDNN
  // 2.6's deconvolution takes 9 ms where this takes ~0.1 ms on an 8 -> 8 channel 4x4 stride-2
  // layer from 64x64 (its kernels pad the channels to 16 and loop over the kernel per pixel).
  void run_as_col2im(KernelContext& ctx, const Tensor& x, const Tensor* b, const Geometry& geo) {
    const int64_t n = x.dim(0), h = x.dim(2), wd = x.dim(3);
    const int64_t m = geo.m, kh = gemm_weights_.dim(2), kw = gemm_weights_.dim(3);
    const int64_t oh = geo.out[0], ow = geo.out[1], hw = h * wd;
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, {n, m, oh, ow});
    if (y.numel() == 0) return;
    std::vector<float>& z = gemm_scratch_;
    for (int64_t s = 0; s < n; ++s) {
      gemm_sample(x, s, z);
      for (int64_t o = 0; o < m; ++o) {
        float* plane = y.data<float>() + (s * m + o) * oh * ow;
        std::fill(plane, plane + oh * ow, b ? b->data<float>()[o] : 0.f);
        for (int64_t ki = 0; ki < kh; ++ki)
          for (int64_t kj = 0; kj < kw; ++kj)
            add_kernel_tap(plane, z.data() + ((o * kh + ki) * kw + kj) * hw, geo, h, wd, ki, kj);
        if (gemm_activation_) ew::apply_activation(gemm_activation_, plane, oh * ow);
      }
    }
  }

  // One kernel tap (ki, kj) of Z, [H, W], added at its output positions.
  static void add_kernel_tap(float* plane, const float* tap, const Geometry& geo, int64_t h, int64_t wd, int64_t ki,
                             int64_t kj) {
    const int64_t oh = geo.out[0], ow = geo.out[1], sh = geo.strides[0], sw = geo.strides[1];
    const int64_t row_off = ki * (geo.dilations[0] + 1) - geo.pad_begin[0];
    const int64_t col_off = kj * (geo.dilations[1] + 1) - geo.pad_begin[1];
    // Input columns q with 0 <= q*sw + col_off < ow.
    const int64_t q0 = col_off >= 0 ? 0 : (-col_off + sw - 1) / sw;
    const int64_t q1 = ow - col_off <= 0 ? 0 : std::min(wd, (ow - col_off + sw - 1) / sw);
    for (int64_t r = 0; r < h; ++r) {
      const int64_t out_row = r * sh + row_off;
      if (out_row < 0 || out_row >= oh) continue;
      float* yr = plane + out_row * ow + col_off;
      const float* zr = tap + r * wd;
      for (int64_t q = q0; q < q1; ++q) yr[q * sw] += zr[q];
    }
  }

  // oneDNN's deconvolution weights are [G, OC/G, IC/G, k...] (or [OC, IC, k...]); ONNX stores
  // [IC, OC/G, k...] with IC = G * IC/G. Described with strides over the ONNX bytes, so one reorder
  // both transposes and blocks them.
  memory::desc onnx_weights_desc(const Shape& w) const { return conv_transpose_weights_desc(w, attrs_.group); }

  // Output size and padding per spatial dim, with the checks every path needs.
  Geometry resolve_geometry(const Shape& xs, const Shape& ws, const Shape* bs) const {
    const std::string what = node_.describe();
    const int64_t group = attrs_.group;
    if (xs.size() < 3 || xs.size() > 5)
      fail(ErrorKind::kUnsupported, what + ": input X of shape " + shape_str(xs) +
                                        " (only 1-D, 2-D and 3-D transposed convolutions: rank 3 to 5)");
    if (ws.size() != xs.size())
      fail(ErrorKind::kInvalidArgument, what + ": weights W of shape " + shape_str(ws) +
                                            " must have the rank of X " + shape_str(xs));
    const int64_t c = xs[1];
    if (ws[0] != c)
      fail(ErrorKind::kInvalidArgument, what + ": weights W " + shape_str(ws) + " expect " + std::to_string(ws[0]) +
                                            " input channels, X " + shape_str(xs) + " has " + std::to_string(c));
    if (c % group != 0)
      fail(ErrorKind::kInvalidArgument, what + ": group " + std::to_string(group) + " does not divide " +
                                            std::to_string(c) + " input channels");
    Geometry geo;
    geo.m = ws[1] * group;
    if (bs && (bs->size() != 1 || (*bs)[0] != geo.m))
      fail(ErrorKind::kInvalidArgument, what + ": bias B of shape " + shape_str(*bs) + " must be [" +
                                            std::to_string(geo.m) + "]");
    const size_t sp = xs.size() - 2;
    WindowAttrs a = attrs_.window;
    const Shape kernel(ws.begin() + 2, ws.end());
    if (!a.kernel.empty() && a.kernel != kernel)
      fail(ErrorKind::kInvalidArgument, what + ": kernel_shape disagrees with weights W " + shape_str(ws));
    a.kernel = kernel;
    a = a.resolved(node_, sp);
    std::vector<int64_t> out_pad = attrs_.output_padding;
    if (out_pad.empty()) out_pad.assign(sp, 0);
    if (out_pad.size() != sp)
      fail(ErrorKind::kInvalidModel, what + ": output_padding has " + std::to_string(out_pad.size()) +
                                         " values, expected " + std::to_string(sp));
    // output_shape may list the spatial dims only or the whole shape (N, C, spatial...).
    std::vector<int64_t> out_shape_attr = attrs_.output_shape;
    if (out_shape_attr.size() == sp + 2) out_shape_attr.erase(out_shape_attr.begin(), out_shape_attr.begin() + 2);
    if (!out_shape_attr.empty() && out_shape_attr.size() != sp)
      fail(ErrorKind::kInvalidModel, what + ": output_shape has " + std::to_string(attrs_.output_shape.size()) +
                                         " values, expected " + std::to_string(sp));

    geo.out.resize(sp);
    geo.pad_begin.resize(sp);
    geo.pad_end.resize(sp);
    geo.strides.resize(sp);
    geo.dilations.resize(sp);
    for (size_t i = 0; i < sp; ++i) {
      const int64_t in = xs[2 + i], s = a.strides[i], ext = (a.kernel[i] - 1) * a.dilations[i] + 1;
      geo.strides[i] = s;
      geo.dilations[i] = a.dilations[i] - 1;
      const int64_t natural = s * (in - 1) + out_pad[i] + ext;  // output size before pads
      int64_t pb = 0, pe = 0;
      auto split = [&](int64_t total, bool upper) {
        if (total < 0) {  // a requested size beyond the natural one grows the end (bias only there)
          pb = 0;
          pe = total;
          return;
        }
        pb = upper ? total / 2 : total - total / 2;
        pe = total - pb;
      };
      if (!out_shape_attr.empty()) {
        split(natural - out_shape_attr[i], a.auto_pad == AutoPad::kSameUpper);
      } else if (a.auto_pad == AutoPad::kSameUpper || a.auto_pad == AutoPad::kSameLower) {
        split(natural - in * s, a.auto_pad == AutoPad::kSameUpper);
      } else if (a.auto_pad == AutoPad::kNotSet) {
        pb = a.pads[i];
        pe = a.pads[i + sp];
      }
      geo.out[i] = natural - pb - pe;
      if (geo.out[i] <= 0)
        fail(ErrorKind::kInvalidArgument, what + ": pads leave no output along spatial dim " + std::to_string(i));
      geo.pad_begin[i] = pb;
      geo.pad_end[i] = pe - out_pad[i];
    }
    return geo;
  }

  ConvLikePlan make_plan(const Shape& xs, const Shape& ws, const Shape* bs) {
    const Geometry geo = resolve_geometry(xs, ws, bs);
    const int64_t m = geo.m;
    const Dims &out = geo.out, &pl = geo.pad_begin, &pr = geo.pad_end, &strides = geo.strides, &dil = geo.dilations;
    ConvLikePlan p;
    p.out_shape = {xs[0], m};
    p.out_shape.insert(p.out_shape.end(), out.begin(), out.end());
    p.src_user = plain_desc(xs);
    p.dst_user = plain_desc(p.out_shape);
    p.weights_user = onnx_weights_desc(ws);
    if (bs) p.bias_user = plain_desc(*bs);

    dnnl::primitive_attr attr = base_attr();
    dnnl::post_ops ops;
    append_fused_activation(ops, node_);
    attr.set_post_ops(ops);
    auto any = memory::format_tag::any;
    memory::desc src_md(to_dnnl_dims(xs), dt::f32, any), dst_md(to_dnnl_dims(p.out_shape), dt::f32, any);
    memory::desc wei_md(p.weights_user.dims(), dt::f32, any);
    using df = dnnl::deconvolution_forward;
    auto pd = make_pd(node_, "this transposed convolution", [&] {
      const auto pk = dnnl::prop_kind::forward_inference;
      const auto alg = dnnl::algorithm::deconvolution_direct;
      df::desc d = bs ? df::desc(pk, alg, src_md, wei_md, p.bias_user, dst_md, strides, dil, pl, pr)
                      : df::desc(pk, alg, src_md, wei_md, dst_md, strides, dil, pl, pr);
      return df::primitive_desc(d, attr, dnnl_engine());
    });
    p.finish<df::primitive_desc, df>(pd, packed_weights_.has_source() ? &packed_weights_ : nullptr, bs != nullptr);
    return p;
  }

  const ir::Node node_;
  ConvTransposeAttrs attrs_;
  Shape const_weights_shape_;
  PackedWeights packed_weights_;
  Tensor gemm_weights_;              // the constant W when a GEMM path applies
  bool kernel_sized_ = false;        // run_as_gemm; else run_as_col2im
  std::vector<float> gemm_scratch_;  // Z of the GEMM path
  ew::Activation gemm_activation_;   // its fused activation
  Tensor const_bias_;
  ShapeCache<ConvLikePlan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_conv_transpose(const KernelInit& init) {
  return std::make_unique<ConvTransposeKernel>(init);
}

}  // namespace slimquant::runtime::dnnl_kernels
