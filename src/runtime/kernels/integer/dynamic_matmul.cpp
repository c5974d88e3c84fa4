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

}  // namespace

std::unique_ptr<Kernel> make_dynamic_matmul(const KernelInit& init) { return std::make_unique<DynamicMatMulKernel>(init); }

}  // namespace slimquant::runtime
