// Power-of-two range histogram: merges across batches without depending on the batching.
#include <algorithm>
#include <cmath>

#include "quant/observers/observer_internal.h"

namespace slimquant::quant::detail {

namespace {
// Values below 2^-100 in magnitude are zero for any practical quantization; the floor keeps
// bins / R representable as a float.
constexpr int kMinExponent = -100;
constexpr int64_t kChunk = 1024;
constexpr int32_t kZeroSlotMask = 3;  // kZeroSlots - 1

struct BinParams {
  float scale;        // bins per unit of |x|: an integer times a power of two
  int32_t last;       // largest trunc(|x| * scale)
  int32_t half;       // index of the bin starting at 0 (signed kind), 0 (abs kind)
  int32_t zero_slot;  // first of the zero slots
};

// trunc(|x| * scale) halves exactly when R doubles (scale is a power of two times an integer), so
// these indices agree with merged bins. Branch-free and in operations SSE2 has (float min before
// the conversion, integer masks for the selects), so both loops vectorise.
void abs_bin_indices(const float* x, int64_t m, const BinParams& p, int32_t* idx) {
  const float last = static_cast<float>(p.last);
  for (int64_t i = 0; i < m; ++i) {
    const float v = x[i];
    const float a = std::fabs(v) * p.scale;
    const int32_t t = static_cast<int32_t>(a < last ? a : last);  // trunc(min(a, last)) = min(trunc(a), last)
    const int32_t zero = -static_cast<int32_t>(v == 0.0f);
    idx[i] = (t & ~zero) | ((p.zero_slot + static_cast<int32_t>(i & kZeroSlotMask)) & zero);
  }
}

void signed_bin_indices(const float* x, int64_t m, const BinParams& p, int32_t* idx) {
  const float last = static_cast<float>(p.last);
  for (int64_t i = 0; i < m; ++i) {
    const float v = x[i];
    const float a = std::fabs(v) * p.scale;
    const int32_t t = static_cast<int32_t>(a < last ? a : last);
    // floor(x / w) for x < 0 is -1 - trunc(|x| / w) = ~t (bins are closed on the side of zero).
    const int32_t negative = -static_cast<int32_t>(v < 0.0f);
    const int32_t zero = -static_cast<int32_t>(v == 0.0f);
    const int32_t j = p.half + (t ^ negative);
    idx[i] = (j & ~zero) | ((p.zero_slot + static_cast<int32_t>(i & kZeroSlotMask)) & zero);
  }
}
}  // namespace

Pow2Histogram::Pow2Histogram(Kind kind, int64_t bins) : kind_(kind), bins_(bins) {
  SQ_CHECK(bins >= 2 && bins % 2 == 0, ErrorKind::kInternal,
           "Pow2Histogram: bins must be even, got " + std::to_string(bins));
  SQ_CHECK(bins <= (int64_t{1} << 30), ErrorKind::kInternal,
           "Pow2Histogram: too many bins (" + std::to_string(bins) + ")");
  counts_.assign(static_cast<size_t>(bins + kZeroSlots), 0);
}

int64_t Pow2Histogram::zeros() const {
  int64_t z = zeros_;
  for (int64_t s = 0; s < kZeroSlots; ++s) z += counts_[bins_ + s];
  return z;
}

void Pow2Histogram::save(std::ostream& out) const {
  write_pod<int32_t>(out, kind_ == Kind::kAbs ? 0 : 1);
  write_vector(out, counts_);
  write_pod(out, zeros_);
  write_pod<uint8_t>(out, has_range_ ? 1 : 0);
  write_pod<int32_t>(out, exponent_);
}

void Pow2Histogram::load(std::istream& in) {
  SQ_CHECK(read_pod<int32_t>(in) == (kind_ == Kind::kAbs ? 0 : 1), ErrorKind::kInvalidData,
           "calibration cache holds another kind of histogram");
  read_vector(in, counts_, counts_.size());
  zeros_ = read_pod<int64_t>(in);
  has_range_ = read_pod<uint8_t>(in) != 0;
  exponent_ = read_pod<int32_t>(in);
}

void Pow2Histogram::merge_from(const Pow2Histogram& other) {
  SQ_CHECK(other.kind_ == kind_ && other.bins_ == bins_, ErrorKind::kInvalidData,
           "cannot merge histograms of different kinds or bin counts");
  if (other.has_range_) {
    Pow2Histogram wider = other;
    if (!has_range_) {
      has_range_ = true;
      exponent_ = other.exponent_;
    } else if (other.exponent_ > exponent_) {
      merge(other.exponent_ - exponent_);
    } else if (other.exponent_ < exponent_) {
      wider.merge(exponent_ - other.exponent_);
    }
    for (size_t j = 0; j < counts_.size(); ++j) counts_[j] += wider.counts_[j];
  } else {
    for (size_t j = static_cast<size_t>(bins_); j < counts_.size(); ++j) counts_[j] += other.counts_[j];
  }
  zeros_ += other.zeros_;
}

double Pow2Histogram::range() const { return std::ldexp(1.0, exponent_); }

double Pow2Histogram::bin_width() const {
  return (kind_ == Kind::kAbs ? range() : 2.0 * range()) / static_cast<double>(bins_);
}

double Pow2Histogram::bin_lo(int64_t j) const {
  return (kind_ == Kind::kAbs ? 0.0 : -range()) + static_cast<double>(j) * bin_width();
}

void Pow2Histogram::ensure_range(float abs_max) {
  if (abs_max == 0.0f) return;
  int e = 0;
  std::frexp(abs_max, &e);  // abs_max = m * 2^e, m in [0.5, 1): 2^e > abs_max
  e = std::max(e, kMinExponent);
  if (!has_range_) {
    has_range_ = true;
    exponent_ = e;
  } else if (e > exponent_) {
    merge(e - exponent_);
  }
}

void Pow2Histogram::merge(int steps) {
  // After log2(bins) + 1 doublings every bin has collapsed into the one(s) next to zero; further
  // doublings leave the counts unchanged, so the shift is capped (and stays well defined).
  const int shift = std::min(steps, 62);
  std::vector<int64_t> merged(counts_.size(), 0);
  std::copy(counts_.begin() + bins_, counts_.end(), merged.begin() + bins_);
  if (kind_ == Kind::kAbs) {
    for (int64_t j = 0; j < bins_; ++j) merged[j >> shift] += counts_[j];
  } else {
    // Offsets o = j - bins/2 are floor(x / w); doubling w maps o to floor(o / 2^shift), which is
    // an arithmetic right shift.
    const int64_t half = bins_ / 2;
    for (int64_t j = 0; j < bins_; ++j) merged[half + ((j - half) >> shift)] += counts_[j];
  }
  counts_.swap(merged);
  exponent_ += steps;
}

void Pow2Histogram::add(const float* x, int64_t n, float abs_max) {
  ensure_range(abs_max);
  if (!has_range_) {  // all values are exactly zero
    zeros_ += n;
    return;
  }
  // Two passes per chunk: bin indices computed branch-free and vectorised, then the increments.
  // Exact zeros go to kZeroSlots extra slots in rotation: post-ReLU tensors are about half zeros
  // in no predictable order (a branch would mispredict), and a single slot would chain every
  // increment on one memory location.
  int64_t* counts = counts_.data();
  const BinParams p = kind_ == Kind::kAbs
                          ? BinParams{std::ldexp(static_cast<float>(bins_), -exponent_),
                                      static_cast<int32_t>(bins_ - 1), 0,
                                      static_cast<int32_t>(bins_)}
                          : BinParams{std::ldexp(static_cast<float>(bins_ / 2), -exponent_),
                                      static_cast<int32_t>(bins_ / 2 - 1),
                                      static_cast<int32_t>(bins_ / 2), static_cast<int32_t>(bins_)};
  int32_t idx[kChunk];
  for (int64_t c0 = 0; c0 < n; c0 += kChunk) {
    const int64_t m = std::min(kChunk, n - c0);
    if (kind_ == Kind::kAbs) {
      abs_bin_indices(x + c0, m, p, idx);
    } else {
      signed_bin_indices(x + c0, m, p, idx);
    }
    for (int64_t i = 0; i < m; ++i) ++counts[idx[i]];
  }
}

}  // namespace slimquant::quant::detail
