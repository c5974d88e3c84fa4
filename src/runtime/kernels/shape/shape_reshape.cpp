// Ops that only change the shape (or look at it): Reshape, Flatten, Squeeze, Unsqueeze, Identity,
// Dropout (inference), Shape, Size. The view ops return the input's storage under a new shape,
// never a copy.
#include <algorithm>

#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::shape {

namespace {

std::string ints_str(const std::vector<int64_t>& v) {
  std::string s = "[";
  for (size_t i = 0; i < v.size(); ++i) {
    if (i) s += 'x';
    s += std::to_string(v[i]);
  }
  return s + "]";
}

// ---- Reshape -----------------------------------------------------------------------------------

class ReshapeKernel : public Kernel {
 public:
  explicit ReshapeKernel(const KernelInit& init) : allow_zero_(init.node.attr_int("allowzero", 0) != 0) {
    // Reshape-1 carried the target shape as an attribute; from opset 5 it is input 1.
    shape_ = init.opset < 5 ? IntListArg::from_attr(init.node, "shape") : IntListArg::from_input(init, 1, "shape");
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const std::vector<int64_t> spec = shape_.get(ctx);
    const ir::Node& node = ctx.node();
    auto bad = [&](const std::string& why) {
      fail(ErrorKind::kInvalidArgument, node.describe() + ": cannot reshape " + shape_str(x.shape()) + " into " +
                                            ints_str(spec) + ": " + why);
    };
    Shape out(spec.size());
    int infer = -1;
    bool has_zero = false;
    int64_t known = 1;
    for (size_t i = 0; i < spec.size(); ++i) {
      int64_t d = spec[i];
      if (d == 0 && !allow_zero_) {
        if (i >= x.rank()) bad("0 at position " + std::to_string(i) + " copies a dimension the input lacks");
        d = x.dim(i);
      } else if (d == 0) {
        has_zero = true;
      } else if (d == -1) {
        if (infer >= 0) bad("more than one -1");
        infer = static_cast<int>(i);
        continue;
      } else if (d < -1) {
        bad("negative dimension " + std::to_string(d));
      }
      out[i] = d;
      known *= d;
    }
    if (infer >= 0) {
      if (has_zero) bad("-1 together with a literal 0 (allowzero=1) is ambiguous");
      if (known == 0 || x.numel() % known != 0) bad("element count " + std::to_string(x.numel()) + " does not divide");
      out[static_cast<size_t>(infer)] = x.numel() / known;
    } else if (known != x.numel()) {
      bad("element counts differ (" + std::to_string(x.numel()) + " vs " + std::to_string(known) + ")");
    }
    ctx.set_output(0, x.reshaped(std::move(out)));
  }

 private:
  bool allow_zero_;
  IntListArg shape_;
};

// ---- Flatten -----------------------------------------------------------------------------------

class FlattenKernel : public Kernel {
 public:
  explicit FlattenKernel(const KernelInit& init) : axis_(init.node.attr_int("axis", 1)), opset_(init.opset) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const int64_t r = static_cast<int64_t>(x.rank());
    // Negative axes are allowed from opset 11; the valid range is [-r, r] (axis r: [numel, 1]).
    if (axis_ > r || axis_ < (opset_ >= 11 ? -r : 0))
      fail(ErrorKind::kInvalidModel, ctx.node().describe() + ": axis " + std::to_string(axis_) +
                                         " out of range for input " + shape_str(x.shape()));
    const int64_t axis = axis_ < 0 ? axis_ + r : axis_;
    int64_t outer = 1, inner = 1;
    for (int64_t d = 0; d < r; ++d) (d < axis ? outer : inner) *= x.dim(static_cast<size_t>(d));
    ctx.set_output(0, x.reshaped({outer, inner}));
  }

 private:
  int64_t axis_;
  int64_t opset_;
};

// ---- Squeeze / Unsqueeze -----------------------------------------------------------------------

// Sorted, de-duplicated, normalized axes; throws on duplicates.
std::vector<int64_t> normalize_axes(const std::vector<int64_t>& axes, int64_t rank, const ir::Node& node) {
  std::vector<int64_t> out;
  for (int64_t a : axes) out.push_back(normalize_axis(a, rank, node.describe()));
  std::sort(out.begin(), out.end());
  if (std::adjacent_find(out.begin(), out.end()) != out.end())
    fail(ErrorKind::kInvalidModel, node.describe() + ": axes " + ints_str(axes) + " repeat an axis");
  return out;
}

class SqueezeKernel : public Kernel {
 public:
  explicit SqueezeKernel(const KernelInit& init) {
    // Opset 13 moved axes from an attribute to an optional input.
    axes_ = init.opset < 13 ? IntListArg::from_attr(init.node, "axes") : IntListArg::from_input(init, 1, "axes");
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const int64_t r = static_cast<int64_t>(x.rank());
    Shape out;
    const std::vector<int64_t> given = axes_.get(ctx);
    if (given.empty()) {  // no (or empty) axes: drop every size-1 dim, as ONNX Runtime does
      for (int64_t d : x.shape())
        if (d != 1) out.push_back(d);
    } else {
      const std::vector<int64_t> axes = normalize_axes(given, r, ctx.node());
      size_t k = 0;
      for (int64_t d = 0; d < r; ++d) {
        if (k < axes.size() && axes[k] == d) {
          ++k;
          if (x.dim(static_cast<size_t>(d)) != 1)
            fail(ErrorKind::kInvalidArgument, ctx.node().describe() + ": cannot squeeze axis " + std::to_string(d) +
                                                  " of " + shape_str(x.shape()) + " (size is not 1)");
          continue;
        }
        out.push_back(x.dim(static_cast<size_t>(d)));
      }
    }
    ctx.set_output(0, x.reshaped(std::move(out)));
  }

 private:
  IntListArg axes_;
};

class UnsqueezeKernel : public Kernel {
 public:
  explicit UnsqueezeKernel(const KernelInit& init) {
    axes_ = init.opset < 13 ? IntListArg::from_attr(init.node, "axes") : IntListArg::from_input(init, 1, "axes");
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (!axes_.present(ctx))
      fail(ErrorKind::kInvalidModel, ctx.node().describe() + ": axes are required");
    const std::vector<int64_t> raw = axes_.get(ctx);
    // Axes index the *output*, whose rank is rank(x) + number of axes.
    const int64_t out_rank = static_cast<int64_t>(x.rank() + raw.size());
    const std::vector<int64_t> axes = normalize_axes(raw, out_rank, ctx.node());
    Shape out(static_cast<size_t>(out_rank));
    size_t k = 0, src = 0;
    for (int64_t d = 0; d < out_rank; ++d) {
      if (k < axes.size() && axes[k] == d) {
        out[static_cast<size_t>(d)] = 1;
        ++k;
      } else {
        out[static_cast<size_t>(d)] = x.dim(src++);
      }
    }
    ctx.set_output(0, x.reshaped(std::move(out)));
  }

 private:
  IntListArg axes_;
};

// ---- Identity / Dropout ------------------------------------------------------------------------

class IdentityKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override { ctx.set_output(0, ctx.input(0)); }
};

// Inference-mode Dropout: y = x, mask all true. Training mode with a non-zero ratio would need a
// random mask, which an inference runtime has no business drawing.
class DropoutKernel : public Kernel {
 public:
  explicit DropoutKernel(const KernelInit& init) : opset_(init.opset) {}

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    if (opset_ >= 12) {
      const Tensor* training = ctx.optional_input(2);
      if (training && training->numel() > 0 && training->to_int64_vector()[0] != 0) {
        const Tensor* ratio = ctx.optional_input(1);
        const float r = ratio && ratio->numel() > 0 ? ratio->to_float_vector()[0] : 0.5f;
        if (r != 0.f)
          fail(ErrorKind::kUnsupported, ctx.node().describe() + ": training_mode=true with ratio " +
                                            std::to_string(r) + " needs a random mask (inference runtime only)");
      }
    }
    ctx.set_output(0, x);
    if (output_requested(ctx, 1)) {
      // The mask was of the input's type before opset 10, bool since.
      const DType mask_type = opset_ < 10 ? x.dtype() : DType::kBool;
      Tensor& mask = ctx.allocate_output(1, mask_type, x.shape());
      dispatch_dtype(mask_type, [&](auto tag) {
        using T = decltype(tag);
        const T one = static_cast<T>(1);
        fill_elems(mask.raw(), &one, sizeof(T), mask.numel());
      });
    }
  }

 private:
  int64_t opset_;
};

// ---- Shape / Size ------------------------------------------------------------------------------

class ShapeKernel : public Kernel {
 public:
  explicit ShapeKernel(const KernelInit& init) {
    if (init.opset >= 15) {
      start_ = init.node.attr_int("start", 0);
      if (init.node.has_attr("end")) end_ = init.node.attr_int("end", 0);
    }
  }

  void run(KernelContext& ctx) override {
    const Shape& s = ctx.input(0).shape();
    const int64_t r = static_cast<int64_t>(s.size());
    // start/end (opset 15) slice the shape; out-of-range values clamp.
    auto clamp = [r](int64_t v) { return std::clamp(v < 0 ? v + r : v, int64_t{0}, r); };
    const int64_t b = clamp(start_), e = end_ ? clamp(*end_) : r;
    const int64_t n = std::max<int64_t>(0, e - b);
    Tensor& out = ctx.allocate_output(0, DType::kInt64, {n});
    std::copy(s.begin() + b, s.begin() + b + n, out.data<int64_t>());
  }

 private:
  int64_t start_ = 0;
  std::optional<int64_t> end_;
};

class SizeKernel : public Kernel {
 public:
  void run(KernelContext& ctx) override {
    Tensor& out = ctx.allocate_output(0, DType::kInt64, {});
    out.data<int64_t>()[0] = ctx.input(0).numel();
  }
};

}  // namespace

std::unique_ptr<Kernel> make_reshape(const KernelInit& init) { return std::make_unique<ReshapeKernel>(init); }
std::unique_ptr<Kernel> make_flatten(const KernelInit& init) { return std::make_unique<FlattenKernel>(init); }
std::unique_ptr<Kernel> make_squeeze(const KernelInit& init) { return std::make_unique<SqueezeKernel>(init); }
std::unique_ptr<Kernel> make_unsqueeze(const KernelInit& init) { return std::make_unique<UnsqueezeKernel>(init); }
std::unique_ptr<Kernel> make_identity(const KernelInit&) { return std::make_unique<IdentityKernel>(); }
std::unique_ptr<Kernel> make_dropout(const KernelInit& init) { return std::make_unique<DropoutKernel>(init); }
std::unique_ptr<Kernel> make_shape(const KernelInit& init) { return std::make_unique<ShapeKernel>(init); }
std::unique_ptr<Kernel> make_size(const KernelInit&) { return std::make_unique<SizeKernel>(); }

}  // namespace slimquant::runtime::shape
