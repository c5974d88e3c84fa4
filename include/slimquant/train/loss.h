#pragma once
// Training losses on logits [N, C] (any rank: the last axis is the class axis). Each returns the
// loss, averaged over the N rows, and its gradient with respect to the logits. Computed in double
// with the max subtracted, so large logits neither overflow nor lose the small probabilities.
#include <cstdint>
#include <vector>

#include "slimquant/core/tensor.h"

namespace slimquant::train {

struct LossResult {
  double loss = 0.0;
  Tensor dlogits;  // same shape as the logits
};

// Softmax cross-entropy with integer labels: L = mean_n (logsumexp(z_n) - z_n[y_n]);
// dL/dz = (softmax(z) - onehot(y)) / N. Labels outside [0, C) are kInvalidArgument.
LossResult softmax_cross_entropy(const Tensor& logits, const std::vector<int64_t>& labels);

// Distillation: KL(p_t || p_s) with p = softmax(z / T), scaled by T^2 (Hinton et al.) so the
// gradient magnitude does not depend on T: L = T^2 mean_n sum_c p_t (log p_t - log p_s);
// dL/dz_s = T (p_s - p_t) / N. Shapes must match; T > 0.
LossResult kl_divergence(const Tensor& student_logits, const Tensor& teacher_logits, float temperature = 1.0f);

}  // namespace slimquant::train
