// InstanceNormalization, LRN (local response normalization across channels) and
// MeanVarianceNormalization: float32 normalizations the oneDNN kernels do not cover.
//
// Statistics are accumulated in double (several partial sums so the loops vectorise) and the
// variance is taken in a second pass around the mean, E[(x - mean)^2], rather than as
// E[x^2] - E[x]^2, which cancels badly when |mean| >> std. For a constant channel the double sum
// of n copies of c is exact, so mean == c, x - mean == 0 and the output is exactly the bias.
#include <algorithm>
#include <cmath>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/math/misc_math_kernels.h"

namespace slimquant::runtime::misc {
namespace {

void require_float32(const ir::Node& node, const Tensor& t, const char* what) {
  if (t.dtype() != DType::kFloat32)
    fail(ErrorKind::kUnsupported, node.describe() + ": " + what + " has dtype " + dtype_name(t.dtype()) +
                                      "; only float32 is supported");
}

// Sum of x[0, n) in double, with four partial sums so the loop vectorises.
double sum_f64(const float* x, int64_t n) {
  double part[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) part[j] += x[i + j];
  for (; i < n; ++i) part[0] += x[i];
  return (part[0] + part[1]) + (part[2] + part[3]);
}

// Sum of (x[i] - mean)^2 over [0, n) in double.
double sum_sq_dev_f64(const float* x, int64_t n, double mean) {
  double part[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t i = 0;
  for (; i + 4 <= n; i += 4)
    for (int j = 0; j < 4; ++j) {
      const double d = x[i + j] - mean;
      part[j] += d * d;
    }
  for (; i < n; ++i) {
    const double d = x[i] - mean;
    part[0] += d * d;
  }
  return (part[0] + part[1]) + (part[2] + part[3]);
}

// Threads worth using for `work` elements split into `units` independent pieces.
int threads_for_units(int64_t work, int64_t units) {
  return static_cast<int>(std::max<int64_t>(1, std::min<int64_t>(ew::threads_for(work), units)));
}

// ---- InstanceNormalization -----------------------------------------------------------------------

// y[n, c, ...] = scale[c] * (x[n, c, ...] - mean[n, c]) / sqrt(var[n, c] + epsilon) + bias[c],
// mean and (biased) variance over the spatial dims of each (n, c) plane.
class InstanceNormalizationKernel final : public Kernel {
 public:
  explicit InstanceNormalizationKernel(const KernelInit& init)
      : node_(init.node), epsilon_(init.node.attr_float("epsilon", 1e-5f)) {
    SQ_CHECK(epsilon_ >= 0.f, ErrorKind::kInvalidModel,
             node_.describe() + ": epsilon must be >= 0 (got " + std::to_string(epsilon_) + ")");
  }

  void run(KernelContext& ctx) override {
    const std::string who = node_.describe();
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    const Tensor& bias = ctx.input(2);
    require_float32(node_, x, "input");
    require_float32(node_, scale, "scale");
    require_float32(node_, bias, "B");
    SQ_CHECK(x.rank() >= 3, ErrorKind::kInvalidArgument,
             who + ": input must have rank >= 3 (N, C, spatial...), got shape " + shape_str(x.shape()));
    const int64_t batch = x.dim(0), channels = x.dim(1);
    SQ_CHECK(scale.shape() == Shape{channels} && bias.shape() == Shape{channels}, ErrorKind::kInvalidArgument,
             who + ": scale " + shape_str(scale.shape()) + " and B " + shape_str(bias.shape()) + " must both be [" +
                 std::to_string(channels) + "] for input " + shape_str(x.shape()));

    Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
    const int64_t planes = batch * channels;
    if (y.numel() == 0) return;
    const int64_t plane = x.numel() / planes;
    const float* px = x.data<float>();
    const float* ps = scale.data<float>();
    const float* pb = bias.data<float>();
    float* py = y.data<float>();
    const double eps = epsilon_;
    const int nt = threads_for_units(x.numel(), planes);
#pragma omp parallel for num_threads(nt) schedule(static) if (nt > 1)
    for (int64_t p = 0; p < planes; ++p) {
      const int64_t c = p % channels;
      const float* xp = px + p * plane;
      float* yp = py + p * plane;
      const double mean = sum_f64(xp, plane) / static_cast<double>(plane);
      const double var = sum_sq_dev_f64(xp, plane, mean) / static_cast<double>(plane);
      const float m = static_cast<float>(mean);
      const float a = static_cast<float>(ps[c] / std::sqrt(var + eps));
      const float b = pb[c];
      for (int64_t i = 0; i < plane; ++i) yp[i] = (xp[i] - m) * a + b;
    }
  }

 private:
  const ir::Node& node_;
  float epsilon_;
};

// ---- LRN -----------------------------------------------------------------------------------------

// y[n, c, ...] = x[n, c, ...] / (bias + alpha / size * sum_{c' in window(c)} x[n, c', ...]^2)^beta
// with window(c) = [c - floor((size-1)/2), c + ceil((size-1)/2)] clipped to [0, C).
class LrnKernel final : public Kernel {
 public:
  explicit LrnKernel(const KernelInit& init) : node_(init.node) {
    SQ_CHECK(node_.has_attr("size"), ErrorKind::kInvalidModel, node_.describe() + ": required attribute size is missing");
    size_ = node_.attr_int("size", 0);
    SQ_CHECK(size_ > 0, ErrorKind::kInvalidModel,
             node_.describe() + ": size must be > 0 (got " + std::to_string(size_) + ")");
    alpha_ = node_.attr_float("alpha", 1e-4f);
    beta_ = node_.attr_float("beta", 0.75f);
    bias_ = node_.attr_float("bias", 1.0f);
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_float32(node_, x, "input");
    SQ_CHECK(x.rank() >= 2, ErrorKind::kInvalidArgument,
             node_.describe() + ": input must have rank >= 2 (N, C, ...), got shape " + shape_str(x.shape()));
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
    if (y.numel() == 0) return;
    const int64_t channels = x.dim(1);
    const int64_t planes = x.dim(0) * channels;
    const int64_t plane = x.numel() / planes;
    const int64_t before = (size_ - 1) / 2, after = size_ - 1 - before;
    const float* px = x.data<float>();
    float* py = y.data<float>();
    const float scale = alpha_ / static_cast<float>(size_);
    const float bias = bias_, beta = beta_;
    const bool beta_is_default = beta == 0.75f;
    const int nt = threads_for_units(x.numel() * std::min<int64_t>(size_, channels), planes);
#pragma omp parallel num_threads(nt) if (nt > 1)
    {
      std::vector<float> window_sum(static_cast<size_t>(plane));
      float* acc = window_sum.data();
#pragma omp for schedule(static)
      for (int64_t p = 0; p < planes; ++p) {
        const int64_t c = p % channels, image = p - c;
        const int64_t first = std::max<int64_t>(0, c - before), last = std::min<int64_t>(channels - 1, c + after);
        std::fill(acc, acc + plane, 0.f);
        for (int64_t k = first; k <= last; ++k) {
          const float* xk = px + (image + k) * plane;
          for (int64_t i = 0; i < plane; ++i) acc[i] += xk[i] * xk[i];
        }
        const float* xp = px + p * plane;
        float* yp = py + p * plane;
        if (beta_is_default) {
          // t^-3/4 = r * sqrt(r) with r = 1/sqrt(t): no pow() in the common (default) case.
          for (int64_t i = 0; i < plane; ++i) {
            const float r = 1.f / std::sqrt(bias + scale * acc[i]);
            yp[i] = xp[i] * r * std::sqrt(r);
          }
        } else {
          for (int64_t i = 0; i < plane; ++i) yp[i] = xp[i] * std::pow(bias + scale * acc[i], -beta);
        }
      }
    }
  }

 private:
  const ir::Node& node_;
  int64_t size_ = 0;
  float alpha_ = 0.f, beta_ = 0.f, bias_ = 0.f;
};

// ---- MeanVarianceNormalization -------------------------------------------------------------------

// Visits the rows of a broadcast plan of x against its statistics on the calling thread:
// fn(stat_offset, stat_inner_stride, x_offset, len). Used for the accumulating passes, which
// would race if rows sharing a statistic ran on different threads.
template <typename Fn>
void for_each_row_serial(const ew::BroadcastPlan& p, Fn&& fn) {
  if (p.numel == 0) return;
  const int nd = static_cast<int>(p.dims.size());
  const int64_t len = p.row_len(), rows = p.rows(), inner = p.inner_stride(0);
  std::vector<int64_t> idx(static_cast<size_t>(nd), 0);
  int64_t so = 0;
  for (int64_t r = 0; r < rows; ++r) {
    fn(so, inner, r * len, len);
    for (int d = nd - 2; d >= 0; --d) {
      so += p.strides[0][d];
      if (++idx[d] < p.dims[d]) break;
      so -= p.strides[0][d] * p.dims[d];
      idx[d] = 0;
    }
  }
}

// Y = (X - E[X]) / (sqrt(E[(X - E[X])^2]) + 1e-9), the expectations over `axes` (default
// [0, 2, 3]: per channel of an NCHW tensor). The 1e-9 added to the standard deviation is the
// constant of the ONNX function definition.
class MeanVarianceNormalizationKernel final : public Kernel {
 public:
  explicit MeanVarianceNormalizationKernel(const KernelInit& init)
      : node_(init.node), axes_(init.node.attr_ints("axes", {0, 2, 3})) {}

  void run(KernelContext& ctx) override {
    const std::string who = node_.describe();
    const Tensor& x = ctx.input(0);
    require_float32(node_, x, "input");
    const int64_t rank = static_cast<int64_t>(x.rank());
    Shape stat_shape = x.shape();  // x's shape with 1 on the reduced dims
    std::vector<bool> reduced(static_cast<size_t>(rank), false);
    int64_t count = 1;
    for (int64_t a : axes_) {
      const int64_t ax = normalize_axis(a, rank, who + " (axes)");
      SQ_CHECK(!reduced[ax], ErrorKind::kInvalidModel, who + ": axis " + std::to_string(a) + " is listed twice");
      reduced[ax] = true;
      count *= x.dim(ax);
      stat_shape[ax] = 1;
    }
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
    if (y.numel() == 0) return;

    const ew::BroadcastPlan plan = ew::make_broadcast_plan(x.shape(), {&stat_shape}, who);
    const int64_t stats = shape_numel(stat_shape);
    const float* px = x.data<float>();
    float* py = y.data<float>();
    // Pass 1: means. Pass 2: variances around them. Both accumulate in double.
    std::vector<double> mean(static_cast<size_t>(stats), 0.0), var(static_cast<size_t>(stats), 0.0);
    for_each_row_serial(plan, [&](int64_t so, int64_t inner, int64_t xo, int64_t len) {
      if (inner == 0) {
        mean[so] += sum_f64(px + xo, len);
      } else {
        double* m = mean.data() + so;
        for (int64_t i = 0; i < len; ++i) m[i] += px[xo + i];
      }
    });
    for (double& m : mean) m /= static_cast<double>(count);
    for_each_row_serial(plan, [&](int64_t so, int64_t inner, int64_t xo, int64_t len) {
      if (inner == 0) {
        var[so] += sum_sq_dev_f64(px + xo, len, mean[so]);
      } else {
        const double* m = mean.data() + so;
        double* v = var.data() + so;
        for (int64_t i = 0; i < len; ++i) {
          const double d = px[xo + i] - m[i];
          v[i] += d * d;
        }
      }
    });
    // Pass 3 (parallel, rows write disjoint outputs): y = (x - mean) * inv_std.
    std::vector<float> mean_f(static_cast<size_t>(stats)), inv_std(static_cast<size_t>(stats));
    for (int64_t s = 0; s < stats; ++s) {
      mean_f[s] = static_cast<float>(mean[s]);
      inv_std[s] = static_cast<float>(1.0 / (std::sqrt(var[s] / static_cast<double>(count)) + 1e-9));
    }
    ew::for_each_row(plan, [&](const int64_t* so, int64_t xo, int64_t len) {
      const float* xr = px + xo;
      float* yr = py + xo;
      const float* m = mean_f.data() + so[0];
      const float* s = inv_std.data() + so[0];
      if (plan.inner_stride(0) == 0) {
        const float m0 = m[0], s0 = s[0];
        for (int64_t i = 0; i < len; ++i) yr[i] = (xr[i] - m0) * s0;
      } else {
        for (int64_t i = 0; i < len; ++i) yr[i] = (xr[i] - m[i]) * s[i];
      }
    });
  }

 private:
  const ir::Node& node_;
  std::vector<int64_t> axes_;
};

}  // namespace

std::unique_ptr<Kernel> make_instance_normalization(const KernelInit& init) {
  return std::make_unique<InstanceNormalizationKernel>(init);
}
std::unique_ptr<Kernel> make_lrn(const KernelInit& init) { return std::make_unique<LrnKernel>(init); }
std::unique_ptr<Kernel> make_mean_variance_normalization(const KernelInit& init) {
  return std::make_unique<MeanVarianceNormalizationKernel>(init);
}

}  // namespace slimquant::runtime::misc
