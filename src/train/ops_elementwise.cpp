// Backward of elementwise ops: activations (from the saved input or output), broadcasting binary
// arithmetic (gradients summed over broadcast dims), Where, Cast.
#include <algorithm>
#include <cmath>
#include <limits>

#include "train/op_base.h"
#include "train/tensor_ops.h"

namespace slimquant::train::detail {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // elements below which OpenMP costs more than it gains

// dx = f(gy, x, y) elementwise. f returns a select of g (not g * mask) where the derivative is
// piecewise, so the inner loop vectorizes without branches (random signs mispredict badly).
template <class F>
Tensor unary_grad(const Tensor& gy, const Tensor& x, const Tensor& y, F f) {
  Tensor dx = empty_f32(x.shape());
  const float* pg = gy.data<float>();
  const float* px = x.data<float>();
  const float* py = y.data<float>();
  float* pd = dx.data<float>();
  const int64_t n = dx.numel();
  constexpr int64_t kChunk = 1 << 14;
  const int64_t chunks = (n + kChunk - 1) / kChunk;
#pragma omp parallel for if (n > kParallelMin)
  for (int64_t c = 0; c < chunks; ++c) {
    const int64_t end = std::min(n, (c + 1) * kChunk);
#pragma omp simd
    for (int64_t i = c * kChunk; i < end; ++i) pd[i] = f(pg[i], px[i], py[i]);
  }
  return dx;
}

enum class Unary { kRelu, kLeakyRelu, kClip, kHardSwish, kHardSigmoid, kSigmoid, kTanh, kGelu, kGeluTanh, kErf,
                   kSqrt, kExp, kLog, kNeg, kAbs, kReciprocal, kIdentity, kSoftplus, kElu };

class UnaryOp final : public KernelOp {
 public:
  UnaryOp(const ir::Node& n, const ir::Graph& g) : KernelOp(n, g) {
    static const std::map<std::string, Unary> kinds = {
        {"Relu", Unary::kRelu},       {"LeakyRelu", Unary::kLeakyRelu}, {"Clip", Unary::kClip},
        {"HardSwish", Unary::kHardSwish}, {"HardSigmoid", Unary::kHardSigmoid}, {"Sigmoid", Unary::kSigmoid},
        {"Tanh", Unary::kTanh},       {"Gelu", Unary::kGelu},           {"Erf", Unary::kErf},
        {"Sqrt", Unary::kSqrt},       {"Exp", Unary::kExp},             {"Log", Unary::kLog},
        {"Neg", Unary::kNeg},         {"Abs", Unary::kAbs},             {"Reciprocal", Unary::kReciprocal},
        {"Identity", Unary::kIdentity}, {"Dropout", Unary::kIdentity},  {"Softplus", Unary::kSoftplus},
        {"Elu", Unary::kElu}};
    kind_ = kinds.at(n.op_type);
    if (kind_ == Unary::kGelu && n.attr_string("approximate", "none") == "tanh") kind_ = Unary::kGeluTanh;
    alpha_ = n.attr_float("alpha", n.op_type == "LeakyRelu" ? 0.01f : n.op_type == "HardSigmoid" ? 0.2f : 1.f);
    beta_ = n.attr_float("beta", 0.5f);
    if (kind_ == Unary::kClip && opset_ < 11) {
      lo_ = n.attr_float("min", std::numeric_limits<float>::lowest());
      hi_ = n.attr_float("max", std::numeric_limits<float>::max());
    }
  }

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const Tensor& x = in_[0];
    const Tensor& y = out_[0];
    const Tensor& g = gy[0];
    const float a = alpha_, b = beta_;
    switch (kind_) {
      case Unary::kRelu: r[0] = unary_grad(g, x, y, [](float d, float v, float) { return v > 0.f ? d : 0.f; }); break;
      case Unary::kLeakyRelu:
        r[0] = unary_grad(g, x, y, [a](float d, float v, float) { return v > 0.f ? d : a * d; });
        break;
      case Unary::kClip: {
        float lo = lo_, hi = hi_;
        if (opset_ >= 11) {
          lo = scalar_or(input_if(1), std::numeric_limits<float>::lowest());
          hi = scalar_or(input_if(2), std::numeric_limits<float>::max());
        }
        // Inside the closed interval the gradient passes (as torch.clamp does).
        r[0] = unary_grad(g, x, y, [lo, hi](float d, float v, float) { return (v >= lo) & (v <= hi) ? d : 0.f; });
        break;
      }
      case Unary::kHardSwish:
        r[0] = unary_grad(g, x, y, [](float d, float v, float) {
          const float inner = d * (2.f * v + 3.f) * (1.f / 6.f);
          return v < -3.f ? 0.f : (v > 3.f ? d : inner);
        });
        break;
      case Unary::kHardSigmoid:
        r[0] = unary_grad(g, x, y, [a, b](float d, float v, float) {
          const float t = a * v + b;
          return (t > 0.f) & (t < 1.f) ? a * d : 0.f;
        });
        break;
      case Unary::kSigmoid: r[0] = unary_grad(g, x, y, [](float d, float, float s) { return d * s * (1.f - s); }); break;
      case Unary::kTanh: r[0] = unary_grad(g, x, y, [](float d, float, float t) { return d * (1.f - t * t); }); break;
      case Unary::kGelu:
        r[0] = unary_grad(g, x, y, [](float d, float v, float) {
          const float cdf = 0.5f * (1.f + std::erf(v * 0.70710678f));
          const float pdf = 0.39894228f * std::exp(-0.5f * v * v);
          return d * (cdf + v * pdf);
        });
        break;
      case Unary::kGeluTanh:
        r[0] = unary_grad(g, x, y, [](float d, float v, float) {
          constexpr float k = 0.7978845608f, c = 0.044715f;
          const float t = std::tanh(k * (v + c * v * v * v));
          return d * (0.5f * (1.f + t) + 0.5f * v * (1.f - t * t) * k * (1.f + 3.f * c * v * v));
        });
        break;
      case Unary::kErf:
        r[0] = unary_grad(g, x, y, [](float d, float v, float) { return d * 1.1283791671f * std::exp(-v * v); });
        break;
      case Unary::kSqrt: r[0] = unary_grad(g, x, y, [](float d, float, float s) { return d * 0.5f / s; }); break;
      case Unary::kExp: r[0] = unary_grad(g, x, y, [](float d, float, float e) { return d * e; }); break;
      case Unary::kLog: r[0] = unary_grad(g, x, y, [](float d, float v, float) { return d / v; }); break;
      case Unary::kNeg: r[0] = unary_grad(g, x, y, [](float d, float, float) { return -d; }); break;
      case Unary::kAbs:
        r[0] = unary_grad(g, x, y, [](float d, float v, float) { return v > 0.f ? d : (v < 0.f ? -d : 0.f); });
        break;
      case Unary::kReciprocal: r[0] = unary_grad(g, x, y, [](float d, float, float q) { return -d * q * q; }); break;
      case Unary::kIdentity: r[0] = g; break;
      case Unary::kSoftplus:
        r[0] = unary_grad(g, x, y, [](float d, float v, float) { return d / (1.f + std::exp(-v)); });
        break;
      case Unary::kElu:
        r[0] = unary_grad(g, x, y, [a](float d, float v, float e) { return v > 0.f ? d : d * (e + a); });
        break;
    }
    return r;
  }

 private:
  Unary kind_;
  float alpha_ = 1.f, beta_ = 0.5f;
  float lo_ = std::numeric_limits<float>::lowest(), hi_ = std::numeric_limits<float>::max();
};

// c = op(a, b) with numpy broadcasting; dA, dB summed back over broadcast dims.
class BinaryOp final : public KernelOp {
 public:
  BinaryOp(const ir::Node& n, const ir::Graph& g) : KernelOp(n, g) {
    if (n.op_type == "Add") kind_ = 0;
    else if (n.op_type == "Sub") kind_ = 1;
    else if (n.op_type == "Mul") kind_ = 2;
    else if (n.op_type == "Div") kind_ = 3;
    else kind_ = 4;  // Pow
  }

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    const Tensor& g = gy[0];
    const Shape& os = g.shape();
    const Tensor &a = in_[0], &b = in_[1];
    const bool na = needed(0) && a.dtype() == DType::kFloat32, nb = needed(1) && b.dtype() == DType::kFloat32;
    const int64_t n = g.numel();
    const float* pg = g.data<float>();
    auto map2 = [&](const Tensor& u, const Tensor& v, auto f) {  // f(g, u, v) over the output shape
      Tensor ue = expand_to(u, os), ve = expand_to(v, os);
      Tensor d = empty_f32(os);
      const float *pu = ue.data<float>(), *pv = ve.data<float>();
      float* pd = d.data<float>();
#pragma omp parallel for simd if (n > kParallelMin)
      for (int64_t i = 0; i < n; ++i) pd[i] = f(pg[i], pu[i], pv[i]);
      return d;
    };
    switch (kind_) {
      case 0:
      case 1:
        if (na) r[0] = reduce_to_shape(g, a.shape());
        if (nb) {
          r[1] = reduce_to_shape(g, b.shape());
          if (kind_ == 1) {
            if (r[1].storage() == g.storage()) r[1] = r[1].clone();
            for (float& v : r[1].values<float>()) v = -v;
          }
        }
        break;
      case 2:
        if (na) r[0] = reduce_to_shape(map2(a, b, [](float gg, float, float v) { return gg * v; }), a.shape());
        if (nb) r[1] = reduce_to_shape(map2(a, b, [](float gg, float u, float) { return gg * u; }), b.shape());
        break;
      case 3:
        if (na) r[0] = reduce_to_shape(map2(a, b, [](float gg, float, float v) { return gg / v; }), a.shape());
        if (nb)
          r[1] = reduce_to_shape(map2(a, b, [](float gg, float u, float v) { return -gg * u / (v * v); }), b.shape());
        break;
      default:  // Pow: d/da = e a^(e-1), d/de = a^e ln a
        if (na && b.dtype() == DType::kFloat32)
          r[0] = reduce_to_shape(
              map2(a, b, [](float gg, float u, float e) { return gg * e * std::pow(u, e - 1.f); }), a.shape());
        else if (na)  // integer exponent
          r[0] = reduce_to_shape(map2(a, b.cast(DType::kFloat32),
                                      [](float gg, float u, float e) { return gg * e * std::pow(u, e - 1.f); }),
                                 a.shape());
        if (nb)
          r[1] = reduce_to_shape(map2(a, b,
                                      [](float gg, float u, float e) {
                                        return u > 0.f ? gg * std::pow(u, e) * std::log(u) : 0.f;
                                      }),
                                 b.shape());
        break;
    }
    return r;
  }

 private:
  int kind_;
};

// Where(cond, X, Y): the gradient goes to X where cond holds, to Y elsewhere.
class WhereOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    const Tensor& g = gy[0];
    Tensor c = in_[0].dtype() == DType::kBool ? in_[0] : in_[0].cast(DType::kBool);
    // The condition broadcast through a float copy (expand_to is float-only).
    const Tensor ce = expand_to(c.cast(DType::kFloat32), g.shape());
    const float* pc = ce.data<float>();
    for (int k = 1; k <= 2; ++k) {
      if (!needed(k) || in_[k].dtype() != DType::kFloat32) continue;
      Tensor d = empty_f32(g.shape());
      const float* pg = g.data<float>();
      float* pd = d.data<float>();
      const bool take = k == 1;
      for (int64_t i = 0; i < g.numel(); ++i) pd[i] = ((pc[i] != 0.f) == take) ? pg[i] : 0.f;
      r[k] = reduce_to_shape(d, in_[k].shape());
    }
    return r;
  }
};

// Cast: gradients pass between float types; integer casts stop them.
class CastOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (needed(0) && in_[0].dtype() == DType::kFloat32) r[0] = gy[0];
    return r;
  }
};

}  // namespace

void add_elementwise_ops(std::map<std::string, OpMaker>& t) {
  for (const char* op : {"Relu", "LeakyRelu", "Clip", "HardSwish", "HardSigmoid", "Sigmoid", "Tanh", "Gelu", "Erf",
                         "Sqrt", "Exp", "Log", "Neg", "Abs", "Reciprocal", "Identity", "Dropout", "Softplus", "Elu"})
    t[op] = &make<UnaryOp>;
  for (const char* op : {"Add", "Sub", "Mul", "Div", "Pow"}) t[op] = &make<BinaryOp>;
  t["Where"] = &make<WhereOp>;
  t["Cast"] = &make<CastOp>;
}

}  // namespace slimquant::train::detail
