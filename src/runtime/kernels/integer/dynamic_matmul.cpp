// The fused dynamically quantized MatMul (fused_ops/dynamic_matmul.h), one kernel for what the
// unfused file runs as DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (-> Add):
//
//   s_x, z_x = dynamic_quant_params(x)                      (the same as DynamicQuantizeLinear's)
//   x_q      = saturate(round_half_even(x / s_x) + z_x)      u8 (quantize_linear, the same codes)
//   acc[i,j] = sum_l (x_q[i,l] - z_x) * w_q[l,j]             s32, exact
//   y[i,j]   = float(acc[i,j]) * (s_x * s_w[j]) (+ bias[j])  f32
//
// The product runs on oneDNN's int8 matmul (u8 src with the run-time zero point z_x, s8 weights
// reordered once per primitive, run-time per-column output scales s_x * s_w[j], the bias as a
// binary add post-op after them) when it is exact: CPUs with VNNI, or weights within +-63
// (int8_common.h). Otherwise the exact int16 loops of integer_gemm.h. Integer sums are exact either
// way, so the output equals the unfused execution's up to the float rounding of the final
// multiply and add.
#include <algorithm>
#include <cmath>
#include <map>

#include "runtime/fused_ops/dynamic_matmul.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/dnnl/dnnl_descriptors.h"
#include "runtime/kernels/integer/dynamic_quantize.h"
#include "runtime/kernels/integer/int8_common.h"
#include "runtime/kernels/integer/integer_gemm.h"

namespace slimquant::runtime {

namespace integer {

DynamicQuantParams dynamic_quant_params(const float* x, int64_t count) {
  float lo = 0.f, hi = 0.f;  // the range always holds 0; NaNs are skipped
#pragma omp simd reduction(min : lo) reduction(max : hi)
  for (int64_t i = 0; i < count; ++i) {
    lo = std::min(lo, x[i]);
    hi = std::max(hi, x[i]);
  }
  DynamicQuantParams p;
  p.scale = hi == lo ? 1.f : (hi - lo) / 255.f;
  p.zero_point = static_cast<uint8_t>(quant_math::saturate_round(0.f - lo / p.scale, 0.f, 255.f));  // NaN -> 0
  return p;
}

}  // namespace integer

namespace {

using dnnl::memory;
using namespace fused_ops;

// A constant's values expanded to n (one value, or n of them).
std::vector<float> per_column(const ir::Node& node, const Tensor* t, int64_t n, const char* what) {
  SQ_CHECK(t != nullptr, ErrorKind::kInvalidModel, node.describe() + ": " + what + " must be a constant");
  SQ_CHECK(t->dtype() == DType::kFloat32 && (t->numel() == 1 || t->numel() == n), ErrorKind::kInvalidModel,
           node.describe() + ": " + what + " must be float32 with one or " + std::to_string(n) + " values, got " +
               dtype_name(t->dtype()) + " " + shape_str(t->shape()));
  std::vector<float> v(static_cast<size_t>(n));
  for (int64_t j = 0; j < n; ++j) v[static_cast<size_t>(j)] = t->data<float>()[t->numel() == 1 ? 0 : j];
  return v;
}

class DynamicMatMulKernel final : public Kernel {
 public:
  explicit DynamicMatMulKernel(const KernelInit& init) : node_(init.node) {
    const Tensor* w = init.constant_input(kDynamicW);
    SQ_CHECK(w && w->dtype() == DType::kInt8 && w->rank() == 2, ErrorKind::kInvalidModel,
             node_.describe() + ": w must be a constant int8 [K, N]");
    w_ = *w;
    k_ = w_.dim(0);
    n_ = w_.dim(1);
    if (!node_.input(kDynamicWZeroPoint).empty()) {
      const Tensor* zp = init.constant_input(kDynamicWZeroPoint);
      SQ_CHECK(zp && zp->dtype() == DType::kInt8, ErrorKind::kInvalidModel,
               node_.describe() + ": w_zero_point must be a constant int8");
      for (int8_t z : zp->values<int8_t>())
        SQ_CHECK(z == 0, ErrorKind::kInvalidModel, node_.describe() + ": w_zero_point must be 0 (symmetric weights)");
    }
    w_scale_ = per_column(node_, init.constant_input(kDynamicWScale), n_, "w_scale");
    if (!node_.input(kDynamicBias).empty()) bias_ = per_column(node_, init.constant_input(kDynamicBias), n_, "bias");
    exact_int8_ = int8::resolve_compute(int8::Compute::kAuto, int8::max_abs_int8(w_)) == int8::Compute::kInt8;
    if (!exact_int8_) {  // B transposed to columns as int16, for integer::gemm_s16_nt
      w16_.resize(static_cast<size_t>(k_ * n_));
      for (int64_t l = 0; l < k_; ++l)
        for (int64_t j = 0; j < n_; ++j) w16_[static_cast<size_t>(j * k_ + l)] = w_.data<int8_t>()[l * n_ + j];
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kDynamicX);
    SQ_CHECK(x.dtype() == DType::kFloat32, ErrorKind::kInvalidModel,
             node_.describe() + ": x must be float32, got " + dtype_name(x.dtype()));
    SQ_CHECK(x.rank() >= 1 && x.shape().back() == k_, ErrorKind::kInvalidArgument,
             node_.describe() + ": x " + shape_str(x.shape()) + " cannot be multiplied by w [" + std::to_string(k_) +
                 ", " + std::to_string(n_) + "]");
    Shape out_shape(x.shape().begin(), x.shape().end() - 1);
    out_shape.push_back(n_);
    const int64_t m = k_ > 0 ? x.numel() / k_ : 0;
    const integer::DynamicQuantParams p = integer::dynamic_quant_params(x.data<float>(), x.numel());
    Tensor xq(DType::kUInt8, x.shape());
    const Tensor zero_point_t = Tensor::scalar(p.zero_point);
    quantize_linear(x, Tensor::scalar(p.scale), &zero_point_t, 0, xq, node_.describe());
    scales_.resize(static_cast<size_t>(n_));
    for (int64_t j = 0; j < n_; ++j) scales_[static_cast<size_t>(j)] = p.scale * w_scale_[static_cast<size_t>(j)];
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, out_shape);
    if (m == 0 || n_ == 0) return;
    if (exact_int8_) run_dnnl(m, xq.data<uint8_t>(), p.zero_point, y.data<float>());
    else run_exact_loops(m, xq.data<uint8_t>(), p.zero_point, y.data<float>());
  }

 private:
  struct Primitive {
    dnnl::matmul prim;
    memory weights;
  };

  const Primitive& primitive(int64_t m) {
    auto it = prims_.find(m);
    if (it != prims_.end()) return it->second;
    if (prims_.size() >= 8) prims_.erase(prims_.begin());
    const memory::desc src({m, k_}, memory::data_type::u8, memory::format_tag::ab);
    const memory::desc wany({k_, n_}, memory::data_type::s8, memory::format_tag::any);
    const memory::desc dst({m, n_}, memory::data_type::f32, memory::format_tag::ab);
    dnnl::primitive_attr attr;
    attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
    if (!bias_.empty()) {
      dnnl::post_ops ops;
      ops.append_binary(dnnl::algorithm::binary_add, memory::desc({1, n_}, memory::data_type::f32, memory::format_tag::ab));
      attr.set_post_ops(ops);
    }
    const dnnl::matmul::primitive_desc pd(dnnl::matmul::desc(src, wany, dst), attr, dnnl_engine());
    Primitive prim{dnnl::matmul(pd), memory(pd.weights_desc(), dnnl_engine())};
    memory user({{k_, n_}, memory::data_type::s8, memory::format_tag::ab}, dnnl_engine(), const_cast<void*>(w_.raw()));
    dnnl::reorder(user, prim.weights).execute(dnnl_stream(), user, prim.weights);
    dnnl_stream().wait();
    return prims_.emplace(m, std::move(prim)).first->second;
  }

  void run_dnnl(int64_t m, const uint8_t* xq, uint8_t zero_point, float* y) {
    const Primitive& p = primitive(m);
    int32_t zp = zero_point;
    memory src({{m, k_}, memory::data_type::u8, memory::format_tag::ab}, dnnl_engine(), const_cast<uint8_t*>(xq));
    memory dst({{m, n_}, memory::data_type::f32, memory::format_tag::ab}, dnnl_engine(), y);
    memory scales({{n_}, memory::data_type::f32, memory::format_tag::a}, dnnl_engine(), scales_.data());
    memory zp_mem({{1}, memory::data_type::s32, memory::format_tag::a}, dnnl_engine(), &zp);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src},
                                         {DNNL_ARG_WEIGHTS, p.weights},
                                         {DNNL_ARG_DST, dst},
                                         {DNNL_ARG_ATTR_OUTPUT_SCALES, scales},
                                         {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, zp_mem}};
    if (!bias_.empty())
      args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] =
          memory({{1, n_}, memory::data_type::f32, memory::format_tag::ab}, dnnl_engine(), bias_.data());
    p.prim.execute(dnnl_stream(), args);
    dnnl_stream().wait();
  }

  void run_exact_loops(int64_t m, const uint8_t* xq, uint8_t zero_point, float* y) {
    std::vector<int16_t> a16(static_cast<size_t>(m * k_));
    integer::widen(xq, m * k_, zero_point, a16.data());
    std::vector<int32_t> acc(static_cast<size_t>(m * n_));
    integer::gemm_s16_nt(a16.data(), k_, m, w16_.data(), k_, n_, k_, acc.data(), n_, 1);
    for (int64_t i = 0; i < m; ++i)
      for (int64_t j = 0; j < n_; ++j) {
        float v = static_cast<float>(acc[static_cast<size_t>(i * n_ + j)]) * scales_[static_cast<size_t>(j)];
        if (!bias_.empty()) v += bias_[static_cast<size_t>(j)];
        y[i * n_ + j] = v;
      }
  }

  const ir::Node& node_;
  Tensor w_;
  int64_t k_ = 0, n_ = 0;
  std::vector<float> w_scale_, bias_, scales_;
  bool exact_int8_ = true;
  std::vector<int16_t> w16_;
  std::map<int64_t, Primitive> prims_;  // by rows M
};


// The 2-D ConvInteger form (fused_ops::kDynamicConv): the same steps on oneDNN's int8 convolution
// (src and dst in the layouts it picks, reordered from and to the plain tensors; u8 weights with
// zero point 128 turned back into their s8 codes once). oneDNN subtracts the src zero point from
// the padding too, as ConvInteger pads with it.
class DynamicConvKernel final : public Kernel {
 public:
  explicit DynamicConvKernel(const KernelInit& init) : node_(init.node) {
    const Tensor* w = init.constant_input(kDynamicW);
    SQ_CHECK(w && w->rank() == 4 && (w->dtype() == DType::kInt8 || w->dtype() == DType::kUInt8),
             ErrorKind::kInvalidModel, node_.describe() + ": w must be a constant 8-bit [M, C / group, kh, kw]");
    w_ = Tensor(DType::kInt8, w->shape());
    if (w->dtype() == DType::kUInt8) {
      for (int64_t i = 0; i < w->numel(); ++i)
        w_.data<int8_t>()[i] = static_cast<int8_t>(int32_t{w->data<uint8_t>()[i]} - 128);
    } else {
      std::copy(w->data<int8_t>(), w->data<int8_t>() + w->numel(), w_.data<int8_t>());
    }
    m_ = w_.dim(0);
    group_ = node_.attr_int("group", 1);
    SQ_CHECK(group_ >= 1 && m_ % group_ == 0, ErrorKind::kInvalidModel, node_.describe() + ": bad group");
    window_ = dnnl_kernels::WindowAttrs::parse(node_);
    if (window_.kernel.empty()) window_.kernel = {w_.dim(2), w_.dim(3)};
    window_ = window_.resolved(node_, 2);
    w_scale_ = per_column(node_, init.constant_input(kDynamicWScale), m_, "w_scale");
    if (!node_.input(kDynamicBias).empty()) bias_ = per_column(node_, init.constant_input(kDynamicBias), m_, "bias");
    SQ_CHECK(int8::resolve_compute(int8::Compute::kAuto, int8::max_abs_int8(w_)) == int8::Compute::kInt8,
             ErrorKind::kUnsupported, node_.describe() + ": needs exact int8 dot products (VNNI) or 7-bit weights");
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kDynamicX);
    SQ_CHECK(x.dtype() == DType::kFloat32 && x.rank() == 4 && x.dim(1) == w_.dim(1) * group_,
             ErrorKind::kInvalidArgument,
             node_.describe() + ": x must be float32 [N, " + std::to_string(w_.dim(1) * group_) + ", H, W], got " +
                 dtype_name(x.dtype()) + " " + shape_str(x.shape()));
    const integer::DynamicQuantParams p = integer::dynamic_quant_params(x.data<float>(), x.numel());
    Tensor xq(DType::kUInt8, x.shape());
    const Tensor zero_point_t = Tensor::scalar(p.zero_point);
    quantize_linear(x, Tensor::scalar(p.scale), &zero_point_t, 0, xq, node_.describe());
    scales_.resize(static_cast<size_t>(m_));
    for (int64_t j = 0; j < m_; ++j) scales_[static_cast<size_t>(j)] = p.scale * w_scale_[static_cast<size_t>(j)];
    Plan& plan = plan_for(x.shape());
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, plan.out_shape);
    if (y.numel() == 0) return;
    int32_t zp = p.zero_point;
    memory src_user(plan.src_user, dnnl_engine(), xq.raw());
    memory dst_user(plan.dst_user, dnnl_engine(), y.raw());
    memory src = src_user, dst = dst_user;
    if (plan.src_reorder) {
      src = dnnl_scratch_memory(DnnlScratch::kSrc, plan.pd.src_desc());
      plan.src_reorder->execute(dnnl_stream(), src_user, src);
    }
    if (plan.dst_reorder) dst = dnnl_scratch_memory(DnnlScratch::kDst, plan.pd.dst_desc());
    memory scales({{m_}, memory::data_type::f32, memory::format_tag::a}, dnnl_engine(), scales_.data());
    memory zp_mem({{1}, memory::data_type::s32, memory::format_tag::a}, dnnl_engine(), &zp);
    std::unordered_map<int, memory> args{{DNNL_ARG_SRC, src},
                                         {DNNL_ARG_WEIGHTS, plan.weights},
                                         {DNNL_ARG_DST, dst},
                                         {DNNL_ARG_ATTR_OUTPUT_SCALES, scales},
                                         {DNNL_ARG_ATTR_ZERO_POINTS | DNNL_ARG_SRC, zp_mem}};
    if (!bias_.empty())
      args[DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1] =
          memory({{1, m_, 1, 1}, memory::data_type::f32, memory::format_tag::nchw}, dnnl_engine(), bias_.data());
    plan.prim.execute(dnnl_stream(), args);
    if (plan.dst_reorder) plan.dst_reorder->execute(dnnl_stream(), dst, dst_user);
    dnnl_stream().wait();
  }

 private:
  struct Plan {
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward prim;
    memory weights;
    memory::desc src_user, dst_user;
    std::optional<dnnl::reorder> src_reorder, dst_reorder;
    Shape out_shape;
  };

  Plan& plan_for(const Shape& x) {
    auto it = plans_.find(x);
    if (it != plans_.end()) return it->second;
    if (plans_.size() >= 8) plans_.erase(plans_.begin());
    const dnnl_kernels::WindowGeometry geo = dnnl_kernels::forward_geometry(node_, window_, {x[2], x[3]}, false);
    const memory::dims src_dims{x[0], x[1], x[2], x[3]}, dst_dims{x[0], m_, geo.out[0], geo.out[1]};
    const memory::dims w_dims = group_ == 1 ? memory::dims{m_, w_.dim(1), w_.dim(2), w_.dim(3)}
                                            : memory::dims{group_, m_ / group_, w_.dim(1), w_.dim(2), w_.dim(3)};
    using tag = memory::format_tag;
    dnnl::primitive_attr attr;
    attr.set_output_scales(1 << 1, {DNNL_RUNTIME_F32_VAL});
    attr.set_zero_points(DNNL_ARG_SRC, 0, {DNNL_RUNTIME_S32_VAL});
    if (!bias_.empty()) {
      dnnl::post_ops ops;
      ops.append_binary(dnnl::algorithm::binary_add, memory::desc({1, m_, 1, 1}, memory::data_type::f32, tag::any));
      attr.set_post_ops(ops);
    }
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::library);
    const dnnl::convolution_forward::desc d(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc(src_dims, memory::data_type::u8, tag::any), memory::desc(w_dims, memory::data_type::s8, tag::any),
        memory::desc(dst_dims, memory::data_type::f32, tag::any), geo.strides, geo.dilations, geo.pad_begin, geo.pad_end);
    const auto pd = dnnl_kernels::make_pd(node_, "dynamic int8 convolution",
                                          [&] { return dnnl::convolution_forward::primitive_desc(d, attr, dnnl_engine()); });
    Plan plan{pd, dnnl::convolution_forward(pd), memory(pd.weights_desc(), dnnl_engine()),
              memory::desc(src_dims, memory::data_type::u8, tag::nchw),
              memory::desc(dst_dims, memory::data_type::f32, tag::nchw), std::nullopt, std::nullopt,
              Shape{x[0], m_, geo.out[0], geo.out[1]}};
    memory w_user({w_dims, memory::data_type::s8, group_ == 1 ? tag::oihw : tag::goihw}, dnnl_engine(), w_.raw());
    dnnl::reorder(w_user, plan.weights).execute(dnnl_stream(), w_user, plan.weights);
    dnnl_stream().wait();
    auto reorder = [](const memory::desc& from, const memory::desc& to) {
      return dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), from, dnnl_engine(), to));
    };
    if (pd.src_desc() != plan.src_user) plan.src_reorder = reorder(plan.src_user, pd.src_desc());
    if (pd.dst_desc() != plan.dst_user) plan.dst_reorder = reorder(pd.dst_desc(), plan.dst_user);
    return plans_.emplace(x, std::move(plan)).first->second;
  }

  const ir::Node& node_;
  Tensor w_;
  int64_t m_ = 0, group_ = 1;
  dnnl_kernels::WindowAttrs window_;
  std::vector<float> w_scale_, bias_, scales_;
  std::map<Shape, Plan> plans_;
};
}  // namespace

std::unique_ptr<Kernel> make_dynamic_conv(const KernelInit& init) { return std::make_unique<DynamicConvKernel>(init); }
std::unique_ptr<Kernel> make_dynamic_matmul(const KernelInit& init) { return std::make_unique<DynamicMatMulKernel>(init); }

}  // namespace slimquant::runtime
