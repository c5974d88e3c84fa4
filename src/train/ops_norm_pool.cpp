// Backward of Softmax, LayerNormalization, BatchNormalization (inference form: frozen statistics),
// pooling (Max/Average, 1-D to 3-D; Global*) and ReduceMean/ReduceSum, as plain loops.
#include <omp.h>

#include <cmath>
#include <limits>
#include <numeric>

#include "runtime/kernels/dnnl/dnnl_descriptors.h"
#include "train/op_base.h"
#include "train/tensor_ops.h"

namespace slimquant::train::detail {

namespace {

namespace dk = runtime::dnnl_kernels;

int64_t prod(const Shape& s, size_t from, size_t to) {
  int64_t p = 1;
  for (size_t i = from; i < to; ++i) p *= s[i];
  return p;
}

// Softmax: dx = y (g - sum(g y)); LogSoftmax: dx = g - exp(y) sum(g); along the axis (before
// opset 13: over all dims from axis on).
class SoftmaxOp final : public KernelOp {
 public:
  SoftmaxOp(const ir::Node& n, const ir::Graph& g) : KernelOp(n, g), log_(n.op_type == "LogSoftmax") {}

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const Tensor &y = out_[0], &g = gy[0];
    const Shape& s = y.shape();
    const int64_t rank = static_cast<int64_t>(s.size());
    const int64_t axis = normalize_axis(node_.attr_int("axis", opset_ >= 13 ? -1 : 1), rank, node_.describe() + " axis");
    const bool coerce = opset_ < 13;
    const int64_t outer = prod(s, 0, axis);
    const int64_t len = coerce ? prod(s, axis, s.size()) : s[axis];
    const int64_t inner = coerce ? 1 : prod(s, axis + 1, s.size());
    Tensor dx(DType::kFloat32, s);
    const float *py = y.data<float>(), *pg = g.data<float>();
    float* pd = dx.data<float>();
#pragma omp parallel for if (outer * len * inner > (1 << 15))
    for (int64_t o = 0; o < outer; ++o)
      for (int64_t i = 0; i < inner; ++i) {
        const int64_t base = o * len * inner + i;
        if (log_) {
          double sum = 0;
          for (int64_t k = 0; k < len; ++k) sum += pg[base + k * inner];
          for (int64_t k = 0; k < len; ++k) {
            const int64_t q = base + k * inner;
            pd[q] = pg[q] - std::exp(py[q]) * static_cast<float>(sum);
          }
          continue;
        }
        double dot = 0;
        for (int64_t k = 0; k < len; ++k) dot += static_cast<double>(pg[base + k * inner]) * py[base + k * inner];
        for (int64_t k = 0; k < len; ++k) {
          const int64_t q = base + k * inner;
          pd[q] = py[q] * (pg[q] - static_cast<float>(dot));
        }
      }
    r[0] = dx;
    return r;
  }

 private:
  bool log_ = false;
};

// LayerNormalization over dims [axis, rank): x̂ = (x - μ) σ⁻¹, y = x̂ scale + B. Statistics are
// recomputed from the saved X (cheaper than keeping the optional outputs).
class LayerNormOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    const Tensor &x = in_[0], &scale = in_[1], &g = gy[0];
    const Shape& s = x.shape();
    const int64_t axis = normalize_axis(node_.attr_int("axis", -1), static_cast<int64_t>(s.size()), node_.describe() + " axis");
    const float eps = node_.attr_float("epsilon", 1e-5f);
    const int64_t rows = prod(s, 0, axis), len = prod(s, axis, s.size());
    const Shape norm_shape(s.begin() + axis, s.end());
    const Tensor sc = expand_to(scale, norm_shape);
    const float *px = x.data<float>(), *pg = g.data<float>(), *ps = sc.data<float>();
    Tensor dx = empty_f32(s);
    float* pd = dx.data<float>();
    const bool want_x = needed(0), want_p = needed(1) || needed(2);
    // Rows split over threads; each thread sums its own dscale/dbias (float rows: len is a
    // feature width, short enough for float sums; the row statistics use double).
    const int threads = rows * len > (1 << 15) ? omp_get_max_threads() : 1;
    std::vector<float> part(static_cast<size_t>(threads) * 2 * len, 0.f);
#pragma omp parallel num_threads(threads)
    {
      const int t = omp_get_thread_num(), nt = omp_get_num_threads();
      float* dsc = part.data() + static_cast<size_t>(t) * 2 * len;
      float* dbs = dsc + len;
      std::vector<float> xhat(len);
      for (int64_t rr = rows * t / nt; rr < rows * (t + 1) / nt; ++rr) {
        const float* xr = px + rr * len;
        const float* gr = pg + rr * len;
        double mean = 0, var = 0;
        for (int64_t k = 0; k < len; ++k) mean += xr[k];
        mean /= len;
        for (int64_t k = 0; k < len; ++k) var += (xr[k] - mean) * (xr[k] - mean);
        var /= len;
        const float inv = static_cast<float>(1.0 / std::sqrt(var + eps));
        const float mu = static_cast<float>(mean);
        float m1 = 0, m2 = 0;  // sums of dx̂ and dx̂·x̂, dx̂ = g·scale
#pragma omp simd reduction(+ : m1, m2)
        for (int64_t k = 0; k < len; ++k) {
          const float xh = (xr[k] - mu) * inv;
          xhat[k] = xh;
          const float dxh = gr[k] * ps[k];
          m1 += dxh;
          m2 += dxh * xh;
        }
        if (want_p)
#pragma omp simd
          for (int64_t k = 0; k < len; ++k) {
            dsc[k] += gr[k] * xhat[k];
            dbs[k] += gr[k];
          }
        if (!want_x) continue;
        m1 /= static_cast<float>(len);
        m2 /= static_cast<float>(len);
        float* dr = pd + rr * len;
#pragma omp simd
        for (int64_t k = 0; k < len; ++k) dr[k] = inv * (gr[k] * ps[k] - m1 - xhat[k] * m2);
      }
    }
    std::vector<double> dscale(len, 0.0), dbias(len, 0.0);
    for (int t = 0; t < threads; ++t)
      for (int64_t k = 0; k < len; ++k) {
        dscale[k] += part[static_cast<size_t>(t) * 2 * len + k];
        dbias[k] += part[static_cast<size_t>(t) * 2 * len + len + k];
      }
    if (want_x) r[0] = dx;
    auto to_tensor = [&](const std::vector<double>& v, const Shape& target) {
      Tensor t(DType::kFloat32, norm_shape);
      float* p = t.data<float>();
      for (int64_t k = 0; k < len; ++k) p[k] = static_cast<float>(v[k]);
      return reduce_to_shape(t, target);
    };
    if (needed(1)) r[1] = to_tensor(dscale, scale.shape());
    if (needed(2)) r[2] = to_tensor(dbias, in_[2].shape());
    return r;
  }
};

// BatchNormalization kept unfolded: the inference form y = (x - mean) / sqrt(var + eps) * scale + B
// with the running statistics frozen; gradients for X, scale and B.
class BatchNormOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    const Tensor& x = in_[0];
    const Shape& s = x.shape();
    const int64_t n = s[0], c = s.size() > 1 ? s[1] : 1, hw = prod(s, 2, s.size());
    const float eps = node_.attr_float("epsilon", 1e-5f);
    const std::vector<float> scale = in_[1].to_float_vector(), mean = in_[3].to_float_vector(),
                             var = in_[4].to_float_vector();
    const float *px = x.data<float>(), *pg = gy[0].data<float>();
    Tensor dx(DType::kFloat32, s), ds(DType::kFloat32, in_[1].shape()), db(DType::kFloat32, in_[2].shape());
    float *pd = dx.data<float>(), *pds = ds.data<float>(), *pdb = db.data<float>();
    for (int64_t ch = 0; ch < c; ++ch) {
      const float inv = 1.f / std::sqrt(var[ch] + eps);
      double sdx = 0, sdb = 0;
      for (int64_t b = 0; b < n; ++b) {
        const int64_t off = (b * c + ch) * hw;
        for (int64_t k = 0; k < hw; ++k) {
          pd[off + k] = pg[off + k] * scale[ch] * inv;
          sdx += static_cast<double>(pg[off + k]) * (px[off + k] - mean[ch]) * inv;
          sdb += pg[off + k];
        }
      }
      pds[ch] = static_cast<float>(sdx);
      pdb[ch] = static_cast<float>(sdb);
    }
    if (needed(0)) r[0] = dx;
    if (needed(1)) r[1] = ds;
    if (needed(2)) r[2] = db;
    return r;
  }
};

// Window geometry padded to three spatial dims (leading dims of size 1).
struct Geo3 {
  int64_t in[3], out[3], k[3], s[3], d[3], pb[3], pe_explicit[3];
};

class PoolOp final : public KernelOp {
 public:
  PoolOp(const ir::Node& n, const ir::Graph& g) : KernelOp(n, g), window_(dk::WindowAttrs::parse(n)) {
    max_ = n.op_type == "MaxPool";
  }

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const Tensor& x = in_[0];
    const Shape& xs = x.shape();
    SQ_CHECK(xs.size() >= 3 && xs.size() <= 5, ErrorKind::kUnsupported,
             node_.describe() + ": training supports 1-D to 3-D pooling, got X " + shape_str(xs));
    const size_t sp = xs.size() - 2;
    dk::WindowAttrs a = window_.resolved(node_, sp);
    const dk::WindowGeometry geo =
        dk::forward_geometry(node_, a, Shape(xs.begin() + 2, xs.end()), node_.attr_int("ceil_mode", 0) != 0);
    Geo3 g{};
    for (int i = 0; i < 3; ++i) {
      const int j = i - (3 - static_cast<int>(sp));
      const bool real = j >= 0;
      g.in[i] = real ? xs[2 + j] : 1;
      g.out[i] = real ? geo.out[j] : 1;
      g.k[i] = real ? geo.kernel[j] : 1;
      g.s[i] = real ? geo.strides[j] : 1;
      g.d[i] = real ? geo.dilations[j] + 1 : 1;
      g.pb[i] = real ? geo.pad_begin[j] : 0;
      g.pe_explicit[i] = real ? geo.explicit_pad_end[j] : 0;
    }
    const int64_t planes = xs[0] * xs[1];
    const int64_t in_plane = g.in[0] * g.in[1] * g.in[2], out_plane = g.out[0] * g.out[1] * g.out[2];
    Tensor dx(DType::kFloat32, xs);
    const float *px = x.data<float>(), *pg = gy[0].data<float>();
    float* pd = dx.data<float>();
    const bool include_pad = node_.attr_int("count_include_pad", 0) != 0;
#pragma omp parallel for if (planes * in_plane > (1 << 15))
    for (int64_t p = 0; p < planes; ++p) {
      const float* xp = px + p * in_plane;
      float* dp = pd + p * in_plane;
      const float* gp = pg + p * out_plane;
      for (int64_t o0 = 0; o0 < g.out[0]; ++o0)
        for (int64_t o1 = 0; o1 < g.out[1]; ++o1)
          for (int64_t o2 = 0; o2 < g.out[2]; ++o2) {
            const float gv = gp[(o0 * g.out[1] + o1) * g.out[2] + o2];
            const int64_t st[3] = {o0 * g.s[0] - g.pb[0], o1 * g.s[1] - g.pb[1], o2 * g.s[2] - g.pb[2]};
            if (max_) {
              int64_t best = -1;
              float bv = -std::numeric_limits<float>::infinity();
              for (int64_t k0 = 0; k0 < g.k[0]; ++k0) {
                const int64_t i0 = st[0] + k0 * g.d[0];
                if (i0 < 0 || i0 >= g.in[0]) continue;
                for (int64_t k1 = 0; k1 < g.k[1]; ++k1) {
                  const int64_t i1 = st[1] + k1 * g.d[1];
                  if (i1 < 0 || i1 >= g.in[1]) continue;
                  for (int64_t k2 = 0; k2 < g.k[2]; ++k2) {
                    const int64_t i2 = st[2] + k2 * g.d[2];
                    if (i2 < 0 || i2 >= g.in[2]) continue;
                    const int64_t q = (i0 * g.in[1] + i1) * g.in[2] + i2;
                    if (best < 0 || xp[q] > bv) {
                      best = q;
                      bv = xp[q];
                    }
                  }
                }
              }
              if (best >= 0) dp[best] += gv;
            } else {
              // Divisor as the forward: the window clipped to the input (plus explicit pads when
              // count_include_pad), never the ceil_mode overhang.
              int64_t lo[3], hi[3], count = 1;
              for (int i = 0; i < 3; ++i) {
                lo[i] = std::max<int64_t>(st[i], 0);
                hi[i] = std::min<int64_t>(st[i] + g.k[i], g.in[i]);
                const int64_t c = include_pad ? std::min(st[i] + g.k[i], g.in[i] + g.pe_explicit[i]) - st[i]
                                              : hi[i] - lo[i];
                count *= c;
              }
              if (count <= 0) continue;
              const float v = gv / static_cast<float>(count);
              for (int64_t i0 = lo[0]; i0 < hi[0]; ++i0)
                for (int64_t i1 = lo[1]; i1 < hi[1]; ++i1)
                  for (int64_t i2 = lo[2]; i2 < hi[2]; ++i2) dp[(i0 * g.in[1] + i1) * g.in[2] + i2] += v;
            }
          }
    }
    r[0] = dx;
    return r;
  }

 private:
  dk::WindowAttrs window_;
  bool max_ = false;
};

// GlobalAveragePool: each input gets g / (spatial size); GlobalMaxPool: the first maximum gets g.
class GlobalPoolOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const Tensor& x = in_[0];
    const Shape& xs = x.shape();
    const int64_t planes = xs[0] * xs[1], hw = prod(xs, 2, xs.size());
    Tensor dx(DType::kFloat32, xs);
    const float *px = x.data<float>(), *pg = gy[0].data<float>();
    float* pd = dx.data<float>();
    const bool avg = node_.op_type == "GlobalAveragePool";
    for (int64_t p = 0; p < planes; ++p) {
      if (avg) {
        const float v = pg[p] / static_cast<float>(hw);
        for (int64_t k = 0; k < hw; ++k) pd[p * hw + k] = v;
      } else {
        const float* xp = px + p * hw;
        pd[p * hw + (std::max_element(xp, xp + hw) - xp)] = pg[p];
      }
    }
    r[0] = dx;
    return r;
  }
};

// ReduceMean / ReduceSum: the output gradient broadcast back over the reduced dims (÷ count for mean).
class ReduceOp final : public KernelOp {
 public:
  using KernelOp::KernelOp;

 protected:
  std::vector<Tensor> grad(const std::vector<Tensor>& gy) override {
    std::vector<Tensor> r = none();
    if (!needed(0)) return r;
    const Shape& xs = in_[0].shape();
    const int64_t rank = static_cast<int64_t>(xs.size());
    const bool axes_input = opset_ >= (node_.op_type == "ReduceSum" ? 13 : 18);
    std::vector<int64_t> axes = axes_input ? (in_.size() > 1 && in_[1].defined() ? in_[1].to_int64_vector()
                                                                                 : std::vector<int64_t>{})
                                           : node_.attr_ints("axes");
    if (axes.empty() && node_.attr_int("noop_with_empty_axes", 0) != 0) {
      r[0] = gy[0];
      return r;
    }
    std::vector<bool> reduced(rank, axes.empty());
    for (int64_t a : axes) reduced[normalize_axis(a, rank, node_.describe() + " axes")] = true;
    Shape kept = xs;  // the output shape with keepdims
    int64_t count = 1;
    for (int64_t i = 0; i < rank; ++i)
      if (reduced[i]) {
        count *= xs[i];
        kept[i] = 1;
      }
    Tensor dx = expand_to(gy[0].reshaped(kept), xs);
    if (dx.storage() == gy[0].storage()) dx = dx.clone();
    if (node_.op_type == "ReduceMean" && count > 0) {
      const float inv = 1.f / static_cast<float>(count);
      for (float& v : dx.values<float>()) v *= inv;
    }
    r[0] = dx;
    return r;
  }
};

}  // namespace

void add_norm_pool_ops(std::map<std::string, OpMaker>& t) {
  t["Softmax"] = &make<SoftmaxOp>;
  t["LogSoftmax"] = &make<SoftmaxOp>;
  t["LayerNormalization"] = &make<LayerNormOp>;
  t["BatchNormalization"] = &make<BatchNormOp>;
  t["MaxPool"] = &make<PoolOp>;
  t["AveragePool"] = &make<PoolOp>;
  t["GlobalAveragePool"] = &make<GlobalPoolOp>;
  t["GlobalMaxPool"] = &make<GlobalPoolOp>;
  t["ReduceMean"] = &make<ReduceOp>;
  t["ReduceSum"] = &make<ReduceOp>;
}

}  // namespace slimquant::train::detail
