#pragma once
// A direct depthwise QConv (group == channels, one filter per channel, 2-D) for CPUs with AVX-512
// VNNI, in channels-last layout.
//
// Why not oneDNN: oneDNN 2.6's int8 depthwise kernel multiplies one tap per instruction (as its f32
// kernel does) and then runs the hard-swish, linear and per-channel binary post-ops of PPLCNet's
// blocks at some cost each; on PP-OCRv4 it was slower than its f32 depthwise kernel (240 channels,
// 5x5, 12x80: 0.22 ms int8 with those post-ops against 0.17 ms f32, one thread).
// Here vpdpbusd sums four taps of one channel at once: the input rows are interleaved four at a
// time (the taps of four kernel rows at one column sit in adjacent bytes), so a 5x5 filter takes 10
// dot-product instructions per 16 outputs instead of 25 multiply-adds (3x3: 3 instead of 9).
//
// Arithmetic: exactly the QConv contract (int8_common.h). Signed sources are shifted to unsigned
// (x + 128) for vpdpbusd; padded taps read the zero point's code and a per-channel constant
// (code of zero x sum of the channel's weights) is subtracted, so acc equals sum (x_q - z_x) w_q.
// Then v = (acc + B') * M as the reference computes it, the activation, the post affine map and
// per-channel 1 / s_y, rounding half to even and saturation.
#include <cstdint>
#include <vector>

#include "runtime/kernels/integer/int8_common.h"
#include "runtime/kernels/integer/int8_reference.h"

namespace slimquant::runtime::int8 {

// True when the direct kernel may run here: AVX-512 VNNI within oneDNN's effective ISA (so
// DNNL_MAX_CPU_ISA limits it as it limits oneDNN), unless SLIMQUANT_DIRECT_DEPTHWISE=0.
bool direct_depthwise_available();
// Filters up to this many rows (the row quads one output row reads: at most four).
inline constexpr int64_t kMaxKernelHeight = 16;

// Below this many channels the 64-channel chunks run mostly empty lanes and oneDNN's kernel is
// faster (PP-OCRv4 rec: 16 channels 0.093 ms against 0.039, 32 channels 0.086 against 0.073),
// except for 16 and 32 channels at a horizontal stride of 1, where a chunk computes 4 or 2 pixels
// (pixel_group_for).
inline constexpr int64_t kMinDirectDepthwiseChannels = 48;

// Output pixels per 64-lane chunk for p: 64 / C for 16 or 32 channels at horizontal stride 1, else 1.
int64_t pixel_group_for(const ConvProblem& p);

// Whether the kernel is faster than oneDNN's for this geometry (measured on an AVX-512 VNNI Xeon):
// filters of 5x5 and larger at every size measured, down to 7x7 maps; 3x3 filters on rows of at
// least two tiles (32 output columns). On narrower maps a 3x3 filter's dot products are few and
// the kernel's per-row work dominates: MobileNetV2's 7x7 and 4x4 layers took 15-25% longer.
// 48-63 channels (a chunk three quarters full) only at stride 1: PP-OCRv4 det's 48-channel 3x3 at
// 160x160 takes 0.49 ms against oneDNN's 0.67-0.70, its stride-2 one 0.16 against 0.11.
bool direct_depthwise_pays(const ConvProblem& p);

// True when the kernel implements q's output stage: no activation, Relu, Clip, LeakyRelu,
// HardSigmoid, HardSwish, Sigmoid or Swish; u8 / s8 (per tensor or per channel) or float32 output.
bool direct_depthwise_supports(const QLinearAttrs& q);

class DirectDepthwise {
 public:
  // w: s8 [C, 1, kh, kw] (ONNX layout); x_type: the input codes' type (u8 or s8).
  // pixels_per_chunk: 1, or 64 / C for C of 16 or 32 (pixel_group_for): each 64-lane chunk then
  // computes that many adjacent output pixels of every channel, for problems of horizontal stride 1
  // (channels-last, a run of pixels is contiguous): no lanes idle.
  DirectDepthwise(const QLinearAttrs& q, const Requant& r, const Tensor& w, DType x_type, int64_t pixels_per_chunk = 1);
  // p: a 2-D problem with group == channels; x: [N, H, W, C] codes of x_type; y: [N, OH, OW, C] of
  // q.y.dtype (channels-last, dense). channel_sums (a float32 y only): [N, C], each channel's sum
  // over the output pixels, taken as the values are written (a squeeze-excitation's pool).
  // float16_y (a float32 y, when float16_holds_outputs()): y holds each value rounded to half
  // precision (to nearest even), 2 bytes an element; the channel sums are of the float32 values.
  void run(const ConvProblem& p, const void* x, void* y, float* channel_sums = nullptr, bool float16_y = false) const;
  // Whether every float32 y the weights, bias and output stage can give, for any input codes, is
  // finite in half precision (|y| < 65504), so that float16 storage cannot overflow.
  bool float16_holds_outputs() const { return float16_holds_outputs_; }

  int64_t channels() const { return channels_; }
  int64_t kernel_h() const { return kernel_h_; }
  int64_t kernel_w() const { return kernel_w_; }

  // The output stage, per channel in the kernel's register order (public for the vector code).
  enum class Act { kNone, kClamp, kLeakyRelu, kHardSigmoid, kHardSwish, kSigmoid, kSwish, kSiLU };  // kSiLU: Swish, alpha 1
  struct Stage {
    Act act = Act::kNone;
    float lo = 0, hi = 0;          // kClamp bounds
    float alpha = 0, beta = 0;     // kLeakyRelu slope, kSwish's alpha; kHardSigmoid: clip(alpha v + beta, 0, top)
    float top = 0;
    DType y_type = DType::kFloat32;
    int32_t y_zero_point = 0;
    float code_hi = 0;  // the largest round(v) that is not saturated (before + z_y)
  };

 private:
  // The largest |act(f)| of the output stage's activation for |f| <= v.
  double activation_bound(double v) const;

  int64_t channels_ = 0, kernel_h_ = 0, kernel_w_ = 0, chunks_ = 0;
  int64_t group_ = 1;  // output pixels per chunk
  int64_t quads_ = 0, alignment_ = 4;  // row quads per window, and the rows between quads (see the .cpp)
  bool signed_x_ = false;
  bool float16_holds_outputs_ = false;
  uint8_t pad_code_ = 0;  // the unsigned code of a real zero input
  Stage stage_;
  // Per 64-channel chunk, in register order (see the .cpp): weights [row offset][chunk][quad][kw]
  // [4][64 bytes] (one set per offset of the window's first row within its first quad),
  // and per channel: compensation (s32), B', M, and the post-activation factor and offset.
  std::vector<int8_t> weights_;
  std::vector<int32_t> compensation_;
  std::vector<float> bias_, multiplier_, post_factor_, post_offset_;
};

}  // namespace slimquant::runtime::int8
