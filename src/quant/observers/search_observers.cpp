// Threshold-search observers over a fine signed histogram: mse and emd.
//
// Both try T = f * max|x| for the fractions of search_fractions() and keep the T whose
// fake-quantized data is closest to the data over everything observed: mse minimises
// mean((x - x_hat)^2); emd minimises |mean(x) - mean(x_hat)| + |std(x) - std(x_hat)| (population
// std), as PaddleSlim's MSE / EMD observers but over all batches instead of the last one.
// x_hat is exactly what QuantizeLinear + DequantizeLinear of the scheme produce.
//
// No sample is kept. The errors are integrals over the histogram with each bin's count spread
// uniformly over the bin: x_hat is constant on every quantization cell
// [(k - 1/2) s, (k + 1/2) s) (the two end cells extend to infinity: saturation), so the moments
// M0 = sum 1, M1 = sum x, M2 = sum x^2 of the data inside each cell, read off prefix sums plus the
// partial bins at the cell edges, give sum (x - k s)^2 = M2 - 2 k s M1 + (k s)^2 M0 exactly under
// that model, in O(levels) per candidate. Exact zeros are counted apart: they are quantized
// exactly by every scheme (0 is always a level) and spreading them over a bin would charge them a
// rounding error they never have. The reference statistics of x for emd come from the same model,
// so an identity quantizer would score exactly 0.
#include <algorithm>
#include <cmath>
#include <limits>

#include "quant/observers/observer_internal.h"

namespace slimquant::quant::detail {

namespace {

struct Moments {
  double m0 = 0.0, m1 = 0.0, m2 = 0.0;
  Moments operator-(const Moments& o) const { return {m0 - o.m0, m1 - o.m1, m2 - o.m2}; }
};

// Cumulative moments of the non-zero values of a signed Pow2Histogram, uniform within bins.
class HistogramMoments {
 public:
  explicit HistogramMoments(const Pow2Histogram& h)
      : lo_(-h.range()), w_(h.bin_width()), bins_(h.bins()) {
    const auto counts = h.counts();
    count_.resize(bins_);
    prefix_.resize(bins_ + 1);
    const double w2_12 = w_ * w_ / 12.0;
    for (int64_t j = 0; j < bins_; ++j) {
      const double c = static_cast<double>(counts[j]);
      const double centre = lo_ + (static_cast<double>(j) + 0.5) * w_;
      count_[j] = c;
      prefix_[j + 1] = {prefix_[j].m0 + c, prefix_[j].m1 + c * centre,
                        prefix_[j].m2 + c * (centre * centre + w2_12)};
    }
  }

  const Moments& total() const { return prefix_[bins_]; }

  // Moments of the values below x.
  Moments below(double x) const {
    const double u = (x - lo_) / w_;
    if (!(u > 0.0)) return {};
    if (u >= static_cast<double>(bins_)) return total();
    const int64_t j = static_cast<int64_t>(u);
    Moments m = prefix_[j];
    const double c = count_[j];
    if (c > 0.0) {
      const double a = lo_ + static_cast<double>(j) * w_;
      const double d = c / w_, len = x - a;
      m.m0 += d * len;
      m.m1 += d * len * (x + a) / 2.0;
      m.m2 += d * len * (x * x + x * a + a * a) / 3.0;
    }
    return m;
  }

 private:
  double lo_, w_;
  int64_t bins_;
  std::vector<double> count_;
  std::vector<Moments> prefix_;
};

enum class SearchLoss { kMse, kEmd };

class SearchObserver final : public Observer {
 public:
  SearchObserver(SearchLoss loss, const ObserverOptions& o)
      : Observer(/*accumulate=*/true), loss_(loss),
        fractions_(search_fractions(o.search_steps, o.search_min_fraction)),
        hist_(Pow2Histogram::Kind::kSigned, o.fine_bins) {}

  std::string name() const override { return loss_ == SearchLoss::kMse ? "mse" : "emd"; }

  // Reads `owner`'s histogram instead of filling its own (owner: a search observer with the same
  // options that observes the same tensors; "auto" keeps one histogram for mse and emd).
  void share_histogram_of(const SearchObserver& owner) { shared_ = &owner.hist_; }

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

  ClipRange clip_range(QuantScheme scheme) const override {
    const double abs_max = observed_abs_max();
    const Pow2Histogram& hist = shared_ ? *shared_ : hist_;
    if (!hist.has_range() || abs_max <= 0.0) return clip_to_observed(0.0);
    const HistogramMoments moments(hist);
    const double n = static_cast<double>(observed_count());
    const Moments& all = moments.total();
    const double mean_x = all.m1 / n;
    const double std_x = std::sqrt(std::max(all.m2 / n - mean_x * mean_x, 0.0));

    double best_loss = std::numeric_limits<double>::infinity();
    double best_t = abs_max;
    // From the largest threshold down, keeping strict improvements: ties go to less clipping.
    for (auto f = fractions_.rbegin(); f != fractions_.rend(); ++f) {
      const double t = *f * abs_max;
      const ClipRange r = clip_to_observed(t);
      const QuantParam g = affine_grid(r.lo, r.hi, scheme);
      const double s = g.scale[0];
      const int32_t kmin = grid_kmin(g), kmax = grid_kmax(g);
      double sq_err = 0.0, sum_q = 0.0, sum_q2 = 0.0;
      Moments prev;
      for (int32_t k = kmin; k <= kmax; ++k) {
        const Moments cur = k == kmax ? all : moments.below((k + 0.5) * s);
        const Moments cell = cur - prev;
        prev = cur;
        if (cell.m0 == 0.0) continue;
        const double v = k * s;
        sq_err += cell.m2 - 2.0 * v * cell.m1 + v * v * cell.m0;
        sum_q += v * cell.m0;
        sum_q2 += v * v * cell.m0;
      }
      double loss;
      if (loss_ == SearchLoss::kMse) {
        loss = sq_err / n;
      } else {
        const double mean_q = sum_q / n;
        const double std_q = std::sqrt(std::max(sum_q2 / n - mean_q * mean_q, 0.0));
        loss = std::abs(mean_x - mean_q) + std::abs(std_x - std_q);
      }
      if (loss < best_loss) {
        best_loss = loss;
        best_t = t;
      }
    }
    return clip_to_observed(best_t);
  }

 private:
  SearchLoss loss_;
  std::vector<double> fractions_;
  Pow2Histogram hist_;
  const Pow2Histogram* shared_ = nullptr;
};

}  // namespace

std::unique_ptr<Observer> make_mse_observer(const ObserverOptions& o) {
  return std::make_unique<SearchObserver>(SearchLoss::kMse, o);
}
std::unique_ptr<Observer> make_emd_observer(const ObserverOptions& o) {
  return std::make_unique<SearchObserver>(SearchLoss::kEmd, o);
}
std::unique_ptr<Observer> make_mse_observer_sharing(const Observer& emd, const ObserverOptions& o) {
  auto mse = std::make_unique<SearchObserver>(SearchLoss::kMse, o);
  mse->share_histogram_of(dynamic_cast<const SearchObserver&>(emd));
  return mse;
}

}  // namespace slimquant::quant::detail
