#pragma once
// Pieces shared by the oneDNN FP32 kernels: fused activations as eltwise post-ops, blocked
// layouts, weights prepacked per layout, and thin execution helpers (window geometry, descriptors
// and the per-shape primitive cache, which training shares, are in dnnl_descriptors.h). Kernel
// inputs and outputs are always plain row-major tensors.
#include <omp.h>

#include <algorithm>
#include <initializer_list>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "runtime/dnnl_context.h"
#include "runtime/fused_ops/fused_activation.h"
#include "runtime/kernels/dnnl/dnnl_descriptors.h"
#include "slimquant/ir/graph.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {

// A value's non-plain physical layout (see kernel.h). Plans only let values stay blocked when the
// blocked buffer has exactly the plain byte size (no channel padding), so the Tensor that holds it
// keeps its logical shape and the buffer pool needs no special sizes.
struct Layout {
  dnnl::memory::desc desc;
};

}  // namespace slimquant::runtime

namespace slimquant::runtime::dnnl_kernels {

// One oneDNN eltwise step (algorithm, alpha, beta).
struct EltwiseStep {
  dnnl::algorithm alg;
  float alpha, beta;
};
// The one mapping of the activation vocabulary to oneDNN eltwise steps, for float and integer
// kernels alike. The chain may run in other units than real ones (an integer kernel's output
// before its 1 / s_y and z_y): Clip's bounds (alpha, beta) are given in the chain's units, and
// HardSigmoid's result is placed in units of `unit` with `zero_point` added; every other
// activation needs real units. kScale is a linear map by alpha.
std::vector<EltwiseStep> activation_eltwise_steps(fused_ops::Activation kind, float alpha, float beta,
                                                  float unit = 1.f, float zero_point = 0.f);

// Fused activations (the execution fusions' contract, runtime/fused_ops/fused_activation.h).
// Throws kUnsupported naming the node for an activation oneDNN post-ops cannot express.
void check_fused_activation(const ir::Node& node);
void append_fused_activation(dnnl::post_ops& ops, const ir::Node& node);
// The fused activation as standalone eltwise primitives to run in place over `desc` (empty when the
// node has none), for primitives whose own post-ops are slow (oneDNN 2.6's GEMM-based convolution
// applies them with a scalar reference loop, 10-30x slower than its JIT eltwise).
std::vector<dnnl::eltwise_forward> make_activation_primitives(const ir::Node& node, const memory::desc& desc);
// For kernels without post-op support: throws kUnsupported if the node carries an activation.
void reject_fused_activation(const ir::Node& node);

// Channel-blocked activation layout oneDNN's JIT kernels use on this CPU (nChw16c with AVX-512,
// nChw8c otherwise) for a tensor of `rank` 3 to 5.
memory::format_tag blocked_channel_tag(size_t rank);
// The layout to hand to readers for a primitive's output `desc`, or null when writing it plain is
// required (not allowed by the plan, or the blocked buffer would be padded).
LayoutPtr output_layout_for(const memory::desc& desc, const Shape& shape, DType dtype, bool allowed);
// A plain copy of t, whose data is in `layout` (for hooks and other non-aware readers).
Tensor to_plain(const Tensor& t, const Layout& layout);
// The same into `out` (already allocated with t's dtype and shape).
void reorder_to_plain(const Tensor& t, const Layout& layout, Tensor& out);
// `layout` for elements of another dtype (the same element order: what per-tensor elementwise ops
// such as QuantizeLinear produce from a blocked input).
LayoutPtr retyped_layout(const Layout& layout, DType dtype);
// Same element order (block structure and dims), whatever the dtypes.
bool same_blocking(const Layout& a, const Layout& b);
// The oneDNN view of an input: its layout's desc, or plain.
inline memory::desc input_desc(const Layout* layout, const Shape& shape, dt type = dt::f32) {
  return layout ? layout->desc : plain_desc(shape, type);
}

// The attribute every kernel uses: user-managed scratchpad (a shared per-thread buffer, see
// DnnlScratch::kScratchpad) so primitives do not each hold their own.
dnnl::primitive_attr base_attr();

// Calls f(begin, end) over row ranges of [0, rows), split across OpenMP threads when the rows hold
// enough elements to pay for the fork (plain loops: BatchNormalization, global pools).
template <class F>
void parallel_rows(int64_t rows, int64_t row_len, F&& f) {
  constexpr int64_t kGrain = 1 << 15;  // elements per thread below which threading costs more than it gains
  const int64_t threads = std::min<int64_t>(omp_get_max_threads(), rows * row_len / kGrain);
  if (threads <= 1) {
    f(int64_t{0}, rows);
    return;
  }
#pragma omp parallel num_threads(static_cast<int>(threads))
  {
    const int64_t t = omp_get_thread_num(), n = omp_get_num_threads();
    f(rows * t / n, rows * (t + 1) / n);
  }
}

// Input checks with messages naming the node and the input.
void require_float32(const ir::Node& node, const Tensor& t, const char* what);
// Output i exists in the node (non-empty name) and the caller wants it.
bool output_requested(const KernelContext& ctx, size_t i);

// A constant's bytes reordered into one layout, shared by every PackedWeights that asks for the same
// bytes in the same layout (see PackedWeights::get).
struct SharedPacking;

// Packings alive in the process, and their bytes (tests, diagnostics).
struct SharedPackingStats {
  size_t count = 0, bytes = 0;
};
SharedPackingStats shared_packing_stats();

// Constant weights reordered once into each layout a primitive asks for (the layout oneDNN picks
// with format_tag::any may differ between cached primitives, e.g. across batch sizes). Equal
// constants packed the same way are held once in the process while any plan uses them: a layer
// sweep builds one session per layer over the same weights (119 packed copies of a U-Net's
// convolution weights took 265 MB).
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
  std::vector<std::shared_ptr<const SharedPacking>> packed_;
};

// A oneDNN memory made once for a plan (no data yet); run() points it at each call's data with
// set_data_handle, which is much cheaper than creating memory objects per call.
memory unbound_memory(const memory::desc& desc);
// Points a plan's scratchpad memory at the shared scratchpad buffer (no-op when it needs none).
void bind_scratchpad(memory& scratchpad);

// A convolution-like primitive (Conv, ConvTranspose) plus the reorders between the plain tensors
// the kernel exchanges and the layouts the primitive picked, with its argument memories bound once.
struct ConvLikePlan {
  dnnl::primitive prim;
  memory::desc src_desc, weights_desc, dst_desc;             // chosen by the primitive
  memory::desc src_user, weights_user, dst_user, bias_user;  // as the tensors are stored
  std::optional<dnnl::reorder> src_reorder, weights_reorder, dst_reorder;
  Shape out_shape;
  // src/weights/dst are the user memories themselves when no reorder is needed.
  memory src_user_mem, src_mem, weights_user_mem, weights_mem, bias_mem, dst_mem, dst_user_mem, scratchpad_mem;
  std::unordered_map<int, memory> args, src_reorder_args, weights_reorder_args, dst_reorder_args;
  // Residual Add fused as a sum post-op: the addend is copied (or reordered) into dst first.
  bool has_sum = false;
  memory::desc sum_user;
  std::optional<dnnl::reorder> sum_reorder;
  memory sum_user_mem;
  std::unordered_map<int, memory> sum_reorder_args;
  // The source reorder's attributes: a folded DequantizeLinear's scale and zero point, when src is
  // 8-bit codes (the reorder then dequantizes as it converts: float(q - z) * s, the same floats).
  dnnl::primitive_attr src_reorder_attr;
  // Layout of the output handed to readers (null: plain).
  LayoutPtr out_layout;
  // The fused activation run in place on the output when it is not a post-op of prim.
  std::vector<dnnl::eltwise_forward> activations;
  std::unordered_map<int, memory> activation_args;
  // A fused Swish run in place on the output by ew::swish_in_place_avx512 (its alpha), instead of
  // oneDNN's post-op or eltwise primitive (swish_pass_available()).
  std::optional<float> swish_pass_alpha;

  // Takes the primitive and its layouts from pd and binds the argument memories. packed: the
  // constant weights (packed now, once per layout), or nullptr when W is a runtime input.
  template <class PrimitiveDesc, class Primitive>
  void finish(const PrimitiveDesc& pd, PackedWeights* packed, bool with_bias) {
    prim = Primitive(pd);
    src_desc = pd.src_desc();
    weights_desc = pd.weights_desc();
    dst_desc = pd.dst_desc();
    src_reorder = make_reorder(src_user, src_desc, src_reorder_attr);
    dst_reorder = make_reorder(dst_desc, dst_user);
    src_user_mem = unbound_memory(src_user);
    src_mem = src_reorder ? unbound_memory(src_desc) : src_user_mem;
    dst_user_mem = unbound_memory(dst_user);
    dst_mem = dst_reorder ? unbound_memory(dst_desc) : dst_user_mem;
    if (packed) {
      weights_mem = packed->get(weights_desc);
    } else {
      weights_reorder = make_reorder(weights_user, weights_desc);
      weights_user_mem = unbound_memory(weights_user);
      weights_mem = weights_reorder ? unbound_memory(weights_desc) : weights_user_mem;
    }
    scratchpad_mem = unbound_memory(pd.scratchpad_desc());
    args = {{DNNL_ARG_SRC, src_mem}, {DNNL_ARG_WEIGHTS, weights_mem}, {DNNL_ARG_DST, dst_mem},
            {DNNL_ARG_SCRATCHPAD, scratchpad_mem}};
    if (with_bias) {
      bias_mem = unbound_memory(bias_user);
      args.emplace(DNNL_ARG_BIAS, bias_mem);
    }
    src_reorder_args = {{DNNL_ARG_FROM, src_user_mem}, {DNNL_ARG_TO, src_mem}};
    weights_reorder_args = {{DNNL_ARG_FROM, weights_user_mem}, {DNNL_ARG_TO, weights_mem}};
    dst_reorder_args = {{DNNL_ARG_FROM, dst_mem}, {DNNL_ARG_TO, dst_user_mem}};
    activation_args = {{DNNL_ARG_SRC, dst_user_mem}, {DNNL_ARG_DST, dst_user_mem}};
    if (has_sum) {
      sum_reorder = make_reorder(sum_user, dst_desc);
      sum_user_mem = unbound_memory(sum_user);
      sum_reorder_args = {{DNNL_ARG_FROM, sum_user_mem}, {DNNL_ARG_TO, dst_mem}};
    }
  }
};
// Runs the plan: x (plain) -> y (plain, already allocated with out_shape). runtime_w is the
// weights input when they are not constant (nullptr: packed at plan creation); bias may be null;
// sum is the fused residual addend (p.has_sum) or null.
void run_conv_like(ConvLikePlan& p, const Tensor& x, const Tensor* runtime_w, const Tensor* bias, Tensor& y,
                   const Tensor* sum = nullptr);

}  // namespace slimquant::runtime::dnnl_kernels
