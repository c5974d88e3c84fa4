// Observer base class, the scheme arithmetic, and the factories.
#include <algorithm>
#include <cstring>
#include <cctype>
#include <cmath>
#include <limits>
#include <sstream>

#include "quant/observers/observer_internal.h"

namespace slimquant::quant {

const char* scheme_name(QuantScheme s) {
  switch (s) {
    case QuantScheme::kSymmetric: return "symmetric";
    case QuantScheme::kUnsignedZeroPoint0: return "unsigned_zp0";
    case QuantScheme::kAsymmetric: return "asymmetric";
  }
  return "?";
}

namespace detail {

ScanResult scan_min_max(const float* p, int64_t n) {
  // `v - v` is 0 for finite values and NaN for NaN/Inf, so one sum detects both. Four 4-lane
  // accumulators per quantity (GCC/Clang vector extensions, one SSE register each) keep several
  // min/max chains in flight: with one accumulator the loop waits on each instruction's latency,
  // and this scan is a large part of calibration's cost beyond inference. min/max reassociate
  // exactly and the order of the check sum does not matter.
  using V = float __attribute__((vector_size(16)));
  constexpr int kAcc = 4, kStep = 4 * kAcc;
  constexpr float kInf = std::numeric_limits<float>::infinity();
  V mn[kAcc], mx[kAcc], ck[kAcc];
  for (int a = 0; a < kAcc; ++a) {
    mn[a] = V{kInf, kInf, kInf, kInf};
    mx[a] = -mn[a];
    ck[a] = V{};
  }
  int64_t i = 0;
  for (; i + kStep <= n; i += kStep) {
    for (int a = 0; a < kAcc; ++a) {
      V v;
      std::memcpy(&v, p + i + 4 * a, sizeof(V));
      mn[a] = v < mn[a] ? v : mn[a];
      mx[a] = v > mx[a] ? v : mx[a];
      ck[a] += v - v;
    }
  }
  float lo = kInf, hi = -kInf, check = 0.0f;
  for (int a = 0; a < kAcc; ++a)
    for (int l = 0; l < 4; ++l) {
      lo = mn[a][l] < lo ? mn[a][l] : lo;
      hi = mx[a][l] > hi ? mx[a][l] : hi;
      check += ck[a][l];
    }
  for (; i < n; ++i) {
    const float v = p[i];
    lo = v < lo ? v : lo;
    hi = v > hi ? v : hi;
    check += v - v;
  }
  return ScanResult{lo, hi, !std::isnan(check)};
}

QuantParam affine_grid(double lo, double hi, QuantScheme scheme, int bits) {
  const int32_t sym_max = (1 << (bits - 1)) - 1;  // 127 for 8 bits
  lo = std::min(lo, 0.0);
  hi = std::max(hi, 0.0);
  float scale = 0.f;
  int32_t zero_point = 0;
  DType dtype = DType::kInt8;
  switch (scheme) {
    case QuantScheme::kSymmetric: {
      scale = static_cast<float>(std::max(-lo, hi) / sym_max);
      break;
    }
    case QuantScheme::kUnsignedZeroPoint0: {
      dtype = DType::kUInt8;
      scale = static_cast<float>(hi / 255.0);
      break;
    }
    case QuantScheme::kAsymmetric: {
      dtype = DType::kUInt8;
      scale = std::max(static_cast<float>((hi - lo) / 255.0), kMinScale);
      const double zp = std::nearbyint(-lo / static_cast<double>(scale));
      zero_point = static_cast<int32_t>(std::clamp(zp, 0.0, 255.0));
      break;
    }
  }
  return QuantParam{dtype, {std::max(scale, kMinScale)}, {zero_point}, QuantParam::kPerTensor, bits};
}

}  // namespace detail

QuantParam params_from_range(ClipRange range, QuantScheme scheme, int bits) {
  SQ_CHECK(bits >= 2 && bits <= 8, ErrorKind::kInvalidArgument,
           "params_from_range: bits must be in [2, 8] (got " + std::to_string(bits) + ")");
  SQ_CHECK(std::isfinite(range.lo) && std::isfinite(range.hi) && range.lo <= range.hi,
           ErrorKind::kInvalidArgument,
           "params_from_range: invalid range [" + std::to_string(range.lo) + ", " +
               std::to_string(range.hi) + "]");
  SQ_CHECK(scheme != QuantScheme::kUnsignedZeroPoint0 || range.lo >= 0.0f,
           ErrorKind::kInvalidArgument,
           "params_from_range: scheme unsigned_zp0 cannot represent negative values (range starts "
           "at " + std::to_string(range.lo) + ")");
  return detail::affine_grid(range.lo, range.hi, scheme, bits);
}

std::vector<double> search_fractions(int steps, double min_fraction) {
  SQ_CHECK(steps >= 1 && min_fraction > 0.0 && min_fraction <= 1.0, ErrorKind::kInvalidArgument,
           "search_fractions: need steps >= 1 and 0 < min_fraction <= 1 (got " +
               std::to_string(steps) + ", " + std::to_string(min_fraction) + ")");
  std::vector<double> f(static_cast<size_t>(steps));
  for (int k = 0; k < steps; ++k) {
    // f_k = min_fraction^((steps-1-k)/(steps-1)); the last one is exactly 1.
    f[k] = steps == 1 ? 1.0
                      : std::pow(min_fraction, static_cast<double>(steps - 1 - k) / (steps - 1));
  }
  f.back() = 1.0;
  return f;
}

// ---- Observer ------------------------------------------------------------------------------

void Observer::observe(const Tensor& x) {
  if (x.dtype() != DType::kFloat32) {
    fail_here(ErrorKind::kInvalidArgument, std::string("expects float32 tensors, got ") +
                                               dtype_name(x.dtype()) + " " + shape_str(x.shape()));
  }
  const int64_t n = x.numel();
  if (n == 0) return;
  const float* p = x.data<float>();
  detail::ScanResult s;
  std::span<const float> per_sample;
  if (per_sample_abs_max_ && x.rank() >= 2 && x.dim(0) > 1) {
    const int64_t samples = x.dim(0), per = n / samples;
    sample_abs_max_.resize(static_cast<size_t>(samples));
    s = detail::ScanResult{std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(), true};
    for (int64_t i = 0; i < samples; ++i) {
      const detail::ScanResult r = detail::scan_min_max(p + i * per, per);
      sample_abs_max_[static_cast<size_t>(i)] = std::max(-r.min, r.max);
      s.min = std::min(s.min, r.min);
      s.max = std::max(s.max, r.max);
      s.finite = s.finite && r.finite;
    }
    per_sample = sample_abs_max_;
  } else {
    s = detail::scan_min_max(p, n);
  }
  if (!s.finite) fail_here(ErrorKind::kInvalidData, "tensor contains NaN/Inf");
  accept(x, p, n, BatchStats{s.min, s.max, std::max(-s.min, s.max), per_sample});
}

void Observer::accept(const Tensor& x, const float* p, int64_t n, const BatchStats& s) {
  // The algorithm first: if it rejects the tensor (e.g. a bad channel axis), the running
  // statistics stay as they were.
  on_observe(x, p, n, s);
  if (!accumulate_ || count_ == 0) {
    min_ = s.min;
    max_ = s.max;
    count_ = 0;
    batches_ = 0;
  } else {
    min_ = std::min(min_, s.min);
    max_ = std::max(max_, s.max);
  }
  count_ += n;
  batches_ += 1;
}

void Observer::save_state(std::ostream& out) const {
  const std::string n = name();
  detail::write_vector(out, std::vector<char>(n.begin(), n.end()));
  detail::write_pod(out, min_);
  detail::write_pod(out, max_);
  detail::write_pod(out, count_);
  detail::write_pod(out, batches_);
  save_algo_state(out);
}

void Observer::load_state(std::istream& in) {
  const std::string n = name();
  std::vector<char> stored;
  detail::read_vector(in, stored, n.size());
  SQ_CHECK(std::string(stored.begin(), stored.end()) == n, ErrorKind::kInvalidData,
           "calibration cache holds the state of another observer than '" + n + "'");
  min_ = detail::read_pod<float>(in);
  max_ = detail::read_pod<float>(in);
  count_ = detail::read_pod<int64_t>(in);
  batches_ = detail::read_pod<int64_t>(in);
  load_algo_state(in);
}

void Observer::merge_state(std::istream& later) {
  SQ_CHECK(accumulate_, ErrorKind::kInvalidArgument,
           "observer " + name() + " describes a single weight tensor: there is no state to merge");
  const std::string n = name();
  std::vector<char> stored;
  detail::read_vector(later, stored, n.size());
  SQ_CHECK(std::string(stored.begin(), stored.end()) == n, ErrorKind::kInvalidData,
           "cannot merge the state of another observer into '" + n + "'");
  const float later_min = detail::read_pod<float>(later), later_max = detail::read_pod<float>(later);
  const int64_t later_count = detail::read_pod<int64_t>(later), later_batches = detail::read_pod<int64_t>(later);
  merge_algo_state(later);
  if (later_count > 0) {
    min_ = count_ > 0 ? std::min(min_, later_min) : later_min;
    max_ = count_ > 0 ? std::max(max_, later_max) : later_max;
  }
  count_ += later_count;
  batches_ += later_batches;
}

ClipRange Observer::range() const {
  check_usable(default_scheme());
  return clip_range(default_scheme());
}

QuantParam Observer::params(QuantScheme scheme) const {
  check_usable(scheme);
  return params_from_range(clip_range(scheme), scheme, bits_);
}

ClipRange Observer::clip_to_observed(double threshold) const {
  const double lo = std::min(static_cast<double>(min_), 0.0);
  const double hi = std::max(static_cast<double>(max_), 0.0);
  return ClipRange{static_cast<float>(std::max(-threshold, lo)),
                   static_cast<float>(std::min(threshold, hi))};
}

void Observer::check_usable(QuantScheme scheme) const {
  if (count_ == 0) fail_here(ErrorKind::kInvalidData, "no data observed yet");
  if (scheme == QuantScheme::kUnsignedZeroPoint0 && seen_negative()) {
    fail_here(ErrorKind::kInvalidArgument,
              "scheme unsigned_zp0 needs a tensor that is never negative, but values down to " +
                  std::to_string(min_) + " were observed");
  }
}

void Observer::fail_here(ErrorKind kind, const std::string& rule) const {
  fail(kind, "observer " + name() + ": " + rule);
}

// ---- factories -----------------------------------------------------------------------------

namespace {

std::string lower(std::string s) {
  for (char& c : s) c = static_cast<char>(std::tolower(static_cast<unsigned char>(c)));
  return s;
}

std::string join(const std::vector<std::string>& v) {
  std::string out;
  for (const auto& s : v) out += (out.empty() ? "" : ", ") + s;
  return out;
}

void validate(const ObserverOptions& o, const std::string& algo) {
  auto bad = [&](const std::string& rule) {
    fail(ErrorKind::kInvalidArgument, "observer " + algo + ": " + rule);
  };
  if (algo == "hist" && !(o.hist_percent > 0.0f && o.hist_percent <= 1.0f)) {
    bad("hist_percent must be in (0, 1] (got " + std::to_string(o.hist_percent) + ")");
  }
  if (algo == "hist" && (o.bins < 16 || o.bins > (1 << 22))) {
    bad("bins must be in [16, 4194304] (got " + std::to_string(o.bins) + ")");
  }
  if (algo == "KL" && (o.bins < 256 || o.bins > (1 << 16))) {
    // 256: one bin per u8 level at least.
    bad("bins must be in [256, 65536] (got " + std::to_string(o.bins) + ")");
  }
  if ((algo == "mse" || algo == "emd") &&
      (o.fine_bins < 64 || o.fine_bins > (1 << 24) || o.fine_bins % 2 != 0)) {
    bad("fine_bins must be even and in [64, 16777216] (got " + std::to_string(o.fine_bins) + ")");
  }
  auto check_grid = [&](int steps, float min_fraction, const char* steps_name,
                        const char* frac_name) {
    if (steps < 1 || steps > 100000) {
      bad(std::string(steps_name) + " must be in [1, 100000] (got " + std::to_string(steps) + ")");
    }
    if (!(min_fraction > 0.0f && min_fraction <= 1.0f)) {
      bad(std::string(frac_name) + " must be in (0, 1] (got " + std::to_string(min_fraction) +
          ")");
    }
  };
  if (algo == "mse" || algo == "emd") {
    check_grid(o.search_steps, o.search_min_fraction, "search_steps", "search_min_fraction");
  }
  if (algo == "mse_channel_wise") {
    check_grid(o.weight_search_steps, o.weight_search_min_fraction, "weight_search_steps",
               "weight_search_min_fraction");
  }
}

}  // namespace

std::vector<std::string> activation_algos() {
  return {"abs_max", "direct", "min_max", "avg", "hist", "KL", "mse", "emd", "auto"};
}

std::vector<std::string> weight_algos() {
  return {"abs_max", "mse", "channel_wise_abs_max", "mse_channel_wise"};
}

std::unique_ptr<Observer> make_activation_observer(const std::string& algo,
                                                   const ObserverOptions& options) {
  const std::string a = lower(algo);
  if (a == "abs_max" || a == "direct") return detail::make_abs_max_observer();
  if (a == "min_max") return detail::make_min_max_observer();
  if (a == "avg") return detail::make_avg_observer();
  if (a == "hist") {
    validate(options, "hist");
    return detail::make_hist_observer(options);
  }
  if (a == "kl") {
    validate(options, "KL");
    return detail::make_kl_observer(options);
  }
  if (a == "mse") {
    validate(options, "mse");
    return detail::make_mse_observer(options);
  }
  if (a == "emd") {
    validate(options, "emd");
    return detail::make_emd_observer(options);
  }
  if (a == "auto") {
    for (const auto& candidate : auto_algo_candidates()) validate(options, candidate);
    return detail::make_auto_observer(options);
  }
  fail(ErrorKind::kInvalidArgument,
       "unknown activation algo '" + algo + "' (known: " + join(activation_algos()) + ")");
}

std::unique_ptr<Observer> make_weight_observer(const std::string& type,
                                               const ObserverOptions& options) {
  const std::string t = lower(type);
  if (options.weight_bits < 2 || options.weight_bits > 8)
    fail(ErrorKind::kInvalidArgument,
         "weight observer " + type + ": weight_bits must be in [2, 8] (got " + std::to_string(options.weight_bits) + ")");
  if (t == "abs_max") return detail::make_weight_abs_max_observer(options);
  if (t == "channel_wise_abs_max") return detail::make_channel_wise_abs_max_observer(options);
  if (t == "mse") {
    validate(options, "mse_channel_wise");  // the same weight search grid
    return detail::make_mse_weight_observer(options);
  }
  if (t == "mse_channel_wise") {
    validate(options, "mse_channel_wise");
    return detail::make_mse_channel_wise_observer(options);
  }
  fail(ErrorKind::kInvalidArgument,
       "unknown weight observer '" + type + "' (known: " + join(weight_algos()) + ")");
}

}  // namespace slimquant::quant
