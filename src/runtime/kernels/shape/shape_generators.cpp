// Ops that make tensors from attributes or small scalar inputs: Constant, ConstantOfShape, Range,
// OneHot.
#include <algorithm>
#include <cmath>

#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

// ---- Constant ----------------------------------------------------------------------------------

class ConstantKernel : public Kernel {
 public:
  explicit ConstantKernel(const KernelInit& init) {
    const ir::Node& node = init.node;
    // Exactly one of the value attributes is set (value: any opset; value_float(s)/value_int(s):
    // opset 12).
    if (const Tensor* t = node.attr_tensor("value")) value_ = *t;
    else if (node.has_attr("value_float")) value_ = Tensor::scalar<float>(node.attr_float("value_float", 0.f));
    else if (node.has_attr("value_floats")) {
      const std::vector<float> v = node.attr_floats("value_floats");
      value_ = Tensor::from_vector<float>({static_cast<int64_t>(v.size())}, v);
    } else if (node.has_attr("value_int")) value_ = Tensor::scalar<int64_t>(node.attr_int("value_int", 0));
    else if (node.has_attr("value_ints")) {
      const std::vector<int64_t> v = node.attr_ints("value_ints");
      value_ = Tensor::from_vector<int64_t>({static_cast<int64_t>(v.size())}, v);
    } else if (node.has_attr("sparse_value")) {
      fail(ErrorKind::kUnsupported, node.describe() + ": sparse_value constants are not supported");
    } else if (node.has_attr("value_string") || node.has_attr("value_strings")) {
      fail(ErrorKind::kUnsupported, node.describe() + ": string constants are not supported");
    } else {
      fail(ErrorKind::kInvalidModel, node.describe() + ": no value attribute");
    }
  }

  // The output shares the attribute's storage: consumers only read their inputs.
  void run(KernelContext& ctx) override { ctx.set_output(0, value_); }

 private:
  Tensor value_;
};

// ---- ConstantOfShape ---------------------------------------------------------------------------

class ConstantOfShapeKernel : public Kernel {
 public:
  explicit ConstantOfShapeKernel(const KernelInit& init) : shape_(IntListArg::from_input(init, 0, "shape")) {
    if (const Tensor* t = init.node.attr_tensor("value")) {
      if (t->numel() != 1)
        fail(ErrorKind::kInvalidModel, init.node.describe() + ": value must hold one element, got " +
                                           shape_str(t->shape()));
      value_ = *t;
    } else {
      value_ = Tensor::scalar<float>(0.f);  // default: float32 zero
    }
  }

  void run(KernelContext& ctx) override {
    const std::vector<int64_t> dims = shape_.get(ctx);
    Shape s(dims.begin(), dims.end());
    checked_numel(s, ctx.node(), "shape");
    Tensor& y = ctx.allocate_output(0, value_.dtype(), s);
    fill_elems(y.raw(), value_.raw(), dtype_size(value_.dtype()), y.numel());
  }

 private:
  IntListArg shape_;
  Tensor value_;
};

// ---- Range -------------------------------------------------------------------------------------

// Element count ceil((limit - start) / delta), clamped at 0, without overflowing for integers.
template <typename T>
int64_t range_count(T start, T limit, T delta) {
  if constexpr (std::is_floating_point_v<T>) {
    const double count = std::ceil((static_cast<double>(limit) - static_cast<double>(start)) / static_cast<double>(delta));
    // Infinite or beyond int64 (a zero or tiny delta): converting it would be undefined. NaN (0 / 0)
    // gives 0 elements below, as an integer Range with delta 0 does.
    if (count >= 9.2e18)
      fail(ErrorKind::kInvalidArgument, "Range from " + std::to_string(start) + " to " + std::to_string(limit) +
                                            " by " + std::to_string(delta) + " has no valid element count");
    return static_cast<int64_t>(std::max(0.0, count));
  } else {
    const int64_t s = start, l = limit, d = delta;
    if (d > 0 && l > s)
      return static_cast<int64_t>((static_cast<uint64_t>(l) - static_cast<uint64_t>(s) - 1) / static_cast<uint64_t>(d) + 1);
    if (d < 0 && l < s)
      return static_cast<int64_t>((static_cast<uint64_t>(s) - static_cast<uint64_t>(l) - 1) /
                                      (0 - static_cast<uint64_t>(d)) + 1);
    return 0;
  }
}

class RangeKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& start = ctx.input(0);
    const Tensor& limit = ctx.input(1);
    const Tensor& delta = ctx.input(2);
    const DType t = start.dtype();
    if (limit.dtype() != t || delta.dtype() != t)
      fail(ErrorKind::kInvalidModel, node.describe() + ": start, limit and delta must share one type");
    if (start.numel() != 1 || limit.numel() != 1 || delta.numel() != 1)
      fail(ErrorKind::kInvalidModel, node.describe() + ": start, limit and delta must be scalars");
    if (t != DType::kFloat32 && t != DType::kFloat64 && t != DType::kInt16 && t != DType::kInt32 &&
        t != DType::kInt64)
      fail(ErrorKind::kUnsupported, node.describe() + ": Range of " + dtype_name(t) + " is not defined by ONNX");
    dispatch_dtype(t, [&](auto tag) {
      using T = decltype(tag);
      if constexpr (!std::is_same_v<T, bool>) {
        const T s = *start.data<T>(), l = *limit.data<T>(), d = *delta.data<T>();
        if (d == T{0}) fail(ErrorKind::kInvalidArgument, node.describe() + ": delta is 0");
        const int64_t n = range_count<T>(s, l, d);
        T* y = ctx.allocate_output(0, t, {n}).template data<T>();
        // start + i * delta (as numpy.arange), not repeated addition, so no error accumulates.
        for (int64_t i = 0; i < n; ++i) y[i] = static_cast<T>(s + static_cast<T>(i) * d);
      }
    });
  }
};

// ---- OneHot ------------------------------------------------------------------------------------

class OneHotKernel : public Kernel {
 public:
  explicit OneHotKernel(const KernelInit& init) : axis_(init.node.attr_int("axis", -1)) {}

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& indices = ctx.input(0);
    const Tensor& depth_t = ctx.input(1);
    const Tensor& values = ctx.input(2);
    if (depth_t.numel() != 1) fail(ErrorKind::kInvalidModel, node.describe() + ": depth must be a scalar");
    if (values.numel() != 2)
      fail(ErrorKind::kInvalidModel, node.describe() + ": values must be [off_value, on_value], got " +
                                         shape_str(values.shape()));
    // depth and indices may be of any numeric type; they are used as (truncated) integers.
    const int64_t depth = static_cast<int64_t>(depth_t.to_float_vector()[0]);
    if (depth <= 0) fail(ErrorKind::kInvalidArgument, node.describe() + ": depth must be positive, got " +
                                                          std::to_string(depth));
    const int64_t r = static_cast<int64_t>(indices.rank());
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, r + 1, node.describe()));
    Shape out_shape = indices.shape();
    out_shape.insert(out_shape.begin() + static_cast<std::ptrdiff_t>(axis), depth);
    Tensor& y = ctx.allocate_output(0, values.dtype(), out_shape);

    const size_t es = dtype_size(values.dtype());
    const auto* off = static_cast<const std::byte*>(values.raw());
    const std::byte* on = off + es;
    fill_elems(y.raw(), off, es, y.numel());
    int64_t outer = 1, inner = 1;
    for (size_t d = 0; d < indices.rank(); ++d) (d < axis ? outer : inner) *= indices.dim(d);
    const std::vector<int64_t> idx = indices.to_int64_vector();
    auto* dst = static_cast<std::byte*>(y.raw());
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        int64_t k = idx[static_cast<size_t>(o * inner + i)];
        if (k < 0) k += depth;
        if (k < 0 || k >= depth) continue;  // out of range: the row stays all off_value
        std::memcpy(dst + static_cast<size_t>((o * depth + k) * inner + i) * es, on, es);
      }
  }

 private:
  int64_t axis_;
};

}  // namespace

std::unique_ptr<Kernel> make_constant(const KernelInit& init) { return std::make_unique<ConstantKernel>(init); }
std::unique_ptr<Kernel> make_constant_of_shape(const KernelInit& init) {
  return std::make_unique<ConstantOfShapeKernel>(init);
}
std::unique_ptr<Kernel> make_range(const KernelInit&) { return std::make_unique<RangeKernel>(); }
std::unique_ptr<Kernel> make_one_hot(const KernelInit& init) { return std::make_unique<OneHotKernel>(init); }

}  // namespace slimquant::runtime::shape
