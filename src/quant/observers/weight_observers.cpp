// Weight observers: abs_max and mse (per tensor), channel_wise_abs_max, mse_channel_wise.
// A weight is a constant observed once and completely, so these describe the last observed tensor
// (observing again replaces it) and need no histogram: the mse observers search on the values.
#include <algorithm>
#include <array>
#include <cmath>
#include <limits>
#include <mutex>
#include <optional>

#include "quant/observers/observer_internal.h"

namespace slimquant::quant::detail {

namespace {

class WeightAbsMaxObserver final : public Observer {
 public:
  explicit WeightAbsMaxObserver(const ObserverOptions& o) : Observer(/*accumulate=*/false, o.weight_bits) {}
  std::string name() const override { return "abs_max"; }

 protected:
  void on_observe(const Tensor&, const float*, int64_t, const BatchStats&) override {}
  ClipRange clip_range(QuantScheme) const override { return clip_to_observed(observed_abs_max()); }
};

// Per-channel extremes along channel_axis; a channel is the slice with a fixed index on that axis:
// data[(o * channels + c) * inner + i] for o < outer, i < inner.
class ChannelWiseObserver : public Observer {
 public:
  explicit ChannelWiseObserver(const ObserverOptions& o)
      : Observer(/*accumulate=*/false, o.weight_bits), requested_axis_(o.channel_axis) {}
  std::string name() const override { return "channel_wise_abs_max"; }

  QuantParam params(QuantScheme scheme) const override {
    check_usable(scheme);
    const std::vector<ClipRange> ranges = channel_ranges(scheme);
    QuantParam p;
    p.axis = axis_;
    p.bits = bits_;
    p.scale.reserve(ranges.size());
    p.zero_point.reserve(ranges.size());
    for (const ClipRange& r : ranges) {
      const QuantParam g = affine_grid(r.lo, r.hi, scheme, bits_);
      p.dtype = g.dtype;
      p.scale.push_back(g.scale[0]);
      p.zero_point.push_back(g.zero_point[0]);
    }
    return p;
  }

 protected:
  void on_observe(const Tensor& x, const float* data, int64_t, const BatchStats&) override {
    axis_ = normalize_axis(requested_axis_, static_cast<int64_t>(x.rank()),
                           "observer " + name() + ": channel_axis for a weight of shape " +
                               shape_str(x.shape()));
    channels_ = x.dim(axis_);
    outer_ = 1;
    for (int64_t d = 0; d < axis_; ++d) outer_ *= x.dim(d);
    inner_ = x.numel() / (outer_ * channels_);
    mins_.assign(channels_, std::numeric_limits<float>::infinity());
    maxs_.assign(channels_, -std::numeric_limits<float>::infinity());
    if (inner_ == 1) {  // e.g. MatMul [K, N] along N: vectorises over the channels of a row
      for (int64_t o = 0; o < outer_; ++o) {
        const float* row = data + o * channels_;
        for (int64_t c = 0; c < channels_; ++c) {
          mins_[c] = row[c] < mins_[c] ? row[c] : mins_[c];
          maxs_[c] = row[c] > maxs_[c] ? row[c] : maxs_[c];
        }
      }
    } else {
      for (int64_t o = 0; o < outer_; ++o) {
        for (int64_t c = 0; c < channels_; ++c) {
          const ScanResult r = scan_min_max(data + (o * channels_ + c) * inner_, inner_);
          mins_[c] = std::min(mins_[c], r.min);
          maxs_[c] = std::max(maxs_[c], r.max);
        }
      }
    }
  }

  // The per-channel clipping ranges for `scheme`; here [min_c, max_c] widened to include 0.
  virtual std::vector<ClipRange> channel_ranges(QuantScheme) const {
    std::vector<ClipRange> r(channels_);
    for (int64_t c = 0; c < channels_; ++c) r[c] = {std::min(mins_[c], 0.0f), std::max(maxs_[c], 0.0f)};
    return r;
  }

  ClipRange clip_range(QuantScheme scheme) const override {
    ClipRange all{0.0f, 0.0f};
    for (const ClipRange& r : channel_ranges(scheme)) {
      all.lo = std::min(all.lo, r.lo);
      all.hi = std::max(all.hi, r.hi);
    }
    return all;
  }

  int64_t requested_axis_;
  int64_t axis_ = 0, outer_ = 1, channels_ = 0, inner_ = 1;
  std::vector<float> mins_, maxs_;
};

// Sum of (x - x_hat)^2 over n values (finite: observers reject NaN / Inf) for the grid g,
// x_hat = clamp(round(x / s), kmin, kmax) * s with round half to even (quant_math, as
// QuantizeLinear). Lanes of float partial sums, flushed to double every block, keep it vectorised
// and accurate.
double squared_error(const float* x, int64_t n, const QuantParam& g) {
  constexpr int64_t kLanes = 16, kBlock = 1024;
  const float s = g.scale[0];
  const float kmin = static_cast<float>(grid_kmin(g)), kmax = static_cast<float>(grid_kmax(g));
  double total = 0.0;
  for (int64_t b = 0; b < n; b += kBlock) {
    const int64_t end = std::min(n, b + kBlock);
    float acc[kLanes] = {};
    int64_t i = b;
    for (; i + kLanes <= end; i += kLanes) {
      for (int64_t l = 0; l < kLanes; ++l) {
        const float v = x[i + l];
        const float k = quant_math::quantize_offset(v, s, kmin, kmax);
        const float d = v - k * s;
        acc[l] += d * d;
      }
    }
    for (int64_t l = 0; i < end; ++i, ++l) {
      const float v = x[i];
      const float k = quant_math::quantize_offset(v, s, kmin, kmax);
      const float d = v - k * s;
      acc[l] += d * d;
    }
    for (float a : acc) total += a;
  }
  return total;
}

// Per channel, the threshold T = f * max|w_c| (f on search_fractions(weight_search_steps,
// weight_search_min_fraction)) whose quantization has the smallest squared error on that
// channel's values; exact, since the whole weight is at hand. Keeps a reference to the observed
// weight (shared storage, no copy): weights are constants. Results are cached per scheme.
class MseChannelWiseObserver final : public ChannelWiseObserver {
 public:
  explicit MseChannelWiseObserver(const ObserverOptions& o)
      : ChannelWiseObserver(o),
        fractions_(search_fractions(o.weight_search_steps, o.weight_search_min_fraction)) {}
  std::string name() const override { return "mse_channel_wise"; }

 protected:
  void on_observe(const Tensor& x, const float* data, int64_t n, const BatchStats& b) override {
    ChannelWiseObserver::on_observe(x, data, n, b);
    weight_ = x;
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& c : cache_) c.reset();
  }

  std::vector<ClipRange> channel_ranges(QuantScheme scheme) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& cached = cache_[static_cast<size_t>(scheme)];
    if (!cached) cached = search(scheme);
    return *cached;
  }

 private:
  std::vector<ClipRange> search(QuantScheme scheme) const {
    std::vector<ClipRange> out(channels_);
    const float* data = weight_.data<float>();
    const int64_t per_channel = outer_ * inner_;
#pragma omp parallel
    {
      std::vector<float> gathered;
#pragma omp for schedule(dynamic)
      for (int64_t c = 0; c < channels_; ++c) {
        const float* values = data + c * inner_;
        if (outer_ > 1) {  // strided channel: copy it once, the search reads it many times
          gathered.resize(per_channel);
          for (int64_t o = 0; o < outer_; ++o) {
            std::copy_n(data + (o * channels_ + c) * inner_, inner_, gathered.data() + o * inner_);
          }
          values = gathered.data();
        }
        const double lo = std::min(mins_[c], 0.0f), hi = std::max(maxs_[c], 0.0f);
        const double abs_max = std::max(-lo, hi);
        double best_err = std::numeric_limits<double>::infinity();
        ClipRange best{static_cast<float>(lo), static_cast<float>(hi)};
        if (abs_max > 0.0) {
          // Largest threshold first, strict improvements: ties keep less clipping.
          for (auto f = fractions_.rbegin(); f != fractions_.rend(); ++f) {
            const double t = *f * abs_max;
            const ClipRange r{static_cast<float>(std::max(-t, lo)),
                              static_cast<float>(std::min(t, hi))};
            const double err = squared_error(values, per_channel, affine_grid(r.lo, r.hi, scheme, bits_));
            if (err < best_err) {
              best_err = err;
              best = r;
            }
          }
        }
        out[c] = best;
      }
    }
    return out;
  }

  std::vector<double> fractions_;
  Tensor weight_;
  mutable std::mutex mutex_;
  mutable std::array<std::optional<std::vector<ClipRange>>, 3> cache_;
};

// Per tensor (seed 003's MSEObserver as a weight observer): the threshold T = f * max|w| (f on
// search_fractions(weight_search_steps, weight_search_min_fraction)) whose quantization has the
// smallest squared error over all the values; the channel-wise search with one channel. Keeps a
// reference to the observed weight; results are cached per scheme.
class MseWeightObserver final : public Observer {
 public:
  explicit MseWeightObserver(const ObserverOptions& o)
      : Observer(/*accumulate=*/false, o.weight_bits),
        fractions_(search_fractions(o.weight_search_steps, o.weight_search_min_fraction)) {}
  std::string name() const override { return "mse"; }

 protected:
  void on_observe(const Tensor& x, const float*, int64_t, const BatchStats&) override {
    weight_ = x;
    std::lock_guard<std::mutex> lock(mutex_);
    for (auto& c : cache_) c.reset();
  }

  ClipRange clip_range(QuantScheme scheme) const override {
    std::lock_guard<std::mutex> lock(mutex_);
    auto& cached = cache_[static_cast<size_t>(scheme)];
    if (!cached) cached = search(scheme);
    return *cached;
  }

 private:
  ClipRange search(QuantScheme scheme) const {
    const double lo = std::min(observed_min(), 0.0f), hi = std::max(observed_max(), 0.0f);
    const double abs_max = std::max(-lo, hi);
    ClipRange best{static_cast<float>(lo), static_cast<float>(hi)};
    if (abs_max == 0.0) return best;
    double best_err = std::numeric_limits<double>::infinity();
    // Largest threshold first, strict improvements: ties keep less clipping.
    for (auto f = fractions_.rbegin(); f != fractions_.rend(); ++f) {
      const double t = *f * abs_max;
      const ClipRange r{static_cast<float>(std::max(-t, lo)), static_cast<float>(std::min(t, hi))};
      const double err = squared_error(weight_.data<float>(), weight_.numel(), affine_grid(r.lo, r.hi, scheme, bits_));
      if (err < best_err) {
        best_err = err;
        best = r;
      }
    }
    return best;
  }

  std::vector<double> fractions_;
  Tensor weight_;
  mutable std::mutex mutex_;
  mutable std::array<std::optional<ClipRange>, 3> cache_;
};

}  // namespace

std::unique_ptr<Observer> make_mse_weight_observer(const ObserverOptions& o) {
  return std::make_unique<MseWeightObserver>(o);
}
std::unique_ptr<Observer> make_weight_abs_max_observer(const ObserverOptions& o) {
  return std::make_unique<WeightAbsMaxObserver>(o);
}
std::unique_ptr<Observer> make_channel_wise_abs_max_observer(const ObserverOptions& o) {
  return std::make_unique<ChannelWiseObserver>(o);
}
std::unique_ptr<Observer> make_mse_channel_wise_observer(const ObserverOptions& o) {
  return std::make_unique<MseChannelWiseObserver>(o);
}

}  // namespace slimquant::quant::detail
