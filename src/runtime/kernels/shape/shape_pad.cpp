// Pad: constant / reflect / edge (and wrap, opset 19), negative pads crop.
//
// Every output index along an axis maps to an input index or to "pad value" (-1); the maps are
// built once per run per axis. Output rows (last axis) are then produced as: fill / gathered
// border elements, one memcpy for the run that maps to a contiguous input run, fill / gather.
#include <algorithm>

#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

enum class PadMode { kConstant, kReflect, kEdge, kWrap };

// Output index o of an axis with `before` padding and input extent n -> input index or -1.
int64_t map_index(int64_t o, int64_t before, int64_t n, PadMode mode) {
  int64_t i = o - before;
  if (i >= 0 && i < n) return i;
  switch (mode) {
    case PadMode::kConstant: return -1;
    case PadMode::kEdge: return i < 0 ? 0 : n - 1;
    case PadMode::kWrap: return ((i % n) + n) % n;
    case PadMode::kReflect: {
      if (n == 1) return 0;
      // Reflection without repeating the border is periodic with period 2(n-1) (as numpy's
      // "reflect"), so pads wider than the input keep bouncing.
      const int64_t period = 2 * (n - 1);
      int64_t m = ((i % period) + period) % period;
      return m < n ? m : period - m;
    }
  }
  return -1;
}

class PadKernel : public Kernel {
 public:
  explicit PadKernel(const KernelInit& init) : opset_(init.opset) {
    const ir::Node& node = init.node;
    const std::string mode = node.attr_string("mode", "constant");
    if (mode == "constant") mode_ = PadMode::kConstant;
    else if (mode == "reflect") mode_ = PadMode::kReflect;
    else if (mode == "edge") mode_ = PadMode::kEdge;
    else if (mode == "wrap") mode_ = PadMode::kWrap;
    else fail(ErrorKind::kInvalidModel, node.describe() + ": unknown mode '" + mode + "'");
    if (opset_ < 11) {
      // Pad-1 called the attribute "paddings", Pad-2 "pads"; the value was a float attribute.
      pads_ = IntListArg::from_attr(node, opset_ < 2 ? "paddings" : "pads");
      value_attr_ = node.attr_float("value", 0.f);
    } else {
      pads_ = IntListArg::from_input(init, 1, "pads");
      axes_ = IntListArg::from_input(init, 3, "axes");  // opset 18
    }
  }

  void run(KernelContext& ctx) override {
    const ir::Node& node = ctx.node();
    const Tensor& x = ctx.input(0);
    const size_t r = x.rank();
    const std::vector<int64_t> raw = pads_.get(ctx);
    // pads = [x1_begin, x2_begin, ..., x1_end, x2_end, ...] over `axes` (default: all axes).
    std::vector<int64_t> axes;
    if (axes_.present(ctx)) {
      for (int64_t a : axes_.get(ctx)) axes.push_back(normalize_axis(a, static_cast<int64_t>(r), node.describe()));
    } else {
      for (size_t d = 0; d < r; ++d) axes.push_back(static_cast<int64_t>(d));
    }
    if (raw.size() != 2 * axes.size())
      fail(ErrorKind::kInvalidModel, node.describe() + ": " + std::to_string(raw.size()) + " pads for " +
                                         std::to_string(axes.size()) + " axes of " + shape_str(x.shape()) +
                                         " (need 2 per axis)");
    std::vector<int64_t> before(r, 0), after(r, 0);
    for (size_t i = 0; i < axes.size(); ++i) {
      before[static_cast<size_t>(axes[i])] = raw[i];
      after[static_cast<size_t>(axes[i])] = raw[i + axes.size()];
    }
    Shape out_shape(r);
    for (size_t d = 0; d < r; ++d) {
      if (__builtin_add_overflow(x.dim(d), before[d], &out_shape[d]) ||
          __builtin_add_overflow(out_shape[d], after[d], &out_shape[d]))
        fail(ErrorKind::kInvalidModel, node.describe() + ": pads " + std::to_string(before[d]) + " and " +
                                           std::to_string(after[d]) + " overflow axis " + std::to_string(d));
      if (out_shape[d] < 0)
        fail(ErrorKind::kInvalidArgument, node.describe() + ": pads crop axis " + std::to_string(d) + " of " +
                                              shape_str(x.shape()) + " below zero");
      if (mode_ != PadMode::kConstant && x.dim(d) == 0 && out_shape[d] > 0)
        fail(ErrorKind::kInvalidArgument, node.describe() + ": cannot reflect/edge/wrap-pad empty axis " +
                                              std::to_string(d));
    }

    if (std::all_of(raw.begin(), raw.end(), [](int64_t p) { return p == 0; })) {
      ctx.set_output(0, x);  // nothing to pad: a view
      return;
    }
    // The pad value in the data's own type.
    const size_t es = dtype_size(x.dtype());
    std::vector<std::byte> value(es, std::byte{0});
    const Tensor* cv = opset_ >= 11 ? ctx.optional_input(2) : nullptr;
    if (cv && cv->numel() > 0) {
      if (cv->dtype() != x.dtype())
        fail(ErrorKind::kInvalidModel, node.describe() + ": constant_value is " + dtype_name(cv->dtype()) +
                                           " but data is " + dtype_name(x.dtype()));
      std::memcpy(value.data(), cv->raw(), es);
    } else if (opset_ < 11) {
      dispatch_dtype(x.dtype(), [&](auto tag) {
        using T = decltype(tag);
        const T v = static_cast<T>(value_attr_);
        std::memcpy(value.data(), &v, es);
      });
    }

    Tensor& y = ctx.allocate_output(0, x.dtype(), out_shape);
    if (y.numel() == 0) return;
    if (r == 0) {
      std::memcpy(y.raw(), x.raw(), es);
      return;
    }
    Job job{x, y, es, value.data(), {}, contiguous_strides(x.shape()), contiguous_strides(out_shape), 0, 0};
    job.maps.resize(r);
    for (size_t d = 0; d < r; ++d) {
      job.maps[d].resize(static_cast<size_t>(out_shape[d]));
      for (int64_t o = 0; o < out_shape[d]; ++o)
        job.maps[d][static_cast<size_t>(o)] = map_index(o, before[d], x.dim(d), mode_);
    }
    // The innermost run that maps 1:1 onto contiguous input: copied with one memcpy per row.
    const int64_t n_last = x.dim(r - 1);
    job.run_lo = std::clamp<int64_t>(before[r - 1], 0, out_shape[r - 1]);
    job.run_hi = std::clamp<int64_t>(before[r - 1] + n_last, job.run_lo, out_shape[r - 1]);
    dispatch_elem_size(es, [&](auto sz) {
      pad_level<decltype(sz)::value>(job, 0, 0, static_cast<std::byte*>(y.raw()));
    });
  }

 private:
  struct Job {
    const Tensor& x;
    Tensor& y;
    size_t es;
    const std::byte* value;
    std::vector<std::vector<int64_t>> maps;
    std::vector<int64_t> in_strides, out_strides;
    int64_t run_lo, run_hi;
  };

  // Fills the output sub-block of axis d (and inner axes) at dst. src_off: input element offset of
  // the mapped outer indices.
  template <size_t N>
  static void pad_level(const Job& j, size_t d, int64_t src_off, std::byte* dst) {
    const size_t r = j.maps.size();
    const int64_t es = static_cast<int64_t>(j.es);
    const auto* src = static_cast<const std::byte*>(j.x.raw());
    const std::vector<int64_t>& map = j.maps[d];
    const int64_t n = static_cast<int64_t>(map.size());
    if (d + 1 == r) {
      // Locals only in the element loops: byte stores may alias anything whose address escaped.
      const std::byte* row = src + src_off * es;
      const std::byte* value = j.value;
      const int64_t* m = map.data();
      const int64_t lo = j.run_lo, hi = j.run_hi;
      const size_t size = j.es;
      for (int64_t o = 0; o < lo; ++o) copy_elem<N>(dst + o * es, m[o] < 0 ? value : row + m[o] * es, size);
      if (hi > lo) std::memcpy(dst + lo * es, row + m[lo] * es, static_cast<size_t>(hi - lo) * size);
      for (int64_t o = hi; o < n; ++o) copy_elem<N>(dst + o * es, m[o] < 0 ? value : row + m[o] * es, size);
      return;
    }
    const int64_t block = j.out_strides[d];
    for (int64_t o = 0; o < n; ++o) {
      const int64_t m = map[static_cast<size_t>(o)];
      std::byte* sub = dst + o * block * es;
      if (m < 0) fill_elems(sub, j.value, j.es, block);  // the whole sub-block is padding
      else pad_level<N>(j, d + 1, src_off + m * j.in_strides[d], sub);
    }
  }

  int64_t opset_;
  PadMode mode_ = PadMode::kConstant;
  IntListArg pads_, axes_;
  float value_attr_ = 0.f;
};

}  // namespace

std::unique_ptr<Kernel> make_pad(const KernelInit& init) { return std::make_unique<PadKernel>(init); }

}  // namespace slimquant::runtime::shape
