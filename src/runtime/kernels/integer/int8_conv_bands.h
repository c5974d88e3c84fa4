#pragma once
// A QConv ending in Swish (or HardSwish) run in bands of output rows (int8_conv.cpp uses it on
// AVX-512 CPUs).
//
// Why: oneDNN 2.6 evaluates a Swish post-op at about a cycle per output value, more than the int8
// convolution itself on the 1x1 expansions of EfficientNet-style blocks (16 -> 96 channels at
// 112x112: 0.19 ms without an activation, 0.75 ms with oneDNN's swish) — half of EfficientNet-B0's
// INT8 time. Here the int8 primitive writes a band's real values v = M[m] (acc + B'[m]) as float32
// into a scratch that stays in cache (or, for a float32 y, into y), and ew::gated_output_avx512
// applies the activation, the post affine map and the output's quantization there. HardSwish is
// cheaper in oneDNN (about 0.2 ns per value), but with the bands PP-OCRv4 det and MobileNetV3 still
// ran 3-5% faster, and rec 12% (its channel-wise quantized outputs: a binary_mul post-op in oneDNN). Over a whole output at once that f32 round
// trip went through memory and cost more than it saved.
//
// Bands: whole images where an image's output fits the band, else rows of one image; each band
// reads the input rows its outputs need, with the model's padding only at the image's top and
// bottom, so one primitive serves all middle bands and the top and bottom ones differ.
// x: u8 codes, y: u8 / s8 codes or float32, both channels-last and dense.
#include <cstdint>
#include <vector>

#include "runtime/kernels/elementwise/swish_avx512.h"
#include "runtime/kernels/integer/int8_common.h"
#include "runtime/kernels/integer/int8_reference.h"

namespace slimquant::runtime::int8 {

// What follows the primitive: y = gate(v) * factor[c] + offset[c], rounded and saturated for a u8 /
// s8 y.
struct GatedOutputStage {
  ew::Gate gate = ew::Gate::kSwish;
  float alpha = 1.f;  // Swish's
  DType y_type = DType::kUInt8;
  std::vector<float> factor, offset;  // one per output channel, or one for all
};

// The output stage of q where the bands pay (Swish or HardSwish; a u8 / s8 output per tensor or per
// channel, or float32), or false.
bool gated_output_stage(const QLinearAttrs& q, GatedOutputStage& stage);

// Output bytes of float32 a band aims at (L2-resident on the CPUs measured).
inline constexpr int64_t kConvBandBytes = 128 * 1024;

class ConvBands {
 public:
  // p: a 2-D problem; weights_any: oneDNN's view of the s8 weights with format_tag::any, packed
  // by `weights`; bias: f32 B' (or a null memory); r: the multipliers M (real units: no 1 / s_y);
  // x_zero_point: of the u8 codes x reads.
  ConvBands(const ConvProblem& p, const dnnl::memory::desc& weights_any, PackedConstant& weights,
            const dnnl::memory& bias, const Requant& r, int32_t x_zero_point, GatedOutputStage stage,
            int64_t band_bytes = kConvBandBytes);
  // False when some band has no oneDNN implementation but the reference one, or the geometry is
  // one this does not cut (unused trailing input columns): run the convolution otherwise.
  bool usable() const { return usable_; }
  void run(const uint8_t* x, void* y);

 private:
  struct Variant {
    dnnl::primitive prim;
    dnnl::memory src, dst, weights, scratchpad;
    std::unordered_map<int, dnnl::memory> args;
  };
  struct Band {
    int64_t image, row, input_row, variant;
  };
  ConvProblem problem_;
  GatedOutputStage stage_;
  std::vector<Variant> variants_;
  std::vector<Band> bands_;
  int64_t band_values_ = 0, scratchpad_bytes_ = 0;
  bool usable_ = false;
};

}  // namespace slimquant::runtime::int8
