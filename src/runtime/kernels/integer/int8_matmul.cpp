// QGemm and QMatMul (com.slimquant): a u8/s8 activation (per tensor) times a constant s8 weight
// (per output column, zero point 0), float32 bias, fused Relu/Clip, u8/s8 or float32 output.
//
//   acc[i,j] = sum_l (x_q[i,l] - z_x) * w_q[l,j]                                   s32
//   v        = act(M[j] * (acc + B'[j]))   M[j] = alpha*s_x*s_w[j]/s_y,  B'[j] = beta*C[j]/(alpha*s_x*s_w[j])
//   y_q      = saturate(round_half_even(v) + z_y)          (y = v for a float32 output)
//
// QMatMul: x_q [..., K] times a constant w_q [K, N]; the leading dims of x are flattened into the
// rows M, so one 2-D primitive serves any batch shape. With a run-time w_q (activation x activation,
// e.g. attention's Q*K^T and attn*V): x_q [..., M, K] times w_q [..., K, N], s8 per tensor, batch
// dims broadcast as in numpy, one batched primitive, w_q converted per call when kF32. QGemm: x_q [M, K] ([K, M] with transA), w_q [K, N]
// ([N, K] with transB), C of N values (Gemm's broadcast of [N] / [1, N]).
// Both run on oneDNN's matmul: Compute::kInt8 with u8/s8 src, s8 weights reordered once, f32 bias,
// per-column output scales, the src zero point as a runtime argument and the activation / + z_y
// as eltwise post-ops; Compute::kF32 with the same integers as float32 (x_q - z_x from the src
// reorder, integer-valued weights: the products and their sums are exact below 2^24) and the
// f32 -> u8/s8 dst reorder rounding half to even and saturating.
#include <algorithm>
#include <string>

#include "runtime/kernels/elementwise/gelu_avx512.h"
#include "runtime/kernels/integer/int8_common.h"
#include "runtime/kernels/integer/int8_reference.h"

namespace slimquant::runtime::int8 {

namespace {

using dnnl::memory;
using tag = memory::format_tag;


struct MatMulPlan {
  PrimitivePlan prim;
  int64_t m = 0;
  bool reference = false;
};

class QLinearMatMulKernel final : public Kernel {
  enum MatMulInput : size_t { kX = 0, kW = 1, kBias = 2 };
 public:
  // gemm: QGemm semantics (transA/transB/alpha/beta); otherwise QMatMul.
  QLinearMatMulKernel(const KernelInit& init, bool gemm) : node_(init.node), gemm_(gemm) {
    q_ = QLinearAttrs::parse(node_);
    if (q_.y_per_channel())
      fail(ErrorKind::kUnsupported, node_.describe() + ": a per-channel quantized output (y_channel_scale) is "
                                                       "implemented for QConv only");
    float alpha = 1.f, beta = 1.f;
    if (gemm_) {
      trans_x_ = node_.attr_int("transA", 0) != 0;
      trans_w_ = node_.attr_int("transB", 0) != 0;
      alpha = node_.attr_float("alpha", 1.f);
      beta = node_.attr_float("beta", 1.f);
    }
    if (!gemm_ && !init.node.input(kW).empty() && !init.constant_input(kW)) {
      // Activation x activation: one scale for the whole w_q, no bias (the selector adds none).
      runtime_w_ = true;
      compute_ = resolve_compute(q_.compute, -1);  // run-time weights may use the full s8 range
      if (q_.w.scale.size() != 1)
        fail(ErrorKind::kInvalidModel, node_.describe() + ": a run-time w_q needs one w_scale, got " +
                                           std::to_string(q_.w.scale.size()));
      if (!init.node.input(kBias).empty())
        fail(ErrorKind::kUnsupported, node_.describe() + ": a bias with a run-time w_q is not supported");
      requant_ = make_requant(node_, q_, 1, nullptr);
      return;
    }
    w_ = require_constant_weight(init, kW);
    compute_ = resolve_compute(q_.compute, max_abs_int8(w_));
    if (w_.rank() != 2)
      fail(ErrorKind::kUnsupported, node_.describe() + ": the weight must be 2-D, got shape " + shape_str(w_.shape()));
    k_ = trans_w_ ? w_.dim(1) : w_.dim(0);
    n_ = trans_w_ ? w_.dim(0) : w_.dim(1);
    const Tensor* b = constant_bias(init, kBias, n_, gemm_ ? "C" : "bias");
    requant_ = make_requant(node_, q_, n_, b, alpha, beta);
    const memory::desc user({k_, n_}, compute_ == Compute::kInt8 ? dt::s8 : dt::f32, trans_w_ ? tag::ba : tag::ab);
    weights_ = PackedConstant(compute_ == Compute::kInt8 ? w_ : w_.cast(DType::kFloat32), user);
    if (b) {
      bias_ = Tensor::from_vector<float>({1, n_}, requant_.bias);
      bias_mem_ = memory({{1, n_}, dt::f32, tag::ab}, dnnl_engine(), bias_.raw());
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kX);
    require_quantized_input(node_, x);
    if (runtime_w_) {
      const Tensor& w = ctx.input(kW);
      if (w.dtype() != DType::kInt8)
        fail(ErrorKind::kInvalidArgument, node_.describe() + ": w_q must be int8, got " + dtype_name(w.dtype()));
      Shape key = x.shape();
      key.push_back(-1);  // separator: the plan depends on both shapes
      key.insert(key.end(), w.shape().begin(), w.shape().end());
      MatMulPlan& p = plans_.get(key, x.dtype(), [&] { return make_batched_plan(x.shape(), w.shape(), x.dtype()); });
      Tensor& y = ctx.allocate_output(0, q_.y.dtype, p.prim.out_shape);
      if (y.numel() == 0) return;
      if (p.reference) reference_qmatmul_batched(q_, requant_, x, w, y);
      else p.prim.run(x.raw(), y.raw(), w.raw());
      return;
    }
    MatMulPlan& p = plans_.get(x.shape(), x.dtype(), [&] { return make_plan(x.shape(), x.dtype()); });
    Tensor& y = ctx.allocate_output(0, q_.y.dtype, p.prim.out_shape);
    if (y.numel() == 0) return;
    if (p.reference) reference_qmatmul(q_, requant_, x, p.m, k_, trans_x_, w_, n_, trans_w_, y);
    else p.prim.run(x.raw(), y.raw());
  }

 private:
  MatMulPlan make_plan(const Shape& xs, DType x_type) {
    const std::string what = node_.describe();
    MatMulPlan p;
    if (gemm_) {
      if (xs.size() != 2)
        fail(ErrorKind::kInvalidArgument, what + ": input x_q must be 2-D, got shape " + shape_str(xs));
      p.m = trans_x_ ? xs[1] : xs[0];
      const int64_t k = trans_x_ ? xs[0] : xs[1];
      if (k != k_)
        fail(ErrorKind::kInvalidArgument, what + ": x_q of shape " + shape_str(xs) + " has " + std::to_string(k) +
                                              " columns, the weight " + shape_str(w_.shape()) + " expects " +
                                              std::to_string(k_));
      p.prim.out_shape = {p.m, n_};
    } else {
      if (xs.empty() || xs.back() != k_)
        fail(ErrorKind::kInvalidArgument, what + ": x_q of shape " + shape_str(xs) + " must end in " +
                                              std::to_string(k_) + " to multiply the weight " + shape_str(w_.shape()));
      p.m = shape_numel(xs) / k_;
      p.prim.out_shape = Shape(xs.begin(), xs.end() - 1);
      p.prim.out_shape.push_back(n_);
    }
    if (p.m == 0) return p;
    p.prim.src_user = memory::desc({p.m, k_}, dnnl_type(x_type), trans_x_ ? tag::ba : tag::ab);
    p.prim.dst_user = memory::desc({p.m, n_}, dnnl_type(q_.y.dtype), tag::ab);
    const MatMulPlan base = p;
    // A GELU runs as the AVX-512 pass after the primitive (PrimitivePlan::gelu_epilogue): the
    // primitive then writes real values (v, bias included) in f32 and has no post-ops.
    const bool gelu_pass = q_.activation == Activation::kGelu && !q_.y_per_channel() && ew::gelu_pass_available();
    QLinearAttrs q_primitive = q_;
    if (gelu_pass) {
      q_primitive.activation = Activation::kNone;
      q_primitive.post_scale = 1.f;
      q_primitive.post_shift = 0.f;
      q_primitive.y = QLinearAttrs::unit_param(DType::kFloat32);
    }
    // Completes p with an int8 or f32 primitive; false when oneDNN has none (or, for int8, only its
    // reference implementation).
    // shift: an s8 x read as u8 x + 128 with a constant zero point z_x + 128 (shifted_u8_source()).
    auto try_primitive = [&](bool int8, bool shift) -> bool {
      p = base;
      const memory::desc src_md = !int8 ? memory::desc({p.m, k_}, dt::f32, tag::ab)
                                  : shift ? memory::desc({p.m, k_}, dt::u8, tag::ab)
                                          : p.prim.src_user;
      const memory::desc dst_md =
          int8 && !gelu_pass ? p.prim.dst_user : memory::desc({p.m, n_}, dt::f32, tag::ab);
      const memory::desc wei_md({k_, n_}, int8 ? dt::s8 : dt::f32, tag::any);
      dnnl::primitive_attr attr = make_attr(q_primitive, requant_, 1 << 1);
      if (shift) attr.set_zero_points(DNNL_ARG_SRC, 0, {q_.x.zero_point[0] + 128});
      else if (int8 && q_.x.zero_point[0] != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
      try {
        const dnnl::matmul::desc d = bias_.defined() ? dnnl::matmul::desc(src_md, wei_md, bias_mem_.get_desc(), dst_md)
                                                     : dnnl::matmul::desc(src_md, wei_md, dst_md);
        const dnnl::matmul::primitive_desc pd(d, attr, dnnl_engine());
        if (int8 && std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return false;
        p.prim.finish<dnnl::matmul::primitive_desc, dnnl::matmul>(
            pd, weights_for(int8).get(pd.weights_desc()), bias_mem_, shift ? 0 : q_.x.zero_point[0],
            int8 ? PrimitivePlan::ZeroPointAt::kPrimitive : PrimitivePlan::ZeroPointAt::kSrcReorder);
      } catch (const dnnl::error&) {
        return false;
      }
      if (gelu_pass) {
        // y = gelu(v) * post_scale / s_y + post_shift / s_y + z_y (s_y 1 and z_y 0 for an f32 y).
        const float inv = 1.f / q_.y_tensor_scale();
        p.prim.gelu_epilogue = true;
        p.prim.gelu_scale = q_.post_scale * inv;
        p.prim.gelu_shift = q_.post_shift * inv + static_cast<float>(q_.y_tensor_zero_point());
      }
      return true;
    };
    // int8 where chosen, else (or without a fast int8 kernel for this shape) the exact f32 path.
    const bool shift = x_type == DType::kInt8 && !trans_x_ && shifted_u8_source();
    if (compute_ == Compute::kInt8 && ((shift && try_primitive(true, true)) || try_primitive(true, false))) return p;
    if (try_primitive(false, false)) return p;
    p = base;
    p.reference = true;
    return p;
  }

  // The constant weights as the int8 or the f32 primitive multiplies them (f32: w_q as floats,
  // made on first use when the int8 path was chosen but has no fast kernel for some shape).
  PackedConstant& weights_for(bool int8) {
    if (int8 == (compute_ == Compute::kInt8)) return weights_;
    if (!weights_f32_.defined())
      weights_f32_ = PackedConstant(w_.cast(DType::kFloat32),
                                    memory::desc({k_, n_}, dt::f32, trans_w_ ? tag::ba : tag::ab));
    return weights_f32_;
  }

  // x_q [..., M, K] x w_q [..., K, N] with broadcast batch dims, w_q a run-time s8 tensor.
  MatMulPlan make_batched_plan(const Shape& xs0, const Shape& ws0, DType x_type) {
    const std::string what = node_.describe();
    if (xs0.size() < 2 || ws0.size() < 2)
      fail(ErrorKind::kUnsupported, what + ": activation x activation MatMul needs inputs of rank >= 2, got " +
                                        shape_str(xs0) + " and " + shape_str(ws0));
    const size_t rank = std::max(xs0.size(), ws0.size());
    Shape xs(rank - xs0.size(), 1), ws(rank - ws0.size(), 1);
    xs.insert(xs.end(), xs0.begin(), xs0.end());
    ws.insert(ws.end(), ws0.begin(), ws0.end());
    if (xs[rank - 1] != ws[rank - 2])
      fail(ErrorKind::kInvalidArgument, what + ": cannot multiply " + shape_str(xs0) + " by " + shape_str(ws0));
    MatMulPlan p;
    for (size_t d = 0; d + 2 < rank; ++d) {
      if (xs[d] != ws[d] && xs[d] != 1 && ws[d] != 1)
        fail(ErrorKind::kInvalidArgument, what + ": batch dims of " + shape_str(xs0) + " and " + shape_str(ws0) +
                                              " do not broadcast");
      p.prim.out_shape.push_back(xs[d] == 1 ? ws[d] : xs[d]);
    }
    p.prim.out_shape.push_back(xs[rank - 2]);
    p.prim.out_shape.push_back(ws[rank - 1]);
    p.m = xs[rank - 2];
    if (shape_numel(p.prim.out_shape) == 0 || xs[rank - 1] == 0) {
      p.reference = true;  // empty: the reference loops handle it without a primitive
      return p;
    }
    const bool int8 = compute_ == Compute::kInt8;
    p.prim.src_user = plain_md(xs, dnnl_type(x_type));
    p.prim.dst_user = plain_md(p.prim.out_shape, dnnl_type(q_.y.dtype));
    const MatMulPlan base = p;
    // shift: an s8 x read as u8 x + 128 with a constant zero point z_x + 128 (shifted_u8_source()).
    auto try_primitive = [&](bool shift) -> bool {
      p = base;
      const memory::desc src_md = !int8 ? plain_md(xs, dt::f32) : shift ? plain_md(xs, dt::u8) : p.prim.src_user;
      const memory::desc dst_md = int8 ? p.prim.dst_user : plain_md(p.prim.out_shape, dt::f32);
      const memory::desc wei_md = plain_md(ws, int8 ? dt::s8 : dt::f32);
      dnnl::primitive_attr attr = make_attr(q_, requant_, 0);
      if (shift) attr.set_zero_points(DNNL_ARG_SRC, 0, {q_.x.zero_point[0] + 128});
      else if (int8 && q_.x.zero_point[0] != 0) attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
      try {
        const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src_md, wei_md, dst_md), attr, dnnl_engine());
        if (shift && std::string(pd.impl_info_str()).rfind("ref", 0) == 0) return false;
        p.prim.finish<dnnl::matmul::primitive_desc, dnnl::matmul>(
            pd, memory(), memory(), shift ? 0 : q_.x.zero_point[0],
            int8 ? PrimitivePlan::ZeroPointAt::kPrimitive : PrimitivePlan::ZeroPointAt::kSrcReorder);
        p.prim.bind_runtime_weights(plain_md(ws, dt::s8), pd.weights_desc());
      } catch (const dnnl::error&) {
        return false;
      }
      return true;
    };
    const bool shift = int8 && x_type == DType::kInt8 && shifted_u8_source();
    if ((shift && try_primitive(true)) || try_primitive(false)) return p;
    p = base;
    p.reference = true;
    return p;
  }

  const ir::Node node_;
  const bool gemm_;
  bool runtime_w_ = false;
  QLinearAttrs q_;
  Compute compute_ = Compute::kInt8;
  bool trans_x_ = false, trans_w_ = false;
  int64_t k_ = 0, n_ = 0;
  Tensor w_;  // s8 as stored in the model
  PackedConstant weights_f32_;  // weights_for(false) when compute_ is kInt8
  Requant requant_;
  PackedConstant weights_;
  Tensor bias_;
  memory bias_mem_;
  PlanCache<MatMulPlan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_qgemm(const KernelInit& init) { return std::make_unique<QLinearMatMulKernel>(init, true); }
std::unique_ptr<Kernel> make_qmatmul(const KernelInit& init) {
  return std::make_unique<QLinearMatMulKernel>(init, false);
}

}  // namespace slimquant::runtime::int8
