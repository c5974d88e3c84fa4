// Histogram-of-|x| observers: hist (percentile) and KL (TensorRT-style entropy calibration).
#include <algorithm>
#include <cmath>
#include <limits>

#include "quant/observers/observer_internal.h"

namespace slimquant::quant::detail {

namespace {

// The internal |x| histogram has kFineFactor * bins bins over [0, R) with R the power of two
// above max|x| (so R < 2 max|x|): at least twice the requested resolution over [0, max|x|].
constexpr int64_t kFineFactor = 4;

class AbsHistogramObserver : public Observer {
 public:
  explicit AbsHistogramObserver(const ObserverOptions& o)
      : Observer(/*accumulate=*/true), options_(o),
        hist_(Pow2Histogram::Kind::kAbs, kFineFactor * o.bins) {}

 protected:
  void on_observe(const Tensor&, const float* data, int64_t n, const BatchStats& b) override {
    if (shared_ == nullptr) hist_.add(data, n, b.abs_max);
  }
  void save_algo_state(std::ostream& out) const override { hist_.save(out); }
  void load_algo_state(std::istream& in) override { hist_.load(in); }
  void merge_algo_state(std::istream& in) override {
    Pow2Histogram later(hist_);
    later.load(in);
    hist_.merge_from(later);
  }

  ObserverOptions options_;
  Pow2Histogram hist_;
  const Pow2Histogram* shared_ = nullptr;  // share_histogram_of()

 public:
  // Reads `owner`'s histogram instead of filling its own (owner: a histogram observer with the same
  // options that observes the same tensors; "auto" keeps one |x| histogram for KL and hist).
  void share_histogram_of(const AbsHistogramObserver& owner) { shared_ = &owner.hist_; }
  const Pow2Histogram& histogram() const { return shared_ ? *shared_ : hist_; }
};

// Threshold below which a fraction hist_percent of all |x| lie, interpolated linearly inside the
// bin where the cumulative count crosses it (values are taken as uniform within a bin).
class HistObserver final : public AbsHistogramObserver {
 public:
  using AbsHistogramObserver::AbsHistogramObserver;
  std::string name() const override { return "hist"; }

 protected:
  ClipRange clip_range(QuantScheme) const override { return clip_to_observed(threshold()); }

 private:
  double threshold() const {
    const double abs_max = observed_abs_max();
    const Pow2Histogram& hist = histogram();
    if (!hist.has_range() || options_.hist_percent >= 1.0f) return abs_max;
    const double target = static_cast<double>(options_.hist_percent) *
                          static_cast<double>(observed_count());
    const auto counts = hist.counts();
    const double w = hist.bin_width();
    double cum = 0.0;
    for (int64_t j = 0; j < hist.bins(); ++j) {
      // Exact zeros belong to the first bin [0, w).
      const double c = static_cast<double>(counts[j] + (j == 0 ? hist.zeros() : 0));
      if (c > 0.0 && cum + c >= target) {
        const double t = hist.bin_lo(j) + std::clamp((target - cum) / c, 0.0, 1.0) * w;
        return std::min(t, abs_max);
      }
      cum += c;
    }
    return abs_max;
  }
};

// Re-bins the fine |x| histogram of the non-zero values onto `bins` equal bins over
// [0, abs_max], splitting each fine bin's count over the target bins it overlaps in proportion
// (uniform within a fine bin). The fine bin holding abs_max only has mass up to abs_max, so its
// overlap is cut there.
std::vector<double> rebin_to_max(const Pow2Histogram& h, double abs_max, int64_t bins) {
  std::vector<double> out(static_cast<size_t>(bins), 0.0);
  const auto counts = h.counts();
  const double to_target = static_cast<double>(bins) / abs_max;
  const double fine_w = h.bin_width() * to_target;  // fine bin width in target-bin units
  const double end = static_cast<double>(bins);
  for (int64_t j = 0; j < h.bins(); ++j) {
    const double c = static_cast<double>(counts[j]);
    if (c == 0.0) continue;
    const double u0 = h.bin_lo(j) * to_target;
    const double u1 = std::min(u0 + fine_w, end);
    if (u1 <= u0) {  // only reachable through rounding at abs_max
      out[bins - 1] += c;
      continue;
    }
    const double density = c / (u1 - u0);
    const int64_t k0 = static_cast<int64_t>(u0);
    const int64_t k1 = std::min(static_cast<int64_t>(std::ceil(u1)), bins);
    for (int64_t k = k0; k < k1; ++k) {
      const double overlap = std::min(static_cast<double>(k + 1), u1) -
                             std::max(static_cast<double>(k), u0);
      if (overlap > 0.0) out[k] += density * overlap;
    }
  }
  return out;
}

// TensorRT entropy calibration on `hist` (bins over [0, abs_max]). For each candidate i in
// [levels, bins]: P = hist[0:i] with the outliers sum(hist[i:]) folded into P[i-1]; Q = hist[0:i]
// (without outliers) merged into `levels` groups of i / levels bins (the last group takes the
// remainder), each group's total spread evenly over the bins where P is non-zero; minimise
// KL(P || Q) with P and Q normalised. A candidate where Q is 0 on a bin where P is not (outliers
// folded into an empty tail) has infinite divergence and is skipped. Threshold (i + 0.5) * width,
// capped at abs_max.
//
// With P_j, Q_j the group sums and n_j the non-zero count, KL = sum_b p_b log p_b -
// sum_j (P_j / S) log(Q_j / (n_j Q_total)), S = sum P, so prefix sums of hist, hist*log(hist) and
// of the non-zero indicator make each candidate O(levels) instead of O(i).
double kl_threshold(const std::vector<double>& hist, double abs_max, int64_t levels) {
  const int64_t bins = static_cast<int64_t>(hist.size());
  std::vector<double> sum(bins + 1, 0.0), xlogx(bins + 1, 0.0);
  std::vector<int64_t> nonzero(bins + 1, 0);
  for (int64_t b = 0; b < bins; ++b) {
    const double h = hist[b];
    sum[b + 1] = sum[b] + h;
    xlogx[b + 1] = xlogx[b] + (h > 0.0 ? h * std::log(h) : 0.0);
    nonzero[b + 1] = nonzero[b] + (h > 0.0 ? 1 : 0);
  }
  const double total = sum[bins];
  if (total <= 0.0) return abs_max;

  double best_kl = std::numeric_limits<double>::infinity();
  int64_t best_i = bins;
  for (int64_t i = levels; i <= bins; ++i) {
    const double outliers = total - sum[i];
    const double q_total = sum[i];
    if (q_total <= 0.0) continue;
    const double p_last = hist[i - 1] + outliers;
    double plogp = xlogx[i - 1] + (p_last > 0.0 ? p_last * std::log(p_last) : 0.0);
    double cross = 0.0;  // sum_j P_j log(Q_j / (n_j q_total))
    bool finite = true;
    const int64_t stride = i / levels;
    for (int64_t j = 0; j < levels; ++j) {
      const int64_t b0 = j * stride;
      const int64_t b1 = j == levels - 1 ? i : b0 + stride;
      const double q_sum = sum[b1] - sum[b0];
      double p_sum = q_sum;
      int64_t nz = nonzero[b1] - nonzero[b0];
      if (j == levels - 1 && outliers > 0.0) {
        p_sum += outliers;
        if (hist[i - 1] <= 0.0) ++nz;  // the folded bin became non-zero in P
      }
      if (p_sum <= 0.0) continue;
      if (q_sum <= 0.0) {
        finite = false;
        break;
      }
      cross += p_sum * std::log(q_sum / (static_cast<double>(nz) * q_total));
    }
    if (!finite) continue;
    const double kl = (plogp - cross) / total - std::log(total);
    if (kl < best_kl) {
      best_kl = kl;
      best_i = i;
    }
  }
  const double width = abs_max / static_cast<double>(bins);
  return std::min((static_cast<double>(best_i) + 0.5) * width, abs_max);
}

// Exact zeros are left out of the KL histogram: every scheme quantizes 0 exactly, so they say
// nothing about where to clip, and as a spike in bin 0 they dominate the divergence (level 0 of
// Q spreads the spike over its bins). With them, post-ReLU tensors (about half zeros) get clipped
// absurdly low: a ReLU'd N(0, 1) at 1.24 instead of 4.28 for a max of 4.96 (u8, NumPy reference).
class KlObserver final : public AbsHistogramObserver {
 public:
  using AbsHistogramObserver::AbsHistogramObserver;
  std::string name() const override { return "KL"; }

 protected:
  ClipRange clip_range(QuantScheme scheme) const override {
    const double abs_max = observed_abs_max();
    if (!hist_.has_range() || abs_max <= 0.0) return clip_to_observed(0.0);
    // |x| levels of the scheme: s8 has 128 (0..127) on each side; u8 with non-negative data
    // spends all 256 on [0, T]; asymmetric u8 over signed data has about 128 per side.
    const bool signed_levels = scheme == QuantScheme::kSymmetric ||
                               (scheme == QuantScheme::kAsymmetric && seen_negative());
    const int64_t levels = signed_levels ? 128 : 256;
    const std::vector<double> hist = rebin_to_max(hist_, abs_max, options_.bins);
    return clip_to_observed(kl_threshold(hist, abs_max, levels));
  }
};

}  // namespace

std::unique_ptr<Observer> make_hist_observer(const ObserverOptions& o) {
  return std::make_unique<HistObserver>(o);
}
std::unique_ptr<Observer> make_kl_observer(const ObserverOptions& o) {
  return std::make_unique<KlObserver>(o);
}
std::unique_ptr<Observer> make_hist_observer_sharing(const Observer& kl, const ObserverOptions& o) {
  auto hist = std::make_unique<HistObserver>(o);
  hist->share_histogram_of(dynamic_cast<const AbsHistogramObserver&>(kl));
  return hist;
}

}  // namespace slimquant::quant::detail
