#pragma once
// QuantizeLinear / DequantizeLinear over tensors, callable outside the kernels (analysis, lowering
// tests), with the per-value arithmetic of slimquant/core/quant_param.h (quant_math):
//   quantize: q = saturate(round_half_even(x / scale) + zero_point); dequantize: float(q - zp) * scale.
// Scale and zero point: one element (per tensor) or a 1-D tensor of x.dim(axis) elements
// (per axis); zero point dtype = quantized dtype (uint8, int8, uint16, int16; int32 for
// dequantize, where it must be 0).
#include <cstdint>
#include <memory>
#include <mutex>
#include <numeric>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/core/quant_param.h"
#include "slimquant/core/tensor.h"
#include "slimquant/ir/graph.h"

namespace slimquant::runtime {

// Writes y (allocated by the caller with x's shape and the quantized dtype: zero_point's dtype,
// or uint8 without one). x: float32 or int32. `who` names the node in error messages.
void quantize_linear(const Tensor& x, const Tensor& scale, const Tensor* zero_point, int64_t axis, Tensor& y,
                     const std::string& who = "QuantizeLinear");
// Writes y (float32, x's shape). x: uint8, int8, uint16, int16 or int32.
void dequantize_linear(const Tensor& x, const Tensor& scale, const Tensor* zero_point, int64_t axis, Tensor& y,
                       const std::string& who = "DequantizeLinear");
// y (float32) = dequantize(quantize(x)) in one pass, with the integer range [qmin, qmax] of
// `qtype` (zero_point's dtype when given).
void fake_quantize_linear(const Tensor& x, const Tensor& scale, const Tensor* zero_point, int64_t axis,
                          DType qtype, Tensor& y, const std::string& who = "FakeQuantize");

// y[i] = quantize(x[i]) per tensor for n floats into uint8 or int8 `type` (the arithmetic above).
void quantize_floats(const float* x, int64_t n, float scale, int32_t zero_point, DType type, void* y);

// Per-channel quantization (into uint8 or int8) of channel-blocked data (kernels/elementwise/channel_blocked.h):
// rows of `lanes` consecutive channels, lane l quantized with channel first + l's scale and zero
// point; the same codes as quantize_linear along the channel axis.
class LaneQuantizer {
 public:
  // `q`: one scale and zero point per channel, or one for all `channels`.
  LaneQuantizer(const QuantParam& q, int64_t channels);
  // y[p * y_stride + l] = quantize(x[p * x_stride + l]) for p < pixels, l < lanes (y: 1-byte codes).
  void quantize(const float* x, int64_t x_stride, int64_t pixels, int64_t first_channel, int64_t lanes, void* y,
                int64_t y_stride) const;
  // The float operation quantize_combined applies to its two operands.
  enum class Combine { kAdd, kSub, kMul };
  // y[i] = quantize(a[i] op b[i]) for i < pixels * lanes: contiguous rows of `lanes` channels from
  // first_channel in a, b and y. The same floats and codes as computing a op b and quantize()-ing
  // it, in one pass, so that the operands' loads (from memory, for a large map) overlap the
  // quantization's arithmetic.
  void quantize_combined(Combine op, const float* a, const float* b, int64_t pixels, int64_t first_channel,
                         int64_t lanes, void* y) const;
  DType dtype() const { return dtype_; }
  // The pixels of a tile of contiguous rows of `lanes`, the unit quantize() vectorises over
  // without a tail (tile * lanes is a multiple of 64); a run of whole tiles quantizes fastest.
  static int64_t pixels_per_tile(int64_t lanes) { return 64 / std::gcd(lanes, int64_t{64}); }

 private:
  // Calls fn(parameters) with the lane parameters from channel `first`, repeated `repeats` times
  // over `lanes` lanes: this quantizer's own arrays for 1, else tiled copies made at the first
  // call for those channels and kept with the quantizer (a per-thread slot shared by every
  // quantizer was rebuilt by each node of a run: 1600 values for 200 channels, more than the
  // quantization of a small map itself).
  template <typename Fn>
  void with_lane_params(size_t first, int64_t lanes, int64_t repeats, Fn&& fn) const;
  struct TiledParams;
  const TiledParams& tiled_params(size_t first, int64_t lanes, int64_t repeats) const;

  DType dtype_;
  uint64_t id_ = 0;  // unique per quantizer (copies share it): keys a thread's last tiled lookup
  // The tiled copies (immutable once made; copies of the quantizer share them).
  struct TiledCache;
  std::shared_ptr<TiledCache> tiled_;
  std::vector<float> scale_, reciprocal_, lo_, hi_;
  std::vector<float> low_, high_;  // lo * s, hi * s: the range of x that quantizes inside [lo, hi]
  std::vector<int32_t> zero_point_;
  std::vector<uint8_t> zero_byte_;  // zero_point_ mod 256: the reciprocal loop adds it to the code's low byte
  bool multiplying_ = false;  // every channel's quotient comes from its reciprocal (as quantize_linear's)
};

// y[i] = quantize(a[i] op b[i]) per tensor for n floats into uint8 or int8 `type`, in one pass:
// the same floats and codes as combining and then quantize_floats. false (nothing written) where
// that arithmetic divides by the scale instead of multiplying by its reciprocal.
bool quantize_combined_floats(LaneQuantizer::Combine op, const float* a, const float* b, int64_t n, float scale,
                              int32_t zero_point, DType type, void* y);
// The same with one operand held as float16 storage (DType::kFloat16): `halves` op `floats` when
// halves_first, else `floats` op `halves`; the same codes as widening it first. false (nothing
// written) where quantize_combined_floats would be, or where the CPU lacks AVX-512 (F, BW, VL).
bool quantize_combined_with_halves(LaneQuantizer::Combine op, const uint16_t* halves, const float* floats,
                                   bool halves_first, int64_t n, float scale, int32_t zero_point, DType type, void* y);

// A per-tensor QuantizeLinear folded into the elementwise op whose float32 result only it reads
// (execution-only plan fusion, see session.cpp): the op writes the quantized tensor itself.
// Attributes on the op's node:
inline constexpr const char* kFoldedQuantizeScale = "slimquant.folded_quantize_scale";  // float
inline constexpr const char* kFoldedQuantizeZeroPoint = "slimquant.folded_quantize_zero_point";  // int
inline constexpr const char* kFoldedQuantizeType = "slimquant.folded_quantize_type";  // int: ONNX type, 2 u8 / 3 s8
// Per tensor (one scale and zero point), dtype uint8 or int8.
struct FoldedQuantize : QuantParam {};
// The node's folded QuantizeLinear, if any (kInvalidModel naming the node for bad attributes).
std::optional<FoldedQuantize> folded_quantize(const ir::Node& node);
// Writes q onto the node as the attributes folded_quantize reads.
void write_folded_quantize(ir::Node& node, const FoldedQuantize& q);

// A per-channel QuantizeLinear (a 1-D scale along `axis`, as channel-wise convolution inputs
// have) folded the same way: the op quantizes each channel's slab with that channel's parameters.
// Attributes on the op's node (the type as above, in kFoldedQuantizeType):
inline constexpr const char* kFoldedQuantizeChannelScale = "slimquant.folded_quantize_channel_scale";  // floats
inline constexpr const char* kFoldedQuantizeChannelZeroPoint = "slimquant.folded_quantize_channel_zero_point";  // ints
inline constexpr const char* kFoldedQuantizeAxis = "slimquant.folded_quantize_axis";  // int, >= 0
// Per channel along `axis` (non-negative), dtype uint8 or int8.
struct FoldedChannelQuantize : QuantParam {};
// The node's folded per-channel QuantizeLinear, if any (kInvalidModel naming the node for bad
// attributes).
std::optional<FoldedChannelQuantize> folded_channel_quantize(const ir::Node& node);
// Writes q onto the node as the attributes folded_channel_quantize reads.
void write_folded_channel_quantize(ir::Node& node, const FoldedChannelQuantize& q);


// Per-tensor DequantizeLinears folded into the op that reads their float32 output (execution-only
// plan fusion: Fold::kDequantizedInput, fusions/declared_folds.h): the op reads the 8-bit codes (uint8 or int8) at
// input position `input` and dequantizes them as it goes, float(q - zero_point) * scale, the
// arithmetic of dequantize_linear (so the same floats). Attributes on the op's node, one entry per
// folded input:
inline constexpr const char* kFoldedDequantizeInputs = "slimquant.folded_dequantize_inputs";  // ints
inline constexpr const char* kFoldedDequantizeScales = "slimquant.folded_dequantize_scales";  // floats
inline constexpr const char* kFoldedDequantizeZeroPoints = "slimquant.folded_dequantize_zero_points";  // ints
struct FoldedDequantize {
  size_t input = 0;
  float scale = 1.f;
  int32_t zero_point = 0;
};
// The node's folded DequantizeLinears, in input order (kInvalidModel naming the node for bad
// attributes); empty when none.
std::vector<FoldedDequantize> folded_dequantize(const ir::Node& node);
// Adds d to the node's folded DequantizeLinears.
void add_folded_dequantize(ir::Node& node, const FoldedDequantize& d);
// y[i] = float(codes[i] - zero_point) * scale for n codes of `type` (uint8 or int8).
void dequantize_codes(const void* codes, DType type, int64_t n, float scale, int32_t zero_point, float* y);
// kInvalidArgument naming `who` unless `codes` are uint8 / int8 with d's zero point in their range.
void check_folded_codes(const Tensor& codes, const FoldedDequantize& d, const std::string& who);
// The float32 tensor a folded DequantizeLinear stands for (codes: uint8 or int8, plain order; the
// checks above), by dequantize_linear.
Tensor dequantized(const Tensor& codes, const FoldedDequantize& d, const std::string& who);

}  // namespace slimquant::runtime
