// The fused dynamically quantized MatMul (fused_ops/dynamic_matmul.h), one kernel for what the
// unfused file runs as DynamicQuantizeLinear -> MatMulInteger -> Cast -> Mul (-> Add):
//
//   s_x, z_x = dynamic_quant_params(x)                      (the same as DynamicQuantizeLinear's)
//   x_q      = saturate(round_half_even(x / s_x) + z_x)      u8 (quantize_linear, the same codes)
//   acc[i,j] = sum_l (x_q[i,l] - z_x) * w_q[l,j]             s32, exact
//   y[i,j]   = float(acc[i,j]) * (s_x * s_w[j]) (+ bias[j])  f32
//
// The product runs on oneDNN's int8 matmul (u8 src, s8 weights reordered once per primitive, s32
// dst) when it is exact: CPUs with VNNI, or weights within +-63 (int8_common.h). The zero point
// comes out of the sum (acc - z_x * sum_l w[l, j], oneDNN 2.6 has no run-time src zero point for
// every primitive). Otherwise (AVX2 without VNNI and 8-bit weights: vpmaddubsw would saturate) it
// runs on oneDNN's f32 matmul on the integers themselves, x_q - z_x and w_q as floats: every
// partial sum is an integer below 2^24 when depth * 255 * max|w| is, so float sums them exactly in
// any order; deeper products are cut into such slices, each slice's exact sum added in int32.
// Either way the epilogue is the op-by-op Cast, Mul, Add: the output equals the unfused execution's.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <map>
#include <optional>

#include "runtime/fused_ops/dynamic_matmul.h"
#include "runtime/kernels/cpu_clones.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/dnnl/dnnl_descriptors.h"
#include "runtime/kernels/integer/dynamic_quantize.h"
#include "runtime/kernels/integer/int8_common.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime {

namespace integer {

namespace {
// min(0, x...) and max(0, x...) skipping NaNs, in two 8-lane accumulators of each the compiler keeps
// in registers (x < lo ? x : lo is std::min's comparison, so the result is the same as one running
// minimum). One 16-lane GCC vector was split by GCC 12 into scalar code with stack spills on AVX2
// (20% of a dynamic ViT's time there).
using Floats8 = float __attribute__((vector_size(32)));  // one ymm

SQ_AVX512_AVX2_CLONES void range_with_zero(const float* x, int64_t count, float& lo_out, float& hi_out) {
  constexpr int kLanes = 8;
  Floats8 lo0 = {}, hi0 = {}, lo1 = {}, hi1 = {};
  int64_t i = 0;
  for (; i + 2 * kLanes <= count; i += 2 * kLanes) {
    Floats8 v0, v1;
    std::memcpy(&v0, x + i, sizeof v0);
    std::memcpy(&v1, x + i + kLanes, sizeof v1);
    lo0 = v0 < lo0 ? v0 : lo0;
    hi0 = hi0 < v0 ? v0 : hi0;
    lo1 = v1 < lo1 ? v1 : lo1;
    hi1 = hi1 < v1 ? v1 : hi1;
  }
  lo_out = 0.f, hi_out = 0.f;
  for (int j = 0; j < kLanes; ++j) {
    lo_out = std::min({lo_out, lo0[j], lo1[j]});
    hi_out = std::max({hi_out, hi0[j], hi1[j]});
  }
  for (; i < count; ++i) {
    lo_out = x[i] < lo_out ? x[i] : lo_out;
    hi_out = hi_out < x[i] ? x[i] : hi_out;
  }
}
}  // namespace

DynamicQuantParams dynamic_quant_params(const float* x, int64_t count) {
  float lo = 0.f, hi = 0.f;  // the range always holds 0; NaNs are skipped
  range_with_zero(x, count, lo, hi);
  return dynamic_quant_params_from_range(lo, hi);
}

DynamicQuantParams dynamic_quant_params_from_range(float lo, float hi) {
  DynamicQuantParams p;
  p.scale = hi == lo ? 1.f : (hi - lo) / 255.f;
  p.zero_point = static_cast<uint8_t>(quant_math::saturate_round(0.f - lo / p.scale, 0.f, 255.f));  // NaN -> 0
  return p;
}

}  // namespace integer

namespace {

using dnnl::memory;
using namespace fused_ops;

// The op-by-op epilogue (Cast, Mul by the scale, Add the bias) of the s32 sums, with the zero point's
// share `correction` taken out first. Per column j of m rows of n (MatMul; bias may be null):
// residual (may be null): m x n values added last, the skip connection's Add.
SQ_AVX512_AVX2_CLONES void dequantize_rows(const int32_t* acc, int64_t m, int64_t n, const int32_t* correction,
                                           const float* scale, const float* bias, const float* residual, float* y) {
  for (int64_t i = 0; i < m; ++i, acc += n, y += n) {
    if (bias) {
      for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(acc[j] - correction[j]) * scale[j] + bias[j];
    } else {
      for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(acc[j] - correction[j]) * scale[j];
    }
    if (residual) {
      for (int64_t j = 0; j < n; ++j) y[j] += residual[j];
      residual += n;
    }
  }
}
// The f32 path's conversions, in the clones (their loops vectorise): codes minus the zero point as
// floats, and a slice's exact float sums into the int32 sums (first slice: assigned).
SQ_AVX512_AVX2_CLONES void codes_as_floats(const uint8_t* q, int64_t count, uint8_t zero_point, float* out) {
  const float z = zero_point;
  for (int64_t i = 0; i < count; ++i) out[i] = static_cast<float>(q[i]) - z;
}
SQ_AVX512_AVX2_CLONES void add_exact_sums(const float* sums, int64_t count, bool first, int32_t* acc) {
  if (first) {
    for (int64_t i = 0; i < count; ++i) acc[i] = static_cast<int32_t>(sums[i]);
  } else {
    for (int64_t i = 0; i < count; ++i) acc[i] += static_cast<int32_t>(sums[i]);
  }
}

// One channel's n sums (convolution).
SQ_AVX512_AVX2_CLONES void dequantize_channel(const int32_t* acc, int64_t n, int32_t correction, float scale,
                                              const float* bias, float* y) {
  if (bias) {
    const float b = *bias;
    for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(acc[j] - correction) * scale + b;
  } else {
    for (int64_t j = 0; j < n; ++j) y[j] = static_cast<float>(acc[j] - correction) * scale;
  }
}

// t as a dtype tensor of `shape`, allocated only when it is not one already (a kernel's scratch
// kept between runs: a fresh Tensor is zero-filled).
Tensor& scratch(Tensor& t, DType dtype, const Shape& shape) {
  if (!t.defined() || t.dtype() != dtype || t.shape() != shape) t = Tensor(dtype, shape);
  return t;
}

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

// u8 rows [m, k] times constant s8 weights [k, n] into s32 sums [m, n] on oneDNN's int8 matmul:
// one primitive per row count (batch sizes change), each with the weights reordered once into the
// layout it picked.
class S32MatMuls {
 public:
  // w: the weights as stored, [k, n] (tag ab) or [n, k] (tag ba: a convolution's [M, C kh kw]).
  S32MatMuls(const ir::Node& node, const int8_t* w, int64_t k, int64_t n, memory::format_tag w_tag)
      : node_(node), w_(w), k_(k), n_(n), w_tag_(w_tag) {}

  void run(int64_t m, const uint8_t* x, int32_t* acc) {
    const Primitive& p = primitive(m);
    memory src({{m, k_}, memory::data_type::u8, memory::format_tag::ab}, dnnl_engine(), const_cast<uint8_t*>(x));
    memory dst({{m, n_}, memory::data_type::s32, memory::format_tag::ab}, dnnl_engine(), acc);
    p.prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, p.weights}, {DNNL_ARG_DST, dst}});
    dnnl_stream().wait();
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
    const memory::desc dst({m, n_}, memory::data_type::s32, memory::format_tag::ab);
    const auto pd = dnnl_kernels::make_pd(node_, "int8 matmul", [&] {
      return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wany, dst), dnnl_engine());
    });
    Primitive prim{dnnl::matmul(pd), memory(pd.weights_desc(), dnnl_engine())};
    memory user({{k_, n_}, memory::data_type::s8, w_tag_}, dnnl_engine(), const_cast<int8_t*>(w_));
    dnnl::reorder(user, prim.weights).execute(dnnl_stream(), user, prim.weights);
    dnnl_stream().wait();
    return prims_.emplace(m, std::move(prim)).first->second;
  }

  const ir::Node& node_;
  const int8_t* w_;
  int64_t k_, n_;
  memory::format_tag w_tag_;
  std::map<int64_t, Primitive> prims_;
};

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
    const int w_max = int8::max_abs_int8(w_);
    exact_int8_ = int8::resolve_compute(int8::Compute::kAuto, w_max) == int8::Compute::kInt8;
    if (exact_int8_) int8_products_.emplace(node_, w_.data<int8_t>(), k_, n_, memory::format_tag::ab);
    w_sum_.assign(static_cast<size_t>(n_), 0);
    for (int64_t l = 0; l < k_; ++l)
      for (int64_t j = 0; j < n_; ++j) w_sum_[static_cast<size_t>(j)] += w_.data<int8_t>()[l * n_ + j];
    if (!exact_int8_) {
      // Rows of w per f32 slice: |sum| <= depth * 255 * max|w| < 2^24 keeps every partial sum exact.
      slice_depth_ = std::max<int64_t>(1, ((int64_t{1} << 24) - 1) / (255 * std::max(w_max, 1)));
      w_float_ = Tensor(DType::kFloat32, w_.shape());
      for (int64_t i = 0; i < w_.numel(); ++i) w_float_.data<float>()[i] = w_.data<int8_t>()[i];
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(kDynamicX);
    const bool codes = x.dtype() == DType::kUInt8;  // a shared DynamicQuantizeLinear's (dynamic_matmul.h)
    SQ_CHECK(x.dtype() == DType::kFloat32 || codes, ErrorKind::kInvalidModel,
             node_.describe() + ": x must be float32 or u8 codes, got " + dtype_name(x.dtype()));
    SQ_CHECK(x.rank() >= 1 && x.shape().back() == k_, ErrorKind::kInvalidArgument,
             node_.describe() + ": x " + shape_str(x.shape()) + " cannot be multiplied by w [" + std::to_string(k_) +
                 ", " + std::to_string(n_) + "]");
    Shape out_shape(x.shape().begin(), x.shape().end() - 1);
    out_shape.push_back(n_);
    const int64_t m = k_ > 0 ? x.numel() / k_ : 0;
    integer::DynamicQuantParams p;
    const Tensor* xq = &x;
    if (codes) {
      const Tensor& s = ctx.input(kDynamicXScale);
      const Tensor& z = ctx.input(kDynamicXZeroPoint);
      SQ_CHECK(s.dtype() == DType::kFloat32 && s.numel() == 1 && z.dtype() == DType::kUInt8 && z.numel() == 1,
               ErrorKind::kInvalidModel,
               node_.describe() + ": u8 codes need a float32 x_scale and a u8 x_zero_point, one value each");
      p.scale = s.data<float>()[0];
      p.zero_point = z.data<uint8_t>()[0];
    } else {
      if (const Tensor* range = ctx.optional_input(kDynamicXRange)) {
        SQ_CHECK(range->dtype() == DType::kFloat32 && range->numel() == 2, ErrorKind::kInvalidModel,
                 node_.describe() + ": x_range must be two float32 values");
        p = integer::dynamic_quant_params_from_range(range->data<float>()[0], range->data<float>()[1]);
      } else {
        p = integer::dynamic_quant_params(x.data<float>(), x.numel());
      }
      Tensor& own = scratch(xq_, DType::kUInt8, x.shape());
      const Tensor zero_point_t = Tensor::scalar(p.zero_point);
      quantize_linear(x, Tensor::scalar(p.scale), &zero_point_t, 0, own, node_.describe());
      xq = &own;
    }
    scales_.resize(static_cast<size_t>(n_));
    for (int64_t j = 0; j < n_; ++j) scales_[static_cast<size_t>(j)] = p.scale * w_scale_[static_cast<size_t>(j)];
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, out_shape);
    if (m == 0 || n_ == 0) return;
    const Tensor* residual = ctx.optional_input(kDynamicResidual);
    SQ_CHECK(!residual || (residual->dtype() == DType::kFloat32 && residual->shape() == out_shape),
             ErrorKind::kInvalidArgument,
             node_.describe() + ": the residual must be float32 of the output's shape " + shape_str(out_shape));
    const float* r = residual ? residual->data<float>() : nullptr;
    if (exact_int8_) run_dnnl(m, xq->data<uint8_t>(), p.zero_point, r, y.data<float>());
    else run_float_exact(m, xq->data<uint8_t>(), p.zero_point, r, y.data<float>());
  }

 private:
  void run_dnnl(int64_t m, const uint8_t* xq, uint8_t zero_point, const float* residual, float* y) {
    acc_.resize(static_cast<size_t>(m * n_));
    int8_products_->run(m, xq, acc_.data());
    // sum_l (x_q - z_x) w = sum_l x_q w - z_x * sum_l w (exact in int32), then the op-by-op
    // epilogue: Cast, Mul by s_x * s_w[j], Add bias[j].
    correction_.resize(static_cast<size_t>(n_));
    for (int64_t j = 0; j < n_; ++j) correction_[static_cast<size_t>(j)] = int32_t{zero_point} * w_sum_[static_cast<size_t>(j)];
    dequantize_rows(acc_.data(), m, n_, correction_.data(), scales_.data(), bias_.empty() ? nullptr : bias_.data(),
                    residual, y);
  }

  struct Primitive {
    dnnl::matmul prim;
    memory weights;
  };

  // The f32 matmul of rows [k0, k0 + depth) of w for m rows of x: src rows keep x's stride k_.
  const Primitive& float_primitive(int64_t m, int64_t k0, int64_t depth) {
    const std::pair<int64_t, int64_t> key{m, k0};
    auto it = float_prims_.find(key);
    if (it != float_prims_.end()) return it->second;
    if (float_prims_.size() >= 16) float_prims_.erase(float_prims_.begin());
    const memory::desc src({m, depth}, memory::data_type::f32, memory::dims{k_, 1});
    const memory::desc wany({depth, n_}, memory::data_type::f32, memory::format_tag::any);
    const memory::desc dst({m, n_}, memory::data_type::f32, memory::format_tag::ab);
    const auto pd = dnnl_kernels::make_pd(node_, "f32 matmul", [&] {
      return dnnl::matmul::primitive_desc(dnnl::matmul::desc(src, wany, dst), dnnl_engine());
    });
    Primitive prim{dnnl::matmul(pd), memory(pd.weights_desc(), dnnl_engine())};
    memory user({{depth, n_}, memory::data_type::f32, memory::format_tag::ab}, dnnl_engine(),
                w_float_.data<float>() + k0 * n_);
    dnnl::reorder(user, prim.weights).execute(dnnl_stream(), user, prim.weights);
    dnnl_stream().wait();
    return float_prims_.emplace(key, std::move(prim)).first->second;
  }

  void run_float_exact(int64_t m, const uint8_t* xq, uint8_t zero_point, const float* residual, float* y) {
    Tensor& xf = scratch(x_float_, DType::kFloat32, {m, k_});
    float* a = xf.data<float>();
    codes_as_floats(xq, m * k_, zero_point, a);
    Tensor& sums = scratch(sums_, DType::kFloat32, {m, n_});
    acc_.resize(static_cast<size_t>(m * n_));
    for (int64_t k0 = 0; k0 < k_; k0 += slice_depth_) {
      const int64_t depth = std::min(slice_depth_, k_ - k0);
      const Primitive& p = float_primitive(m, k0, depth);
      memory src({{m, depth}, memory::data_type::f32, memory::dims{k_, 1}}, dnnl_engine(), a + k0);
      memory dst({{m, n_}, memory::data_type::f32, memory::format_tag::ab}, dnnl_engine(), sums.data<float>());
      p.prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, src}, {DNNL_ARG_WEIGHTS, p.weights}, {DNNL_ARG_DST, dst}});
      dnnl_stream().wait();
      add_exact_sums(sums.data<float>(), m * n_, k0 == 0, acc_.data());
    }
    // x_q - z_x was summed directly: no zero-point correction; then the same epilogue as the int8 path.
    correction_.assign(static_cast<size_t>(n_), 0);
    dequantize_rows(acc_.data(), m, n_, correction_.data(), scales_.data(), bias_.empty() ? nullptr : bias_.data(),
                    residual, y);
  }

  const ir::Node& node_;
  Tensor w_;
  int64_t k_ = 0, n_ = 0;
  std::vector<float> w_scale_, bias_, scales_;
  std::vector<int32_t> w_sum_, acc_, correction_;  // column sums of w; the s32 products; z_x * w_sum_
  Tensor xq_;                          // x's codes
  bool exact_int8_ = true;
  // The f32 path: w's codes as floats, rows per exact slice, x_q - z_x as floats, a slice's sums.
  Tensor w_float_, x_float_, sums_;
  int64_t slice_depth_ = 0;
  std::optional<S32MatMuls> int8_products_;                         // the int8 path
  std::map<std::pair<int64_t, int64_t>, Primitive> float_prims_;  // f32, by rows M and first row of w
};


// The 2-D ConvInteger form (fused_ops::kDynamicConv). oneDNN 2.6 has no int8 convolution with a
// run-time src zero point for every shape (a ViT's patch embedding has none), so the zero point is
// taken out of the sum instead: with x_q padded explicitly with z_x where the convolution pads
// (ConvInteger pads with the zero point), conv(x_q - z_x, w) = conv(x_q, w) - z_x * sum(w[m]); the
// int8 primitive writes conv(x_q, w) as s32 and the epilogue computes
//   y = float(acc - z_x * sum(w[m])) * (s_x * s_w[m]) (+ bias[m])
// which is the op-by-op arithmetic (Cast, Mul, Add) exactly. u8 weights with zero point 128 are
// turned back into their s8 codes once.
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
    SQ_CHECK(group_ >= 1 && m_ % group_ == 0, ErrorKind::kInvalidModel,
             node_.describe() + ": " + std::to_string(m_) + " output channels and group " + std::to_string(group_));
    const int64_t depth = w_.numel() / std::max<int64_t>(m_, 1);
    w_sum_.assign(static_cast<size_t>(m_), 0);
    for (int64_t o = 0; o < m_; ++o)
      for (int64_t l = 0; l < depth; ++l) w_sum_[static_cast<size_t>(o)] += w_.data<int8_t>()[o * depth + l];
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
    Tensor& xq = scratch(xq_, DType::kUInt8, x.shape());
    const Tensor zero_point_t = Tensor::scalar(p.zero_point);
    quantize_linear(x, Tensor::scalar(p.scale), &zero_point_t, 0, xq, node_.describe());
    const dnnl_kernels::WindowGeometry geo = dnnl_kernels::forward_geometry(node_, window_, {x.dim(2), x.dim(3)}, false);
    const bool padded = std::any_of(geo.pad_begin.begin(), geo.pad_begin.end(), [](auto v) { return v != 0; }) ||
                        std::any_of(geo.pad_end.begin(), geo.pad_end.end(), [](auto v) { return v != 0; });
    // With z_x != 0 the padding must hold z_x: pad x_q explicitly and convolve without padding.
    const bool explicit_pad = padded && p.zero_point != 0;
    Tensor src = xq;
    if (explicit_pad) {
      const int64_t h = x.dim(2), w = x.dim(3), ph = h + geo.pad_begin[0] + geo.pad_end[0],
                    pw = w + geo.pad_begin[1] + geo.pad_end[1];
      src = scratch(padded_, DType::kUInt8, {x.dim(0), x.dim(1), ph, pw});
      uint8_t* d = src.data<uint8_t>();
      std::fill(d, d + src.numel(), p.zero_point);
      for (int64_t nc = 0; nc < x.dim(0) * x.dim(1); ++nc)
        for (int64_t r = 0; r < h; ++r)
          std::copy(xq.data<uint8_t>() + (nc * h + r) * w, xq.data<uint8_t>() + (nc * h + r + 1) * w,
                    d + (nc * ph + r + geo.pad_begin[0]) * pw + geo.pad_begin[1]);
    }
    const bool windows_tile = !padded && geo.strides == geo.kernel && group_ == 1 &&
                              std::all_of(geo.dilations.begin(), geo.dilations.end(), [](auto d) { return d == 0; });
    if (windows_tile) {
      run_patches(xq, geo, p, ctx);
      return;
    }
    Plan& plan = plan_for(src.shape(), geo, explicit_pad);
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, plan.out_shape);
    if (y.numel() == 0) return;
    Tensor& acc = scratch(acc_, DType::kInt32, plan.out_shape);
    memory src_user(plan.src_user, dnnl_engine(), src.raw());
    memory dst_user(plan.dst_user, dnnl_engine(), acc.raw());
    memory src_mem = src_user, dst_mem = dst_user;
    if (plan.src_reorder) {
      src_mem = dnnl_scratch_memory(DnnlScratch::kSrc, plan.pd.src_desc());
      plan.src_reorder->execute(dnnl_stream(), src_user, src_mem);
    }
    if (plan.dst_reorder) dst_mem = dnnl_scratch_memory(DnnlScratch::kDst, plan.pd.dst_desc());
    else if (plan.dst_channels_last) dst_mem = memory(plan.pd.dst_desc(), dnnl_engine(), acc.raw());
    plan.prim.execute(dnnl_stream(), {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, plan.weights}, {DNNL_ARG_DST, dst_mem}});
    if (plan.dst_reorder) plan.dst_reorder->execute(dnnl_stream(), dst_mem, dst_user);
    dnnl_stream().wait();
    // The epilogue, in the op-by-op order: Cast, Mul by s_x * s_w[m], Add bias[m].
    const int64_t pixels = plan.out_shape[2] * plan.out_shape[3];
    if (plan.dst_channels_last) {
      channels_last_epilogue(acc.data<int32_t>(), plan.out_shape[0], pixels, p, y);
      return;
    }
    for (int64_t n = 0; n < plan.out_shape[0]; ++n)
      for (int64_t o = 0; o < m_; ++o) {
        const int32_t correction = int32_t{p.zero_point} * w_sum_[static_cast<size_t>(o)];
        const float scale = p.scale * w_scale_[static_cast<size_t>(o)];
        dequantize_channel(acc.data<int32_t>() + (n * m_ + o) * pixels, pixels, correction, scale,
                           bias_.empty() ? nullptr : &bias_[static_cast<size_t>(o)], y.data<float>() + (n * m_ + o) * pixels);
      }
  }

 private:
  // Sums [N, pixels, M] (channels last): rows of M channels through the MatMul's epilogue, then one
  // transposing copy to y [N, M, pixels]; oneDNN 2.6's s32 reorder between the two layouts took
  // longer than the convolution itself (ViT-small's patch embedding at batch 32).
  void channels_last_epilogue(const int32_t* acc, int64_t images, int64_t pixels,
                              const integer::DynamicQuantParams& p, Tensor& y) {
    correction_.resize(static_cast<size_t>(m_));
    scales_.resize(static_cast<size_t>(m_));
    for (int64_t o = 0; o < m_; ++o) {
      correction_[static_cast<size_t>(o)] = int32_t{p.zero_point} * w_sum_[static_cast<size_t>(o)];
      scales_[static_cast<size_t>(o)] = p.scale * w_scale_[static_cast<size_t>(o)];
    }
    auto* rows = static_cast<float*>(dnnl_scratch(DnnlScratch::kAux, static_cast<size_t>(y.numel()) * sizeof(float)));
    dequantize_rows(acc, images * pixels, m_, correction_.data(), scales_.data(), bias_.empty() ? nullptr : bias_.data(),
                    nullptr, rows);
    shape::transpose_bytes(y.raw(), rows, {images, pixels, m_}, {0, 2, 1}, sizeof(float));
  }

  // Windows that tile the input (stride = kernel, no padding or dilation, one group: a ViT's patch
  // embedding) are the rows of a matrix [N * OH * OW, C * kh * kw] in the weights' order: the
  // convolution is one int8 MatMul of those rows by w^T, whose sums come out channels last. oneDNN
  // 2.6's convolution took 0.065 ms for ViT-small's 4x4 patches of one channel at batch 32, the
  // MatMul 0.009 ms.
  void run_patches(const Tensor& xq, const dnnl_kernels::WindowGeometry& geo, const integer::DynamicQuantParams& p,
                   KernelContext& ctx) {
    const int64_t n = xq.dim(0), c = xq.dim(1), h = xq.dim(2), w = xq.dim(3);
    const int64_t kh = geo.kernel[0], kw = geo.kernel[1], oh = geo.out[0], ow = geo.out[1];
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, {n, m_, oh, ow});
    if (y.numel() == 0) return;
    const int64_t rows = n * oh * ow, depth = c * kh * kw;
    Tensor& windows = scratch(windows_, DType::kUInt8, {rows, depth});
    // x_q viewed as [n, oh, ow, c, kh, kw].
    shape::strided_copy(windows.raw(), xq.raw(), {n, oh, ow, c, kh, kw}, {c * h * w, kh * w, kw, h * w, w, 1}, 1);
    if (!window_products_) window_products_.emplace(node_, w_.data<int8_t>(), depth, m_, memory::format_tag::ba);
    Tensor& acc = scratch(acc_, DType::kInt32, {rows, m_});
    window_products_->run(rows, windows.data<uint8_t>(), acc.data<int32_t>());
    channels_last_epilogue(acc.data<int32_t>(), n, oh * ow, p, y);
  }

  struct Plan {
    dnnl::convolution_forward::primitive_desc pd;
    dnnl::convolution_forward prim;
    memory weights;
    memory::desc src_user, dst_user;
    std::optional<dnnl::reorder> src_reorder, dst_reorder;
    Shape out_shape;
    bool dst_channels_last = false;  // the primitive writes NHWC sums, read by the epilogue as they are
  };

  Plan& plan_for(const Shape& x, const dnnl_kernels::WindowGeometry& geo, bool explicit_pad) {
    Shape key = x;
    key.push_back(explicit_pad ? 1 : 0);
    auto it = plans_.find(key);
    if (it != plans_.end()) return it->second;
    if (plans_.size() >= 8) plans_.erase(plans_.begin());
    using tag = memory::format_tag;
    const memory::dims zero{0, 0};
    const memory::dims src_dims{x[0], x[1], x[2], x[3]}, dst_dims{x[0], m_, geo.out[0], geo.out[1]};
    const memory::dims w_dims = group_ == 1 ? memory::dims{m_, w_.dim(1), w_.dim(2), w_.dim(3)}
                                            : memory::dims{group_, m_ / group_, w_.dim(1), w_.dim(2), w_.dim(3)};
    dnnl::primitive_attr attr;
    attr.set_scratchpad_mode(dnnl::scratchpad_mode::library);
    const dnnl::convolution_forward::desc d(
        dnnl::prop_kind::forward_inference, dnnl::algorithm::convolution_direct,
        memory::desc(src_dims, memory::data_type::u8, tag::any), memory::desc(w_dims, memory::data_type::s8, tag::any),
        memory::desc(dst_dims, memory::data_type::s32, tag::any), geo.strides, geo.dilations,
        explicit_pad ? zero : geo.pad_begin, explicit_pad ? zero : geo.pad_end);
    const auto pd = dnnl_kernels::make_pd(node_, "int8 convolution",
                                          [&] { return dnnl::convolution_forward::primitive_desc(d, attr, dnnl_engine()); });
    Plan plan{pd, dnnl::convolution_forward(pd), memory(pd.weights_desc(), dnnl_engine()),
              memory::desc(src_dims, memory::data_type::u8, tag::nchw),
              memory::desc(dst_dims, memory::data_type::s32, tag::nchw), std::nullopt, std::nullopt,
              Shape{x[0], m_, geo.out[0], geo.out[1]}};
    memory w_user({w_dims, memory::data_type::s8, group_ == 1 ? tag::oihw : tag::goihw}, dnnl_engine(), w_.raw());
    dnnl::reorder(w_user, plan.weights).execute(dnnl_stream(), w_user, plan.weights);
    dnnl_stream().wait();
    auto reorder = [](const memory::desc& from, const memory::desc& to) {
      return dnnl::reorder(dnnl::reorder::primitive_desc(dnnl_engine(), from, dnnl_engine(), to));
    };
    if (pd.src_desc() != plan.src_user) plan.src_reorder = reorder(plan.src_user, pd.src_desc());
    if (pd.dst_desc() == memory::desc(dst_dims, memory::data_type::s32, tag::nhwc)) plan.dst_channels_last = true;
    else if (pd.dst_desc() != plan.dst_user) plan.dst_reorder = reorder(pd.dst_desc(), plan.dst_user);
    return plans_.emplace(key, std::move(plan)).first->second;
  }

  const ir::Node& node_;
  Tensor w_;
  int64_t m_ = 0, group_ = 1;
  std::vector<int32_t> w_sum_;
  Tensor xq_, padded_, acc_, windows_;  // scratch kept between runs: x's codes, padded, the s32 sums, run_patches' rows
  std::optional<S32MatMuls> window_products_;  // run_patches' MatMul of the windows by w^T
  dnnl_kernels::WindowAttrs window_;
  std::vector<float> w_scale_, bias_, scales_;  // scales_: s_x * s_w[m] of the current run
  std::vector<int32_t> correction_;             // z_x * sum(w[m]) of the current run
  std::map<Shape, Plan> plans_;
};
}  // namespace

std::unique_ptr<Kernel> make_dynamic_conv(const KernelInit& init) { return std::make_unique<DynamicConvKernel>(init); }
std::unique_ptr<Kernel> make_dynamic_matmul(const KernelInit& init) { return std::make_unique<DynamicMatMulKernel>(init); }

}  // namespace slimquant::runtime
