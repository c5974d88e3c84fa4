#pragma once
// Calibration observers: small objects that watch float32 tensors batch after batch and then give
// quantization parameters. They never keep the samples: activation observers hold running
// statistics or a histogram of fixed size, so memory does not grow with the number of batches.
// Pure objects (no graph, no session); see docs/observers.md for the algorithms.
//
// Typical use (PTQ):
//   auto obs = make_activation_observer("KL");
//   for (batch : calibration set) obs->observe(activation_of(batch));
//   QuantParam p = obs->params(obs->seen_negative() ? QuantScheme::kSymmetric
//                                                    : QuantScheme::kUnsignedZeroPoint0);
#include <algorithm>
#include <cstdint>
#include <iosfwd>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slimquant/core/quant_param.h"
#include "slimquant/core/tensor.h"

namespace slimquant::quant {

namespace detail {
class AutoObserver;
}

// How a clipping range becomes scale / zero point (params_from_range below). Every scheme first
// widens the range to include 0 so that 0 (padding, ReLU) is represented exactly.
enum class QuantScheme {
  kSymmetric,           // s8, zero point 0, scale = T / 127 with T = max(|lo|, |hi|) (T / 63 for
                        // 7-bit weights, see ObserverOptions::weight_bits)
  kUnsignedZeroPoint0,  // u8, zero point 0, scale = hi / 255: for tensors that are never negative
                        // (after ReLU, Sigmoid...), one extra bit of resolution for free
  kAsymmetric,          // u8, scale = (hi - lo) / 255, zero point = round(-lo / scale) in [0, 255]
};
const char* scheme_name(QuantScheme s);  // "symmetric", "unsigned_zp0", "asymmetric"

// Observers give slimquant::QuantParam (core/quant_param.h): dtype kInt8 or kUInt8, axis
// kPerTensor or the (non-negative) channel axis, bits < 8 for a narrower symmetric weight grid.
using slimquant::QuantParam;

// The clipping range an observer chose, in real units (for reports, plots and params).
struct ClipRange {
  float lo = 0.0f;
  float hi = 0.0f;
};

// Smallest scale we ever emit: a degenerate range (all-zero tensor, or a range so small that
// range/255 would underflow) gets this scale instead of 0 so that x / scale stays finite.
inline constexpr float kMinScale = 1e-8f;

// Per-tensor parameters of `range` under `scheme`. kUnsignedZeroPoint0 fails (kInvalidArgument)
// when lo < 0: it cannot represent negative values.
// `bits` < 8 uses fewer levels of the same type: kSymmetric scale = T / (2^(bits-1) - 1).
QuantParam params_from_range(ClipRange range, QuantScheme scheme, int bits = 8);

struct ObserverOptions {
  // hist: the fraction of |x| values kept below the threshold.
  float hist_percent = 0.99999f;
  // hist / KL: histogram resolution over [0, max|x|] (KL runs on exactly this many bins).
  int bins = 2048;
  // mse / emd: bins of the signed histogram over [-R, R) that the errors are computed from.
  int fine_bins = 8192;
  // mse / emd: candidate thresholds T = f * max|x| for f on a geometric grid from
  // search_min_fraction to 1 (search_steps points, see search_fractions()).
  int search_steps = 200;
  float search_min_fraction = 0.01f;
  // mse_channel_wise (weights): the same kind of grid; weights rarely gain from clipping below
  // 0.3 * max and the search runs over every weight value, so the grid is smaller.
  int weight_search_steps = 100;
  float weight_search_min_fraction = 0.3f;
  // Channel-wise weight observers: the output-channel axis (0 for Conv OIHW; the caller passes 1
  // for a MatMul weight [K, N]). Negative counts from the back.
  int64_t channel_axis = 0;
  // Weight observers: bits of the symmetric s8 grid, 2..8 (PaddleSlim's `weight_bits`). 7 keeps
  // |w_q| <= 63, which makes int8 dot products exact on CPUs without VNNI (AVX2's vpmaddubsw
  // saturates on 2 * 255 * 127), so the INT8 runtime can use them there (docs/int8_execution.md).
  int weight_bits = 8;
};

class Observer {
 public:
  virtual ~Observer() = default;
  // Canonical algorithm name ("KL", "hist", "abs_max", "channel_wise_abs_max", ...).
  virtual std::string name() const = 0;

  // Observes one float32 tensor of any shape. Throws kInvalidArgument for other dtypes and
  // kInvalidData for NaN/Inf ("observer KL: tensor contains NaN/Inf"; the observer is left
  // unchanged then). Empty tensors are ignored. Activation observers accumulate over calls;
  // weight observers describe the last tensor. Not virtual: validation and the running extremes
  // live here, algorithms implement on_observe().
  void observe(const Tensor& x);

  // The clipping range under default_scheme(); for channel-wise weight observers the union of
  // the channel ranges. Throws kInvalidData when nothing was observed.
  virtual ClipRange range() const;
  // Quantization parameters under `scheme`. Threshold searches (KL, mse, emd) depend on the
  // scheme's number of levels, so they are run for the scheme asked for.
  virtual QuantParam params(QuantScheme scheme) const;

  bool seen_negative() const { return min_ < 0.0f; }
  // kSymmetric when negatives were seen, else kUnsignedZeroPoint0.
  QuantScheme default_scheme() const {
    return seen_negative() ? QuantScheme::kSymmetric : QuantScheme::kUnsignedZeroPoint0;
  }
  int64_t observed_count() const { return count_; }      // values observed (elements)
  int64_t observed_batches() const { return batches_; }  // non-empty observe() calls
  // Exact extremes of everything observed (for weight observers: of the last tensor).
  float observed_min() const { return min_; }
  float observed_max() const { return max_; }
  float observed_abs_max() const { return std::max(-min_, max_); }

  // The accumulated state in a binary form, for the calibration cache (is_use_cache_file): a
  // calibration can stop after any batch and resume from disk. load_state() accepts only the state
  // of an observer with the same name and options (kInvalidData otherwise, or when truncated).
  void save_state(std::ostream& out) const;
  void load_state(std::istream& in);
  // Adds the saved state of the same observer (name and options) that observed the batches right
  // after this one's, e.g. another rank's share of a sharded calibration: afterwards this observer
  // is exactly the one that observed both runs' batches in order (extremes combine, counts and
  // histograms add, avg's per-batch sums are appended). Activation observers only: weight observers
  // describe one tensor (kInvalidArgument). kInvalidData as load_state().
  void merge_state(std::istream& later);

 protected:
  // accumulate = false: every observe() starts afresh (weight observers).
  explicit Observer(bool accumulate, int bits = 8) : bits_(bits), accumulate_(accumulate) {}

  // Extremes of the batch being observed, already checked finite.
  struct BatchStats {
    float min, max, abs_max;
    // max |x| of each sample (slice along axis 0), when the observer set per_sample_abs_max_ and
    // the tensor has rank >= 2 and more than one sample; empty otherwise.
    std::span<const float> sample_abs_max;
  };
  // Called by observe() after validation, before the running extremes (observed_*) include x.
  virtual void on_observe(const Tensor& x, const float* data, int64_t n,
                          const BatchStats& batch) = 0;
  // Per-tensor clipping range for `scheme`; the default params()/range() build on it.
  virtual ClipRange clip_range(QuantScheme scheme) const = 0;

  // [-T, T] intersected with the observed extremes widened to include 0.
  ClipRange clip_to_observed(double threshold) const;
  // Throws kInvalidData when nothing was observed, kInvalidArgument for kUnsignedZeroPoint0
  // after negatives; messages name the observer.
  void check_usable(QuantScheme scheme) const;
  [[noreturn]] void fail_here(ErrorKind kind, const std::string& rule) const;
  // What an algorithm accumulates beyond the base class's extremes and counts.
  virtual void save_algo_state(std::ostream&) const {}
  virtual void load_algo_state(std::istream&) {}
  // Merges what save_algo_state() wrote for the later batches (merge_state()).
  virtual void merge_algo_state(std::istream&) {}

  int bits_;  // of the grid params() builds (ObserverOptions::weight_bits for weight observers)
  // observe() then scans each sample on its own and hands the per-sample max |x| to on_observe()
  // (BatchStats::sample_abs_max): one pass over the data instead of two.
  bool per_sample_abs_max_ = false;

 private:
  friend class detail::AutoObserver;  // feeds its candidates one scan of each tensor
  // observe() after validation and the scan: the algorithm, then the running statistics.
  void accept(const Tensor& x, const float* data, int64_t n, const BatchStats& batch);

  bool accumulate_;
  std::vector<float> sample_abs_max_;  // observe()'s buffer for BatchStats::sample_abs_max
  float min_ = 0.0f, max_ = 0.0f;  // valid once count_ > 0
  int64_t count_ = 0;
  int64_t batches_ = 0;
};

// Activation observers by name (case-insensitive). Unknown names throw kInvalidArgument listing
// the known ones. T below is the clipping threshold on |x|; the range is [-T, T] cut to the
// observed [min, max] widened to include 0.
//  "abs_max" / "direct": T = running max |x| (no clipping).
//  "min_max": the range is the observed [min, max] itself.
//  "avg": T = mean over all observed samples of the per-sample max |x|; a sample is one slice
//         along axis 0 of a rank >= 2 tensor (the whole tensor for rank 0/1). PaddleSlim averages
//         per batch first; weighting by samples is the same for equal batches and split-free.
//  "hist": T = the hist_percent quantile of |x| (exact zeros included), from a histogram.
//  "KL": TensorRT's entropy calibration on `bins` bins of the non-zero |x| over [0, max|x|],
//        128 levels for s8 (and asymmetric over signed data), 256 for u8 over non-negative data.
//  "mse" / "emd": the T on search_fractions() minimising, over everything observed, the mean
//        squared error between x and its quantize-dequantize under the requested scheme (mse), or
//        |mean diff| + |std diff| (emd); computed from a signed histogram of fine_bins bins.
//  "auto": observes with every algorithm of auto_algo_candidates() at once (one scan of each tensor)
//         and reports the selected one's range; emd until select_auto_candidate() picks another.
//         PostTrainingQuantization selects, per model, the candidate whose quantized model stays
//         closest to FP32 on samples held back from calibration (algo_choice.h).
// Histograms span a power-of-two range that doubles when a batch exceeds it, merging bins; the
// result depends only on the values observed, not on how they were split into batches.
std::unique_ptr<Observer> make_activation_observer(const std::string& algo,
                                                   const ObserverOptions& options = {});
// Weight observers by name: "abs_max" (per tensor), "mse" (per tensor, the threshold on
// search_fractions(weight_search_steps, weight_search_min_fraction) with the least squared error over
// all the values), "channel_wise_abs_max" (per-channel [min, max] along options.channel_axis),
// "mse_channel_wise" (per channel, the threshold on
// search_fractions(weight_search_steps, weight_search_min_fraction) with the least squared error
// over that channel's values; keeps a reference to the observed weight, no copy). Per-channel
// params() carry one scale / zero point per channel and axis = the normalised channel axis.
std::unique_ptr<Observer> make_weight_observer(const std::string& type,
                                               const ObserverOptions& options = {});
std::vector<std::string> activation_algos();
// The algorithms an "auto" observer weighs, the first being its selection until told otherwise.
std::vector<std::string> auto_algo_candidates();
// Makes an "auto" observer report `algo` (one of auto_algo_candidates()); false when `observer` is
// not an "auto" observer, kInvalidArgument for another algo.
bool select_auto_candidate(Observer& observer, const std::string& algo);
std::vector<std::string> weight_algos();

// The clipping-threshold grid of the searching observers, as fractions of max|x|: `steps`
// points spaced geometrically from min_fraction up to exactly 1 (increasing).
std::vector<double> search_fractions(int steps, double min_fraction);

}  // namespace slimquant::quant
