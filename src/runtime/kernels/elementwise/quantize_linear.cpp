// QuantizeLinear / DequantizeLinear (opsets 10 and 13: per tensor, and per axis from 13; blocked
// DequantizeLinear from 21, dequantize_blocked) and the
// fused fake-quantization used by simulation, with core/quant_param.h's arithmetic:
//   q = saturate(round_half_even(x / s) + z)        y = float(q - z) * s
// (saturation before rounding, on v = x / s against [qmin - z, qmax - z]). Every loop vectorises.
#include "runtime/kernels/elementwise/elementwise_qdq.h"

#include <algorithm>
#include <atomic>
#include <bit>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <optional>
#include <type_traits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "runtime/kernels/elementwise/channel_blocked.h"
#include "runtime/kernels/cpu_clones.h"
#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_math.h"
#include "runtime/kernels/elementwise/elementwise_register.h"

namespace slimquant::runtime {
namespace {

// The parameters of one call, with x viewed as outer x channels x inner (channels = 1 per tensor).
struct BlockedParams {
  QuantParam q;
  int64_t outer = 1, channels = 1, inner = 1;
};

BlockedParams quant_params(const Tensor& x, const Tensor& scale, const Tensor* zp, int64_t axis, DType qtype,
                           const std::string& who) {
  SQ_CHECK(scale.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument,
           who + ": scale must be float32, got " + dtype_name(scale.dtype()));
  BlockedParams p;
  if (zp) {
    SQ_CHECK(zp->numel() == scale.numel(), ErrorKind::kInvalidArgument,
             who + ": zero point shape " + shape_str(zp->shape()) + " does not match scale shape " +
                 shape_str(scale.shape()));
  }
  if (scale.numel() == 1) {
    p.inner = x.numel();
  } else {
    SQ_CHECK(scale.rank() == 1, ErrorKind::kInvalidArgument,
             who + ": scale must be a scalar or 1-D, got shape " + shape_str(scale.shape()));
    const int64_t ax = normalize_axis(axis, static_cast<int64_t>(x.rank()), who);
    SQ_CHECK(scale.dim(0) == x.dim(ax), ErrorKind::kInvalidArgument,
             who + ": " + std::to_string(scale.dim(0)) + " scales for axis " + std::to_string(ax) + " of size " +
                 std::to_string(x.dim(ax)) + " (input shape " + shape_str(x.shape()) + ")");
    p.channels = x.dim(ax);
    p.q.axis = ax;
    for (int64_t d = 0; d < ax; ++d) p.outer *= x.dim(d);
    for (int64_t d = ax + 1; d < static_cast<int64_t>(x.rank()); ++d) p.inner *= x.dim(d);
  }
  const float* s = scale.data<float>();
  p.q.scale.assign(s, s + p.channels);
  p.q.zero_point.assign(static_cast<size_t>(p.channels), 0);
  if (zp) {
    const std::vector<int64_t> z = zp->to_int64_vector();
    for (int64_t c = 0; c < p.channels; ++c) p.q.zero_point[c] = static_cast<int32_t>(z[c]);
  }
  p.q.dtype = qtype;
  return p;
}

// Runs fn(channel, first_element, count) over the (outer, channel) blocks, in parallel when large.
// With inner == 1 (axis is the last dim) a "block" is a whole row of channels: fn(-1, start, n).
template <typename Fn>
void for_each_block(const BlockedParams& p, Fn&& fn) {
  if (p.inner == 1 && p.channels > 1) {
    ew::parallel_range(p.outer, [&](int64_t o0, int64_t o1) {
      for (int64_t o = o0; o < o1; ++o) fn(int64_t{-1}, o * p.channels, p.channels);
    });
    return;
  }
  if (p.channels == 1) {  // per tensor: one flat range
    ew::parallel_range(p.outer * p.inner, [&](int64_t b, int64_t e) { fn(int64_t{0}, b, e - b); });
    return;
  }
  const int64_t blocks = p.outer * p.channels;
  ew::parallel_range(blocks, [&](int64_t b0, int64_t b1) {
    for (int64_t b = b0; b < b1; ++b) fn(b % p.channels, b * p.inner, p.inner);
  });
}

using quant_math::quantize_offset;  // x / s saturated to [lo, hi] = [qmin - z, qmax - z], rounded
using quant_math::saturate_round;

template <typename Q>
constexpr int32_t lowest_code() { return static_cast<int32_t>(std::numeric_limits<Q>::min()); }
template <typename Q>
constexpr int32_t highest_code() { return static_cast<int32_t>(std::numeric_limits<Q>::max()); }

// [qmin - z, qmax - z]: the range x / s saturates to before the zero point is added.
struct OffsetRange {
  float lo, hi;
};
template <typename Q>
OffsetRange offset_range(int32_t zero_point) {
  return {static_cast<float>(lowest_code<Q>() - zero_point), static_cast<float>(highest_code<Q>() - zero_point)};
}
// The same for a u8 or s8 `type` known at run time.
OffsetRange offset_range(DType type, int32_t zero_point) {
  return type == DType::kUInt8 ? offset_range<uint8_t>(zero_point) : offset_range<int8_t>(zero_point);
}

// The hot loops over one block of one (scale, zero point): compiled for AVX2 and AVX-512 too,
// where they run several times faster than the baseline's SSE2 (the narrowing float -> int -> 8-bit
// conversion does not vectorise well there).
template <typename X, typename Q>
SQ_AVX512_AVX2_CLONES void quantize_span_dividing(const X* x, Q* y, int64_t n, float s, float lo, float hi, int32_t z) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = static_cast<Q>(static_cast<int32_t>(quantize_offset(static_cast<float>(x[i]), s, lo, hi)) + z);
}

SQ_AVX512_AVX2_CLONES void fake_quantize_span_dividing(const float* x, float* y, int64_t n, float s, float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) y[i] = quantize_offset(x[i], s, lo, hi) * s;
}

// x / s exactly as the division rounds it, from r = 1 / s (Markstein's theorem: q = x * r is within
// an ulp of x / s, and q + (x - q * s) * r, the remainder exact by FMA, is the correctly rounded
// quotient while nothing overflows or goes subnormal). Division has a fraction of an FMA's
// throughput: QuantizeLinear runs 1.4x faster this way (AVX-512, measured). x is first clamped to
// +-bound, beyond which either way quantizes to an end of the range (and NaN to the low end).
struct Reciprocal {
  float r = 0.f, bound = 0.f;
};
std::optional<Reciprocal> reciprocal_for(float s, float lo, float hi) {
  static const bool fma = __builtin_cpu_supports("fma");
  // Scales whose quotients of interest (|x / s| >= 0.5) could come from subnormal x, or whose
  // bound overflows, divide.
  if (!fma || !(s >= 1e-30f && s <= 1e30f)) return std::nullopt;
  return Reciprocal{1.f / s, (hi - lo + 1.f) * s};
}

inline float divide_by_reciprocal(float x, float s, const Reciprocal& rc) {
  x = ew::select(x > -rc.bound, x, -rc.bound);
  x = ew::select(x < rc.bound, x, rc.bound);
  const float q = x * rc.r;
  return std::fma(std::fma(-q, s, x), rc.r, q);
}

// The 8-bit code of v (the bits of a uint8 / int8) from the reciprocal r of s, with fewer operations
// than saturate(round(divide_by_reciprocal(v))) and the same code (lo, hi within +-255):
// - v is clamped to [low, high] = [fl(lo * s), fl(hi * s)] first, in place of both the +-bound
//   clamp and the saturation of the quotient: a clamped x quotients to within lo (hi) * (1 +- 2^-23),
//   which rounds to lo (hi) as the saturated quotient does (|lo|, |hi| <= 255), and v within the
//   range is untouched (NaN becomes low, so lo, as saturate_round makes it);
// - the quotient k + 1.5 * 2^23 holds k's low byte in its low mantissa bits (ulp 1 in
//   [2^23, 2^24)), so the code's byte is that byte plus z's (added as bytes): no
//   subtraction of the magic number, no float -> int conversion, no widened z.
template <typename Q>
inline Q multiplying_code(float v, float low, float high, float s, float r, uint8_t z) {
  v = v > low ? v : low;
  v = v < high ? v : high;
  const float q = v * r;
  const float quotient = std::fma(std::fma(-q, s, v), r, q);
  const auto low_byte = static_cast<uint8_t>(std::bit_cast<uint32_t>(quotient + quant_math::kRoundHalfEvenMagic));
  return static_cast<Q>(low_byte + z);
}

template <typename X, typename Q>
SQ_AVX512_AVX2_CLONES void quantize_span_multiplying(const X* x, Q* y, int64_t n, float s, Reciprocal rc, float lo,
                                                     float hi, int32_t z) {
  for (int64_t i = 0; i < n; ++i)
    y[i] = static_cast<Q>(static_cast<int32_t>(saturate_round(divide_by_reciprocal(static_cast<float>(x[i]), s, rc), lo, hi)) + z);
}

SQ_AVX512_AVX2_CLONES void fake_quantize_span_multiplying(const float* x, float* y, int64_t n, float s, Reciprocal rc,
                                                          float lo, float hi) {
  for (int64_t i = 0; i < n; ++i) y[i] = saturate_round(divide_by_reciprocal(x[i], s, rc), lo, hi) * s;
}

// Float x into 8-bit codes: multiplying_code with one scale.
template <typename Q>
SQ_AVX512_AVX2_CLONES void quantize_span_to_bytes(const float* __restrict x, Q* __restrict y, int64_t n, float low,
                                                  float high, float s, float r, uint8_t z) {
  for (int64_t i = 0; i < n; ++i) y[i] = multiplying_code<Q>(x[i], low, high, s, r, z);
}

// a[i] op b[i] into 8-bit codes in one pass (quantize_combined_floats).
template <LaneQuantizer::Combine kOp, typename Q>
SQ_AVX512_AVX2_CLONES void combine_span_to_bytes(const float* __restrict a, const float* __restrict b, Q* __restrict y,
                                                 int64_t n, float low, float high, float s, float r, uint8_t z) {
  for (int64_t i = 0; i < n; ++i) {
    float v;
    if constexpr (kOp == LaneQuantizer::Combine::kAdd) v = a[i] + b[i];
    else if constexpr (kOp == LaneQuantizer::Combine::kSub) v = a[i] - b[i];
    else v = a[i] * b[i];
    y[i] = multiplying_code<Q>(v, low, high, s, r, z);
  }
}

template <typename X, typename Q>
void quantize_span(const X* x, Q* y, int64_t n, float s, float lo, float hi, int32_t z) {
  if (const auto rc = reciprocal_for(s, lo, hi)) {
    if constexpr (sizeof(Q) == 1 && std::is_same_v<X, float>)
      quantize_span_to_bytes(x, y, n, lo * s, hi * s, s, rc->r, static_cast<uint8_t>(z));
    else
      quantize_span_multiplying(x, y, n, s, *rc, lo, hi, z);
  } else {
    quantize_span_dividing(x, y, n, s, lo, hi, z);
  }
}

template <typename Q>
SQ_AVX512_AVX2_CLONES void dequantize_span(const Q* x, float* y, int64_t n, float s, int32_t z) {
  for (int64_t i = 0; i < n; ++i) y[i] = static_cast<float>(static_cast<int32_t>(x[i]) - z) * s;
}

void fake_quantize_span(const float* x, float* y, int64_t n, float s, float lo, float hi) {
  if (const auto rc = reciprocal_for(s, lo, hi)) fake_quantize_span_multiplying(x, y, n, s, *rc, lo, hi);
  else fake_quantize_span_dividing(x, y, n, s, lo, hi);
}

template <typename X, typename Q>
void quantize_typed(const X* x, Q* y, const BlockedParams& p) {
  constexpr int32_t kMin = lowest_code<Q>(), kMax = highest_code<Q>();
  const size_t nc = static_cast<size_t>(p.channels);
  std::vector<float> lo(nc), hi(nc);
  for (size_t c = 0; c < nc; ++c) {
    lo[c] = static_cast<float>(kMin - p.q.zero_point[c]);
    hi[c] = static_cast<float>(kMax - p.q.zero_point[c]);
  }
  for_each_block(p, [&](int64_t c, int64_t start, int64_t n) {
    const X* xs = x + start;
    Q* ys = y + start;
    if (c < 0) {
      const float* s = p.q.scale.data();
      const int32_t* z = p.q.zero_point.data();
      for (int64_t i = 0; i < n; ++i)
        ys[i] = static_cast<Q>(static_cast<int32_t>(quantize_offset(static_cast<float>(xs[i]), s[i], lo[i], hi[i])) + z[i]);
      return;
    }
    quantize_span(xs, ys, n, p.q.scale[c], lo[c], hi[c], p.q.zero_point[c]);
  });
}

template <typename Q>
void dequantize_typed(const Q* x, float* y, const BlockedParams& p) {
  for_each_block(p, [&](int64_t c, int64_t start, int64_t n) {
    const Q* xs = x + start;
    float* ys = y + start;
    if (c < 0) {
      const float* s = p.q.scale.data();
      const int32_t* z = p.q.zero_point.data();
      for (int64_t i = 0; i < n; ++i) ys[i] = static_cast<float>(static_cast<int32_t>(xs[i]) - z[i]) * s[i];
      return;
    }
    dequantize_span(xs, ys, n, p.q.scale[c], p.q.zero_point[c]);
  });
}

void fake_quantize_typed(const float* x, float* y, const BlockedParams& p, int32_t kMin, int32_t kMax) {
  const size_t nc = static_cast<size_t>(p.channels);
  std::vector<float> lo(nc), hi(nc);
  for (size_t c = 0; c < nc; ++c) {
    lo[c] = static_cast<float>(kMin - p.q.zero_point[c]);
    hi[c] = static_cast<float>(kMax - p.q.zero_point[c]);
  }
  for_each_block(p, [&](int64_t c, int64_t start, int64_t n) {
    const float* xs = x + start;
    float* ys = y + start;
    if (c < 0) {
      const float* s = p.q.scale.data();
      for (int64_t i = 0; i < n; ++i) ys[i] = quantize_offset(xs[i], s[i], lo[i], hi[i]) * s[i];
      return;
    }
    fake_quantize_span(xs, ys, n, p.q.scale[c], lo[c], hi[c]);
  });
}

// Rows of `lanes` floats (x_stride apart) into rows of codes (y_stride apart), lane l with the
// parameters at index l: one call per run of pixels, the lanes vectorised (restrict: byte stores
// could otherwise alias the parameters, which stops the vectoriser). For lanes whose quotient
// comes from a division (see reciprocal_for).
template <typename Q>
SQ_AVX512_AVX2_CLONES void quantize_lanes_dividing(const float* __restrict x, int64_t x_stride, Q* __restrict y,
                                                   int64_t y_stride, int64_t pixels, int64_t lanes,
                                                   const float* __restrict s, const float* __restrict lo,
                                                   const float* __restrict hi, const int32_t* __restrict z) {
  for (int64_t p = 0; p < pixels; ++p) {
    const float* xs = x + p * x_stride;
    Q* ys = y + p * y_stride;
    for (int64_t i = 0; i < lanes; ++i)
      ys[i] = static_cast<Q>(static_cast<int32_t>(quantize_offset(xs[i], s[i], lo[i], hi[i])) + z[i]);
  }
}

// The same for lanes whose quotient comes from the reciprocal (see multiplying_code).
template <typename Q>
SQ_AVX512_AVX2_CLONES void quantize_lanes_multiplying(const float* __restrict x, int64_t x_stride, Q* __restrict y,
                                                      int64_t y_stride, int64_t pixels, int64_t lanes,
                                                      const float* __restrict low, const float* __restrict high,
                                                      const float* __restrict s, const float* __restrict r,
                                                      const uint8_t* __restrict z) {
  for (int64_t p = 0; p < pixels; ++p) {
    const float* xs = x + p * x_stride;
    Q* ys = y + p * y_stride;
    for (int64_t i = 0; i < lanes; ++i) ys[i] = multiplying_code<Q>(xs[i], low[i], high[i], s[i], r[i], z[i]);
  }
}

template <LaneQuantizer::Combine kOp>
inline float combine(float a, float b) {
  if constexpr (kOp == LaneQuantizer::Combine::kAdd) return a + b;
  else if constexpr (kOp == LaneQuantizer::Combine::kSub) return a - b;
  else return a * b;
}

// quantize_lanes_multiplying of a op b, `rows` contiguous rows of row_len elements (whole tiles).
template <LaneQuantizer::Combine kOp, typename Q>
SQ_AVX512_AVX2_CLONES void combine_lanes_multiplying(const float* __restrict a, const float* __restrict b,
                                                     Q* __restrict y, int64_t rows, int64_t row_len,
                                                     const float* __restrict low, const float* __restrict high,
                                                     const float* __restrict s, const float* __restrict r,
                                                     const uint8_t* __restrict z) {
  for (int64_t p = 0; p < rows; ++p) {
    const float* as = a + p * row_len;
    const float* bs = b + p * row_len;
    Q* ys = y + p * row_len;
    for (int64_t i = 0; i < row_len; ++i)
      ys[i] = multiplying_code<Q>(combine<kOp>(as[i], bs[i]), low[i], high[i], s[i], r[i], z[i]);
  }
}

template <typename Q> inline constexpr bool kIsQuantType =
    std::is_same_v<Q, uint8_t> || std::is_same_v<Q, int8_t> || std::is_same_v<Q, uint16_t> || std::is_same_v<Q, int16_t>;

}  // namespace

LaneQuantizer::LaneQuantizer(const QuantParam& q, int64_t channels)
    : dtype_(q.dtype), tiled_(std::make_shared<TiledCache>()) {
  static std::atomic<uint64_t> next_id{1};
  id_ = next_id++;
  SQ_CHECK((dtype_ == DType::kUInt8 || dtype_ == DType::kInt8) &&
               (static_cast<int64_t>(q.scale.size()) == channels || q.scale.size() == 1) &&
               q.zero_point.size() == q.scale.size(),
           ErrorKind::kInternal, "LaneQuantizer: bad parameters");
  multiplying_ = true;
  for (int64_t c = 0; c < channels; ++c) {
    const size_t k = q.scale.size() == 1 ? 0 : static_cast<size_t>(c);
    const float s = q.scale[k];
    const auto [lo, hi] = offset_range(dtype_, q.zero_point[k]);
    scale_.push_back(s);
    lo_.push_back(lo);
    hi_.push_back(hi);
    zero_point_.push_back(q.zero_point[k]);
    zero_byte_.push_back(static_cast<uint8_t>(q.zero_point[k]));
    const auto rc = reciprocal_for(s, lo, hi);
    multiplying_ = multiplying_ && rc.has_value();
    reciprocal_.push_back(rc ? rc->r : 0.f);
    low_.push_back(lo * s);
    high_.push_back(hi * s);
  }
}

namespace {

// The lane parameters of the quantizer's multiplying or dividing loop, from lane `first` on.
struct LaneParams {
  const float *s, *r, *low, *high, *lo, *hi;
  const int32_t* z;
  const uint8_t* z_byte;
};

template <typename Q>
void quantize_lane_rows(bool multiplying, const LaneParams& p, const float* x, int64_t x_stride, Q* y,
                        int64_t y_stride, int64_t pixels, int64_t lanes) {
  if (multiplying)
    quantize_lanes_multiplying(x, x_stride, y, y_stride, pixels, lanes, p.low, p.high, p.s, p.r,
                               p.z_byte);
  else
    quantize_lanes_dividing(x, x_stride, y, y_stride, pixels, lanes, p.s, p.lo, p.hi, p.z);
}

}  // namespace

struct LaneQuantizer::TiledParams {
  size_t first = 0;
  int64_t lanes = 0, repeats = 0;
  bool tiles(size_t f, int64_t l, int64_t r) const { return first == f && lanes == l && repeats == r; }
  std::vector<float> s, r, low, high, lo, hi;
  std::vector<int32_t> z;
  std::vector<uint8_t> z_byte;
};

struct LaneQuantizer::TiledCache {
  std::mutex mutex;
  std::vector<std::unique_ptr<const TiledParams>> entries;  // a plan uses one or two channel ranges
};

const LaneQuantizer::TiledParams& LaneQuantizer::tiled_params(size_t first, int64_t lanes, int64_t repeats) const {
  // The rows of one plane ask for the same block again and again: a thread remembers its last
  // answer and takes no lock for it (ids are never reused, so a match is this live quantizer).
  struct Last {
    uint64_t id = 0;
    const TiledParams* params = nullptr;
  };
  thread_local Last last;
  if (last.id == id_ && last.params->tiles(first, lanes, repeats)) return *last.params;
  std::lock_guard lock(tiled_->mutex);
  auto remember = [&](const TiledParams& t) -> const TiledParams& {
    last = {id_, &t};
    return t;
  };
  for (const auto& e : tiled_->entries)
    if (e->tiles(first, lanes, repeats)) return remember(*e);
  auto t = std::make_unique<TiledParams>();
  t->first = first;
  t->lanes = lanes;
  t->repeats = repeats;
  auto tile = [&](const auto& per_channel, auto& out) {
    out.reserve(static_cast<size_t>(repeats * lanes));
    for (int64_t k = 0; k < repeats; ++k)
      out.insert(out.end(), per_channel.begin() + static_cast<std::ptrdiff_t>(first),
                 per_channel.begin() + static_cast<std::ptrdiff_t>(first) + lanes);
  };
  tile(scale_, t->s);
  tile(reciprocal_, t->r);
  tile(low_, t->low);
  tile(high_, t->high);
  tile(lo_, t->lo);
  tile(hi_, t->hi);
  tile(zero_point_, t->z);
  tile(zero_byte_, t->z_byte);
  tiled_->entries.push_back(std::move(t));
  return remember(*tiled_->entries.back());
}

template <typename Fn>
void LaneQuantizer::with_lane_params(size_t first, int64_t lanes, int64_t repeats, Fn&& fn) const {
  if (repeats == 1) {
    fn(LaneParams{&scale_[first], &reciprocal_[first], &low_[first], &high_[first], &lo_[first], &hi_[first],
                  &zero_point_[first], &zero_byte_[first]});
    return;
  }
  const TiledParams& t = tiled_params(first, lanes, repeats);
  fn(LaneParams{t.s.data(), t.r.data(), t.low.data(), t.high.data(), t.lo.data(), t.hi.data(), t.z.data(),
                t.z_byte.data()});
}

void LaneQuantizer::quantize(const float* x, int64_t x_stride, int64_t pixels, int64_t first_channel, int64_t lanes,
                             void* y, int64_t y_stride) const {
  const size_t c = static_cast<size_t>(first_channel);
  auto run = [&](const LaneParams& params, int64_t stride_x, int64_t stride_y, int64_t rows, int64_t row_lanes) {
    if (dtype_ == DType::kUInt8)
      quantize_lane_rows(multiplying_, params, x, stride_x, static_cast<uint8_t*>(y), stride_y, rows, row_lanes);
    else
      quantize_lane_rows(multiplying_, params, x, stride_x, static_cast<int8_t*>(y), stride_y, rows, row_lanes);
  };
  // Contiguous rows: the parameters repeated over a tile of pixels (see pixels_per_tile), so the
  // vectorised loop covers whole tiles (a row of 24 or 96 lanes alone would leave a scalar tail of
  // up to 63 elements per pixel).
  if (x_stride == lanes && y_stride == lanes) {
    const int64_t tile = pixels_per_tile(lanes);
    if (pixels >= tile) {
      const int64_t tiles = pixels / tile, tile_len = tile * lanes;
      with_lane_params(c, lanes, tile, [&](const LaneParams& p) { run(p, tile_len, tile_len, tiles, tile_len); });
      x += tiles * tile_len;
      y = static_cast<std::byte*>(y) + tiles * tile_len;
      pixels -= tiles * tile;
      if (pixels == 0) return;
    }
  }
  with_lane_params(c, lanes, 1, [&](const LaneParams& p) { run(p, x_stride, y_stride, pixels, lanes); });
}

void LaneQuantizer::quantize_combined(Combine op, const float* a, const float* b, int64_t pixels,
                                      int64_t first_channel, int64_t lanes, void* y) const {
  const size_t c = static_cast<size_t>(first_channel);
  const int64_t tile = pixels_per_tile(lanes);
  const int64_t tiles = multiplying_ ? pixels / tile : 0, tile_len = tile * lanes;
  if (tiles > 0) {
    with_lane_params(c, lanes, tile, [&](const LaneParams& p) {
      auto run = [&](auto op_tag, auto* out) {
        combine_lanes_multiplying<decltype(op_tag)::value>(a, b, out, tiles, tile_len, p.low, p.high, p.s, p.r,
                                                           p.z_byte);
      };
      auto with_op = [&](auto* out) {
        if (op == Combine::kAdd) run(std::integral_constant<Combine, Combine::kAdd>{}, out);
        else if (op == Combine::kSub) run(std::integral_constant<Combine, Combine::kSub>{}, out);
        else run(std::integral_constant<Combine, Combine::kMul>{}, out);
      };
      if (dtype_ == DType::kUInt8) with_op(static_cast<uint8_t*>(y));
      else with_op(static_cast<int8_t*>(y));
    });
    a += tiles * tile_len;
    b += tiles * tile_len;
    y = static_cast<std::byte*>(y) + tiles * tile_len;
    pixels -= tiles * tile;
    if (pixels == 0) return;
  }
  // A tail of pixels, or lanes that divide: the op into a buffer, then quantize() it.
  thread_local std::vector<float> combined;
  const size_t n = static_cast<size_t>(pixels * lanes);
  if (combined.size() < n) combined.resize(n);
  auto fill = [&](auto op_tag) {
    for (size_t i = 0; i < n; ++i) combined[i] = combine<decltype(op_tag)::value>(a[i], b[i]);
  };
  if (op == Combine::kAdd) fill(std::integral_constant<Combine, Combine::kAdd>{});
  else if (op == Combine::kSub) fill(std::integral_constant<Combine, Combine::kSub>{});
  else fill(std::integral_constant<Combine, Combine::kMul>{});
  quantize(combined.data(), lanes, pixels, first_channel, lanes, y, lanes);
}

void quantize_floats(const float* x, int64_t n, float scale, int32_t zero_point, DType type, void* y) {
  if (type == DType::kUInt8) {
    const auto [lo, hi] = offset_range<uint8_t>(zero_point);
    quantize_span(x, static_cast<uint8_t*>(y), n, scale, lo, hi, zero_point);
  } else if (type == DType::kInt8) {
    const auto [lo, hi] = offset_range<int8_t>(zero_point);
    quantize_span(x, static_cast<int8_t*>(y), n, scale, lo, hi, zero_point);
  } else {
    fail(ErrorKind::kInternal, std::string("quantize_floats: unsupported type ") + dtype_name(type));
  }
}

namespace {
template <typename Q>
bool combine_to_codes(LaneQuantizer::Combine op, const float* a, const float* b, int64_t n, float scale,
                      int32_t zero_point, Q* y) {
  const auto [lo, hi] = offset_range<Q>(zero_point);
  const auto rc = reciprocal_for(scale, lo, hi);
  if (!rc) return false;
  const auto z = static_cast<uint8_t>(zero_point);
  switch (op) {
    case LaneQuantizer::Combine::kAdd:
      combine_span_to_bytes<LaneQuantizer::Combine::kAdd>(a, b, y, n, lo * scale, hi * scale, scale, rc->r, z);
      break;
    case LaneQuantizer::Combine::kSub:
      combine_span_to_bytes<LaneQuantizer::Combine::kSub>(a, b, y, n, lo * scale, hi * scale, scale, rc->r, z);
      break;
    case LaneQuantizer::Combine::kMul:
      combine_span_to_bytes<LaneQuantizer::Combine::kMul>(a, b, y, n, lo * scale, hi * scale, scale, rc->r, z);
      break;
  }
  return true;
}
}  // namespace

bool quantize_combined_floats(LaneQuantizer::Combine op, const float* a, const float* b, int64_t n, float scale,
                              int32_t zero_point, DType type, void* y) {
  if (type == DType::kUInt8) return combine_to_codes(op, a, b, n, scale, zero_point, static_cast<uint8_t*>(y));
  if (type == DType::kInt8) return combine_to_codes(op, a, b, n, scale, zero_point, static_cast<int8_t*>(y));
  return false;
}

#if defined(__x86_64__) && defined(__GNUC__)
// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*(), which
// -Wmaybe-uninitialized reports once they are inlined (as in int8_depthwise.cpp).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
namespace {
// multiplying_code of (h op f) or (f op h), h widened from half precision, 16 lanes at a time: the
// same float operations, so the same codes (the code's low byte plus z, wrapped, is the u8 or s8
// byte).
template <LaneQuantizer::Combine kOp, bool kHalvesFirst>
__attribute__((target("avx512f,avx512bw,avx512vl"))) inline void combine_halves_lanes(
    const uint16_t* halves, const float* floats, uint8_t* y, __mmask16 m, __m512 lo, __m512 hi, __m512 s, __m512 r,
    __m512i z) {
  const __m512 h = _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(m, halves));
  const __m512 f = _mm512_maskz_loadu_ps(m, floats);
  const __m512 first = kHalvesFirst ? h : f, second = kHalvesFirst ? f : h;
  __m512 v;
  if constexpr (kOp == LaneQuantizer::Combine::kAdd) v = _mm512_add_ps(first, second);
  else if constexpr (kOp == LaneQuantizer::Combine::kSub) v = _mm512_sub_ps(first, second);
  else v = _mm512_mul_ps(first, second);
  v = _mm512_min_ps(_mm512_max_ps(v, lo), hi);  // max gives lo for NaN, as v > low ? v : low does
  const __m512 q = _mm512_mul_ps(v, r);
  const __m512 quotient = _mm512_fmadd_ps(_mm512_fnmadd_ps(q, s, v), r, q);
  const __m512i bits = _mm512_add_epi32(
      _mm512_castps_si512(_mm512_add_ps(quotient, _mm512_set1_ps(quant_math::kRoundHalfEvenMagic))), z);
  _mm_mask_storeu_epi8(y, m, _mm512_cvtepi32_epi8(bits));
}

template <LaneQuantizer::Combine kOp, bool kHalvesFirst>
__attribute__((target("avx512f,avx512bw,avx512vl"))) void combine_halves_to_bytes(
    const uint16_t* halves, const float* floats, uint8_t* y, int64_t n, float low, float high, float s, float r,
    uint8_t z) {
  const __m512 lo = _mm512_set1_ps(low), hi = _mm512_set1_ps(high), vs = _mm512_set1_ps(s), vr = _mm512_set1_ps(r);
  const __m512i vz = _mm512_set1_epi32(z);
  int64_t i = 0;
  for (; i + 16 <= n; i += 16)
    combine_halves_lanes<kOp, kHalvesFirst>(halves + i, floats + i, y + i, 0xFFFF, lo, hi, vs, vr, vz);
  if (i < n)
    combine_halves_lanes<kOp, kHalvesFirst>(halves + i, floats + i, y + i, static_cast<__mmask16>((1u << (n - i)) - 1u),
                                            lo, hi, vs, vr, vz);
}

template <LaneQuantizer::Combine kOp>
void combine_halves_either_side(const uint16_t* halves, const float* floats, bool halves_first, uint8_t* y, int64_t n,
                                float low, float high, float s, float r, uint8_t z) {
  if (halves_first) combine_halves_to_bytes<kOp, true>(halves, floats, y, n, low, high, s, r, z);
  else combine_halves_to_bytes<kOp, false>(halves, floats, y, n, low, high, s, r, z);
}
}  // namespace
#pragma GCC diagnostic pop
#endif

bool quantize_combined_with_halves(LaneQuantizer::Combine op, const uint16_t* halves, const float* floats,
                                   bool halves_first, int64_t n, float scale, int32_t zero_point, DType type, void* y) {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool avx512 = __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
                             __builtin_cpu_supports("avx512vl");
  if (!avx512 || (type != DType::kUInt8 && type != DType::kInt8)) return false;
  const auto [lo, hi] = offset_range(type, zero_point);
  const auto rc = reciprocal_for(scale, lo, hi);
  if (!rc) return false;
  auto* out = static_cast<uint8_t*>(y);
  const auto z = static_cast<uint8_t>(zero_point);
  switch (op) {
    case LaneQuantizer::Combine::kAdd:
      combine_halves_either_side<LaneQuantizer::Combine::kAdd>(halves, floats, halves_first, out, n, lo * scale,
                                                               hi * scale, scale, rc->r, z);
      break;
    case LaneQuantizer::Combine::kSub:
      combine_halves_either_side<LaneQuantizer::Combine::kSub>(halves, floats, halves_first, out, n, lo * scale,
                                                               hi * scale, scale, rc->r, z);
      break;
    case LaneQuantizer::Combine::kMul:
      combine_halves_either_side<LaneQuantizer::Combine::kMul>(halves, floats, halves_first, out, n, lo * scale,
                                                               hi * scale, scale, rc->r, z);
      break;
  }
  return true;
#else
  (void)op, (void)halves, (void)floats, (void)halves_first, (void)n, (void)scale, (void)zero_point, (void)type, (void)y;
  return false;
#endif
}

std::optional<FoldedQuantize> folded_quantize(const ir::Node& node) {
  if (!node.attrs.count(kFoldedQuantizeScale)) return std::nullopt;
  FoldedQuantize f;
  const float scale = node.attr_float(kFoldedQuantizeScale, 1.f);
  const auto zero_point = static_cast<int32_t>(node.attr_int(kFoldedQuantizeZeroPoint, 0));
  const int64_t type = node.attr_int(kFoldedQuantizeType, 2);
  f.dtype = type == 3 ? DType::kInt8 : DType::kUInt8;
  f.scale = {scale};
  f.zero_point = {zero_point};
  if ((type != 2 && type != 3) || !(scale > 0.f) || !std::isfinite(scale) || zero_point < f.qmin() ||
      zero_point > f.qmax())
    fail(ErrorKind::kInvalidModel, node.describe() + ": invalid folded QuantizeLinear attributes");
  return f;
}

void write_folded_quantize(ir::Node& node, const FoldedQuantize& q) {
  node.attrs[kFoldedQuantizeScale] = q.scale.at(0);
  node.attrs[kFoldedQuantizeZeroPoint] = static_cast<int64_t>(q.zero_point.at(0));
  node.attrs[kFoldedQuantizeType] = static_cast<int64_t>(q.dtype);
}

std::optional<FoldedChannelQuantize> folded_channel_quantize(const ir::Node& node) {
  if (!node.attrs.count(kFoldedQuantizeChannelScale)) return std::nullopt;
  FoldedChannelQuantize f;
  f.scale = node.attr_floats(kFoldedQuantizeChannelScale);
  const std::vector<int64_t> zero_points = node.attr_ints(kFoldedQuantizeChannelZeroPoint);
  const int64_t type = node.attr_int(kFoldedQuantizeType, 2);
  f.dtype = type == 3 ? DType::kInt8 : DType::kUInt8;
  f.axis = node.attr_int(kFoldedQuantizeAxis, 1);
  const int64_t lo = f.dtype == DType::kUInt8 ? 0 : -128, hi = f.dtype == DType::kUInt8 ? 255 : 127;
  bool valid = (type == 2 || type == 3) && f.axis >= 0 && !f.scale.empty() && zero_points.size() == f.scale.size();
  for (size_t c = 0; valid && c < f.scale.size(); ++c)
    valid = f.scale[c] > 0.f && std::isfinite(f.scale[c]) && zero_points[c] >= lo && zero_points[c] <= hi;
  if (!valid) fail(ErrorKind::kInvalidModel, node.describe() + ": invalid folded per-channel QuantizeLinear attributes");
  f.zero_point.assign(zero_points.begin(), zero_points.end());
  return f;
}

void write_folded_channel_quantize(ir::Node& node, const FoldedChannelQuantize& q) {
  node.attrs[kFoldedQuantizeChannelScale] = q.scale;
  node.attrs[kFoldedQuantizeChannelZeroPoint] = std::vector<int64_t>(q.zero_point.begin(), q.zero_point.end());
  node.attrs[kFoldedQuantizeType] = static_cast<int64_t>(q.dtype);
  node.attrs[kFoldedQuantizeAxis] = q.axis;
}

std::vector<FoldedDequantize> folded_dequantize(const ir::Node& node) {
  if (!node.attrs.count(kFoldedDequantizeInputs)) return {};
  const std::vector<int64_t> inputs = node.attr_ints(kFoldedDequantizeInputs);
  const std::vector<float> scales = node.attr_floats(kFoldedDequantizeScales);
  const std::vector<int64_t> zero_points = node.attr_ints(kFoldedDequantizeZeroPoints);
  bool valid = scales.size() == inputs.size() && zero_points.size() == inputs.size();
  std::vector<FoldedDequantize> folded;
  for (size_t k = 0; valid && k < inputs.size(); ++k) {
    valid = inputs[k] >= 0 && static_cast<size_t>(inputs[k]) < node.inputs.size() && scales[k] > 0.f &&
            std::isfinite(scales[k]) && zero_points[k] >= -128 && zero_points[k] <= 255;
    for (const FoldedDequantize& f : folded) valid = valid && f.input != static_cast<size_t>(inputs[k]);
    if (valid) folded.push_back({static_cast<size_t>(inputs[k]), scales[k], static_cast<int32_t>(zero_points[k])});
  }
  if (!valid) fail(ErrorKind::kInvalidModel, node.describe() + ": invalid folded DequantizeLinear attributes");
  std::sort(folded.begin(), folded.end(), [](const auto& a, const auto& b) { return a.input < b.input; });
  return folded;
}

void add_folded_dequantize(ir::Node& node, const FoldedDequantize& d) {
  std::vector<int64_t> inputs = node.attr_ints(kFoldedDequantizeInputs);
  std::vector<float> scales = node.attr_floats(kFoldedDequantizeScales);
  std::vector<int64_t> zero_points = node.attr_ints(kFoldedDequantizeZeroPoints);
  inputs.push_back(static_cast<int64_t>(d.input));
  scales.push_back(d.scale);
  zero_points.push_back(d.zero_point);
  node.attrs[kFoldedDequantizeInputs] = std::move(inputs);
  node.attrs[kFoldedDequantizeScales] = std::move(scales);
  node.attrs[kFoldedDequantizeZeroPoints] = std::move(zero_points);
}

void dequantize_codes(const void* codes, DType type, int64_t n, float scale, int32_t zero_point, float* y) {
  if (type == DType::kUInt8) dequantize_span(static_cast<const uint8_t*>(codes), y, n, scale, zero_point);
  else dequantize_span(static_cast<const int8_t*>(codes), y, n, scale, zero_point);
}

void check_folded_codes(const Tensor& codes, const FoldedDequantize& d, const std::string& who) {
  const bool u8 = codes.dtype() == DType::kUInt8;
  SQ_CHECK((u8 || codes.dtype() == DType::kInt8) && d.zero_point >= (u8 ? 0 : -128) && d.zero_point <= (u8 ? 255 : 127),
           ErrorKind::kInvalidArgument,
           who + ": input " + std::to_string(d.input) + " (a folded DequantizeLinear's codes) has dtype " +
               dtype_name(codes.dtype()) + " and zero point " + std::to_string(d.zero_point) +
               " (uint8 or int8 codes, with a zero point of that type)");
}

Tensor dequantized(const Tensor& codes, const FoldedDequantize& d, const std::string& who) {
  check_folded_codes(codes, d, who);
  Tensor zero_point(codes.dtype(), {});
  if (codes.dtype() == DType::kUInt8) zero_point.data<uint8_t>()[0] = static_cast<uint8_t>(d.zero_point);
  else zero_point.data<int8_t>()[0] = static_cast<int8_t>(d.zero_point);
  Tensor y(DType::kFloat32, codes.shape());
  dequantize_linear(codes, Tensor::scalar<float>(d.scale), &zero_point, 1, y, who);
  return y;
}

void quantize_linear(const Tensor& x, const Tensor& scale, const Tensor* zero_point, int64_t axis, Tensor& y,
                     const std::string& who) {
  const DType qtype = zero_point ? zero_point->dtype() : DType::kUInt8;
  const BlockedParams p = quant_params(x, scale, zero_point, axis, qtype, who);
  SQ_CHECK(y.dtype() == qtype && y.shape() == x.shape(), ErrorKind::kInternal,
           who + ": output must be " + dtype_name(qtype) + " " + shape_str(x.shape()));
  dispatch_dtype(qtype, [&](auto qtag) {
    using Q = decltype(qtag);
    if constexpr (kIsQuantType<Q>) {
      if (x.dtype() == DType::kFloat32) quantize_typed(x.data<float>(), y.data<Q>(), p);
      else if (x.dtype() == DType::kInt32) quantize_typed(x.data<int32_t>(), y.data<Q>(), p);
      else fail(ErrorKind::kUnsupported, who + ": input dtype " + dtype_name(x.dtype()) + " is not supported (float32, int32)");
    } else {
      fail(ErrorKind::kUnsupported, who + ": quantized dtype " + dtype_name(qtype) +
                                        " is not supported (uint8, int8, uint16, int16)");
    }
  });
}

void dequantize_linear(const Tensor& x, const Tensor& scale, const Tensor* zero_point, int64_t axis, Tensor& y,
                       const std::string& who) {
  if (zero_point)
    SQ_CHECK(zero_point->dtype() == x.dtype(), ErrorKind::kInvalidArgument,
             who + ": zero point dtype " + dtype_name(zero_point->dtype()) + " differs from input dtype " +
                 dtype_name(x.dtype()));
  const BlockedParams p = quant_params(x, scale, zero_point, axis, x.dtype(), who);
  SQ_CHECK(y.dtype() == DType::kFloat32 && y.shape() == x.shape(), ErrorKind::kInternal,
           who + ": output must be float32 " + shape_str(x.shape()));
  dispatch_dtype(x.dtype(), [&](auto qtag) {
    using Q = decltype(qtag);
    if constexpr (kIsQuantType<Q>) {
      dequantize_typed(x.data<Q>(), y.data<float>(), p);
    } else if constexpr (std::is_same_v<Q, int32_t>) {
      for (int32_t z : p.q.zero_point)
        SQ_CHECK(z == 0, ErrorKind::kInvalidArgument, who + ": int32 input needs a zero point of 0, got " + std::to_string(z));
      dequantize_typed(x.data<int32_t>(), y.data<float>(), p);
    } else {
      fail(ErrorKind::kUnsupported, who + ": input dtype " + dtype_name(x.dtype()) +
                                        " is not supported (uint8, int8, uint16, int16, int32)");
    }
  });
}

namespace {
// Blocked DequantizeLinear (opset 21, block_size B > 0): scale (and zero point) have x's rank, with
// dim `axis` ceil(x.dim(axis) / B) and the others equal to x's; y[..., k, ...] = (x - z) * s at
// [..., k / B, ...]. The last block may be shorter than B. Codes are int8 / uint8 (also what INT4 /
// UINT4 initializers are held as).
template <typename Q>
void dequantize_blocked_typed(const Q* x, const float* s, const Q* z, float* y, int64_t outer, int64_t k, int64_t inner,
                              int64_t block) {
  const int64_t kb = (k + block - 1) / block;
  ew::parallel_range(outer * k, [&](int64_t r0, int64_t r1) {
    for (int64_t r = r0; r < r1; ++r) {
      const int64_t o = r / k, kk = r % k;
      const float* sr = s + (o * kb + kk / block) * inner;
      const Q* zr = z ? z + (o * kb + kk / block) * inner : nullptr;
      const Q* xr = x + r * inner;
      float* yr = y + r * inner;
      if (zr)
        for (int64_t i = 0; i < inner; ++i) yr[i] = static_cast<float>(int32_t{xr[i]} - int32_t{zr[i]}) * sr[i];
      else
        for (int64_t i = 0; i < inner; ++i) yr[i] = static_cast<float>(xr[i]) * sr[i];
    }
  });
}
}  // namespace

static void dequantize_blocked(const Tensor& x, const Tensor& scale, const Tensor* zero_point, int64_t axis,
                               int64_t block, Tensor& y, const std::string& who) {
  SQ_CHECK(scale.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument,
           who + ": scale must be float32, got " + dtype_name(scale.dtype()));
  SQ_CHECK(x.dtype() == DType::kInt8 || x.dtype() == DType::kUInt8, ErrorKind::kUnsupported,
           who + ": blocked dequantization of " + dtype_name(x.dtype()) + " is not supported (int4, uint4, int8, uint8)");
  SQ_CHECK(block > 0, ErrorKind::kInvalidModel, who + ": block_size must be positive, got " + std::to_string(block));
  const int64_t rank = static_cast<int64_t>(x.rank());
  SQ_CHECK(rank >= 1, ErrorKind::kInvalidModel, who + ": blocked dequantization needs an input of rank 1 or more");
  const int64_t ax = normalize_axis(axis, rank, who);
  Shape want = x.shape();
  want[static_cast<size_t>(ax)] = (x.dim(ax) + block - 1) / block;
  SQ_CHECK(scale.shape() == want, ErrorKind::kInvalidModel,
           who + ": with block_size " + std::to_string(block) + " on axis " + std::to_string(ax) + " of input " +
               shape_str(x.shape()) + " the scale must have shape " + shape_str(want) + ", got " + shape_str(scale.shape()));
  if (zero_point)
    SQ_CHECK(zero_point->dtype() == x.dtype() && zero_point->shape() == want, ErrorKind::kInvalidModel,
             who + ": the zero point must be " + dtype_name(x.dtype()) + " " + shape_str(want) + ", got " +
                 dtype_name(zero_point->dtype()) + " " + shape_str(zero_point->shape()));
  int64_t outer = 1, inner = 1;
  for (int64_t d = 0; d < ax; ++d) outer *= x.dim(d);
  for (int64_t d = ax + 1; d < rank; ++d) inner *= x.dim(d);
  if (x.dtype() == DType::kInt8)
    dequantize_blocked_typed(x.data<int8_t>(), scale.data<float>(), zero_point ? zero_point->data<int8_t>() : nullptr,
                             y.data<float>(), outer, x.dim(ax), inner, block);
  else
    dequantize_blocked_typed(x.data<uint8_t>(), scale.data<float>(), zero_point ? zero_point->data<uint8_t>() : nullptr,
                             y.data<float>(), outer, x.dim(ax), inner, block);
}

void fake_quantize_linear(const Tensor& x, const Tensor& scale, const Tensor* zero_point, int64_t axis, DType qtype,
                          Tensor& y, const std::string& who) {
  SQ_CHECK(x.dtype() == DType::kFloat32, ErrorKind::kUnsupported,
           who + ": input dtype " + dtype_name(x.dtype()) + " is not supported (float32)");
  SQ_CHECK(y.dtype() == DType::kFloat32 && y.shape() == x.shape(), ErrorKind::kInternal,
           who + ": output must be float32 " + shape_str(x.shape()));
  const BlockedParams p = quant_params(x, scale, zero_point, axis, qtype, who);
  dispatch_dtype(qtype, [&](auto qtag) {
    using Q = decltype(qtag);
    if constexpr (kIsQuantType<Q>) {
      fake_quantize_typed(x.data<float>(), y.data<float>(), p, lowest_code<Q>(), highest_code<Q>());
    } else {
      fail(ErrorKind::kUnsupported, who + ": quantized dtype " + dtype_name(qtype) + " is not supported");
    }
  });
}

namespace ew {
namespace {

// Shared by both ops: the axis attribute (opset 13+) and per-axis parameters only from 13.
struct QdqAttrs {
  int64_t axis = 1;
  bool per_axis_allowed = true;
  int64_t block_size = 0;  // DequantizeLinear (opset 21): blocked scales
};

QdqAttrs qdq_attrs(const KernelInit& init, bool blocks_allowed) {
  reject_fused_activation(init.node);
  QdqAttrs a;
  a.per_axis_allowed = init.opset >= 13;
  a.axis = init.node.attr_int("axis", 1);
  a.block_size = init.node.attr_int("block_size", 0);
  if (a.block_size != 0 && !blocks_allowed)
    fail(ErrorKind::kUnsupported, init.node.describe() + ": blocked quantization (block_size) is not supported");
  if (a.block_size < 0)
    fail(ErrorKind::kInvalidModel, init.node.describe() + ": block_size must not be negative, got " +
                                       std::to_string(a.block_size));
  if (init.node.attr_int("output_dtype", 0) != 0)
    fail(ErrorKind::kUnsupported, init.node.describe() + ": output_dtype (opset 21) is not supported");
  return a;
}

void check_per_axis(const ir::Node& node, const QdqAttrs& a, const Tensor& scale) {
  if (!a.per_axis_allowed && scale.numel() != 1)
    fail(ErrorKind::kInvalidModel, node.describe() + ": per-axis scales (shape " + shape_str(scale.shape()) +
                                       ") need opset 13 or later");
}

// Byte planes [c][pixels] -> channels-last [pixels][c]. With the channel count a constant the
// compiler vectorises the gather (AVX2: 0.074 ms for 3x640x640; 0.74 ms with a run-time count, and
// oneDNN 2.6's reorder takes 0.45 ms).
template <int C>
SQ_AVX2_CLONES void interleave_byte_planes(const uint8_t* __restrict x, int64_t pixels, uint8_t* __restrict y) {
  for (int64_t p = 0; p < pixels; ++p)
    for (int c = 0; c < C; ++c) y[p * C + c] = x[c * pixels + p];
}

class QuantizeLinearKernel final : public Kernel {
 public:
  explicit QuantizeLinearKernel(const KernelInit& init) : node_(init.node), attrs_(qdq_attrs(init, false)) {}
  void run(KernelContext& ctx) override {
    const Tensor& scale = ctx.input(1);
    const Tensor* zp = ctx.optional_input(2);
    check_per_axis(node_, attrs_, scale);
    if (ctx.input_layout(0) && run_channel_blocked(ctx, scale, zp)) return;
    if (!ctx.input_layout(0) && run_image_to_channels_last(ctx, scale, zp)) return;
    const Tensor x = channel_blocked::plain_input(ctx, 0);
    Tensor& y = ctx.allocate_output(0, zp ? zp->dtype() : DType::kUInt8, x.shape());
    quantize_linear(x, scale, zp, attrs_.axis, y, node_.describe());
  }

 private:
  // 2 to this many channels: an image, whose plain codes the reading int8 convolution would
  // reorder to channels-last itself, slowly (see interleave_byte_planes).
  static constexpr int64_t kMaxImageChannels = 4;

  // A plain float32 image [N, C, H, W] (C <= kMaxImageChannels) whose readers take blocked
  // layouts: quantized as usual, then written channels-last, the layout the int8 convolutions
  // compute in; false (nothing written) otherwise.
  bool run_image_to_channels_last(KernelContext& ctx, const Tensor& scale, const Tensor* zp) {
    const Tensor& x = ctx.input(0);
    const DType qtype = zp ? zp->dtype() : DType::kUInt8;
    if (!ctx.output_layout_allowed(0) || x.dtype() != DType::kFloat32 || x.rank() != 4 || x.dim(1) < 2 ||
        x.dim(1) > kMaxImageChannels || x.dim(2) * x.dim(3) < 2 || (qtype != DType::kUInt8 && qtype != DType::kInt8))
      return false;
    if (!planes_.defined() || planes_.shape() != x.shape() || planes_.dtype() != qtype) planes_ = Tensor(qtype, x.shape());
    quantize_linear(x, scale, zp, attrs_.axis, planes_, node_.describe());
    Tensor& y = ctx.allocate_output(0, qtype, x.shape());
    const int64_t pixels = x.dim(2) * x.dim(3), sample = x.dim(1) * pixels;
    for (int64_t n = 0; n < x.dim(0); ++n) {
      const auto* from = static_cast<const uint8_t*>(planes_.raw()) + n * sample;
      auto* to = static_cast<uint8_t*>(y.raw()) + n * sample;
      switch (x.dim(1)) {
        case 2: interleave_byte_planes<2>(from, pixels, to); break;
        case 3: interleave_byte_planes<3>(from, pixels, to); break;
        default: interleave_byte_planes<4>(from, pixels, to); break;
      }
    }
    const dnnl::memory::desc channels_last(to_dnnl_dims(x.shape()), to_dnnl_type(qtype),
                                           dnnl::memory::format_tag::acdb);
    ctx.set_output_layout(0, std::make_shared<const Layout>(Layout{channels_last}));
    return true;
  }

  // A channel-blocked float32 x quantized per channel (axis 1) or per tensor into u8 / s8 in the
  // same layout, pixel row by pixel row; false (nothing written) for other cases.
  bool run_channel_blocked(KernelContext& ctx, const Tensor& scale, const Tensor* zp) {
    const Tensor& x = ctx.input(0);
    const Layout& layout = *ctx.input_layout(0);
    const std::optional<channel_blocked::Blocking> blocking = channel_blocked::blocking_of(layout);
    const DType qtype = zp ? zp->dtype() : DType::kUInt8;
    if (!blocking || !ctx.output_layout_allowed(0) || x.dtype() != DType::kFloat32 || x.rank() != 4 ||
        (qtype != DType::kUInt8 && qtype != DType::kInt8) || scale.dtype() != DType::kFloat32 ||
        (zp && zp->numel() != scale.numel()))
      return false;
    const bool per_channel = scale.numel() != 1;
    if (per_channel && (scale.rank() != 1 || scale.dim(0) != x.dim(1) || (attrs_.axis != 1 && attrs_.axis != -3)))
      return false;
    QuantParam q;
    q.dtype = qtype;
    q.scale = scale.to_float_vector();
    if (zp)
      for (int64_t z : zp->to_int64_vector()) q.zero_point.push_back(static_cast<int32_t>(z));
    else
      q.zero_point.assign(q.scale.size(), 0);
    const LaneQuantizer quantizer(q, x.dim(1));
    Tensor& y = ctx.allocate_output(0, qtype, x.shape());
    const channel_blocked::View v(x.shape(), *blocking);
    const float* px = x.data<float>();
    auto* py = static_cast<std::byte*>(y.raw());  // 1-byte codes
    const int64_t pixels = v.pixels(), b = v.block;
    ew::parallel_range(v.n * v.blocks() * pixels, [&](int64_t begin, int64_t end) {
      while (begin < end) {  // cut at plane boundaries
        const int64_t plane = begin / pixels, first = begin % pixels;
        const int64_t count = std::min(end - begin, pixels - first);
        const int64_t offset = plane * pixels * b + first * b;
        quantizer.quantize(px + offset, b, count, (plane % v.blocks()) * b, b, py + offset, b);
        begin += count;
      }
    });
    ctx.set_output_layout(0, dnnl_kernels::retyped_layout(layout, qtype));
    return true;
  }

  const ir::Node& node_;
  QdqAttrs attrs_;
  Tensor planes_;  // plain codes before run_image_to_channels_last interleaves them (kept: 1.2 MB for 640x640)
};

class DequantizeLinearKernel final : public Kernel {
 public:
  explicit DequantizeLinearKernel(const KernelInit& init) : node_(init.node), attrs_(qdq_attrs(init, true)) {}
  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const Tensor& scale = ctx.input(1);
    if (attrs_.block_size > 0) {
      Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
      dequantize_blocked(x, scale, ctx.optional_input(2), attrs_.axis, attrs_.block_size, y, node_.describe());
      return;
    }
    check_per_axis(node_, attrs_, scale);
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
    dequantize_linear(x, scale, ctx.optional_input(2), attrs_.axis, y, node_.describe());
  }

 private:
  const ir::Node& node_;
  QdqAttrs attrs_;
};

}  // namespace

void register_quantize_kernels(KernelRegistry& r) {
  r.add(
      "QuantizeLinear",
      [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<QuantizeLinearKernel>(init); }, "",
      layouts::kChannelBlockedElementwise);
  r.add(
      "DequantizeLinear",
      [](const KernelInit& init) -> std::unique_ptr<Kernel> { return std::make_unique<DequantizeLinearKernel>(init); },
      "", layouts::kPassthrough);
}

}  // namespace ew
}  // namespace slimquant::runtime
