// The direct depthwise QConv (see int8_depthwise.h).
//
// Register order: a chunk of 64 channels lives in four zmm registers of 16 lanes. Interleaving four
// input rows with unpacklo/hi_epi8 and then unpacklo/hi_epi16 (both work within 128-bit lanes)
// puts, in register j, lane l, element i, the four row bytes of channel 16 l + 4 j + i. The weights
// and per-channel constants are stored in that order; packs_epi32 then packus/packs_epi16 (also
// within lanes) give the 64 output codes back in channel order, and a 4x4 transpose of 128-bit
// blocks does the same for float32 outputs.
//
// Row quads: quad m holds padded rows A*m .. A*m+3 (rows counted from the first padded row), built
// once per tile of output columns and chunk. Output row oh reads padded rows oh*sh .. oh*sh+kh-1:
// they start at offset o = oh*sh % A of quad oh*sh / A, and the window takes G = ceil(kh / 4)
// quads, 4 / A indices apart, with the weight set for offset o (filter row kh at row (kh + o) % 4
// of its (kh + o) / 4-th quad, zeros elsewhere). The alignment A (1, 2 or 4) is the largest with
// o + kh <= 4 G for every offset: 4 for 5x5 filters (non-overlapping quads, one per four input
// rows), 2 for 3x3 (quads overlap by two rows, one per two input rows). Before, every output row
// interleaved its own quads: a quarter of the kernel's time for 5x5 filters.
#include "runtime/kernels/integer/int8_depthwise.h"

#include <algorithm>
#include <array>
#include <cfloat>
#include <cmath>
#include <cstdlib>
#include <string>
#include <vector>

#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/elementwise/avx512_exp.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
// GCC 12's AVX-512 intrinsic headers start some results from _mm512_undefined_*(), which
// -Wmaybe-uninitialized (and, at -O1, -Wuninitialized) reports inside them once they are inlined here.
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
#define SQ_HAS_DIRECT_DEPTHWISE 1
#define SQ_AVX512_VNNI __attribute__((target("avx512f,avx512bw,avx512dq,avx512vl,avx512vnni")))
#else
#define SQ_HAS_DIRECT_DEPTHWISE 0
#endif

namespace slimquant::runtime::int8 {

namespace {

constexpr int64_t kChunk = 64;          // channels per chunk (four registers of 16 s32 accumulators)
constexpr int64_t kQuadBytes = 4 * 64;  // one column of one quad of rows, one chunk: four registers
// Output columns per tile: the tile's interleaved rows (re-read for every filter column) stay in
// L1. Without tiling, a whole row's (84 columns x 2 quads x 256 bytes for 5x5 filters) fell out of
// it and the kernel ran at a third of its speed.
constexpr int64_t kTileColumns = 16;

// Position of channel c's value in the per-channel arrays (register order, see the file comment).
int64_t register_index(int64_t c) {
  const int64_t chunk = c / kChunk, within = c % kChunk;
  const int64_t lane = within / 16, j = (within % 16) / 4, i = within % 4;
  return chunk * kChunk + j * 16 + lane * 4 + i;
}

// A 2-D depthwise problem as the loops read it.
struct Geometry {
  int64_t batch, channels, in_h, in_w, out_h, out_w, kernel_h, kernel_w, stride_h, stride_w, pad_top, pad_left;
};

Geometry geometry_of(const ConvProblem& p) {
  if (p.in_spatial.size() != 2 || p.group != p.in_channels || p.out_channels != p.in_channels)
    fail(ErrorKind::kInternal, "direct depthwise convolution: needs a 2-D problem with one filter per channel");
  return {p.batch,          p.in_channels,    p.in_spatial[0], p.in_spatial[1], p.out_spatial[0], p.out_spatial[1],
          p.kernel[0],      p.kernel[1],      p.strides[0],    p.strides[1],    p.pad_begin[0],   p.pad_begin[1]};
}

using Act = DirectDepthwise::Act;
using Stage = DirectDepthwise::Stage;

}  // namespace

bool direct_depthwise_available() {
#if SQ_HAS_DIRECT_DEPTHWISE
  static const bool available = [] {
    if (const char* env = std::getenv("SLIMQUANT_DIRECT_DEPTHWISE"); env && std::string(env) == "0") return false;
    return effective_isa_includes(dnnl::cpu_isa::avx512_core_vnni) && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vnni");
  }();
  return available;
#else
  return false;
#endif
}

int64_t pixel_group_for(const ConvProblem& p) {
  const int64_t c = p.out_channels;
  return (c == 16 || c == 32) && p.strides.size() == 2 && p.strides[1] == 1 ? kChunk / c : 1;
}

bool direct_depthwise_pays(const ConvProblem& p) {
  if (p.kernel.size() != 2) return false;
  const int64_t group = pixel_group_for(p);
  if (group == 1 && p.out_channels < kMinDirectDepthwiseChannels) return false;
  // A partly filled 64-channel chunk pays only at stride 1 (every quad serves each output row).
  if (group == 1 && p.out_channels < kChunk && (p.strides[0] != 1 || p.strides[1] != 1)) return false;
  return p.kernel[0] * p.kernel[1] >= 25 || p.out_spatial[1] >= 2 * kTileColumns * group;
}

bool direct_depthwise_supports(const QLinearAttrs& q) {
  switch (q.activation) {
    case Activation::kNone:
    case Activation::kRelu:
    case Activation::kClip:
    case Activation::kLeakyRelu:
    case Activation::kHardSigmoid:
    case Activation::kHardSwish:
    case Activation::kSigmoid:
    case Activation::kSwish: return true;
    default: return false;
  }
}

DirectDepthwise::DirectDepthwise(const QLinearAttrs& q, const Requant& r, const Tensor& w, DType x_type,
                                 int64_t pixels_per_chunk) {
  if (w.rank() != 4 || w.dim(1) != 1 || w.dtype() != DType::kInt8)
    fail(ErrorKind::kInternal,
         "direct depthwise convolution: weights must be s8 [C, 1, kh, kw], got " + shape_str(w.shape()));
  if (!direct_depthwise_supports(q))
    fail(ErrorKind::kInternal, std::string("direct depthwise convolution: unsupported activation ") +
                                   activation_name(q.activation));
  if (w.dim(2) > kMaxKernelHeight)
    fail(ErrorKind::kInternal, "direct depthwise convolution: filters taller than " + std::to_string(kMaxKernelHeight) +
                                   " rows");
  channels_ = w.dim(0);
  kernel_h_ = w.dim(2);
  kernel_w_ = w.dim(3);
  group_ = pixels_per_chunk;
  if (group_ != 1 && channels_ * group_ != kChunk)
    fail(ErrorKind::kInternal, "direct depthwise convolution: " + std::to_string(group_) + " pixels of " +
                                   std::to_string(channels_) + " channels do not fill a chunk");
  // Lane position p (over the chunks) computes channel p % channels_ (of pixel p / channels_ in its
  // group).
  const int64_t lanes = channels_ * group_;
  chunks_ = (lanes + kChunk - 1) / kChunk;
  quads_ = (kernel_h_ + 3) / 4;
  // The alignment of the quads (see the file comment): the largest power of two dividing 4 with
  // (alignment - 1) + kh <= 4 * quads_.
  alignment_ = 4;
  while (alignment_ - 1 + kernel_h_ > 4 * quads_) alignment_ /= 2;
  signed_x_ = x_type == DType::kInt8;
  const int32_t zero_code = q.x.zero_point.at(0) + (signed_x_ ? 128 : 0);
  if (zero_code < 0 || zero_code > 255)
    fail(ErrorKind::kInternal, "direct depthwise convolution: x_zero_point " + std::to_string(q.x.zero_point[0]) +
                                   " is not a code of " + dtype_name(x_type));
  pad_code_ = static_cast<uint8_t>(zero_code);

  const bool quantized = q.quantized_output();
  const float inv = quantized ? 1.f / q.y_tensor_scale() : 1.f;
  Stage& s = stage_;
  s.y_type = q.y.dtype;
  s.y_zero_point = q.y_tensor_zero_point();
  if (quantized) {
    s.code_hi = static_cast<float>(qmax_of(q.y.dtype) - s.y_zero_point);
  }
  switch (q.activation) {
    case Activation::kNone: s.act = Act::kNone; break;
    case Activation::kRelu:
      s.act = Act::kClamp;
      s.lo = 0.f;
      s.hi = FLT_MAX;
      break;
    case Activation::kClip:
      s.act = Act::kClamp;
      s.lo = std::isfinite(q.activation_min) ? q.activation_min * inv : -FLT_MAX;
      s.hi = std::isfinite(q.activation_max) ? q.activation_max * inv : FLT_MAX;
      break;
    case Activation::kLeakyRelu:
      s.act = Act::kLeakyRelu;
      s.alpha = q.activation_alpha;
      break;
    case Activation::kHardSigmoid:
      s.act = Act::kHardSigmoid;
      s.alpha = q.activation_alpha;
      s.beta = q.activation_beta * inv;
      s.top = inv;
      break;
    case Activation::kHardSwish: s.act = Act::kHardSwish; break;
    case Activation::kSigmoid: s.act = Act::kSigmoid; break;
    case Activation::kSwish:
      s.act = q.activation_alpha == 1.f ? Act::kSiLU : Act::kSwish;
      s.alpha = q.activation_alpha;
      break;
    default: break;
  }

  const int64_t padded = chunks_ * kChunk;
  weights_.assign(static_cast<size_t>(alignment_ * chunks_ * quads_ * kernel_w_ * kQuadBytes), 0);
  compensation_.assign(padded, 0);
  bias_.assign(padded, 0.f);
  multiplier_.assign(padded, 0.f);
  post_factor_.assign(padded, 1.f);
  post_offset_.assign(padded, 0.f);
  const int8_t* wq = w.data<int8_t>();
  // The largest |x_q - z_x| of any input code, for the bound on float32 outputs.
  const double widest_input = std::max(zero_code, 255 - zero_code);
  double largest_output = 0;
  for (int64_t position = 0; position < lanes; ++position) {
    const int64_t c = position % channels_;
    const int64_t chunk = position / kChunk, within = position % kChunk;
    const int64_t lane = within / 16, j = (within % 16) / 4, i = within % 4;
    int32_t weight_sum = 0, weight_magnitude = 0;
    for (int64_t kh = 0; kh < kernel_h_; ++kh)
      for (int64_t kw = 0; kw < kernel_w_; ++kw) {
        const int8_t v = wq[(c * kernel_h_ + kh) * kernel_w_ + kw];
        weight_sum += v;
        weight_magnitude += std::abs(v);
        for (int64_t offset = 0; offset < alignment_; ++offset) {  // the window's first row within its first quad
          const int64_t quad = (kh + offset) / 4, row = (kh + offset) % 4;
          const int64_t at = (((offset * chunks_ + chunk) * quads_ + quad) * kernel_w_ + kw) * 4 + j;
          weights_[static_cast<size_t>(at * 64 + lane * 16 + i * 4 + row)] = v;
        }
      }
    const int64_t at = register_index(position);
    compensation_[at] = zero_code * weight_sum;
    bias_[at] = r.bias.empty() ? 0.f : r.bias[c];
    multiplier_[at] = r.multiplier[c];
    const float channel_factor = q.needs_channel_multiply() ? 1.f / q.y.scale[c] : 1.f;
    if (q.real_units()) {  // act(v) * post_scale + post_shift, then 1 / s_y (per tensor, per channel)
      post_factor_[at] = q.post_scale * inv * channel_factor;
      post_offset_[at] = q.post_shift * inv * channel_factor;
    } else {
      post_factor_[at] = channel_factor;
    }
    if (!quantized) {
      const double largest_f = (weight_magnitude * widest_input + std::fabs(bias_[at])) * std::fabs(multiplier_[at]);
      largest_output = std::max(largest_output, activation_bound(largest_f) * std::fabs(post_factor_[at]) +
                                                    std::fabs(post_offset_[at]));
    }
  }
  // Below float16's largest finite value with room for the float32 arithmetic's rounding.
  float16_holds_outputs_ = !quantized && largest_output < 65000.0;
}

double DirectDepthwise::activation_bound(double v) const {
  const Stage& s = stage_;
  switch (s.act) {
    case Act::kClamp:  // clamp(f, lo, hi) lies in [lo, hi], and within |f| of zero when 0 is in it
      return s.lo <= 0.f && s.hi >= 0.f ? std::min<double>(v, std::max(std::fabs(s.lo), std::fabs(s.hi)))
                                        : std::max(std::fabs(s.lo), std::fabs(s.hi));
    case Act::kLeakyRelu: return v * std::max(1.0, std::fabs(static_cast<double>(s.alpha)));
    case Act::kHardSigmoid: return std::fabs(s.top);
    case Act::kSigmoid: return 1.0;
    // |f * gate| <= |f| for gates in [0, 1] (Swish's logistic, hard-swish's clipped line).
    case Act::kNone:
    case Act::kHardSwish:
    case Act::kSwish:
    case Act::kSiLU: return v;
  }
  return v;
}

#if SQ_HAS_DIRECT_DEPTHWISE
namespace {

struct DepthwisePass {
  const Stage* stage;
  const int8_t* weights;
  const int32_t* compensation;
  const float *bias, *multiplier, *post_factor, *post_offset;
  int64_t chunks, quads, alignment;
  bool signed_x;
  uint8_t pad_code;
  bool float16_y;  // a float32 y stored as float16
  int64_t group;   // output pixels per chunk (DirectDepthwise::pixels_per_chunk)
};

// One quad of rows (row t: rows[t], or the zero code when null) interleaved for one chunk over
// `cols` columns starting at input column first_iw (negative in the padding): q[col][j] is
// register j of that column. With group g > 1 (channels * g == 64) a column's chunk is the g
// pixels from iw on, and lanes of pixels outside the row read the zero code.
template <bool kPixelGroups>
SQ_AVX512_VNNI void interleave_rows(const uint8_t* const rows[4], int64_t channels, int64_t in_w, int64_t first_iw,
                                    int64_t cols, __mmask64 mask, __m512i zero_code, __m512i flip, uint8_t* q,
                                    int64_t group) {
  const __mmask64 pixel_lanes = kPixelGroups ? (__mmask64{1} << channels) - 1 : 0;
  for (int64_t col = 0; col < cols; ++col) {
    const int64_t iw = first_iw + col;
    __mmask64 lanes = iw >= 0 && iw + group <= in_w ? mask : 0;
    bool edge = false;  // some lanes' pixels lie outside the row
    if (kPixelGroups && !lanes)
      for (int64_t j = 0; j < group; ++j)
        if (iw + j >= 0 && iw + j < in_w) lanes |= pixel_lanes << (j * channels), edge = true;
    __m512i r[4];
#pragma GCC unroll 4
    for (int t = 0; t < 4; ++t) {
      if (!lanes || !rows[t]) {
        r[t] = zero_code;
        continue;
      }
      // (a group at the row's left edge forms an address left of the row; those lanes are not read)
      const __m512i codes = _mm512_xor_si512(_mm512_maskz_loadu_epi8(lanes, rows[t] + iw * channels), flip);
      r[t] = kPixelGroups && edge ? _mm512_mask_blend_epi8(lanes, zero_code, codes) : codes;
    }
    const __m512i ab_lo = _mm512_unpacklo_epi8(r[0], r[1]), ab_hi = _mm512_unpackhi_epi8(r[0], r[1]);
    const __m512i cd_lo = _mm512_unpacklo_epi8(r[2], r[3]), cd_hi = _mm512_unpackhi_epi8(r[2], r[3]);
    uint8_t* out = q + col * kQuadBytes;
    _mm512_storeu_si512(out, _mm512_unpacklo_epi16(ab_lo, cd_lo));
    _mm512_storeu_si512(out + 64, _mm512_unpackhi_epi16(ab_lo, cd_lo));
    _mm512_storeu_si512(out + 128, _mm512_unpacklo_epi16(ab_hi, cd_hi));
    _mm512_storeu_si512(out + 192, _mm512_unpackhi_epi16(ab_hi, cd_hi));
  }
}

// acc[p][j] for P output columns whose first input column (within the tile) is col0, stride sw,
// over `count` quads (quads[g]: its interleaved columns) and their weights w[g]. The p and j loops
// unroll fully so the 4 P accumulators stay in registers.
template <int P>
SQ_AVX512_VNNI inline void accumulate(const uint8_t* const* quads, int64_t count, const int8_t* w, int64_t kernel_w,
                                      int64_t col0, int64_t sw, __m512i (&acc)[P][4]) {
#pragma GCC unroll 16
  for (int p = 0; p < P; ++p)
#pragma GCC unroll 4
    for (int j = 0; j < 4; ++j) acc[p][j] = _mm512_setzero_si512();
  for (int64_t g = 0; g < count; ++g) {
    const uint8_t* qg = quads[g] + col0 * kQuadBytes;
    const int8_t* wg = w + g * kernel_w * kQuadBytes;
    for (int64_t kw = 0; kw < kernel_w; ++kw) {
      const uint8_t* qk = qg + kw * kQuadBytes;
      const int8_t* wk = wg + kw * kQuadBytes;
#pragma GCC unroll 4
      for (int j = 0; j < 4; ++j) {
        const __m512i wv = _mm512_loadu_si512(wk + j * 64);
#pragma GCC unroll 16
        for (int p = 0; p < P; ++p)
          acc[p][j] = _mm512_dpbusd_epi32(acc[p][j], _mm512_loadu_si512(qk + p * sw * kQuadBytes + j * 64), wv);
      }
    }
  }
}

// The output stage of one chunk at one pixel: acc (register order) -> y (channel order).
// A: the activation, fixed per instantiation so the hot loop holds no dispatch (a run-time switch
// with the logistic's code in it made 5x5 layers 1.4x slower).
// Registers in the kernel's order -> channels in order: 4x4 transpose of 128-bit blocks (register j
// block l holds channels 16 l + 4 j .. + 3).
SQ_AVX512_VNNI inline void to_channel_order(const __m512 (&v)[4], __m512 (&out)[4]) {
  const __m512 t0 = _mm512_shuffle_f32x4(v[0], v[1], 0x44), t1 = _mm512_shuffle_f32x4(v[0], v[1], 0xEE);
  const __m512 t2 = _mm512_shuffle_f32x4(v[2], v[3], 0x44), t3 = _mm512_shuffle_f32x4(v[2], v[3], 0xEE);
  out[0] = _mm512_shuffle_f32x4(t0, t2, 0x88);
  out[1] = _mm512_shuffle_f32x4(t0, t2, 0xDD);
  out[2] = _mm512_shuffle_f32x4(t1, t3, 0x88);
  out[3] = _mm512_shuffle_f32x4(t1, t3, 0xDD);
}

// sums (a float32 y, or null): the values written added in, per register lane.
template <Act A>
SQ_AVX512_VNNI inline void finish(const DepthwisePass& k, int64_t chunk, const __m512i (&acc)[4], void* y, int64_t valid,
                                  __m512* sums) {
  const Stage& s = *k.stage;
  __m512 v[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) {
    const int64_t at = chunk * kChunk + j * 16;
    __m512 f = _mm512_cvtepi32_ps(_mm512_sub_epi32(acc[j], _mm512_loadu_si512(k.compensation + at)));
    f = _mm512_mul_ps(_mm512_add_ps(f, _mm512_loadu_ps(k.bias + at)), _mm512_loadu_ps(k.multiplier + at));
    if constexpr (A == Act::kClamp) {
      f = _mm512_min_ps(_mm512_max_ps(f, _mm512_set1_ps(s.lo)), _mm512_set1_ps(s.hi));
    } else if constexpr (A == Act::kLeakyRelu) {
      f = _mm512_mask_mul_ps(f, _mm512_cmp_ps_mask(f, _mm512_setzero_ps(), _CMP_LT_OQ), f, _mm512_set1_ps(s.alpha));
    } else if constexpr (A == Act::kHardSigmoid) {
      f = _mm512_add_ps(_mm512_mul_ps(f, _mm512_set1_ps(s.alpha)), _mm512_set1_ps(s.beta));
      f = _mm512_min_ps(_mm512_max_ps(f, _mm512_setzero_ps()), _mm512_set1_ps(s.top));
    } else if constexpr (A == Act::kHardSwish) {
      const __m512 gate = _mm512_fmadd_ps(f, _mm512_set1_ps(1.f / 6.f), _mm512_set1_ps(0.5f));
      f = _mm512_mul_ps(f, _mm512_min_ps(_mm512_max_ps(gate, _mm512_setzero_ps()), _mm512_set1_ps(1.f)));
    } else if constexpr (A == Act::kSigmoid) {
      f = ew::logistic_avx512(f);
    } else if constexpr (A == Act::kSwish) {
      // The logistic for codes (7e-5 relative) for float outputs too: a sum of 8-bit codes is
      // already off by far more (half an input step), and the float y (a squeeze-excitation's
      // input) is quantized after its gate. EfficientNet-B0 INT8: 6.25 -> 6.01 ms, 39.06 -> 38.99 dB.
      f = ew::swish_avx512<false, true>(f, _mm512_set1_ps(s.alpha));
    } else if constexpr (A == Act::kSiLU) {
      f = ew::swish_avx512<true, true>(f, f);
    }
    v[j] = _mm512_fmadd_ps(f, _mm512_loadu_ps(k.post_factor + at), _mm512_loadu_ps(k.post_offset + at));
  }
  if (s.y_type == DType::kFloat32) {
    __m512 out[4];
    to_channel_order(v, out);
    if (sums && valid >= kChunk) {
      for (int l = 0; l < 4; ++l) sums[l] = _mm512_add_ps(sums[l], out[l]);
    } else if (sums) {  // in channel order, the valid lanes only (a pixel group's last may be past the row)
      for (int l = 0; l < 4; ++l) {
        const int64_t n = std::clamp<int64_t>(valid - 16 * l, 0, 16);
        sums[l] = _mm512_mask_add_ps(sums[l], static_cast<__mmask16>((1u << n) - 1u), sums[l], out[l]);
      }
    }
    if (k.float16_y) {
      auto* dst = static_cast<uint16_t*>(y);
      for (int l = 0; l < 4 && 16 * l < valid; ++l) {
        const int64_t n = std::min<int64_t>(16, valid - 16 * l);
        _mm256_mask_storeu_epi16(dst + 16 * l, static_cast<__mmask16>((1u << n) - 1u),
                                 _mm512_cvtps_ph(out[l], _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
      }
      return;
    }
    float* dst = static_cast<float*>(y);
    for (int l = 0; l < 4 && 16 * l < valid; ++l) {
      const int64_t n = std::min<int64_t>(16, valid - 16 * l);
      _mm512_mask_storeu_ps(dst + 16 * l, static_cast<__mmask16>((1u << n) - 1u), out[l]);
    }
    return;
  }
  // round(v) + z_y saturated: v is capped at the top of the range first (larger floats, and NaN,
  // convert to INT_MIN); the packs saturate to 16 bits, the zero point is added with 16-bit
  // saturation, and the last pack saturates to the 8-bit range.
  const __m512 hi = _mm512_set1_ps(s.code_hi);
  __m512i code[4];
#pragma GCC unroll 4
  for (int j = 0; j < 4; ++j) code[j] = _mm512_cvtps_epi32(_mm512_min_ps(hi, v[j]));
  const __m512i zp = _mm512_set1_epi16(static_cast<int16_t>(s.y_zero_point));
  const __m512i low = _mm512_adds_epi16(_mm512_packs_epi32(code[0], code[1]), zp);
  const __m512i high = _mm512_adds_epi16(_mm512_packs_epi32(code[2], code[3]), zp);
  const __m512i bytes = s.y_type == DType::kUInt8 ? _mm512_packus_epi16(low, high) : _mm512_packs_epi16(low, high);
  const __mmask64 mask = valid >= 64 ? ~__mmask64{0} : (__mmask64{1} << valid) - 1;
  _mm512_mask_storeu_epi8(y, mask, bytes);
}

// Units (n, tile of output columns, chunk), each over all output rows, keeping the quads that
// windows still to come read in a ring (slots tagged with the quad they hold). An output column
// here is k.group output pixels (the chunk's lanes), whose windows start k.group input columns
// apart (stride 1).
// partial_sums (or null): 64 floats per unit, in lane order, its chunk's sums over its tile of
// columns (with pixel groups, lane l is channel l % channels).
template <Act A>
SQ_AVX512_VNNI void run_units(const DepthwisePass& k, const Geometry& s, const uint8_t* x, uint8_t* y, int64_t y_bytes,
                              int64_t unit_begin, int64_t unit_end, float* partial_sums) {
  const int64_t group = k.group, sw = s.stride_w * group, out_cols = (s.out_w + group - 1) / group;
  const int64_t max_cols = (kTileColumns - 1) * sw + s.kernel_w;
  const int64_t quad_step = 4 / k.alignment;              // quad indices between a window's quads
  const int64_t slots = (k.quads - 1) * quad_step + 1;  // a window's span of quad indices
  // The ring in this thread's shared scratch (the caller's reorders use kSrc / kDst).
  const size_t ring_bytes = static_cast<size_t>(slots * max_cols * kQuadBytes);
  auto* ring = static_cast<uint8_t*>(dnnl_scratch(DnnlScratch::kAux, ring_bytes));
  std::array<int64_t, 16> held{};  // slots <= 13 (four quads four indices apart)
  const __m512i zero_code = _mm512_set1_epi8(static_cast<char>(k.pad_code));
  const __m512i flip = _mm512_set1_epi8(k.signed_x ? static_cast<char>(0x80) : 0);
  const int64_t c = s.channels, tiles = (out_cols + kTileColumns - 1) / kTileColumns;
  for (int64_t unit = unit_begin; unit < unit_end; ++unit) {
    const int64_t chunk = unit % k.chunks, tile = unit / k.chunks % tiles, n = unit / k.chunks / tiles;
    const int64_t valid = std::min(kChunk, c * group - chunk * kChunk);
    // The lanes an output column writes: a pixel group's last may reach past the row.
    auto valid_at = [&](int64_t ow) { return group == 1 ? valid : std::min(group, s.out_w - ow * group) * c; };
    const __mmask64 mask = valid >= 64 ? ~__mmask64{0} : (__mmask64{1} << valid) - 1;
    const int64_t tile_begin = tile * kTileColumns, tile_end = std::min(out_cols, tile_begin + kTileColumns);
    const int64_t cols = (tile_end - tile_begin - 1) * sw + s.kernel_w;
    const uint8_t* image = x + n * s.in_h * s.in_w * c + chunk * kChunk;
    held.fill(-1);
    __m512 sums[4] = {_mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps(), _mm512_setzero_ps()};
    __m512* sum_into = partial_sums ? sums : nullptr;
    for (int64_t oh = 0; oh < s.out_h; ++oh) {
      const int64_t first_row = oh * s.stride_h, offset = first_row % k.alignment;
      const int64_t first_quad = first_row / k.alignment;
      for (int64_t g = 0; g < k.quads; ++g) {
        const int64_t m = first_quad + g * quad_step, slot = m % slots;
        if (held[slot] == m) continue;
        const uint8_t* rows[4];
        for (int t = 0; t < 4; ++t) {
          const int64_t ih = k.alignment * m + t - s.pad_top;
          rows[t] = ih >= 0 && ih < s.in_h ? image + ih * s.in_w * c : nullptr;
        }
        if (group > 1)
          interleave_rows<true>(rows, c, s.in_w, tile_begin * sw - s.pad_left, cols, mask, zero_code, flip,
                                ring + slot * cols * kQuadBytes, group);
        else
          interleave_rows<false>(rows, c, s.in_w, tile_begin * sw - s.pad_left, cols, mask, zero_code, flip,
                                 ring + slot * cols * kQuadBytes, group);
        held[slot] = m;
      }
      const uint8_t* quads[4];  // k.quads <= 4 (filters of up to 16 rows)
      for (int64_t g = 0; g < k.quads; ++g)
        quads[g] = ring + ((first_quad + g * quad_step) % slots) * cols * kQuadBytes;
      const int64_t count = k.quads;
      const int8_t* w = k.weights + ((offset * k.chunks + chunk) * k.quads) * s.kernel_w * kQuadBytes;
      uint8_t* out_row = y + (((n * s.out_h + oh) * s.out_w) * c + chunk * kChunk) * y_bytes;
      int64_t ow = tile_begin;
      for (; ow + 4 <= tile_end; ow += 4) {
        __m512i acc[4][4];
        accumulate<4>(quads, count, w, s.kernel_w, (ow - tile_begin) * sw, sw, acc);
#pragma GCC unroll 4
        for (int p = 0; p < 4; ++p)
          finish<A>(k, chunk, acc[p], out_row + (ow + p) * group * c * y_bytes, valid_at(ow + p), sum_into);
      }
      for (; ow < tile_end; ++ow) {
        __m512i acc[1][4];
        accumulate<1>(quads, count, w, s.kernel_w, (ow - tile_begin) * sw, sw, acc);
        finish<A>(k, chunk, acc[0], out_row + ow * group * c * y_bytes, valid_at(ow), sum_into);
      }
    }
    if (partial_sums)
      for (int l = 0; l < 4; ++l) _mm512_storeu_ps(partial_sums + unit * kChunk + 16 * l, sums[l]);
  }
}

}  // namespace
#endif

void DirectDepthwise::run(const ConvProblem& p, const void* x, void* y, float* channel_sums, bool float16_y) const {
  const Geometry s = geometry_of(p);
  if (s.channels != channels_ || s.kernel_h != kernel_h_ || s.kernel_w != kernel_w_)
    fail(ErrorKind::kInternal, "direct depthwise convolution: shape does not match the packed weights");
  if (group_ > 1 && s.stride_w != 1)
    fail(ErrorKind::kInternal, "direct depthwise convolution: pixel groups need a horizontal stride of 1");
#if SQ_HAS_DIRECT_DEPTHWISE
  const DepthwisePass k{&stage_, weights_.data(), compensation_.data(), bias_.data(), multiplier_.data(), post_factor_.data(),
                 post_offset_.data(), chunks_, quads_, alignment_, signed_x_, pad_code_, float16_y, group_};
  if (float16_y && !(stage_.y_type == DType::kFloat32 && float16_holds_outputs_))
    fail(ErrorKind::kInternal, "direct depthwise convolution: float16 storage of outputs it may not hold");
  const int64_t y_bytes = stage_.y_type == DType::kFloat32 ? (float16_y ? 2 : 4) : 1;
  const int64_t out_cols = (s.out_w + group_ - 1) / group_;
  const int64_t tiles = (out_cols + kTileColumns - 1) / kTileColumns;
  const int64_t unit_outputs = s.out_h * std::min(out_cols, kTileColumns) * kChunk;
  const auto* in = static_cast<const uint8_t*>(x);
  auto* out = static_cast<uint8_t*>(y);
  if (channel_sums && stage_.y_type != DType::kFloat32)
    fail(ErrorKind::kInternal, "direct depthwise convolution: channel sums of a quantized output");
  const int64_t unit_count = s.batch * tiles * chunks_;
  std::vector<float> partial(channel_sums ? static_cast<size_t>(unit_count * kChunk) : 0);
  float* partial_sums = channel_sums ? partial.data() : nullptr;
  auto units = [&](int64_t begin, int64_t end) {
    switch (stage_.act) {
      case Act::kNone: return run_units<Act::kNone>(k, s, in, out, y_bytes, begin, end, partial_sums);
      case Act::kClamp: return run_units<Act::kClamp>(k, s, in, out, y_bytes, begin, end, partial_sums);
      case Act::kLeakyRelu: return run_units<Act::kLeakyRelu>(k, s, in, out, y_bytes, begin, end, partial_sums);
      case Act::kHardSigmoid: return run_units<Act::kHardSigmoid>(k, s, in, out, y_bytes, begin, end, partial_sums);
      case Act::kHardSwish: return run_units<Act::kHardSwish>(k, s, in, out, y_bytes, begin, end, partial_sums);
      case Act::kSigmoid: return run_units<Act::kSigmoid>(k, s, in, out, y_bytes, begin, end, partial_sums);
      case Act::kSwish: return run_units<Act::kSwish>(k, s, in, out, y_bytes, begin, end, partial_sums);
      case Act::kSiLU: return run_units<Act::kSiLU>(k, s, in, out, y_bytes, begin, end, partial_sums);
    }
  };
  dnnl_kernels::parallel_rows(unit_count, unit_outputs * s.kernel_h * s.kernel_w / 8, units);
  if (!channel_sums) return;
  // Units are (n, tile, chunk), chunk fastest: each channel's sum is its tiles' partial sums (and,
  // with pixel groups, its lanes').
  const int64_t c = s.channels;
  std::fill(channel_sums, channel_sums + s.batch * c, 0.f);
  for (int64_t unit = 0; unit < unit_count; ++unit) {
    const int64_t chunk = unit % chunks_, n = unit / chunks_ / tiles;
    const int64_t valid = std::min(kChunk, c * group_ - chunk * kChunk);
    for (int64_t l = 0; l < valid; ++l)
      channel_sums[n * c + (chunk * kChunk + l) % c] += partial[static_cast<size_t>(unit * kChunk + l)];
  }
#else
  (void)x;
  (void)y;
  (void)channel_sums;
  (void)float16_y;
  fail(ErrorKind::kInternal, "direct depthwise convolution: not built for this CPU architecture");
#endif
}

}  // namespace slimquant::runtime::int8
