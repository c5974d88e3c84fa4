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
// by samples instead gives the same value for equal batch sizes and does not depend on how the
// samples are split into batches.
class AvgObserver final : public Observer {
 public:
  AvgObserver() : Observer(/*accumulate=*/true) { per_sample_abs_max_ = true; }
  std::string name() const override { return "avg"; }

 protected:
  void on_observe(const Tensor&, const float*, int64_t, const BatchStats& b) override {
    if (b.sample_abs_max.empty()) {  // rank < 2 or one sample: the whole tensor is the sample
      sum_ += b.abs_max;
      samples_ += 1;
      return;
    }
    for (float m : b.sample_abs_max) sum_ += m;
    samples_ += static_cast<int64_t>(b.sample_abs_max.size());
  }
  ClipRange clip_range(QuantScheme) const override {
    return clip_to_observed(sum_ / static_cast<double>(samples_));
  }
  void save_algo_state(std::ostream& out) const override {
    write_pod(out, sum_);
    write_pod(out, samples_);
  }
  void load_algo_state(std::istream& in) override {
    sum_ = read_pod<double>(in);
    samples_ = read_pod<int64_t>(in);
  }

 private:
  double sum_ = 0.0;
  int64_t samples_ = 0;
};

}  // namespace

std::unique_ptr<Observer> make_abs_max_observer() { return std::make_unique<AbsMaxObserver>(); }
std::unique_ptr<Observer> make_min_max_observer() { return std::make_unique<MinMaxObserver>(); }
std::unique_ptr<Observer> make_avg_observer() { return std::make_unique<AvgObserver>(); }

}  // namespace slimquant::quant::detail
