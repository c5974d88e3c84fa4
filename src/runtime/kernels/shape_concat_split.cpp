// Concat and Split along one axis. Both see their tensors as [outer, axis * inner] rows, so every
// move is one memcpy of a contiguous block per (outer index, piece), never per element.
#include <algorithm>

#include "runtime/kernels/elementwise_common.h"
#include "runtime/kernels/elementwise_qdq.h"
#include "runtime/kernels/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

class ConcatKernel : public Kernel {
 public:
  explicit ConcatKernel(const KernelInit& init) : quantize_(folded_channel_quantize(init.node)) {
    // Concat-1 had axis default 1; from opset 4 it is required.
    if (!init.node.has_attr("axis") && init.opset >= 4)
      fail(ErrorKind::kInvalidModel, init.node.describe() + ": attribute 'axis' is required");
    axis_ = init.node.attr_int("axis", 1);
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    std::vector<const Tensor*> ins;
    for (size_t i = 0; i < ctx.num_inputs(); ++i)
      if (ctx.has_input(i)) ins.push_back(&ctx.input(i));
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
  // channel_quantize_fusion.h): each input's channels are quantized straight into their place in
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

  int64_t axis_;
  std::optional<FoldedChannelQuantize> quantize_;  // a per-channel QuantizeLinear the plan folded in
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
