// Hardmax and CumSum: scans along one axis. Both view the input as [outer, len, inner] (len the
// scanned extent) and, when inner > 1, process whole rows of `inner` elements at a time so the
// inner loops are contiguous and vectorise.
#include <algorithm>
#include <cstring>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_math.h"
#include "runtime/kernels/math/misc_math_kernels.h"

namespace slimquant::runtime::misc {
namespace {

// x viewed as [outer, len, inner] around one axis.
struct AxisView {
  int64_t outer = 1, len = 1, inner = 1;
};

AxisView view_around_axis(const Shape& shape, int64_t axis) {
  AxisView v;
  for (size_t d = 0; d < shape.size(); ++d) {
    const int64_t a = static_cast<int64_t>(d);
    if (a < axis) v.outer *= shape[d];
    else if (a == axis) v.len = shape[d];
    else v.inner *= shape[d];
  }
  return v;
}

// Runs fn(o) for o in [0, outer), on several threads when the whole tensor (`work` elements) is
// large enough to pay for it.
template <typename Fn>
void for_each_outer(int64_t outer, int64_t work, Fn&& fn) {
  const int nt = static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ew::threads_for(work), outer)));
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
  for (int64_t o = 0; o < outer; ++o) fn(o);
}

// ---- Hardmax -------------------------------------------------------------------------------------

// One-hot of the first maximum along the scanned extent of each [len, inner] block: y is 1 there
// and 0 elsewhere.
template <typename T>
void hardmax(const T* px, T* py, const AxisView& v) {
  std::memset(py, 0, static_cast<size_t>(v.outer * v.len * v.inner) * sizeof(T));
  if (v.len == 0) return;
  for_each_outer(v.outer, v.outer * v.len * v.inner, [&](int64_t o) {
    const T* base = px + o * v.len * v.inner;
    T* out = py + o * v.len * v.inner;
    if (v.inner == 1) {
      T best = base[0];
      int64_t best_at = 0;
      for (int64_t r = 1; r < v.len; ++r)
        if (base[r] > best) {  // strict: the first maximum wins ties
          best = base[r];
          best_at = r;
        }
      out[best_at] = T(1);
      return;
    }
    std::vector<T> best(base, base + v.inner);
    std::vector<int64_t> best_at(static_cast<size_t>(v.inner), 0);
    for (int64_t r = 1; r < v.len; ++r) {
      const T* row = base + r * v.inner;
      for (int64_t j = 0; j < v.inner; ++j) {
        const bool take = row[j] > best[j];
        best[j] = ew::select(take, row[j], best[j]);
        best_at[j] = ew::select(take, r, best_at[j]);
      }
    }
    for (int64_t j = 0; j < v.inner; ++j) out[best_at[j] * v.inner + j] = T(1);
  });
}

// Hardmax-1..11 coerces the input to 2-D [prod(dims < axis), prod(dims >= axis)] and takes the
// hardmax of each row (default axis 1); Hardmax-13 works along the single dim `axis` (default -1).
class HardmaxKernel final : public Kernel {
 public:
  explicit HardmaxKernel(const KernelInit& init)
      : node_(init.node),
        coerce_to_2d_(init.opset < 13),
        axis_(init.node.attr_int("axis", init.opset < 13 ? 1 : -1)) {}

  void run(KernelContext& ctx) override {
    const std::string who = node_.describe();
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    const int64_t axis = normalize_axis(axis_, rank, who + " (axis)");
    AxisView v = view_around_axis(x.shape(), axis);
    if (coerce_to_2d_) {
      v.len *= v.inner;
      v.inner = 1;
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    switch (x.dtype()) {
      case DType::kFloat32: hardmax(x.data<float>(), y.data<float>(), v); break;
      case DType::kFloat64: hardmax(x.data<double>(), y.data<double>(), v); break;
      default:
        fail(ErrorKind::kUnsupported, who + ": input dtype " + dtype_name(x.dtype()) +
                                          " is not supported (float32 and float64 are)");
    }
  }

 private:
  const ir::Node& node_;
  bool coerce_to_2d_;
  int64_t axis_;
};

// ---- CumSum --------------------------------------------------------------------------------------

// Running sums along the scanned extent. The previous output row is the accumulator:
//   inclusive: y[r] = y[r - 1] + x[r]      exclusive: y[r] = y[r - 1] + x[r - 1], y[first] = 0
// with r running backwards under `reverse`. Integers wrap on overflow (two's complement).
template <typename T>
void cumsum(const T* px, T* py, const AxisView& v, bool exclusive, bool reverse) {
  if (v.len == 0 || v.inner == 0) return;
  const int64_t step = reverse ? -v.inner : v.inner;  // from one scanned row to the next
  for_each_outer(v.outer, v.outer * v.len * v.inner, [&](int64_t o) {
    const int64_t first = o * v.len * v.inner + (reverse ? (v.len - 1) * v.inner : 0);
    const T* x = px + first;
    T* y = py + first;
    if (exclusive) std::fill(y, y + v.inner, T(0));
    else std::copy(x, x + v.inner, y);
    for (int64_t r = 1; r < v.len; ++r) {
      const T* add = exclusive ? x + (r - 1) * step : x + r * step;
      const T* prev = y + (r - 1) * step;
      T* cur = y + r * step;
      for (int64_t j = 0; j < v.inner; ++j) cur[j] = ew::wrap_add(prev[j], add[j]);
    }
  });
}

class CumSumKernel final : public Kernel {
 public:
  explicit CumSumKernel(const KernelInit& init)
      : node_(init.node),
        exclusive_(init.node.attr_int("exclusive", 0) != 0),
        reverse_(init.node.attr_int("reverse", 0) != 0) {}

  void run(KernelContext& ctx) override {
    const std::string who = node_.describe();
    const Tensor& x = ctx.input(0);
    const Tensor& axis_t = ctx.input(1);
    SQ_CHECK(axis_t.dtype() == DType::kInt32 || axis_t.dtype() == DType::kInt64, ErrorKind::kInvalidModel,
             who + ": axis must be int32 or int64, got " + dtype_name(axis_t.dtype()));
    SQ_CHECK(axis_t.numel() == 1 && axis_t.rank() <= 1, ErrorKind::kInvalidArgument,
             who + ": axis must be a scalar, got shape " + shape_str(axis_t.shape()));
    const int64_t axis = normalize_axis(axis_t.to_int64_vector()[0], static_cast<int64_t>(x.rank()), who + " (axis)");
    const AxisView v = view_around_axis(x.shape(), axis);
    Tensor& y = ctx.allocate_output(0, x.dtype(), x.shape());
    auto run_typed = [&](auto tag) {
      using T = decltype(tag);
      cumsum(x.data<T>(), y.data<T>(), v, exclusive_, reverse_);
    };
    switch (x.dtype()) {
      case DType::kFloat32: run_typed(float{}); break;
      case DType::kFloat64: run_typed(double{}); break;
      case DType::kInt32: run_typed(int32_t{}); break;
      case DType::kInt64: run_typed(int64_t{}); break;
      case DType::kUInt32: run_typed(uint32_t{}); break;
      case DType::kUInt64: run_typed(uint64_t{}); break;
      default:
        fail(ErrorKind::kUnsupported, who + ": input dtype " + dtype_name(x.dtype()) +
                                          " is not supported (float32/64, int32/64, uint32/64 are)");
    }
  }

 private:
  const ir::Node& node_;
  bool exclusive_, reverse_;
};

}  // namespace

std::unique_ptr<Kernel> make_hardmax(const KernelInit& init) { return std::make_unique<HardmaxKernel>(init); }
std::unique_ptr<Kernel> make_cumsum(const KernelInit& init) { return std::make_unique<CumSumKernel>(init); }

}  // namespace slimquant::runtime::misc
