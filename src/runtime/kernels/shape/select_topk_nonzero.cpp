// TopK, NonZero, Compress: selections whose output size depends on the data (NonZero, Compress) or
// on a run-time k (TopK).
#include <algorithm>
#include <cmath>
#include <numeric>
#include <type_traits>

#include "runtime/kernels/shape/index_common.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::indexing {

namespace {

// ---- TopK --------------------------------------------------------------------------------------

// Whether value a ranks strictly before value b. NaN counts as larger than every number (as in
// numpy's sort), which keeps the order a strict weak ordering that std::nth_element can rely on.
template <typename T, bool kLargest>
inline bool ranks_before(T a, T b) {
  if constexpr (std::is_floating_point_v<T>) {
    const bool a_nan = std::isnan(a), b_nan = std::isnan(b);
    if (a_nan || b_nan) return kLargest ? a_nan && !b_nan : !a_nan && b_nan;
  }
  return kLargest ? a > b : a < b;
}

// Rows with fewer elements than this all together stay on the calling thread.
constexpr int64_t kTopKParallelElems = 1 << 15;

// For each of the outer * inner rows of length n (stride inner), the k best elements in rank order,
// ties broken by the lower index (the ONNX rule), selected on an index array: O(n log k) or
// O(n + k log k) per row, never a full sort for small k. `values` / `indices` may be null (not wanted).
template <typename T, bool kLargest>
void top_k_rows(const T* x, T* values, int64_t* indices, int64_t outer, int64_t n, int64_t inner, int64_t k) {
  const int64_t rows = outer * inner;
  const bool parallel = rows > 1 && rows * n >= kTopKParallelElems;
#pragma omp parallel if (parallel)
  {
    std::vector<int64_t> order(static_cast<size_t>(n));
    std::vector<T> gathered(inner > 1 ? static_cast<size_t>(n) : 0);  // a strided row made contiguous
#pragma omp for schedule(static)
    for (int64_t row = 0; row < rows; ++row) {
      const int64_t o = row / inner, i = row % inner;
      const T* v = x + o * n * inner + i;
      if (inner > 1) {
        for (int64_t j = 0; j < n; ++j) gathered[static_cast<size_t>(j)] = v[j * inner];
        v = gathered.data();
      }
      std::iota(order.begin(), order.end(), int64_t{0});
      const auto before = [v](int64_t a, int64_t b) {
        return ranks_before<T, kLargest>(v[a], v[b]) || (!ranks_before<T, kLargest>(v[b], v[a]) && a < b);
      };
      // sorted = 0 leaves the order unspecified; rank order is a valid choice and keeps runs reproducible.
      // For k much smaller than n a k-heap (partial_sort) rejects most elements with one comparison
      // and beats nth_element + sort about 3x (measured on detection-sized rows); otherwise select
      // then sort the first k.
      const auto kth = order.begin() + k;
      if (k * 16 < n) {
        std::partial_sort(order.begin(), kth, order.end(), before);
      } else {
        if (k < n) std::nth_element(order.begin(), kth, order.end(), before);
        std::sort(order.begin(), kth, before);
      }
      const int64_t out_base = o * k * inner + i;
      for (int64_t j = 0; j < k; ++j) {
        const int64_t src = order[static_cast<size_t>(j)];
        if (values) values[out_base + j * inner] = v[src];
        if (indices) indices[out_base + j * inner] = src;
      }
    }
  }
}

class TopKKernel : public Kernel {
 public:
  explicit TopKKernel(const KernelInit& init)
      : axis_(init.node.attr_int("axis", -1)), largest_(init.node.attr_int("largest", 1) != 0) {
    // TopK-1: k is an attribute. TopK-10+: k is input 1 (read once here when it is a constant).
    if (init.opset < 10) {
      if (!init.node.has_attr("k"))
        fail(ErrorKind::kInvalidModel, init.node.describe() + ": TopK-1 needs the k attribute");
      k_attr_ = init.node.attr_int("k", 0);
    } else {
      k_input_ = shape::IntListArg::from_input(init, 1, "k");
    }
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const int64_t rank = static_cast<int64_t>(x.rank());
    if (rank == 0)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": input must have at least one dimension, got a scalar");
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, rank, node.describe()));
    const int64_t k = read_k(ctx);
    const int64_t n = x.dim(axis);
    if (k < 0 || k > n)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": k = " + std::to_string(k) + " is outside [0, " +
                                            std::to_string(n) + "] for axis " + std::to_string(axis) + " of input " +
                                            shape_str(x.shape()));
    int64_t outer = 1, inner = 1;
    for (size_t d = 0; d < x.rank(); ++d) {
      if (d < axis) outer *= x.dim(d);
      if (d > axis) inner *= x.dim(d);
    }
    Shape out_shape = x.shape();
    out_shape[axis] = k;

    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      if constexpr (std::is_same_v<T, bool>) {
        fail(ErrorKind::kUnsupported, node.describe() + ": input dtype bool is not supported (TopK is numeric only)");
      } else {
        T* values = shape::output_requested(ctx, 0) ? ctx.allocate_output(0, x.dtype(), out_shape).template data<T>()
                                                    : nullptr;
        int64_t* indices = shape::output_requested(ctx, 1)
                               ? ctx.allocate_output(1, DType::kInt64, out_shape).template data<int64_t>()
                               : nullptr;
        if (outer * inner * k == 0) return;
        if (largest_) top_k_rows<T, true>(x.data<T>(), values, indices, outer, n, inner, k);
        else top_k_rows<T, false>(x.data<T>(), values, indices, outer, n, inner, k);
      }
    });
  }

 private:
  int64_t read_k(const KernelContext& ctx) const {
    if (!k_input_) return k_attr_;
    if (!k_input_->present(ctx))
      fail(ErrorKind::kInvalidModel, ctx.node().describe() + ": input 1 (k) is missing");
    const std::vector<int64_t> k = k_input_->get(ctx);
    if (k.size() != 1)
      fail(ErrorKind::kInvalidArgument,
           ctx.node().describe() + ": k must hold exactly one value, got " + std::to_string(k.size()));
    return k[0];
  }

  int64_t axis_;
  bool largest_;
  int64_t k_attr_ = 0;
  std::optional<shape::IntListArg> k_input_;
};

// ---- NonZero -----------------------------------------------------------------------------------

// Output int64 [rank, count]: column j holds the coordinates of the j-th non-zero element in
// row-major order (numpy.nonzero stacked). A scalar counts as a 1-element 1-D tensor, as in numpy.
class NonZeroKernel : public Kernel {
 public:
  explicit NonZeroKernel(const KernelInit&) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Shape dims = x.rank() == 0 ? Shape{1} : x.shape();
    const size_t rank = dims.size();
    dispatch_dtype(x.dtype(), [&](auto tag) {
      using T = decltype(tag);
      const T* p = x.data<T>();
      const int64_t n = x.numel();
      int64_t count = 0;
      for (int64_t i = 0; i < n; ++i) count += p[i] != T(0);  // NaN counts as non-zero
      Tensor& y = ctx.allocate_output(0, DType::kInt64, {static_cast<int64_t>(rank), count});
      if (count == 0) return;
      int64_t* out = y.data<int64_t>();
      // Walk rows of the last dim; `prefix` holds the coordinates of the row in the other dims.
      const int64_t last = dims[rank - 1];
      std::vector<int64_t> prefix(rank - 1, 0);
      int64_t col = 0;
      for (int64_t row_start = 0; row_start < n; row_start += last) {
        for (int64_t j = 0; j < last; ++j) {
          if (p[row_start + j] == T(0)) continue;
          for (size_t d = 0; d + 1 < rank; ++d) out[static_cast<int64_t>(d) * count + col] = prefix[d];
          out[static_cast<int64_t>(rank - 1) * count + col] = j;
          ++col;
        }
        for (size_t d = rank - 1; d-- > 0;) {
          if (++prefix[d] < dims[d]) break;
          prefix[d] = 0;
        }
      }
    });
  }
};

// ---- Compress ----------------------------------------------------------------------------------

// Keeps the slices along `axis` whose condition entry is true (the flattened elements when no axis
// is given). A condition shorter than the axis drops the rest; one that is longer may only hold
// false past the end (numpy.compress).
class CompressKernel : public Kernel {
 public:
  explicit CompressKernel(const KernelInit& init)
      : has_axis_(init.node.has_attr("axis")), axis_(init.node.attr_int("axis", 0)) {}

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const Tensor& cond = ctx.input(1);
    if (cond.dtype() != DType::kBool)
      fail(ErrorKind::kInvalidModel, node.describe() + ": condition must be bool, got " + dtype_name(cond.dtype()));
    if (cond.rank() != 1)
      fail(ErrorKind::kInvalidArgument,
           node.describe() + ": condition must be 1-D, got shape " + shape_str(cond.shape()));

    int64_t outer = 1, dim = x.numel(), inner = 1;
    size_t axis = 0;
    if (has_axis_) {
      axis = static_cast<size_t>(normalize_axis(axis_, static_cast<int64_t>(x.rank()), node.describe()));
      dim = x.dim(axis);
      for (size_t d = 0; d < x.rank(); ++d) {
        if (d < axis) outer *= x.dim(d);
        if (d > axis) inner *= x.dim(d);
      }
    }
    const bool* c = cond.data<bool>();
    std::vector<int64_t> selected;
    for (int64_t i = 0; i < cond.numel(); ++i) {
      if (!c[i]) continue;
      if (i >= dim)
        fail(ErrorKind::kInvalidArgument, node.describe() + ": condition selects index " + std::to_string(i) +
                                              " of an axis of size " + std::to_string(dim));
      selected.push_back(i);
    }
    const int64_t kept = static_cast<int64_t>(selected.size());
    Shape out_shape{kept};
    if (has_axis_) {
      out_shape = x.shape();
      out_shape[axis] = kept;
    }
    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    std::vector<int64_t> src_blocks;
    src_blocks.reserve(static_cast<size_t>(outer * kept));
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t s : selected) src_blocks.push_back(o * dim + s);
    gather_blocks(y.raw(), x.raw(), src_blocks, static_cast<size_t>(inner) * dtype_size(x.dtype()));
  }

 private:
  bool has_axis_;
  int64_t axis_;
};

}  // namespace

std::unique_ptr<Kernel> make_top_k(const KernelInit& init) { return std::make_unique<TopKKernel>(init); }
std::unique_ptr<Kernel> make_non_zero(const KernelInit& init) { return std::make_unique<NonZeroKernel>(init); }
std::unique_ptr<Kernel> make_compress(const KernelInit& init) { return std::make_unique<CompressKernel>(init); }

}  // namespace slimquant::runtime::indexing
