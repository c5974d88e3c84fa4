// Observers that need only running extremes: abs_max (direct), min_max, avg.
#include <algorithm>

#include "quant/observers/observer_internal.h"

namespace slimquant::quant::detail {

namespace {

// Running max |x| (the base class keeps it); non-saturating.
class AbsMaxObserver final : public Observer {
 public:
  AbsMaxObserver() : Observer(/*accumulate=*/true) {}
  std::string name() const override { return "abs_max"; }

 protected:
  void on_observe(const Tensor&, const float*, int64_t, const BatchStats&) override {}
  ClipRange clip_range(QuantScheme) const override { return clip_to_observed(observed_abs_max()); }
};

// Running min and max; the range is [min, max] as observed (params widen it to include 0, and
// the symmetric scheme uses max(|min|, |max|)).
class MinMaxObserver final : public Observer {
 public:
  MinMaxObserver() : Observer(/*accumulate=*/true) {}
  std::string name() const override { return "min_max"; }

 protected:
  void on_observe(const Tensor&, const float*, int64_t, const BatchStats&) override {}
  ClipRange clip_range(QuantScheme) const override {
    return ClipRange{observed_min(), observed_max()};
  }
};

// T = mean over all observed samples of the per-sample max |x|, a sample being one slice along
// axis 0 (the batch axis) of a rank >= 2 tensor, or the whole tensor for rank 0/1. PaddleSlim's
// AVG observer averages per batch the per-sample maxima and then averages the batches; weighting
// by samples instead gives the same value for equal batch sizes (up to the rounding of the sums).
class AvgObserver final : public Observer {
 public:
  AvgObserver() : Observer(/*accumulate=*/true) { per_sample_abs_max_ = true; }
  std::string name() const override { return "avg"; }

 protected:
  void on_observe(const Tensor&, const float*, int64_t, const BatchStats& b) override {
    if (b.sample_abs_max.empty()) {  // rank < 2 or one sample: the whole tensor is the sample
      batch_sums_.push_back(b.abs_max);
      samples_ += 1;
      return;
    }
    double sum = 0.0;
    for (float m : b.sample_abs_max) sum += m;
    batch_sums_.push_back(sum);
    samples_ += static_cast<int64_t>(b.sample_abs_max.size());
  }
  ClipRange clip_range(QuantScheme) const override {
    // Summed in batch order at the end, not into one running sum: a sharded calibration appends
    // the other ranks' batch sums (merge_algo_state) and gets the same double, bit for bit.
    double sum = 0.0;
    for (double s : batch_sums_) sum += s;
    return clip_to_observed(sum / static_cast<double>(samples_));
  }
  void save_algo_state(std::ostream& out) const override {
    write_pod<uint64_t>(out, batch_sums_.size());
    write_vector(out, batch_sums_);
    write_pod(out, samples_);
  }
  void load_algo_state(std::istream& in) override {
    read_vector(in, batch_sums_, read_pod<uint64_t>(in));
    samples_ = read_pod<int64_t>(in);
  }
  void merge_algo_state(std::istream& in) override {
    std::vector<double> later;
    read_vector(in, later, read_pod<uint64_t>(in));
    batch_sums_.insert(batch_sums_.end(), later.begin(), later.end());
    samples_ += read_pod<int64_t>(in);
  }

 private:
  std::vector<double> batch_sums_;  // one per observed batch: one double per batch, never samples
  int64_t samples_ = 0;
};

}  // namespace

std::unique_ptr<Observer> make_abs_max_observer() { return std::make_unique<AbsMaxObserver>(); }
std::unique_ptr<Observer> make_min_max_observer() { return std::make_unique<MinMaxObserver>(); }
std::unique_ptr<Observer> make_avg_observer() { return std::make_unique<AvgObserver>(); }

}  // namespace slimquant::quant::detail
