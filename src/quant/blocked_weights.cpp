// 4-bit blocked weights: round to nearest and GPTQ (include/slimquant/quant/blocked_weights.h).
//
// Both work on the weight as rows = output features, columns = input features (the reduction
// axis), in double. GPTQ follows the paper's Algorithm 1: H = 2 X^T X, dampened by damp * mean
// diag(H) (dead inputs, diag 0, get 1 and their weights 0); U = the upper Cholesky factor of H^-1;
// column j is rounded, its error e = (w - q) / U[j][j] updates the columns after it in its column
// block at once (w -= e U[j][.]) and the later blocks lazily, after the column block. A block's
// scale is taken from the updated weights when its first column is reached. Column blocks are a
// multiple of the quantization block, so no quantization block waits on a lazy update.
// The Cholesky factorisations and the inverse are LAPACK's (K x K with K the layer's input
// features: 4096-wide layers take seconds there, minutes in plain loops).
#include "slimquant/quant/blocked_weights.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <string>

#include "slimquant/core/error.h"

namespace slimquant::quant {
namespace {

struct RowsView {
  int64_t n = 0, k = 0;      // rows (output features), columns (input features)
  std::vector<double> w;     // n x k
};

RowsView to_rows(const Tensor& weight, int64_t axis) {
  SQ_CHECK(weight.dtype() == DType::kFloat32 && weight.rank() == 2, ErrorKind::kInvalidArgument,
           "blocked weights: the weight must be a 2-D float32 tensor, got " + std::string(dtype_name(weight.dtype())) +
               " " + shape_str(weight.shape()));
  SQ_CHECK(axis == 0 || axis == 1, ErrorKind::kInvalidArgument,
           "blocked weights: the reduction axis must be 0 or 1, got " + std::to_string(axis));
  RowsView r;
  const float* p = weight.data<float>();
  r.k = weight.dim(axis);
  r.n = weight.dim(1 - axis);
  r.w.resize(static_cast<size_t>(r.n * r.k));
  for (int64_t i = 0; i < r.n; ++i)
    for (int64_t j = 0; j < r.k; ++j)
      r.w[static_cast<size_t>(i * r.k + j)] = axis == 1 ? p[i * r.k + j] : p[j * r.n + i];
  return r;
}

// codes (n x k) and scales (n x kb), row-major by output feature, in the weight's own layout.
BlockedWeights from_rows(const std::vector<int8_t>& codes, const std::vector<float>& scales, int64_t n, int64_t k,
                         int64_t kb, int64_t axis) {
  BlockedWeights out;
  out.codes = axis == 1 ? Tensor(DType::kInt8, {n, k}) : Tensor(DType::kInt8, {k, n});
  out.scales = axis == 1 ? Tensor(DType::kFloat32, {n, kb}) : Tensor(DType::kFloat32, {kb, n});
  auto* c = out.codes.data<int8_t>();
  auto* s = out.scales.data<float>();
  for (int64_t i = 0; i < n; ++i) {
    for (int64_t j = 0; j < k; ++j) (axis == 1 ? c[i * k + j] : c[j * n + i]) = codes[static_cast<size_t>(i * k + j)];
    for (int64_t b = 0; b < kb; ++b) (axis == 1 ? s[i * kb + b] : s[b * n + i]) = scales[static_cast<size_t>(i * kb + b)];
  }
  return out;
}

float block_scale(const double* w, int64_t count) {
  double m = 0;
  for (int64_t i = 0; i < count; ++i) m = std::max(m, std::abs(w[i]));
  const auto s = static_cast<float>(m / kBlockedWeightMaxCode);
  return s > 0.f && std::isfinite(s) ? s : 1.f;
}

int8_t round_to_grid(double w, float s) {
  const double q = std::nearbyint(w / static_cast<double>(s));
  return static_cast<int8_t>(std::clamp(q, double{kBlockedWeightMinCode}, double{kBlockedWeightMaxCode}));
}

// LAPACK (Debian's liblapack-dev; OpenBLAS's optimised build where libopenblas0 is installed).
extern "C" {
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info);
}

// The upper Cholesky factor U of H^-1 (H^-1 = U^T U), row-major, or false when H is not positive
// definite. H is symmetric, so its row-major array is its column-major one too: LAPACK factors
// H = L L^T ('L'), forms H^-1 from L, and factors H^-1 = U^T U ('U'), all column-major.
bool upper_cholesky_of_inverse(const std::vector<double>& h, int64_t n, std::vector<double>& u) {
  SQ_CHECK(n > 0 && n <= INT32_MAX / n, ErrorKind::kUnsupported, "GPTQ: " + std::to_string(n) + " input features");
  const int order = static_cast<int>(n);
  int info = 0;
  std::vector<double> a = h;
  dpotrf_("L", &order, a.data(), &order, &info);
  if (info != 0) return false;
  dpotri_("L", &order, a.data(), &order, &info);  // the lower triangle of H^-1
  if (info != 0) return false;
  auto at = [&](int64_t i, int64_t j) -> double& { return a[static_cast<size_t>(i + j * n)]; };  // column-major
  for (int64_t j = 0; j < n; ++j)
    for (int64_t i = 0; i < j; ++i) at(i, j) = at(j, i);
  dpotrf_("U", &order, a.data(), &order, &info);
  if (info != 0) return false;
  u.assign(static_cast<size_t>(n * n), 0.0);
  for (int64_t i = 0; i < n; ++i)
    for (int64_t j = i; j < n; ++j) u[static_cast<size_t>(i * n + j)] = at(i, j);
  return true;
}

}  // namespace

void check_block_size(int64_t block_size) {
  SQ_CHECK(block_size == 32 || block_size == 64 || block_size == 128, ErrorKind::kInvalidArgument,
           "block_size must be 32, 64 or 128 (got " + std::to_string(block_size) + ")");
}

BlockedWeights quantize_blocked_rtn(const Tensor& weight, int64_t axis, int64_t block_size) {
  SQ_CHECK(block_size > 0, ErrorKind::kInvalidArgument, "block_size must be positive");
  const RowsView r = to_rows(weight, axis);
  const int64_t kb = (r.k + block_size - 1) / block_size;
  std::vector<int8_t> codes(r.w.size());
  std::vector<float> scales(static_cast<size_t>(r.n * kb));
  for (int64_t i = 0; i < r.n; ++i)
    for (int64_t b = 0; b < kb; ++b) {
      const int64_t j0 = b * block_size, j1 = std::min(r.k, j0 + block_size);
      const double* w = r.w.data() + i * r.k;
      const float s = block_scale(w + j0, j1 - j0);
      scales[static_cast<size_t>(i * kb + b)] = s;
      for (int64_t j = j0; j < j1; ++j) codes[static_cast<size_t>(i * r.k + j)] = round_to_grid(w[j], s);
    }
  return from_rows(codes, scales, r.n, r.k, kb, axis);
}

BlockedWeights quantize_blocked_gptq(const Tensor& weight, int64_t axis, int64_t block_size,
                                     const std::vector<double>& gram, const GptqOptions& options) {
  SQ_CHECK(block_size > 0, ErrorKind::kInvalidArgument, "block_size must be positive");
  RowsView r = to_rows(weight, axis);
  const int64_t n = r.n, k = r.k, kb = (k + block_size - 1) / block_size;
  SQ_CHECK(gram.size() == static_cast<size_t>(k * k), ErrorKind::kInvalidArgument,
           "GPTQ: X^T X has " + std::to_string(gram.size()) + " values, the weight's " + std::to_string(k) +
               " input features need " + std::to_string(k * k));
  std::vector<double> h(gram.size());
  for (size_t i = 0; i < gram.size(); ++i) h[i] = 2.0 * gram[i];
  double mean_diag = 0;
  for (int64_t j = 0; j < k; ++j) {
    double& d = h[static_cast<size_t>(j * k + j)];
    if (d == 0) {  // an input that was always 0: its weights cannot matter
      d = 1;
      for (int64_t i = 0; i < n; ++i) r.w[static_cast<size_t>(i * k + j)] = 0;
    }
    mean_diag += d / static_cast<double>(k);
  }
  std::vector<double> u;
  double damp = options.damp;
  for (int attempt = 0;; ++attempt) {
    std::vector<double> damped = h;
    for (int64_t j = 0; j < k; ++j) damped[static_cast<size_t>(j * k + j)] += damp * mean_diag;
    if (upper_cholesky_of_inverse(damped, k, u)) break;
    SQ_CHECK(attempt < 6, ErrorKind::kInvalidData,
             "GPTQ: the layer's input Hessian is not positive definite even with damping " + std::to_string(damp));
    damp *= 10;
  }
  const int64_t cb = std::max<int64_t>(1, (options.column_block + block_size - 1) / block_size) * block_size;
  std::vector<int8_t> codes(r.w.size());
  std::vector<float> scales(static_cast<size_t>(n * kb));
  std::vector<double> err(static_cast<size_t>(n * cb));
  for (int64_t i1 = 0; i1 < k; i1 += cb) {
    const int64_t i2 = std::min(k, i1 + cb);
    for (int64_t j = i1; j < i2; ++j) {
      if (j % block_size == 0)
        for (int64_t i = 0; i < n; ++i)
          scales[static_cast<size_t>(i * kb + j / block_size)] =
              block_scale(r.w.data() + i * k + j, std::min(block_size, k - j));
      const double* uj = u.data() + j * k;
      for (int64_t i = 0; i < n; ++i) {
        double* w = r.w.data() + i * k;
        const float s = scales[static_cast<size_t>(i * kb + j / block_size)];
        const int8_t q = round_to_grid(w[j], s);
        codes[static_cast<size_t>(i * k + j)] = q;
        const double e = (w[j] - static_cast<double>(q) * s) / uj[j];
        for (int64_t t = j + 1; t < i2; ++t) w[t] -= e * uj[t];
        err[static_cast<size_t>(i * cb + (j - i1))] = e;
      }
    }
    for (int64_t i = 0; i < n; ++i) {  // the lazy update of the later columns
      double* w = r.w.data() + i * k;
      for (int64_t j = i1; j < i2; ++j) {
        const double e = err[static_cast<size_t>(i * cb + (j - i1))];
        const double* uj = u.data() + j * k;
        for (int64_t t = i2; t < k; ++t) w[t] -= e * uj[t];
      }
    }
  }
  return from_rows(codes, scales, n, k, kb, axis);
}

Tensor dequantize_blocked_weights(const BlockedWeights& q, int64_t axis, int64_t block_size) {
  Tensor out(DType::kFloat32, q.codes.shape());
  const int64_t d0 = q.codes.dim(0), d1 = q.codes.dim(1), sd1 = q.scales.dim(1);
  const auto* c = q.codes.data<int8_t>();
  const auto* s = q.scales.data<float>();
  float* y = out.data<float>();
  for (int64_t i = 0; i < d0; ++i)
    for (int64_t j = 0; j < d1; ++j)
      y[i * d1 + j] = static_cast<float>(c[i * d1 + j]) *
                      (axis == 0 ? s[(i / block_size) * sd1 + j] : s[i * sd1 + j / block_size]);
  return out;
}

void accumulate_gram(const float* x, int64_t rows, int64_t k, std::vector<double>& gram) {
  SQ_CHECK(gram.size() == static_cast<size_t>(k * k), ErrorKind::kInternal, "accumulate_gram: wrong size");
  for (int64_t r = 0; r < rows; ++r) {
    const float* xr = x + r * k;
    for (int64_t a = 0; a < k; ++a) {
      const double xa = xr[a];
      if (xa == 0) continue;
      double* g = gram.data() + a * k;
      for (int64_t b = 0; b < k; ++b) g[b] += xa * xr[b];
    }
  }
}

}  // namespace slimquant::quant
