#pragma once
// Rank-4 values whose channels lie innermost within a block, [N][C/B][H][W][B] densely: channels-last
// (oneDNN's acdb, B = C: what the int8 convolutions write) or B = 8 / 16 with C % B == 0 (aBcd8b /
// aBcd16b: oneDNN's FP32 convolutions). The FPN / squeeze-excitation ops after those convolutions
// (global pools, elementwise ops with a per-channel operand, nearest Resize, Concat along channels,
// per-channel QuantizeLinear) read and write them in place of plain NCHW, which saves a reorder of
// the whole map before and after each of them. Element (n, c, h, w) of a view is at
//   ((n * C/B + c / B) * H * W + h * W + w) * B + c % B.
#include <cstdint>
#include <optional>

#include "runtime/kernels/dnnl/dnnl_common.h"

namespace slimquant::runtime::channel_blocked {

// How a value's channels are blocked: channels-last (B = C whatever C is), or B channels per block.
struct Blocking {
  bool channels_last = true;
  int64_t block = 0;  // when !channels_last
  int64_t block_for(int64_t channels) const { return channels_last ? channels : block; }
  bool operator==(const Blocking& o) const {
    return channels_last == o.channels_last && (channels_last || block == o.block);
  }
};

// The blocking of a rank-4 `layout`, or nullopt when it is not of the form above (padded, other
// block structure, other rank). A block that holds every channel counts as channels-last.
std::optional<Blocking> blocking_of(const Layout& layout);
// The layout of a rank-4 value of `shape` and `dtype` stored with `blocking`, or null when the
// blocking does not divide its channels or has no oneDNN format (blocks other than 4, 8, 16, 32).
LayoutPtr blocked_layout(const Blocking& blocking, const Shape& shape, DType dtype);

// A view of one rank-4 value in a blocking: planes (n, channel block) of H * W pixels of B lanes.
struct View {
  int64_t n = 0, channels = 0, height = 0, width = 0, block = 0;
  View(const Shape& shape, const Blocking& b)
      : n(shape[0]), channels(shape[1]), height(shape[2]), width(shape[3]), block(b.block_for(shape[1])) {}
  int64_t blocks() const { return channels / block; }
  int64_t pixels() const { return height * width; }
  int64_t plane_elements() const { return pixels() * block; }
  // Element offset of plane (n, channel block cb).
  int64_t plane(int64_t batch, int64_t cb) const { return (batch * blocks() + cb) * plane_elements(); }
};

// The blocking shared by the kernel's inputs at `positions` that carry a layout, or nullopt when
// one of them carries another kind of layout or none does (inputs without a layout are plain).
std::optional<Blocking> common_blocking(const KernelContext& ctx, std::initializer_list<size_t> positions);
std::optional<Blocking> common_blocking(const KernelContext& ctx);  // every input
// Input i as a plain tensor: itself, or a plain copy when it carries a layout (the fallback of a
// kernel whose blocked path does not cover a case); float16 storage comes back as float32.
Tensor plain_input(const KernelContext& ctx, size_t i);

}  // namespace slimquant::runtime::channel_blocked
