#pragma once
// Pieces shared by the oneDNN FP32 kernels: window geometry (Conv, ConvTranspose, pools), fused
// activations as eltwise post-ops, a small per-shape primitive cache, weights prepacked per
// layout, and thin execution helpers. Kernel inputs and outputs are always plain row-major tensors.
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/dnnl_context.h"
#include "slimquant/ir/graph.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::dnnl_kernels {

using dnnl::memory;
using Dims = memory::dims;
using dt = memory::data_type;

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// Spatial attributes of windowed ops, parsed once at kernel creation. Vectors stay empty when the
// attribute is absent; resolve() fills defaults once the number of spatial dims is known.
struct WindowAttrs {
  std::vector<int64_t> kernel;     // kernel_shape
  std::vector<int64_t> strides;    // default 1
  std::vector<int64_t> dilations;  // default 1
  std::vector<int64_t> pads;       // begin..., end...; default 0
  AutoPad auto_pad = AutoPad::kNotSet;

  static WindowAttrs parse(const ir::Node& node);
  // Returns a copy with defaults for `spatial` dims; throws kInvalidModel naming the node when an
  // attribute has the wrong length or a non-positive stride/dilation/kernel, or a negative pad.
  WindowAttrs resolved(const ir::Node& node, size_t spatial) const;
};

// Geometry of one forward window op (Conv or pool) for concrete input dims, in oneDNN's terms.
struct WindowGeometry {
  Dims out;                   // output spatial dims
  Dims pad_begin, pad_end;    // pad_end includes any ceil_mode overhang (see explicit_pad_end)
  Dims explicit_pad_end;      // the model's own end pads (AveragePool count_include_pad needs them)
  Dims strides, kernel;
  Dims dilations;             // oneDNN convention: ONNX dilation - 1
};
// `a` must be resolved. ceil_mode applies to pools only (Conv always floors).
WindowGeometry forward_geometry(const ir::Node& node, const WindowAttrs& a, const Shape& in_spatial,
                                bool ceil_mode);

// Fused activations (set by the execution-only fusion pass on node.fused).
// Throws kUnsupported naming the node for an activation oneDNN post-ops cannot express.
void check_fused_activation(const ir::Node& node);
void append_fused_activation(dnnl::post_ops& ops, const ir::Node& node);
// For kernels without post-op support: throws kUnsupported if the node carries an activation.
void reject_fused_activation(const ir::Node& node);

// Runs f() (which builds a oneDNN primitive descriptor) and turns oneDNN's errors (typically
// "unimplemented" for a configuration it has no kernel for) into kUnsupported naming the node.
template <class F>
auto make_pd(const ir::Node& node, const std::string& what, F&& f) -> decltype(f()) {
  try {
    return f();
  } catch (const dnnl::error& e) {
    fail(ErrorKind::kUnsupported,
         node.describe() + ": oneDNN has no implementation for " + what + " (" + e.what() + ")");
  }
}

// A plain row-major f32 (or `type`) descriptor; rank 0 becomes {1}.
memory::desc plain_desc(const Shape& shape, dt type = dt::f32);
// A oneDNN memory over existing data (oneDNN takes a non-const pointer even for inputs).
memory wrap(const memory::desc& desc, const void* data);
// Executes on the shared stream and waits.
void execute(const dnnl::primitive& p, const std::unordered_map<int, memory>& args);
// The attribute every kernel uses: user-managed scratchpad (a shared per-thread buffer, see
// DnnlScratch::kScratchpad) so primitives do not each hold their own.
dnnl::primitive_attr base_attr();
// Adds DNNL_ARG_SCRATCHPAD for pd to args.
void add_scratchpad(std::unordered_map<int, memory>& args, const memory::desc& scratchpad_desc);

// Input checks with messages naming the node and the input.
void require_float32(const ir::Node& node, const Tensor& t, const char* what);
// Output i exists in the node (non-empty name) and the caller wants it.
bool output_requested(const KernelContext& ctx, size_t i);

// Primitives and their descriptors cached by the input shapes they were built for: shapes
// change rarely (batch size), so a linear scan over a handful of entries is the cheapest lookup.
template <class V>
class ShapeCache {
 public:
  template <class Make>
  V& get(const std::vector<Shape>& key, Make&& make) {
    if (last_ < entries_.size() && entries_[last_].first == key) return *entries_[last_].second;
    for (size_t i = 0; i < entries_.size(); ++i)
      if (entries_[i].first == key) {
        last_ = i;
        return *entries_[i].second;
      }
    if (entries_.size() >= kMaxEntries) entries_.erase(entries_.begin());
    entries_.emplace_back(key, std::make_unique<V>(make()));
    last_ = entries_.size() - 1;
    return *entries_.back().second;
  }
  size_t size() const { return entries_.size(); }

 private:
  static constexpr size_t kMaxEntries = 8;
  std::vector<std::pair<std::vector<Shape>, std::unique_ptr<V>>> entries_;
  size_t last_ = 0;
};

// Constant weights reordered once into each layout a primitive asks for (the layout oneDNN picks
// with format_tag::any may differ between cached primitives, e.g. across batch sizes).
class PackedWeights {
 public:
  PackedWeights() = default;
  // `user` describes the constant in its ONNX layout (it must stay alive: it is kept).
  void set_source(Tensor owner, const memory::desc& user_desc);
  bool has_source() const { return source_.defined(); }
  const memory& get(const memory::desc& want);

 private:
  Tensor source_;
  memory::desc user_desc_;
  std::vector<std::pair<memory::desc, memory>> packed_;
};

// Reorders `src` into `dst_desc` using the scratch slot when layouts differ; returns src itself
// when they already match.
memory reorder_into_scratch(const memory& src, const memory::desc& dst_desc, DnnlScratch slot);

// A reorder primitive from one layout to another, or nullopt when they are the same.
std::optional<dnnl::reorder> make_reorder(const memory::desc& from, const memory::desc& to);

// A convolution-like primitive (Conv, ConvTranspose) plus the reorders between the plain tensors
// the kernel exchanges and the layouts the primitive picked.
struct ConvLikePlan {
  dnnl::primitive prim;
  memory::desc src_desc, weights_desc, dst_desc, scratchpad_desc;  // chosen by the primitive
  memory::desc src_user, weights_user, dst_user, bias_user;        // as the tensors are stored
  std::optional<dnnl::reorder> src_reorder, weights_reorder, dst_reorder;
  Shape out_shape;

  // Takes the primitive and its layouts from pd; weights reorder only when W is a runtime input.
  template <class PrimitiveDesc, class Primitive>
  void finish(const PrimitiveDesc& pd, bool runtime_weights) {
    prim = Primitive(pd);
    src_desc = pd.src_desc();
    weights_desc = pd.weights_desc();
    dst_desc = pd.dst_desc();
    scratchpad_desc = pd.scratchpad_desc();
    src_reorder = make_reorder(src_user, src_desc);
    dst_reorder = make_reorder(dst_desc, dst_user);
    if (runtime_weights) weights_reorder = make_reorder(weights_user, weights_desc);
  }
};
// Runs the plan: x (plain) -> y (plain, already allocated with out_shape). runtime_w is the
// weights input when they are not constant (nullptr: take them from packed); bias may be null.
void run_conv_like(const ConvLikePlan& p, const Tensor& x, const Tensor* runtime_w, PackedWeights& packed,
                   const Tensor* bias, Tensor& y);

}  // namespace slimquant::runtime::dnnl_kernels
