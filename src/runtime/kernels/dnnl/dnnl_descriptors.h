#pragma once
// The oneDNN descriptor helpers the runtime's kernels and training's backward ops
// (src/train/ops_dnnl.cpp, ops_norm_pool.cpp) share: window geometry (Conv, ConvTranspose, pools),
// plain and ONNX-weight descriptors, primitive creation with errors naming the node, a small
// per-shape primitive cache and reorders. Part of the runtime's detail interface (CMakeLists.txt).
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/dnnl_context.h"
#include "slimquant/core/error.h"
#include "slimquant/ir/graph.h"

namespace slimquant::runtime::dnnl_kernels {

using dnnl::memory;
using Dims = memory::dims;
using dt = memory::data_type;

enum class AutoPad { kNotSet, kSameUpper, kSameLower, kValid };

// Spatial attributes of windowed ops, parsed once at kernel creation. Vectors stay empty when the
// attribute is absent; resolved() fills defaults once the number of spatial dims is known.
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

// Primitives and their descriptors cached by the input shapes they were built for: shapes
// change rarely (batch size), so a linear scan over a handful of entries is the cheapest lookup,
// and a hit allocates nothing. A null shape stands for an absent optional input; `tag` carries
// anything else the plan depends on (a dtype, a flag).
template <class V>
class ShapeCache {
 public:
  template <class Make>
  V& get(std::initializer_list<const Shape*> shapes, Make&& make, int64_t tag = 0) {
    if (last_ < entries_.size() && matches(entries_[last_], shapes, tag)) return *entries_[last_].value;
    for (size_t i = 0; i < entries_.size(); ++i)
      if (matches(entries_[i], shapes, tag)) {
        last_ = i;
        return *entries_[i].value;
      }
    if (entries_.size() >= kMaxEntries) entries_.erase(entries_.begin());
    Entry e;
    for (const Shape* s : shapes) e.shapes.push_back(s ? std::optional<Shape>(*s) : std::nullopt);
    e.tag = tag;
    e.value = std::make_unique<V>(make());
    entries_.push_back(std::move(e));
    last_ = entries_.size() - 1;
    return *entries_.back().value;
  }
  size_t size() const { return entries_.size(); }

 private:
  struct Entry {
    std::vector<std::optional<Shape>> shapes;
    int64_t tag = 0;
    std::unique_ptr<V> value;
  };
  static bool matches(const Entry& e, std::initializer_list<const Shape*> shapes, int64_t tag) {
    if (e.tag != tag || e.shapes.size() != shapes.size()) return false;
    size_t i = 0;
    for (const Shape* s : shapes) {
      const std::optional<Shape>& have = e.shapes[i++];
      if (have.has_value() != (s != nullptr) || (s && *have != *s)) return false;
    }
    return true;
  }
  static constexpr size_t kMaxEntries = 8;
  std::vector<Entry> entries_;
  size_t last_ = 0;
};

// A reorder primitive from one layout to another, or nullopt when they are the same.
std::optional<dnnl::reorder> make_reorder(const memory::desc& from, const memory::desc& to,
                                          const dnnl::primitive_attr& attr = {});
// oneDNN's view of ONNX Conv weights [M, C/G, k...]: [G, M/G, C/G, k...] when grouped (the same
// bytes), in `tag` (format_tag::undef: plain row-major; format_tag::any: the primitive's choice).
memory::desc conv_weights_desc(const Shape& w, int64_t group, dt type, memory::format_tag tag);
// oneDNN's view of ONNX ConvTranspose weights [C, M/G, k...]: [G, M/G, C/G, k...] (or [M, C, k...]),
// described with strides over the ONNX bytes, so one reorder both transposes and blocks them.
memory::desc conv_transpose_weights_desc(const Shape& w, int64_t group);

}  // namespace slimquant::runtime::dnnl_kernels
