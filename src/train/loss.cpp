#include "slimquant/train/loss.h"

#include <cmath>
#include <string>

namespace slimquant::train {

namespace {

// Rows x classes view of logits; the class axis is the last one.
std::pair<int64_t, int64_t> rows_classes(const Tensor& logits, const std::string& who) {
  SQ_CHECK(logits.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument,
           who + ": logits must be float32, got " + dtype_name(logits.dtype()));
  SQ_CHECK(logits.rank() >= 1 && logits.numel() > 0, ErrorKind::kInvalidArgument,
           who + ": logits must be a non-empty tensor [N, C], got shape " + shape_str(logits.shape()));
  const int64_t c = logits.shape().back();
  return {logits.numel() / c, c};
}

// log softmax of one row of z / T into out.
void log_softmax(const float* z, int64_t c, double inv_t, std::vector<double>& out) {
  double m = -INFINITY;
  for (int64_t j = 0; j < c; ++j) m = std::max(m, z[j] * inv_t);
  double sum = 0.0;
  for (int64_t j = 0; j < c; ++j) sum += std::exp(z[j] * inv_t - m);
  const double lse = m + std::log(sum);
  out.resize(static_cast<size_t>(c));
  for (int64_t j = 0; j < c; ++j) out[j] = z[j] * inv_t - lse;
}

}  // namespace

LossResult softmax_cross_entropy(const Tensor& logits, const std::vector<int64_t>& labels) {
  const auto [n, c] = rows_classes(logits, "cross-entropy");
  SQ_CHECK(static_cast<int64_t>(labels.size()) == n, ErrorKind::kInvalidArgument,
           "cross-entropy: " + std::to_string(labels.size()) + " labels for " + std::to_string(n) + " rows of logits");
  LossResult r;
  r.dlogits = Tensor(DType::kFloat32, logits.shape());
  const float* z = logits.data<float>();
  float* d = r.dlogits.data<float>();
  std::vector<double> lp;
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    const int64_t y = labels[static_cast<size_t>(i)];
    SQ_CHECK(y >= 0 && y < c, ErrorKind::kInvalidArgument,
             "cross-entropy: label " + std::to_string(y) + " of row " + std::to_string(i) + " is outside [0, " +
                 std::to_string(c) + ")");
    log_softmax(z + i * c, c, 1.0, lp);
    total -= lp[static_cast<size_t>(y)];
    for (int64_t j = 0; j < c; ++j)
      d[i * c + j] = static_cast<float>((std::exp(lp[j]) - (j == y ? 1.0 : 0.0)) / static_cast<double>(n));
  }
  r.loss = total / static_cast<double>(n);
  return r;
}

LossResult kl_divergence(const Tensor& student, const Tensor& teacher, float temperature) {
  const auto [n, c] = rows_classes(student, "KL divergence");
  SQ_CHECK(teacher.dtype() == DType::kFloat32 && teacher.shape() == student.shape(), ErrorKind::kInvalidArgument,
           "KL divergence: teacher logits " + shape_str(teacher.shape()) + " do not match student logits " +
               shape_str(student.shape()));
  SQ_CHECK(temperature > 0.0f && std::isfinite(temperature), ErrorKind::kInvalidArgument,
           "KL divergence: temperature must be positive, got " + std::to_string(temperature));
  const double t = temperature, inv_t = 1.0 / t;
  LossResult r;
  r.dlogits = Tensor(DType::kFloat32, student.shape());
  const float* zs = student.data<float>();
  const float* zt = teacher.data<float>();
  float* d = r.dlogits.data<float>();
  std::vector<double> ls, lt;
  double total = 0.0;
  for (int64_t i = 0; i < n; ++i) {
    log_softmax(zs + i * c, c, inv_t, ls);
    log_softmax(zt + i * c, c, inv_t, lt);
    for (int64_t j = 0; j < c; ++j) {
      const double pt = std::exp(lt[j]);
      if (pt > 0.0) total += pt * (lt[j] - ls[j]);
      d[i * c + j] = static_cast<float>(t * (std::exp(ls[j]) - pt) / static_cast<double>(n));
    }
  }
  r.loss = t * t * total / static_cast<double>(n);
  return r;
}

}  // namespace slimquant::train
