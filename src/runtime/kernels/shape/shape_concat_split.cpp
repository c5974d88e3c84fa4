// Concat and Split along one axis. Both see their tensors as [outer, axis * inner] rows, so every
// move is one memcpy of a contiguous block per (outer index, piece), never per element.
#include <algorithm>

#include "runtime/kernels/elementwise/channel_blocked.h"
#include "runtime/kernels/cpu_clones.h"
#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_qdq.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

// dst[p * dst_stride + l] = src[p * lanes + l] for p < pixels, l < lanes: a loop (not a memcpy
// call per few dozen floats), in the CPU's vector width.
SQ_AVX512_AVX2_CLONES void gather_pixels(const float* __restrict src, int64_t lanes, int64_t pixels,
                                         float* __restrict dst, int64_t dst_stride) {
  for (int64_t p = 0; p < pixels; ++p)
    for (int64_t l = 0; l < lanes; ++l) dst[p * dst_stride + l] = src[p * lanes + l];
}

class ConcatKernel : public Kernel {
 public:
  explicit ConcatKernel(const KernelInit& init) : quantize_(folded_channel_quantize(init.node)) {
    // Concat-1 had axis default 1; from opset 4 it is required.
    if (!init.node.has_attr("axis") && init.opset >= 4)
      fail(ErrorKind::kInvalidModel, init.node.describe() + ": attribute 'axis' is required");
    axis_ = init.node.attr_int("axis", 1);
    if (quantize_) lane_quantizer_.emplace(*quantize_, static_cast<int64_t>(quantize_->scale.size()));
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    if (run_channel_blocked(ctx)) return;
    std::vector<Tensor> plain;  // inputs that carried a layout, as plain copies (stable: reserved)
    plain.reserve(ctx.num_inputs());
    std::vector<const Tensor*> ins;
    for (size_t i = 0; i < ctx.num_inputs(); ++i) {
      if (!ctx.has_input(i)) continue;
      if (ctx.input_layout(i)) plain.push_back(channel_blocked::plain_input(ctx, i));
      ins.push_back(ctx.input_layout(i) ? &plain.back() : &ctx.input(i));
    }
    if (ins.empty()) fail(ErrorKind::kInvalidModel, node.describe() + ": no inputs");
    const Tensor& first = *ins[0];
    const int64_t r = static_cast<int64_t>(first.rank());
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, r, node.describe()));
    Shape out_shape = first.shape();
    out_shape[axis] = 0;
    for (const Tensor* t : ins) {
      bool ok = t->dtype() == first.dtype() && t->rank() == first.rank();
      for (size_t d = 0; ok && d < first.rank(); ++d) ok = d == axis || t->dim(d) == first.dim(d);
      if (!ok)
        fail(ErrorKind::kInvalidArgument, node.describe() + ": cannot concatenate " + dtype_name(t->dtype()) +
                                              shape_str(t->shape()) + " with " + dtype_name(first.dtype()) +
                                              shape_str(first.shape()) + " along axis " + std::to_string(axis));
      out_shape[axis] += t->dim(axis);
    }
    int64_t outer = 1, inner = 1;
    for (size_t d = 0; d < first.rank(); ++d) {
      if (d < axis) outer *= first.dim(d);
      if (d > axis) inner *= first.dim(d);
    }
    if (quantize_) {
      SQ_CHECK(first.dtype() == DType::kFloat32, ErrorKind::kInternal,
               node.describe() + ": a folded per-channel QuantizeLinear needs float32 inputs");
      Tensor& y = ctx.allocate_output(0, quantize_->dtype, out_shape);
      if (static_cast<size_t>(quantize_->axis) == axis && static_cast<int64_t>(quantize_->scale.size()) == out_shape[axis]) {
        concat_quantized(ins, outer, inner, out_shape[axis], y);
        return;
      }
      // Quantized along another axis: join, then quantize as the QuantizeLinear would.
      Tensor joined(DType::kFloat32, out_shape);
      join(ins, axis, outer, inner, out_shape[axis], joined);
      const int64_t channels = static_cast<int64_t>(quantize_->scale.size());
      Tensor zero_point(quantize_->dtype, {channels});
      for (int64_t c = 0; c < channels; ++c) {
        const int32_t z = quantize_->zero_point[static_cast<size_t>(c)];
        if (quantize_->dtype == DType::kUInt8) zero_point.data<uint8_t>()[c] = static_cast<uint8_t>(z);
        else zero_point.data<int8_t>()[c] = static_cast<int8_t>(z);
      }
      quantize_linear(joined, Tensor::from_vector<float>({channels}, quantize_->scale), &zero_point, quantize_->axis, y,
                      node.describe());
      return;
    }
    if (ins.size() == 1) {  // nothing to join: a view
      ctx.set_output(0, first);
      return;
    }
    Tensor& y = ctx.allocate_output(0, first.dtype(), out_shape);
    join(ins, axis, outer, inner, out_shape[axis], y);
  }

 private:
  // y = the inputs joined along the axis, each seen as [outer, its axis * inner].
  static void join(const std::vector<const Tensor*>& ins, size_t axis, int64_t outer, int64_t inner, int64_t axis_total,
                   Tensor& y) {
    const Tensor& first = *ins[0];
    const size_t es = dtype_size(first.dtype());
    const size_t row = static_cast<size_t>(axis_total * inner) * es;
    auto* dst = static_cast<std::byte*>(y.raw());
    size_t offset = 0;
    // Input-major order: each input is read once, front to back.
    for (const Tensor* t : ins) {
      const size_t block = static_cast<size_t>(t->dim(axis) * inner) * es;
      if (block == 0) continue;
      copy_blocks(dst + offset, static_cast<int64_t>(row), t->raw(), static_cast<int64_t>(block), outer, block);
      offset += block;
    }
  }

  // A per-channel QuantizeLinear along the concatenation axis folded in (see
  // Fold::kChannelQuantize): each input's channels are quantized straight into their place in
  // y with their own scale and zero point, instead of joining floats for a separate pass.
  void concat_quantized(const std::vector<const Tensor*>& ins, int64_t outer, int64_t inner, int64_t channels,
                        Tensor& y) const {
    auto* dst = static_cast<std::byte*>(y.raw());  // 1-byte elements
    int64_t first_channel = 0;
    for (const Tensor* t : ins) {
      const int64_t own = t->dim(static_cast<size_t>(quantize_->axis));
      const float* src = t->data<float>();
      ew::parallel_range(outer * own * inner, [&](int64_t begin, int64_t end) {
        // [begin, end) in t's elements, cut at channel boundaries.
        while (begin < end) {
          const int64_t block = begin / inner, o = block / own, c = block % own;
          const int64_t n = std::min(end, (block + 1) * inner) - begin;
          const int64_t g = first_channel + c;
          quantize_floats(src + begin, n, quantize_->scale[static_cast<size_t>(g)],
                          quantize_->zero_point[static_cast<size_t>(g)], quantize_->dtype,
                          dst + (o * channels + g) * inner + (begin - block * inner));
          begin += n;
        }
      });
      first_channel += own;
    }
  }

  // Rank-4 inputs that all carry one channel blocking (kernels/elementwise/channel_blocked.h), joined along
  // the channels into the same blocking (channels-last stays channels-last): each input's block
  // of B lanes goes, pixel by pixel, to its channels' place in the output's blocks, quantized on
  // the way with a folded per-channel Q. False (nothing written) for other cases.
  bool run_channel_blocked(KernelContext& ctx) const {
    const std::optional<channel_blocked::Blocking> blocking = channel_blocked::common_blocking(ctx);
    if (!blocking || !ctx.output_layout_allowed(0)) return false;
    std::vector<size_t> positions;
    for (size_t i = 0; i < ctx.num_inputs(); ++i)
      if (ctx.has_input(i)) positions.push_back(i);
    const Tensor& first = ctx.input(positions[0]);
    if (first.rank() != 4 || (axis_ != 1 && axis_ != -3)) return false;
    Shape out_shape = first.shape();
    out_shape[1] = 0;
    for (size_t i : positions) {
      const Tensor& t = ctx.input(i);
      if (!ctx.input_layout(i) || t.dtype() != first.dtype() || t.rank() != 4 || t.dim(0) != first.dim(0) ||
          t.dim(2) != first.dim(2) || t.dim(3) != first.dim(3))
        return false;
      out_shape[1] += t.dim(1);
    }
    if (quantize_ && (first.dtype() != DType::kFloat32 || quantize_->axis != 1 ||
                      static_cast<int64_t>(quantize_->scale.size()) != out_shape[1]))
      return false;
    const DType out_type = quantize_ ? quantize_->dtype : first.dtype();
    const LayoutPtr out_layout = channel_blocked::blocked_layout(*blocking, out_shape, out_type);
    if (!out_layout) return false;
    Tensor& y = ctx.allocate_output(0, out_type, out_shape);
    const channel_blocked::View out(out_shape, *blocking);
    const size_t in_size = dtype_size(first.dtype()), out_size = dtype_size(out_type);
    auto* dst = static_cast<std::byte*>(y.raw());
    const int64_t pixels = out.pixels();
    if (quantize_ && blocking->channels_last) {
      concat_quantized_channels_last(ctx, positions, out, dst);
      ctx.set_output_layout(0, out_layout);
      return true;
    }
    int64_t first_channel = 0;
    for (size_t i : positions) {
      const Tensor& t = ctx.input(i);
      const channel_blocked::View in(t.shape(), *blocking);
      const auto* src = static_cast<const std::byte*>(t.raw());
      const int64_t lanes = in.block;
      for (int64_t n = 0; n < in.n; ++n)
        for (int64_t cb = 0; cb < in.blocks(); ++cb) {
          const std::byte* from = src + in.plane(n, cb) * static_cast<int64_t>(in_size);
          const int64_t g = first_channel + cb * lanes;
          std::byte* to = dst + (out.plane(n, g / out.block) + g % out.block) * static_cast<int64_t>(out_size);
          ew::parallel_range(pixels * lanes, [&](int64_t begin, int64_t end) {
            const int64_t p0 = begin / lanes, p1 = end / lanes;  // whole pixels (ranges cut at lanes)
            if (p0 >= p1) return;
            if (quantize_) {
              lane_quantizer_->quantize(reinterpret_cast<const float*>(from) + p0 * lanes, lanes, p1 - p0, g, lanes,
                                        to + p0 * out.block, out.block);
            } else if (lanes == out.block) {
              std::memcpy(to + p0 * lanes * static_cast<int64_t>(out_size), from + p0 * lanes * static_cast<int64_t>(in_size),
                          static_cast<size_t>((p1 - p0) * lanes) * in_size);
            } else {
              for (int64_t p = p0; p < p1; ++p)
                std::memcpy(to + p * out.block * static_cast<int64_t>(out_size), from + p * lanes * static_cast<int64_t>(in_size),
                            static_cast<size_t>(lanes) * in_size);
            }
          });
        }
      first_channel += t.dim(1);
    }
    ctx.set_output_layout(0, out_layout);
    return true;
  }

  // Channels-last inputs into channels-last codes: each run of pixels is gathered into whole
  // float pixels of all channels, then quantized as one run of C lanes (a few dozen lanes per input
  // are too short for the vectorised loop).
  void concat_quantized_channels_last(const KernelContext& ctx, const std::vector<size_t>& positions,
                                      const channel_blocked::View& out, std::byte* dst) const {
    // Runs of about kRunFloats (whole quantizer tiles): small enough that the gathered floats stay
    // in L1 while the next inputs stream in (12 KB: 32 pixels of 96 channels, measured 10-20%
    // faster than 64 pixels).
    constexpr int64_t kRunFloats = 3072;
    const int64_t channels = out.channels, tile = LaneQuantizer::pixels_per_tile(channels);
    const int64_t run_pixels = std::max(tile, kRunFloats / channels / tile * tile);
    const int64_t runs_per_sample = (out.pixels() + run_pixels - 1) / run_pixels;
    ew::parallel_range(out.n * runs_per_sample, [&](int64_t begin, int64_t end) {
      thread_local std::vector<float> gathered;
      gathered.resize(static_cast<size_t>(run_pixels * channels));
      for (int64_t r = begin; r < end; ++r) {
        const int64_t n = r / runs_per_sample, p0 = (r % runs_per_sample) * run_pixels;
        const int64_t count = std::min(run_pixels, out.pixels() - p0);
        int64_t first_channel = 0;
        for (size_t i : positions) {
          const Tensor& t = ctx.input(i);
          const int64_t own = t.dim(1);
          gather_pixels(t.data<float>() + (n * out.pixels() + p0) * own, own, count, gathered.data() + first_channel,
                        channels);
          first_channel += own;
        }
        lane_quantizer_->quantize(gathered.data(), channels, count, 0, channels,
                                  dst + (n * out.pixels() + p0) * channels, channels);
      }
    });
  }

  int64_t axis_;
  std::optional<FoldedChannelQuantize> quantize_;  // a per-channel QuantizeLinear the plan folded in
  std::optional<LaneQuantizer> lane_quantizer_;    // the same on channel-blocked data
};

class SplitKernel : public Kernel {
 public:
  explicit SplitKernel(const KernelInit& init) : axis_(init.node.attr_int("axis", 0)) {
    // split: attribute in opsets 2..12 (Split-1 also took it as an optional 2nd input); input from 13.
    if (init.opset < 13 && init.node.has_attr("split")) split_ = IntListArg::from_attr(init.node, "split");
    else split_ = IntListArg::from_input(init, 1, "split");
    num_outputs_ = init.node.attr_int("num_outputs", 0);  // opset 18
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const int64_t r = static_cast<int64_t>(x.rank());
    const size_t axis = static_cast<size_t>(normalize_axis(axis_, r, node.describe()));
    const int64_t dim = x.dim(axis);
    const size_t n_out = ctx.num_outputs();
    std::vector<int64_t> split = split_.get(ctx);
    if (split.empty()) {
      if (num_outputs_ > 0) {
        // num_outputs (opset 18): ceil-sized pieces, the last one possibly smaller.
        const int64_t piece = (dim + num_outputs_ - 1) / num_outputs_;
        for (int64_t i = 0; i < num_outputs_; ++i) split.push_back(std::clamp<int64_t>(dim - i * piece, 0, piece));
      } else {
        if (n_out == 0 || dim % static_cast<int64_t>(n_out) != 0)
          fail(ErrorKind::kInvalidArgument, node.describe() + ": axis " + std::to_string(axis) + " of " +
                                                shape_str(x.shape()) + " does not split into " +
                                                std::to_string(n_out) + " equal parts");
        split.assign(n_out, dim / static_cast<int64_t>(n_out));
      }
    }
    int64_t total = 0;
    for (int64_t s : split) {
      if (s < 0) fail(ErrorKind::kInvalidModel, node.describe() + ": negative split size " + std::to_string(s));
      total += s;
    }
    if (split.size() != n_out || total != dim)
      fail(ErrorKind::kInvalidArgument, node.describe() + ": split sizes (" + std::to_string(split.size()) +
                                            " pieces, sum " + std::to_string(total) + ") do not match " +
                                            std::to_string(n_out) + " outputs over axis " + std::to_string(axis) +
                                            " of " + shape_str(x.shape()));
    int64_t outer = 1, inner = 1;
    for (size_t d = 0; d < x.rank(); ++d) {
      if (d < axis) outer *= x.dim(d);
      if (d > axis) inner *= x.dim(d);
    }
    const size_t es = dtype_size(x.dtype());
    const size_t row = static_cast<size_t>(dim * inner) * es;
    const auto* src = static_cast<const std::byte*>(x.raw());
    size_t offset = 0;
    for (size_t i = 0; i < n_out; ++i) {
      const size_t block = static_cast<size_t>(split[i] * inner) * es;
      if (output_requested(ctx, i)) {
        Shape s = x.shape();
        s[axis] = split[i];
        Tensor& y = ctx.allocate_output(i, x.dtype(), s);
        copy_blocks(y.raw(), static_cast<int64_t>(block), src + offset, static_cast<int64_t>(row), outer, block);
      }
      offset += block;
    }
  }

 private:
  int64_t axis_;
  IntListArg split_;
  int64_t num_outputs_;
};

}  // namespace

std::unique_ptr<Kernel> make_concat(const KernelInit& init) { return std::make_unique<ConcatKernel>(init); }
std::unique_ptr<Kernel> make_split(const KernelInit& init) { return std::make_unique<SplitKernel>(init); }

}  // namespace slimquant::runtime::shape
