// Reductions (ReduceSum ReduceMean ReduceMax ReduceMin ReduceProd ReduceL1 ReduceL2 ReduceSumSquare
// ReduceLogSum ReduceLogSumExp) and ArgMax / ArgMin.
//
// Axes come from the `axes` attribute before the opset where they became an input (ReduceSum 13,
// the others 18), from the optional second input after. Empty axes reduce everything, unless
// noop_with_empty_axes = 1, which makes the op an identity.
//
// The input is walked once in memory order. Adjacent dims are collapsed by (reduced, kept) runs,
// so a reduction is a sequence of rows that either fold into one output element (reduced innermost
// run: a multi-accumulator loop) or accumulate elementwise into an output row (kept innermost run:
// a vector loop). Accumulation is in the data type (float for float32).
#include <cmath>
#include <limits>
#include <memory>

#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_math.h"
#include "runtime/kernels/elementwise/elementwise_register.h"

namespace slimquant::runtime::ew {
namespace {

enum class Reduce { kSum, kMean, kMax, kMin, kProd, kL1, kL2, kSumSquare, kLogSum, kLogSumExp };

// What each reduction folds: init, map (per element, given the LogSumExp shift), combine.
template <Reduce R, typename T>
struct Fold {
  static T init() {
    if constexpr (R == Reduce::kMax)
      return kIsFloat<T> ? -std::numeric_limits<T>::infinity() : std::numeric_limits<T>::lowest();
    else if constexpr (R == Reduce::kMin)
      return kIsFloat<T> ? std::numeric_limits<T>::infinity() : std::numeric_limits<T>::max();
    else if constexpr (R == Reduce::kProd)
      return T(1);
    else
      return T(0);
  }
  static T map(T x, T shift) {
    if constexpr (R == Reduce::kL1) {
      if constexpr (kIsFloat<T>) return std::abs(x);
      else if constexpr (std::is_signed_v<T>) return select(x < T(0), wrap_neg(x), x);
      else return x;
    } else if constexpr (R == Reduce::kL2 || R == Reduce::kSumSquare) {
      return wrap_mul(x, x);
    } else if constexpr (R == Reduce::kLogSumExp) {
      return exp_t(x - shift);
    } else {
      return x;
    }
  }
  static T combine(T a, T b) {
    if constexpr (R == Reduce::kMax) return max_t(a, b);
    else if constexpr (R == Reduce::kMin) return min_t(a, b);
    else if constexpr (R == Reduce::kProd) return wrap_mul(a, b);
    else return wrap_add(a, b);
  }
};

// Folds a contiguous row with 8 independent accumulators: the loop vectorises and float sums
// lose less precision than with one running total.
template <Reduce R, typename T>
T fold_row(const T* x, int64_t n, T shift) {
  using F = Fold<R, T>;
  constexpr int kLanes = 8;
  T part[kLanes];
  for (int j = 0; j < kLanes; ++j) part[j] = F::init();
  int64_t i = 0;
  for (; i + kLanes <= n; i += kLanes)
    for (int j = 0; j < kLanes; ++j) part[j] = F::combine(part[j], F::map(x[i + j], shift));
  for (; i < n; ++i) part[0] = F::combine(part[0], F::map(x[i], shift));
  for (int j = kLanes / 2; j >= 1; j /= 2)
    for (int k = 0; k < j; ++k) part[k] = F::combine(part[k], part[k + j]);
  return part[0];
}

// acc (output layout) = fold over the reduced dims of x; `shift` (LogSumExp) has acc's layout.
template <Reduce R, typename T>
void reduce_into(const T* x, const BroadcastPlan& p, T* acc, const T* shift) {
  using F = Fold<R, T>;
  const int nd = static_cast<int>(p.dims.size());
  const int64_t len = p.row_len(), inner_acc = p.inner_stride(0);
  const int64_t rows = p.rows();
  auto run_rows = [&](int64_t r0, int64_t r1) {
    std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
    int64_t ao = 0, rem = r0;
    for (int d = nd - 2; d >= 0; --d) {
      idx[d] = rem % p.dims[d];
      rem /= p.dims[d];
      ao += idx[d] * p.strides[0][d];
    }
    for (int64_t r = r0; r < r1; ++r) {
      const T* row = x + r * len;
      if (inner_acc == 0) {
        const T s = shift ? shift[ao] : T(0);
        acc[ao] = F::combine(acc[ao], fold_row<R, T>(row, len, s));
      } else if (shift) {
        T* a = acc + ao;
        const T* sh = shift + ao;
        for (int64_t j = 0; j < len; ++j) a[j] = F::combine(a[j], F::map(row[j], sh[j]));
      } else {
        T* a = acc + ao;
        for (int64_t j = 0; j < len; ++j) a[j] = F::combine(a[j], F::map(row[j], T(0)));
      }
      for (int d = nd - 2; d >= 0; --d) {
        ao += p.strides[0][d];
        if (++idx[d] < p.dims[d]) break;
        ao -= p.strides[0][d] * p.dims[d];
        idx[d] = 0;
      }
    }
  };
  if (p.numel == 0) return;
  // Ranges of a kept outermost dim write disjoint outputs, so they may run in parallel.
  const int nt =
      (nd > 1 && p.strides[0][0] != 0) ? static_cast<int>(std::min<int64_t>(threads_for(p.numel), p.dims[0])) : 1;
  if (nt <= 1) {
    run_rows(0, rows);
    return;
  }
  const int64_t d0 = p.dims[0], per = rows / d0;
#pragma omp parallel num_threads(nt)
  {
    const int64_t t = omp_get_thread_num(), nth = omp_get_num_threads();
    const int64_t o0 = d0 * t / nth, o1 = d0 * (t + 1) / nth;
    if (o0 < o1) run_rows(o0 * per, o1 * per);
  }
}

struct ReduceAttrs {
  bool keepdims = true;
  bool noop_with_empty_axes = false;
  bool axes_from_input = false;
  std::vector<int64_t> axes;  // from the attribute
};

template <Reduce R>
class ReduceKernel final : public Kernel {
 public:
  ReduceKernel(const KernelInit& init, int64_t axes_input_opset) : node_(init.node) {
    reject_fused_activation(node_);
    attrs_.keepdims = node_.attr_int("keepdims", 1) != 0;
    attrs_.noop_with_empty_axes = node_.attr_int("noop_with_empty_axes", 0) != 0;
    attrs_.axes_from_input = init.opset >= axes_input_opset;
    if (attrs_.axes_from_input) {
      SQ_CHECK(!node_.has_attr("axes"), ErrorKind::kInvalidModel,
               node_.describe() + ": axes is an input from opset " + std::to_string(axes_input_opset) +
                   ", not an attribute");
    } else {
      attrs_.axes = node_.attr_ints("axes");
    }
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::string who = node_.describe();
    std::vector<int64_t> axes = attrs_.axes;
    if (attrs_.axes_from_input) {
      if (const Tensor* t = ctx.optional_input(1)) axes = t->to_int64_vector();
      else axes.clear();
    }
    if (axes.empty() && attrs_.noop_with_empty_axes) {
      ctx.set_output(0, x);
      return;
    }
    const int64_t rank = static_cast<int64_t>(x.rank());
    std::vector<bool> reduced(static_cast<size_t>(rank), axes.empty());
    for (int64_t a : axes) {
      const int64_t ax = normalize_axis(a, rank, who);
      SQ_CHECK(!reduced[ax] || axes.empty(), ErrorKind::kInvalidModel,
               who + ": axis " + std::to_string(a) + " is listed twice");
      reduced[ax] = true;
    }
    Shape out_shape, acc_shape;  // acc_shape: x's rank, 1 on reduced dims
    int64_t count = 1;
    for (int64_t d = 0; d < rank; ++d) {
      if (reduced[d]) {
        count *= x.dim(d);
        acc_shape.push_back(1);
        if (attrs_.keepdims) out_shape.push_back(1);
      } else {
        acc_shape.push_back(x.dim(d));
        out_shape.push_back(x.dim(d));
      }
    }

    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (kIsNumeric<T>) {
        Tensor& out = ctx.allocate_output(0, dtype_of<T>, out_shape);
        T* o = out.data<T>();
        const int64_t n_out = out.numel();
        const BroadcastPlan p = make_broadcast_plan(x.shape(), {&acc_shape}, who);
        Tensor shift;
        if constexpr (R == Reduce::kLogSumExp) {
          // Shift by the max so exp cannot overflow: log sum exp(x - m) + m.
          shift = Tensor(dtype_of<T>, out_shape);
          T* m = shift.data<T>();
          for (int64_t i = 0; i < n_out; ++i) m[i] = Fold<Reduce::kMax, T>::init();
          reduce_into<Reduce::kMax, T>(x.data<T>(), p, m, nullptr);
          for (int64_t i = 0; i < n_out; ++i)
            if (!std::isfinite(static_cast<double>(m[i]))) m[i] = T(0);
        }
        for (int64_t i = 0; i < n_out; ++i) o[i] = Fold<R, T>::init();
        reduce_into<R, T>(x.data<T>(), p, o, shift.defined() ? shift.data<T>() : nullptr);
        finalize(o, n_out, count, shift.defined() ? shift.data<T>() : nullptr);
      } else {
        fail(ErrorKind::kUnsupported, who + ": input dtype " + dtype_name(x.dtype()) + " is not supported");
      }
    });
  }

 private:
  template <typename T>
  static void finalize(T* o, int64_t n, int64_t count, const T* shift) {
    if constexpr (R == Reduce::kMean) {
      const T c = static_cast<T>(count);
      for (int64_t i = 0; i < n; ++i) o[i] = div_t(o[i], c);
    } else if constexpr (R == Reduce::kL2) {
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(std::sqrt(static_cast<double>(o[i])));
    } else if constexpr (R == Reduce::kLogSum) {
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(std::log(static_cast<double>(o[i])));
    } else if constexpr (R == Reduce::kLogSumExp) {
      for (int64_t i = 0; i < n; ++i) o[i] = static_cast<T>(std::log(static_cast<double>(o[i])) + shift[i]);
    }
  }

  const ir::Node& node_;
  ReduceAttrs attrs_;
};

// Index of the first (kLast: last) maximum (kMax) or minimum along the middle dim of
// x = [outer, len, inner]. With inner > 1 the scan runs over whole rows of `inner` candidates.
template <typename T, bool kMax, bool kLast>
void arg_extreme(const T* px, int64_t* po, int64_t outer, int64_t len, int64_t inner) {
  auto better = [](T v, T best) {
    if constexpr (kMax) return kLast ? v >= best : v > best;
    else return kLast ? v <= best : v < best;
  };
  parallel_range(outer, [&](int64_t o0, int64_t o1) {
    std::vector<T> best(static_cast<size_t>(inner));
    for (int64_t o = o0; o < o1; ++o) {
      const T* base = px + o * len * inner;
      int64_t* idx = po + o * inner;
      if (inner == 1) {
        T b = base[0];
        int64_t bi = 0;
        for (int64_t r = 1; r < len; ++r) {
          const bool take = better(base[r], b);
          b = select(take, base[r], b);
          bi = select(take, r, bi);
        }
        idx[0] = bi;
        continue;
      }
      for (int64_t j = 0; j < inner; ++j) {
        best[j] = base[j];
        idx[j] = 0;
      }
      for (int64_t r = 1; r < len; ++r) {
        const T* row = base + r * inner;
        for (int64_t j = 0; j < inner; ++j) {
          const bool take = better(row[j], best[j]);
          best[j] = select(take, row[j], best[j]);
          idx[j] = select(take, r, idx[j]);
        }
      }
    }
  });
}

// ArgMax / ArgMin along one axis: int64 indices, first (or with select_last_index, last) extreme.
template <bool kMax>
class ArgKernel final : public Kernel {
 public:
  explicit ArgKernel(const KernelInit& init) : node_(init.node) {
    reject_fused_activation(node_);
    axis_ = node_.attr_int("axis", 0);
    keepdims_ = node_.attr_int("keepdims", 1) != 0;
    last_ = node_.attr_int("select_last_index", 0) != 0;
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::string who = node_.describe();
    const int64_t rank = static_cast<int64_t>(x.rank());
    const int64_t axis = normalize_axis(axis_, std::max<int64_t>(rank, 1), who);
    int64_t outer = 1, inner = 1;
    const int64_t len = rank == 0 ? 1 : x.dim(axis);
    Shape out_shape;
    for (int64_t d = 0; d < rank; ++d) {
      if (d < axis) outer *= x.dim(d);
      if (d > axis) inner *= x.dim(d);
      if (d != axis) out_shape.push_back(x.dim(d));
      else if (keepdims_) out_shape.push_back(1);
    }
    SQ_CHECK(len > 0 || outer * inner == 0, ErrorKind::kInvalidArgument,
             who + ": cannot take the arg-extreme of an empty axis");
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (kIsNumeric<T>) {
        Tensor& out = ctx.allocate_output(0, DType::kInt64, out_shape);
        if (last_) arg_extreme<T, kMax, true>(x.data<T>(), out.data<int64_t>(), outer, len, inner);
        else arg_extreme<T, kMax, false>(x.data<T>(), out.data<int64_t>(), outer, len, inner);
      } else {
        fail(ErrorKind::kUnsupported, who + ": input dtype " + dtype_name(x.dtype()) + " is not supported");
      }
    });
  }

 private:
  const ir::Node& node_;
  int64_t axis_ = 0;
  bool keepdims_ = true, last_ = false;
};

template <Reduce R>
KernelFactory reduce(int64_t axes_input_opset) {
  return [axes_input_opset](const KernelInit& init) -> std::unique_ptr<Kernel> {
    return std::make_unique<ReduceKernel<R>>(init, axes_input_opset);
  };
}

}  // namespace

void register_reduce_kernels(KernelRegistry& r) {
  r.add("ReduceSum", reduce<Reduce::kSum>(13));
  r.add("ReduceMean", reduce<Reduce::kMean>(18));
  r.add("ReduceMax", reduce<Reduce::kMax>(18));
  r.add("ReduceMin", reduce<Reduce::kMin>(18));
  r.add("ReduceProd", reduce<Reduce::kProd>(18));
  r.add("ReduceL1", reduce<Reduce::kL1>(18));
  r.add("ReduceL2", reduce<Reduce::kL2>(18));
  r.add("ReduceSumSquare", reduce<Reduce::kSumSquare>(18));
  r.add("ReduceLogSum", reduce<Reduce::kLogSum>(18));
  r.add("ReduceLogSumExp", reduce<Reduce::kLogSumExp>(18));
  r.add("ArgMax", [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<ArgKernel<true>>(init); });
  r.add("ArgMin", [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<ArgKernel<false>>(init); });
}

}  // namespace slimquant::runtime::ew
