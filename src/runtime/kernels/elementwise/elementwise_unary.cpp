// Unary elementwise ops: math (Sqrt Exp Log Erf trig ...), rounding, activations (Relu LeakyRelu
// Sigmoid Tanh HardSigmoid HardSwish Elu Selu Celu Softplus Softsign Gelu Mish ...), Clip, Not,
// IsNaN, IsInf. One contiguous loop per op and dtype; activation math is in float for float32.
#include <cmath>
#include <limits>
#include <memory>

#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_math.h"
#include "runtime/kernels/elementwise/elementwise_register.h"
#include "slimquant/ir/passes.h"

namespace slimquant::runtime::ew {
namespace {

// y[i] = fn(x[i]) for float ops, whose math gains most from AVX2 + FMA.
template <typename In, typename Out, typename Fn>
SQ_AVX512_AVX2_CLONES void map_floats(const In* x, Out* y, int64_t n, Fn fn) {
  for (int64_t i = 0; i < n; ++i) y[i] = fn(x[i]);
}

// Fn maps one element; Pred<T> says which dtypes the op takes; BoolOut for predicates (IsNaN).
template <template <typename> class Pred, typename Fn, bool BoolOut = false>
class UnaryKernel final : public Kernel {
 public:
  UnaryKernel(const KernelInit& init, Fn fn) : node_(init.node), fn_(fn) { reject_fused_activation(node_); }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (Pred<T>::value) {
        using O = std::conditional_t<BoolOut, bool, T>;
        Tensor& out = ctx.allocate_output(0, dtype_of<O>, x.shape());
        const Storage<T>* px = storage_ptr<T>(x.raw());
        Storage<O>* po = storage_ptr<O>(out.raw());
        const Fn fn = fn_;
        parallel_range(x.numel(), [&](int64_t b, int64_t e) {
          if constexpr (kIsFloat<T>) map_floats(px + b, po + b, e - b, fn);
          else for (int64_t i = b; i < e; ++i) po[i] = fn(px[i]);
        });
      } else {
        fail(ErrorKind::kUnsupported, node_.describe() + ": input dtype " + dtype_name(x.dtype()) +
                                          " is not supported by " + node_.op_type);
      }
    });
  }

 private:
  const ir::Node& node_;
  Fn fn_;
};

template <template <typename> class Pred, bool BoolOut = false, typename Fn>
KernelFactory unary(Fn fn) {
  return [fn](const KernelInit& init) -> std::unique_ptr<Kernel> {
    return std::make_unique<UnaryKernel<Pred, Fn, BoolOut>>(init, fn);
  };
}

// Factory for ops whose functor is built from the node's attributes.
template <template <typename> class Pred, typename MakeFn>
KernelFactory unary_attr(MakeFn make) {
  return [make](const KernelInit& init) -> std::unique_ptr<Kernel> {
    auto fn = make(init.node);
    return std::make_unique<UnaryKernel<Pred, decltype(fn)>>(init, fn);
  };
}

// ---- functors ----

#define SQ_UNARY_FN(Name, expr) \
  struct Name {                 \
    template <typename T> T operator()(T x) const { return expr; } \
  };
SQ_UNARY_FN(NegFn, wrap_neg(x))
SQ_UNARY_FN(ReluFn, select(x > T(0), x, T(0)))
SQ_UNARY_FN(SqrtFn, std::sqrt(x))
SQ_UNARY_FN(ExpFn, exp_t(x))
SQ_UNARY_FN(LogFn, std::log(x))
SQ_UNARY_FN(ReciprocalFn, T(1) / x)
SQ_UNARY_FN(SigmoidFn, sigmoid_t(x))
SQ_UNARY_FN(TanhFn, tanh_t(x))
SQ_UNARY_FN(ErfFn, erf_t(x))
SQ_UNARY_FN(FloorFn, floor_t(x))
SQ_UNARY_FN(CeilFn, ceil_t(x))
SQ_UNARY_FN(RoundFn, round_even_t(x))
SQ_UNARY_FN(SoftsignFn, x / (T(1) + std::abs(x)))
// log(1 + e^x) without overflow: max(x, 0) + log1p(e^-|x|).
SQ_UNARY_FN(SoftplusFn, select(x > T(0), x, T(0)) + std::log1p(exp_t(-std::abs(x))))
SQ_UNARY_FN(HardSwishFn, x * clamp_t(x * T(1.0 / 6.0) + T(0.5), T(0), T(1)))
SQ_UNARY_FN(SinFn, std::sin(x))
SQ_UNARY_FN(CosFn, std::cos(x))
SQ_UNARY_FN(TanFn, std::tan(x))
SQ_UNARY_FN(AsinFn, std::asin(x))
SQ_UNARY_FN(AcosFn, std::acos(x))
SQ_UNARY_FN(AtanFn, std::atan(x))
SQ_UNARY_FN(SinhFn, std::sinh(x))
SQ_UNARY_FN(CoshFn, std::cosh(x))
SQ_UNARY_FN(AsinhFn, std::asinh(x))
SQ_UNARY_FN(AcoshFn, std::acosh(x))
SQ_UNARY_FN(AtanhFn, std::atanh(x))
#undef SQ_UNARY_FN

struct AbsFn {
  template <typename T> T operator()(T x) const {
    if constexpr (kIsFloat<T>) return std::abs(x);
    else if constexpr (std::is_signed_v<T>) return select(x < T(0), wrap_neg(x), x);
    else return x;
  }
};
struct SignFn {
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_signed_v<T>) return select(x > T(0), T(1), select(x < T(0), T(-1), x));  // NaN, -0 kept
    else return select(x > T(0), T(1), T(0));
  }
};

// Mish(x) = x * tanh(softplus(x)).
struct MishFn {
  template <typename T> T operator()(T x) const {
    const T sp = select(x > T(0), x, T(0)) + std::log1p(exp_t(-std::abs(x)));
    return x * tanh_t(sp);
  }
};

struct NotFn {  // on the byte (0 or 1) holding a bool
  uint8_t operator()(uint8_t x) const { return x ^ 1u; }
};
struct IsNaNFn {
  template <typename T> bool operator()(T x) const { return x != x; }
};
struct IsInfFn {
  bool positive = true, negative = true;
  template <typename T> bool operator()(T x) const {
    return (positive && x == std::numeric_limits<T>::infinity()) ||
           (negative && x == -std::numeric_limits<T>::infinity());
  }
};

struct LeakyReluFn {
  float alpha;
  template <typename T> T operator()(T x) const { return select(x < T(0), x * T(alpha), x); }
};
struct ThresholdedReluFn {
  float alpha;
  template <typename T> T operator()(T x) const { return select(x > T(alpha), x, T(0)); }
};
struct SwishFn {  // com.slimquant Swish (ir::merge_swish): x * sigmoid(alpha x) in one pass
  float alpha;
  template <typename T> T operator()(T x) const { return x * sigmoid_t(T(alpha) * x); }
};
struct EluFn {
  float alpha;
  template <typename T> T operator()(T x) const { return select(x < T(0), T(alpha) * (exp_t(x) - T(1)), x); }
};
struct SeluFn {
  float alpha, gamma;
  template <typename T> T operator()(T x) const {
    return T(gamma) * select(x > T(0), x, T(alpha) * (exp_t(x) - T(1)));
  }
};
struct CeluFn {
  float alpha;
  template <typename T> T operator()(T x) const {
    const T neg = T(alpha) * (exp_t(x / T(alpha)) - T(1));
    return select(x > T(0), x, T(0)) + select(neg < T(0), neg, T(0));
  }
};
struct HardSigmoidFn {
  float alpha, beta;
  template <typename T> T operator()(T x) const {
    const T v = T(alpha) * x + T(beta);
    return clamp_t(v, T(0), T(1));
  }
};
struct ShrinkFn {
  float bias, lambd;
  template <typename T> T operator()(T x) const {
    // Compare in float: the thresholds are float attributes even for integer data.
    const float v = static_cast<float>(x);
    if (v < -lambd) return static_cast<T>(v + bias);
    if (v > lambd) return static_cast<T>(v - bias);
    return T(0);
  }
};
// Gelu (opset 20): 0.5 x (1 + erf(x / sqrt 2)), or with approximate = "tanh"
// 0.5 x (1 + tanh(sqrt(2 / pi) (x + 0.044715 x^3))).
struct GeluErfFn {
  template <typename T> T operator()(T x) const {
    if constexpr (std::is_same_v<T, float>) return 0.5f * x * one_plus_erf_f32(x * 0.70710678118654752f);
    else return T(0.5) * x * std::erfc(-x * T(0.7071067811865476));
  }
};
struct GeluTanhFn {
  template <typename T> T operator()(T x) const {
    const T k = T(0.7978845608028654);  // sqrt(2 / pi)
    return T(0.5) * x * (T(1) + tanh_t(k * (x + T(0.044715) * x * x * x)));
  }
};

// Clip: bounds are attributes before opset 11 (float only), optional scalar inputs from 11.
class ClipKernel final : public Kernel {
 public:
  explicit ClipKernel(const KernelInit& init) : node_(init.node), attr_bounds_(init.opset < 11) {
    reject_fused_activation(node_);
    if (attr_bounds_) {
      min_ = node_.attr_float("min", std::numeric_limits<float>::lowest());
      max_ = node_.attr_float("max", std::numeric_limits<float>::max());
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::string who = node_.describe();
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (kIsNumeric<T>) {
        T lo = std::numeric_limits<T>::lowest(), hi = std::numeric_limits<T>::max();
        if (attr_bounds_) {
          if constexpr (kIsFloat<T>) {
            lo = static_cast<T>(min_);
            hi = static_cast<T>(max_);
          } else {
            fail(ErrorKind::kUnsupported, who + ": Clip before opset 11 takes float data only");
          }
        } else {
          lo = bound<T>(ctx.optional_input(1), lo, "min");
          hi = bound<T>(ctx.optional_input(2), hi, "max");
        }
        Tensor& out = ctx.allocate_output(0, dtype_of<T>, x.shape());
        const T* px = x.data<T>();
        T* po = out.data<T>();
        parallel_range(x.numel(), [&](int64_t b, int64_t e) {
          for (int64_t i = b; i < e; ++i) {
            po[i] = clamp_t(px[i], lo, hi);  // min > max clips everything to max, as the spec says
          }
        });
      } else {
        fail(ErrorKind::kUnsupported, who + ": input dtype " + dtype_name(x.dtype()) + " is not supported by Clip");
      }
    });
  }

 private:
  template <typename T>
  T bound(const Tensor* t, T def, const char* what) const {
    if (!t) return def;
    SQ_CHECK(t->dtype() == dtype_of<T>, ErrorKind::kInvalidArgument,
             node_.describe() + ": " + what + " has dtype " + dtype_name(t->dtype()) + ", input has " +
                 dtype_name(dtype_of<T>));
    SQ_CHECK(t->numel() == 1, ErrorKind::kInvalidArgument,
             node_.describe() + ": " + what + " must be a scalar, got shape " + shape_str(t->shape()));
    return t->data<T>()[0];
  }

  const ir::Node& node_;
  bool attr_bounds_;
  float min_ = 0.f, max_ = 0.f;
};

}  // namespace

void register_unary_kernels(KernelRegistry& r) {
  r.add("Abs", unary<NumericP>(AbsFn{}));
  r.add("Neg", unary<SignedNumericP>(NegFn{}));
  r.add("Sign", unary<NumericP>(SignFn{}));
  r.add("Relu", unary<SignedNumericP>(ReluFn{}), "", layouts::kPassthrough);
  r.add("Sqrt", unary<FloatP>(SqrtFn{}));
  r.add("Exp", unary<FloatP>(ExpFn{}));
  r.add("Log", unary<FloatP>(LogFn{}));
  r.add("Reciprocal", unary<FloatP>(ReciprocalFn{}));
  r.add("Sigmoid", unary<FloatP>(SigmoidFn{}));
  r.add("Tanh", unary<FloatP>(TanhFn{}));
  r.add("Erf", unary<FloatP>(ErfFn{}));
  r.add("Floor", unary<FloatP>(FloorFn{}));
  r.add("Ceil", unary<FloatP>(CeilFn{}));
  r.add("Round", unary<FloatP>(RoundFn{}));
  r.add("Softsign", unary<FloatP>(SoftsignFn{}));
  r.add("Softplus", unary<FloatP>(SoftplusFn{}));
  r.add("HardSwish", unary<FloatP>(HardSwishFn{}));
  r.add("Mish", unary<FloatP>(MishFn{}));
  r.add("Sin", unary<FloatP>(SinFn{}));
  r.add("Cos", unary<FloatP>(CosFn{}));
  r.add("Tan", unary<FloatP>(TanFn{}));
  r.add("Asin", unary<FloatP>(AsinFn{}));
  r.add("Acos", unary<FloatP>(AcosFn{}));
  r.add("Atan", unary<FloatP>(AtanFn{}));
  r.add("Sinh", unary<FloatP>(SinhFn{}));
  r.add("Cosh", unary<FloatP>(CoshFn{}));
  r.add("Asinh", unary<FloatP>(AsinhFn{}));
  r.add("Acosh", unary<FloatP>(AcoshFn{}));
  r.add("Atanh", unary<FloatP>(AtanhFn{}));
  r.add("Not", unary<BoolP>(NotFn{}));
  r.add("IsNaN", unary<FloatP, true>(IsNaNFn{}));
  r.add("IsInf", [](const KernelInit& init) -> std::unique_ptr<Kernel> {
    const IsInfFn fn{init.node.attr_int("detect_positive", 1) != 0, init.node.attr_int("detect_negative", 1) != 0};
    return std::make_unique<UnaryKernel<FloatP, IsInfFn, true>>(init, fn);
  });

  r.add("LeakyRelu", unary_attr<FloatP>([](const ir::Node& n) { return LeakyReluFn{n.attr_float("alpha", 0.01f)}; }));
  r.add("ThresholdedRelu",
        unary_attr<FloatP>([](const ir::Node& n) { return ThresholdedReluFn{n.attr_float("alpha", 1.f)}; }));
  r.add("Elu", unary_attr<FloatP>([](const ir::Node& n) { return EluFn{n.attr_float("alpha", 1.f)}; }));
  r.add("Swish", unary_attr<FloatP>([](const ir::Node& n) { return SwishFn{n.attr_float("alpha", 1.f)}; }),
        ir::kSlimquantDomain);
  r.add("Selu", unary_attr<FloatP>([](const ir::Node& n) {
          return SeluFn{n.attr_float("alpha", 1.67326319217681884765625f),
                        n.attr_float("gamma", 1.05070102214813232421875f)};
        }));
  r.add("Celu", unary_attr<FloatP>([](const ir::Node& n) { return CeluFn{n.attr_float("alpha", 1.f)}; }));
  r.add("HardSigmoid", unary_attr<FloatP>([](const ir::Node& n) {
          return HardSigmoidFn{n.attr_float("alpha", 0.2f), n.attr_float("beta", 0.5f)};
        }));
  r.add("Shrink", unary_attr<NumericP>([](const ir::Node& n) {
          return ShrinkFn{n.attr_float("bias", 0.f), n.attr_float("lambd", 0.5f)};
        }));
  r.add("Gelu", [](const KernelInit& init) -> std::unique_ptr<Kernel> {
    const std::string approx = init.node.attr_string("approximate", "none");
    if (approx == "none") return std::make_unique<UnaryKernel<FloatP, GeluErfFn>>(init, GeluErfFn{});
    if (approx == "tanh") return std::make_unique<UnaryKernel<FloatP, GeluTanhFn>>(init, GeluTanhFn{});
    fail(ErrorKind::kInvalidModel,
         init.node.describe() + ": approximate must be 'none' or 'tanh', got '" + approx + "'");
  });
  r.add(
      "Clip", [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<ClipKernel>(init); }, "",
      layouts::kPassthrough);
}

}  // namespace slimquant::runtime::ew
