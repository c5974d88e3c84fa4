// Backward of Conv (oneDNN convolution_backward_data / _backward_weights, primitives cached per
// shape), Gemm and MatMul (oneDNN sgemm).
#include <numeric>

#include "runtime/kernels/dnnl/dnnl_descriptors.h"
#include "train/op_base.h"
#include "train/tensor_ops.h"

namespace slimquant::train::detail {

namespace {

namespace dk = runtime::dnnl_kernels;
using dnnl::memory;
using tag = memory::format_tag;

// `user` in the layout a primitive wants: user itself when no reorder is needed, else a copy.
memory reordered(const std::optional<dnnl::reorder>& ro, const memory& user, const memory::desc& want) {
  if (!ro) return user;
  memory m(want, runtime::dnnl_engine());
  ro->execute(runtime::dnnl_stream(), const_cast<memory&>(user), m);
  return m;
}

struct ConvBwdPlan {
  Shape out_shape;
  memory::desc src_user, wei_user, dst_user, bias_user;
  dnnl::convolution_backward_data::primitive_desc data_pd;
  dnnl::convolution_backward_weights::primitive_desc wei_pd;
  dnnl::convolution_backward_data data_prim;
  dnnl::convolution_backward_weights wei_prim;
  // Reorders between the plain tensors and the layouts the primitives chose (built once).
  std::optional<dnnl::reorder> dst_to_data, wei_to_data, diff_src_to_user, src_to_wei, dst_to_wei, diff_wei_to_user;
};

class ConvOp final : public KernelOp {
 public:
  ConvOp(const ir::Node& n, const ir::Graph& g) : KernelOp(n, g), window_(dk::WindowAttrs::parse(n)) {
    group_ = n.attr_int("group", 1);
  }

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    const Tensor& x = in_[0];
    const Tensor& w = in_[1];
    SQ_CHECK(x.dtype() == DType::kFloat32 && w.dtype() == DType::kFloat32, ErrorKind::kUnsupported,
             node_.describe() + ": training needs float32 X and W");
    ConvBwdPlan& p = plans_.get({&x.shape(), &w.shape()}, [&] { return make_plan(x.shape(), w.shape()); });
    dnnl::stream& s = runtime::dnnl_stream();
    dnnl::engine& e = runtime::dnnl_engine();
    Tensor g = gy[0];
    memory dst_user = dk::wrap(p.dst_user, g.raw());
    memory diff_dst_data;  // kept: the weights pass usually wants the same blocked layout
    if (needed(0)) {
      Tensor dx = empty_f32(x.shape());
      diff_dst_data = reordered(p.dst_to_data, dst_user, p.data_pd.diff_dst_desc());
      memory& diff_dst = diff_dst_data;
      memory wei = reordered(p.wei_to_data, dk::wrap(p.wei_user, w.raw()), p.data_pd.weights_desc());
      memory dx_user = dk::wrap(p.src_user, dx.raw());
      memory diff_src = p.diff_src_to_user ? memory(p.data_pd.diff_src_desc(), e) : dx_user;
      memory scratch(p.data_pd.scratchpad_desc(), e);
      p.data_prim.execute(s, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, diff_src},
                              {DNNL_ARG_SCRATCHPAD, scratch}});
      if (p.diff_src_to_user) p.diff_src_to_user->execute(s, diff_src, dx_user);
      s.wait();
      r[0] = dx;
    }
    const bool has_bias = in_.size() > 2 && in_[2].defined();
    if (needed(1) || (has_bias && needed(2))) {
      Tensor dw = empty_f32(w.shape());
      Tensor db = empty_f32({w.dim(0)});
      memory src = reordered(p.src_to_wei, dk::wrap(p.src_user, x.raw()), p.wei_pd.src_desc());
      memory diff_dst = diff_dst_data && p.dst_to_wei && diff_dst_data.get_desc() == p.wei_pd.diff_dst_desc()
                            ? diff_dst_data
                            : reordered(p.dst_to_wei, dst_user, p.wei_pd.diff_dst_desc());
      memory dw_user = dk::wrap(p.wei_user, dw.raw());
      memory diff_wei = p.diff_wei_to_user ? memory(p.wei_pd.diff_weights_desc(), e) : dw_user;
      memory diff_bias = dk::wrap(p.bias_user, db.raw());
      memory scratch(p.wei_pd.scratchpad_desc(), e);
      p.wei_prim.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, diff_wei},
                             {DNNL_ARG_DIFF_BIAS, diff_bias}, {DNNL_ARG_SCRATCHPAD, scratch}});
      if (p.diff_wei_to_user) p.diff_wei_to_user->execute(s, diff_wei, dw_user);
      s.wait();
      if (needed(1)) r[1] = dw;
      if (has_bias && needed(2)) r[2] = db;
    }
    return r;
  }

 private:
  memory::desc weights_desc(const Shape& w, tag t) const {
    return dk::conv_weights_desc(w, group_, memory::data_type::f32, t);
  }

  ConvBwdPlan make_plan(const Shape& xs, const Shape& ws) {
    SQ_CHECK(xs.size() >= 3 && xs.size() <= 5 && ws.size() == xs.size(), ErrorKind::kUnsupported,
             node_.describe() + ": training supports 1-D to 3-D convolutions, got X " + shape_str(xs) + ", W " +
                 shape_str(ws));
    dk::WindowAttrs a = window_;
    a.kernel = Shape(ws.begin() + 2, ws.end());
    a = a.resolved(node_, xs.size() - 2);
    const dk::WindowGeometry geo = dk::forward_geometry(node_, a, Shape(xs.begin() + 2, xs.end()), false);
    ConvBwdPlan p;
    p.out_shape = {xs[0], ws[0]};
    p.out_shape.insert(p.out_shape.end(), geo.out.begin(), geo.out.end());
    p.src_user = dk::plain_desc(xs);
    p.dst_user = dk::plain_desc(p.out_shape);
    p.wei_user = weights_desc(ws, tag::undef);
    p.bias_user = dk::plain_desc({ws[0]});
    // Measured on the fixtures (AVX2, batch 64): plain NCHW (oneDNN's GEMM-based backward, no
    // reorders) wins for 1x1 and non-overlapping (patchify) convolutions; blocked layouts win for
    // overlapping spatial kernels, and depthwise has no fast plain backward at all.
    bool non_overlapping = true;
    for (size_t i = 0; i < geo.kernel.size(); ++i)
      non_overlapping = non_overlapping && geo.strides[i] >= geo.kernel[i] && geo.dilations[i] == 0;
    const bool use_plain = group_ == 1 && non_overlapping;
    const memory::desc src_any = use_plain ? p.src_user : memory::desc(runtime::to_dnnl_dims(xs), memory::data_type::f32, tag::any);
    const memory::desc dst_any = use_plain ? p.dst_user : memory::desc(runtime::to_dnnl_dims(p.out_shape), memory::data_type::f32, tag::any);
    const memory::desc wei_any = use_plain ? p.wei_user : weights_desc(ws, tag::any);
    dnnl::engine& e = runtime::dnnl_engine();
    const auto alg = dnnl::algorithm::convolution_direct;
    dk::make_pd(node_, "this convolution's backward", [&] {
      dnnl::convolution_forward::desc fd(dnnl::prop_kind::forward_training, alg, src_any, wei_any, p.bias_user,
                                         dst_any, geo.strides, geo.dilations, geo.pad_begin, geo.pad_end);
      dnnl::convolution_forward::primitive_desc fpd(fd, e);
      dnnl::convolution_backward_data::desc dd(alg, src_any, wei_any, dst_any, geo.strides, geo.dilations,
                                               geo.pad_begin, geo.pad_end);
      p.data_pd = dnnl::convolution_backward_data::primitive_desc(dd, e, fpd);
      dnnl::convolution_backward_weights::desc wd(alg, src_any, wei_any, p.bias_user, dst_any, geo.strides,
                                                  geo.dilations, geo.pad_begin, geo.pad_end);
      p.wei_pd = dnnl::convolution_backward_weights::primitive_desc(wd, e, fpd);
      return 0;
    });
    p.data_prim = dnnl::convolution_backward_data(p.data_pd);
    p.wei_prim = dnnl::convolution_backward_weights(p.wei_pd);
    p.dst_to_data = dk::make_reorder(p.dst_user, p.data_pd.diff_dst_desc());
    p.wei_to_data = dk::make_reorder(p.wei_user, p.data_pd.weights_desc());
    p.diff_src_to_user = dk::make_reorder(p.data_pd.diff_src_desc(), p.src_user);
    p.src_to_wei = dk::make_reorder(p.src_user, p.wei_pd.src_desc());
    p.dst_to_wei = dk::make_reorder(p.dst_user, p.wei_pd.diff_dst_desc());
    p.diff_wei_to_user = dk::make_reorder(p.wei_pd.diff_weights_desc(), p.wei_user);
    return p;
  }

  dk::WindowAttrs window_;
  int64_t group_ = 1;
  dk::ShapeCache<ConvBwdPlan> plans_;
};

// ConvTranspose through oneDNN's deconvolution_backward_data / _backward_weights, with the
// geometry the runtime's forward uses (output_padding folded into the end pads, output_shape and
// SAME auto_pad split as there).
struct DeconvBwdPlan {
  memory::desc src_user, wei_user, dst_user, bias_user;
  dnnl::deconvolution_backward_data::primitive_desc data_pd;
  dnnl::deconvolution_backward_weights::primitive_desc wei_pd;
  dnnl::deconvolution_backward_data data_prim;
  dnnl::deconvolution_backward_weights wei_prim;
  std::optional<dnnl::reorder> dst_to_data, wei_to_data, diff_src_to_user, src_to_wei, dst_to_wei, diff_wei_to_user;
};

class ConvTransposeOp final : public KernelOp {
 public:
  ConvTransposeOp(const ir::Node& n, const ir::Graph& g) : KernelOp(n, g), window_(dk::WindowAttrs::parse(n)) {
    group_ = n.attr_int("group", 1);
  }

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    const Tensor &x = in_[0], &w = in_[1], &g = gy[0];
    DeconvBwdPlan& p =
        plans_.get({&x.shape(), &w.shape(), &g.shape()}, [&] { return make_plan(x.shape(), w.shape(), g.shape()); });
    dnnl::stream& s = runtime::dnnl_stream();
    dnnl::engine& e = runtime::dnnl_engine();
    memory dst_user = dk::wrap(p.dst_user, g.raw());
    if (needed(0)) {
      Tensor dx = empty_f32(x.shape());
      memory diff_dst = reordered(p.dst_to_data, dst_user, p.data_pd.diff_dst_desc());
      memory wei = reordered(p.wei_to_data, dk::wrap(p.wei_user, w.raw()), p.data_pd.weights_desc());
      memory dx_user = dk::wrap(p.src_user, dx.raw());
      memory diff_src = p.diff_src_to_user ? memory(p.data_pd.diff_src_desc(), e) : dx_user;
      memory scratch(p.data_pd.scratchpad_desc(), e);
      p.data_prim.execute(s, {{DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_WEIGHTS, wei}, {DNNL_ARG_DIFF_SRC, diff_src},
                              {DNNL_ARG_SCRATCHPAD, scratch}});
      if (p.diff_src_to_user) p.diff_src_to_user->execute(s, diff_src, dx_user);
      s.wait();
      r[0] = dx;
    }
    const bool has_bias = in_.size() > 2 && in_[2].defined();
    if (needed(1) || (has_bias && needed(2))) {
      Tensor dw = empty_f32(w.shape());
      Tensor db = empty_f32({g.dim(1)});
      memory src = reordered(p.src_to_wei, dk::wrap(p.src_user, x.raw()), p.wei_pd.src_desc());
      memory diff_dst = reordered(p.dst_to_wei, dst_user, p.wei_pd.diff_dst_desc());
      memory dw_user = dk::wrap(p.wei_user, dw.raw());
      memory diff_wei = p.diff_wei_to_user ? memory(p.wei_pd.diff_weights_desc(), e) : dw_user;
      memory scratch(p.wei_pd.scratchpad_desc(), e);
      p.wei_prim.execute(s, {{DNNL_ARG_SRC, src}, {DNNL_ARG_DIFF_DST, diff_dst}, {DNNL_ARG_DIFF_WEIGHTS, diff_wei},
                             {DNNL_ARG_DIFF_BIAS, dk::wrap(p.bias_user, db.raw())}, {DNNL_ARG_SCRATCHPAD, scratch}});
      if (p.diff_wei_to_user) p.diff_wei_to_user->execute(s, diff_wei, dw_user);
      s.wait();
      if (needed(1)) r[1] = dw;
      if (has_bias && needed(2)) r[2] = db;
    }
    return r;
  }

 private:
  // ONNX ConvTranspose weights [C_in, M/G, k...] as oneDNN's [G, M/G, C_in/G, k...] (strides over
  // the ONNX bytes, as the runtime's forward describes them).
  memory::desc onnx_weights_desc(const Shape& w) const { return dk::conv_transpose_weights_desc(w, group_); }

  DeconvBwdPlan make_plan(const Shape& xs, const Shape& ws, const Shape& ys) {
    SQ_CHECK(xs.size() >= 3 && xs.size() <= 5 && ws.size() == xs.size(), ErrorKind::kUnsupported,
             node_.describe() + ": training supports 1-D to 3-D transposed convolutions, got X " + shape_str(xs));
    const size_t sp = xs.size() - 2;
    dk::WindowAttrs a = window_;
    a.kernel = Shape(ws.begin() + 2, ws.end());
    a = a.resolved(node_, sp);
    std::vector<int64_t> out_pad = node_.attr_ints("output_padding");
    if (out_pad.empty()) out_pad.assign(sp, 0);
    memory::dims pl(sp), pr(sp), strides(sp), dil(sp);
    for (size_t i = 0; i < sp; ++i) {
      const int64_t s = a.strides[i], ext = (a.kernel[i] - 1) * a.dilations[i] + 1;
      strides[i] = s;
      dil[i] = a.dilations[i] - 1;
      const int64_t natural = s * (xs[2 + i] - 1) + out_pad[i] + ext;
      // The forward fixed the output size; the pads follow from it as the runtime split them.
      const int64_t total = natural - ys[2 + i];
      int64_t pb = 0, pe = 0;
      if (a.auto_pad == dk::AutoPad::kNotSet && node_.attr_ints("output_shape").empty()) {
        pb = a.pads[i];
        pe = a.pads[i + sp];
      } else if (total < 0) {
        pe = total;
      } else {
        pb = a.auto_pad == dk::AutoPad::kSameUpper ? total / 2 : total - total / 2;
        pe = total - pb;
      }
      pl[i] = pb;
      pr[i] = pe - out_pad[i];
    }
    DeconvBwdPlan p;
    p.src_user = dk::plain_desc(xs);
    p.dst_user = dk::plain_desc(ys);
    p.wei_user = onnx_weights_desc(ws);
    p.bias_user = dk::plain_desc({ys[1]});
    const memory::desc src_any(runtime::to_dnnl_dims(xs), memory::data_type::f32, tag::any);
    const memory::desc dst_any(runtime::to_dnnl_dims(ys), memory::data_type::f32, tag::any);
    const memory::desc wei_any(p.wei_user.dims(), memory::data_type::f32, tag::any);
    dnnl::engine& e = runtime::dnnl_engine();
    const auto alg = dnnl::algorithm::deconvolution_direct;
    dk::make_pd(node_, "this transposed convolution's backward", [&] {
      dnnl::deconvolution_forward::desc fd(dnnl::prop_kind::forward_training, alg, src_any, wei_any, p.bias_user,
                                           dst_any, strides, dil, pl, pr);
      dnnl::deconvolution_forward::primitive_desc fpd(fd, e);
      dnnl::deconvolution_backward_data::desc dd(alg, src_any, wei_any, dst_any, strides, dil, pl, pr);
      p.data_pd = dnnl::deconvolution_backward_data::primitive_desc(dd, e, fpd);
      dnnl::deconvolution_backward_weights::desc wd(alg, src_any, wei_any, p.bias_user, dst_any, strides, dil, pl, pr);
      p.wei_pd = dnnl::deconvolution_backward_weights::primitive_desc(wd, e, fpd);
      return 0;
    });
    p.data_prim = dnnl::deconvolution_backward_data(p.data_pd);
    p.wei_prim = dnnl::deconvolution_backward_weights(p.wei_pd);
    p.dst_to_data = dk::make_reorder(p.dst_user, p.data_pd.diff_dst_desc());
    p.wei_to_data = dk::make_reorder(p.wei_user, p.data_pd.weights_desc());
    p.diff_src_to_user = dk::make_reorder(p.data_pd.diff_src_desc(), p.src_user);
    p.src_to_wei = dk::make_reorder(p.src_user, p.wei_pd.src_desc());
    p.dst_to_wei = dk::make_reorder(p.dst_user, p.wei_pd.diff_dst_desc());
    p.diff_wei_to_user = dk::make_reorder(p.wei_pd.diff_weights_desc(), p.wei_user);
    return p;
  }

  dk::WindowAttrs window_;
  int64_t group_ = 1;
  dk::ShapeCache<DeconvBwdPlan> plans_;
};

// Y = alpha op(A) op(B) + beta C (C broadcast to [M, N]).
class GemmOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    const bool ta = node_.attr_int("transA", 0) != 0, tb = node_.attr_int("transB", 0) != 0;
    const float alpha = node_.attr_float("alpha", 1.f), beta = node_.attr_float("beta", 1.f);
    const Tensor &A = in_[0], &B = in_[1], &g = gy[0];
    const int64_t m = g.dim(0), n = g.dim(1), k = ta ? A.dim(0) : A.dim(1);
    const float *pa = A.data<float>(), *pb = B.data<float>(), *pg = g.data<float>();
    if (needed(0)) {
      Tensor d(DType::kFloat32, A.shape());
      if (!ta) gemm(false, !tb, m, k, n, alpha, pg, pb, 0.f, d.data<float>());  // g op(B)^T
      else gemm(tb, true, k, m, n, alpha, pb, pg, 0.f, d.data<float>());       // op(B) g^T
      r[0] = d;
    }
    if (needed(1)) {
      Tensor d(DType::kFloat32, B.shape());
      if (!tb) gemm(!ta, false, k, n, m, alpha, pa, pg, 0.f, d.data<float>());  // op(A)^T g
      else gemm(true, ta, n, k, m, alpha, pg, pa, 0.f, d.data<float>());       // g^T op(A)
      r[1] = d;
    }
    if (needed(2)) {
      Tensor d = reduce_to_shape(g, in_[2].shape());
      if (beta != 1.f) {
        if (d.storage() == g.storage()) d = d.clone();
        for (float& v : d.values<float>()) v *= beta;
      }
      r[2] = d;
    }
    return r;
  }
};

// Batched products over [batch, m, k] x [batch, k, n] with per-operand transposition.
void batched_gemm(int64_t batch, bool ta, bool tb, int64_t m, int64_t n, int64_t k, const float* a, const float* b,
                  float* c) {
  // Small per-batch products: spread the batch over threads (sgemm itself would run single-threaded).
  const bool small = m * n * k < (1 << 18);
#pragma omp parallel for if (small && batch > 1)
  for (int64_t i = 0; i < batch; ++i) gemm(ta, tb, m, n, k, 1.f, a + i * m * k, b + i * k * n, 0.f, c + i * m * n);
}

// MatMul with numpy semantics: rank-1 operands are promoted, batch dims broadcast.
class MatMulOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    Tensor A = in_[0], B = in_[1];
    const Shape as0 = A.shape(), bs0 = B.shape();
    if (A.rank() == 1) A = A.reshaped({1, A.dim(0)});
    if (B.rank() == 1) B = B.reshaped({B.dim(0), 1});
    const Shape &as = A.shape(), &bs = B.shape();
    const int64_t m = as[as.size() - 2], k = as.back(), n = bs.back();
    const Shape abatch(as.begin(), as.end() - 2), bbatch(bs.begin(), bs.end() - 2);
    const Shape batch = broadcast_shapes(abatch, bbatch);
    const int64_t nb = shape_numel(batch);
    Shape gs = batch;
    gs.push_back(m);
    gs.push_back(n);
    const Tensor g = gy[0].reshaped(gs);
    if (bbatch.empty()) {
      // x @ W (the linear-layer case): fold A's batch into rows, one GEMM each.
      const int64_t rows = nb * m;
      if (needed(0)) {
        Tensor d(DType::kFloat32, as);
        gemm(false, true, rows, k, n, 1.f, g.data<float>(), B.data<float>(), 0.f, d.data<float>());
        r[0] = d.reshaped(as0);
      }
      if (needed(1)) {
        Tensor d(DType::kFloat32, bs);
        gemm(true, false, k, n, rows, 1.f, expand_to(A, cat(batch, {m, k})).data<float>(), g.data<float>(), 0.f,
             d.data<float>());
        r[1] = d.reshaped(bs0);
      }
      return r;
    }
    const Tensor Ae = expand_to(A, cat(batch, {m, k})), Be = expand_to(B, cat(batch, {k, n}));
    if (needed(0)) {
      Tensor d(DType::kFloat32, cat(batch, {m, k}));
      batched_gemm(nb, false, true, m, k, n, g.data<float>(), Be.data<float>(), d.data<float>());
      r[0] = reduce_to_shape(d, as).reshaped(as0);
    }
    if (needed(1)) {
      Tensor d(DType::kFloat32, cat(batch, {k, n}));
      batched_gemm(nb, true, false, k, n, m, Ae.data<float>(), g.data<float>(), d.data<float>());
      r[1] = reduce_to_shape(d, bs).reshaped(bs0);
    }
    return r;
  }

 private:
  static Shape cat(const Shape& a, std::initializer_list<int64_t> b) {
    Shape s = a;
    s.insert(s.end(), b);
    return s;
  }
};

}  // namespace

void add_dnnl_ops(std::map<std::string, OpMaker>& t) {
  t["Conv"] = &make<ConvOp>;
  t["ConvTranspose"] = &make<ConvTransposeOp>;
  t["Gemm"] = &make<GemmOp>;
  t["MatMul"] = &make<MatMulOp>;
}

}  // namespace slimquant::train::detail
