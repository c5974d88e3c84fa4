#pragma once
// Pieces shared by the observer implementations: the batch scan, the power-of-two histogram, the
// integer grid of a quantization scheme, and the per-algorithm factories.
#include <cstdint>
#include <istream>
#include <ostream>
#include <memory>
#include <span>
#include <vector>

#include "slimquant/quant/observer.h"

namespace slimquant::quant::detail {

// Min and max of n floats, and whether all of them are finite.
struct ScanResult {
  float min, max;
  bool finite;
};
ScanResult scan_min_max(const float* p, int64_t n);

// Binary state I/O for the calibration cache: raw little-endian host values, the file is only ever
// read back by the same build on the same machine.
template <typename T>
void write_pod(std::ostream& out, const T& v) {
  out.write(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <typename T>
T read_pod(std::istream& in) {
  T v{};
  in.read(reinterpret_cast<char*>(&v), sizeof(T));
  SQ_CHECK(in.good(), ErrorKind::kInvalidData, "calibration cache is truncated");
  return v;
}
template <typename T>
void write_vector(std::ostream& out, const std::vector<T>& v) {
  write_pod<uint64_t>(out, v.size());
  out.write(reinterpret_cast<const char*>(v.data()), static_cast<std::streamsize>(v.size() * sizeof(T)));
}
// The length must equal `expected_size` (the observer's configuration fixes it).
template <typename T>
void read_vector(std::istream& in, std::vector<T>& v, size_t expected_size) {
  const auto n = read_pod<uint64_t>(in);
  SQ_CHECK(n == expected_size, ErrorKind::kInvalidData,
           "calibration cache was written with other observer options (" + std::to_string(n) + " vs " +
               std::to_string(expected_size) + " entries)");
  v.resize(n);
  in.read(reinterpret_cast<char*>(v.data()), static_cast<std::streamsize>(n * sizeof(T)));
  SQ_CHECK(in.good() || n == 0, ErrorKind::kInvalidData, "calibration cache is truncated");
}

// The per-tensor grid a scheme quantizes [lo, hi] onto: x_hat = k * scale for k in [kmin, kmax],
// k = clamp(round(x / scale), kmin, kmax) with kmin = qmin() - zero_point, kmax = qmax() - zero_point
// (grid_kmin / grid_kmax), exactly what QuantizeLinear followed by DequantizeLinear computes.
// No checks: callers make sure kUnsignedZeroPoint0 only sees lo >= 0.
// bits < 8: kSymmetric uses [-(2^(bits-1) - 1), 2^(bits-1) - 1] (weights only).
QuantParam affine_grid(double lo, double hi, QuantScheme scheme, int bits = 8);
inline int32_t grid_kmin(const QuantParam& g) { return g.qmin() - g.zero_point[0]; }
inline int32_t grid_kmax(const QuantParam& g) { return g.qmax() - g.zero_point[0]; }

// Histogram whose range is a power of two R strictly above every |x| added: kAbs bins |x| over
// [0, R), kSigned bins x over [-R, R) (bins even). Exact zeros are counted apart (zeros()), never
// in a bin. When a batch exceeds R, R doubles (possibly several times) and bin groups merge:
// because bin indices are computed as trunc(|x| * bins / R) and a multiplication by a power of two
// is exact in floating point, the merged counts equal those of binning everything at the final R.
// The histogram therefore depends only on the multiset of observed values, not on the batching.
class Pow2Histogram {
 public:
  enum class Kind { kAbs, kSigned };
  Pow2Histogram(Kind kind, int64_t bins);

  // abs_max: the batch's max |x| (finite).
  void add(const float* x, int64_t n, float abs_max);

  bool has_range() const { return has_range_; }  // false until a non-zero value was seen
  double range() const;                            // R
  double bin_width() const;
  double bin_lo(int64_t j) const;  // left edge of bin j
  int64_t bins() const { return bins_; }
  std::span<const int64_t> counts() const { return {counts_.data(), static_cast<size_t>(bins_)}; }
  int64_t zeros() const;

  void save(std::ostream& out) const;
  void load(std::istream& in);
  // Adds another histogram of the same kind and bins: the result is the histogram of both value
  // multisets (the narrower one's bins merge up to the wider range first, as add() would).
  void merge_from(const Pow2Histogram& other);

 private:
  void ensure_range(float abs_max);
  void merge(int steps);  // R *= 2^steps

  Kind kind_;
  int64_t bins_;
  static constexpr int64_t kZeroSlots = 4;  // see add()
  std::vector<int64_t> counts_;  // bins_ + kZeroSlots: the last entries count exact zeros
  int64_t zeros_ = 0;            // zeros seen before any range existed
  bool has_range_ = false;
  int exponent_ = 0;  // R = 2^exponent_
};

std::unique_ptr<Observer> make_abs_max_observer();
std::unique_ptr<Observer> make_min_max_observer();
std::unique_ptr<Observer> make_avg_observer();
std::unique_ptr<Observer> make_hist_observer(const ObserverOptions& o);
std::unique_ptr<Observer> make_kl_observer(const ObserverOptions& o);
std::unique_ptr<Observer> make_mse_observer(const ObserverOptions& o);
std::unique_ptr<Observer> make_emd_observer(const ObserverOptions& o);
std::unique_ptr<Observer> make_auto_observer(const ObserverOptions& o);
// hist / mse reading the histogram of a KL / emd observer made with the same options that observes
// the same tensors (which must outlive them) instead of filling their own: "auto"'s candidates.
std::unique_ptr<Observer> make_hist_observer_sharing(const Observer& kl, const ObserverOptions& o);
std::unique_ptr<Observer> make_mse_observer_sharing(const Observer& emd, const ObserverOptions& o);

std::unique_ptr<Observer> make_weight_abs_max_observer(const ObserverOptions& options);
std::unique_ptr<Observer> make_channel_wise_abs_max_observer(const ObserverOptions& o);
std::unique_ptr<Observer> make_mse_channel_wise_observer(const ObserverOptions& o);
std::unique_ptr<Observer> make_mse_weight_observer(const ObserverOptions& o);

}  // namespace slimquant::quant::detail
