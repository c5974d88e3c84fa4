// Softmax and LogSoftmax on oneDNN's softmax_v2_forward (softmax_accurate / softmax_log, both
// subtract the row maximum first, so large inputs do not overflow).
//
// Opsets 1-12: the input is coerced to 2-D [prod(dims < axis), prod(dims >= axis)] and normalised
// along the second dim (axis default 1). Opset 13+: normalised along `axis` alone (default -1).
// Either way X is viewed as [outer, n, inner] (same bytes), which also keeps the rank within
// oneDNN's limit.
#include "runtime/kernels/dnnl/dnnl_common.h"
#include "runtime/kernels/dnnl/dnnl_kernels.h"

namespace slimquant::runtime::dnnl_kernels {

namespace {

struct SoftmaxPlan {
  dnnl::softmax_v2_forward prim;
  memory src, dst, scratchpad;  // bound once, pointed at each call's data
  std::unordered_map<int, memory> args;
};

class SoftmaxKernel final : public Kernel {
 public:
  SoftmaxKernel(const KernelInit& init, bool log)
      : node_(init.node), log_(log), coerce_2d_(init.opset < 13),
        axis_(node_.attr_int("axis", init.opset < 13 ? 1 : -1)) {
    reject_fused_activation(node_);
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_float32(node_, x, "input");
    SoftmaxPlan& p = plans_.get({&x.shape()}, [&] { return make_plan(x.shape()); });
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
    if (y.numel() == 0) return;
    p.src.set_data_handle(const_cast<void*>(x.raw()));
    p.dst.set_data_handle(y.raw());
    bind_scratchpad(p.scratchpad);
    execute(p.prim, p.args);
  }

 private:
  SoftmaxPlan make_plan(const Shape& xs) const {
    const int64_t rank = static_cast<int64_t>(xs.size());
    // A scalar is a one-element row.
    const int64_t axis = rank == 0 ? 0 : normalize_axis(axis_, rank, node_.describe() + " axis");
    int64_t outer = 1, n = 1, inner = 1;
    for (int64_t i = 0; i < rank; ++i) {
      if (i < axis) outer *= xs[i];
      else if (i == axis || coerce_2d_) n *= xs[i];
      else inner *= xs[i];
    }
    SoftmaxPlan p;
    // inner == 1 is the common case (last axis); a 2-D view lets oneDNN use its vectorised kernel.
    const memory::desc data = inner == 1 ? memory::desc({outer, n}, dt::f32, memory::format_tag::ab)
                                         : memory::desc({outer, n, inner}, dt::f32, memory::format_tag::abc);
    const auto alg = log_ ? dnnl::algorithm::softmax_log : dnnl::algorithm::softmax_accurate;
    using sm = dnnl::softmax_v2_forward;
    auto pd = make_pd(node_, "this softmax", [&] {
      return sm::primitive_desc(sm::desc(dnnl::prop_kind::forward_inference, alg, data, data, 1), base_attr(),
                                dnnl_engine());
    });
    p.prim = sm(pd);
    p.src = unbound_memory(data);
    p.dst = unbound_memory(data);
    p.scratchpad = unbound_memory(pd.scratchpad_desc());
    p.args = {{DNNL_ARG_SRC, p.src}, {DNNL_ARG_DST, p.dst}, {DNNL_ARG_SCRATCHPAD, p.scratchpad}};
    return p;
  }

  const ir::Node node_;
  const bool log_;
  const bool coerce_2d_;
  const int64_t axis_;
  ShapeCache<SoftmaxPlan> plans_;
};

}  // namespace

namespace {

// Gelu (erf form) over any float32 tensor: one JIT eltwise pass in place of the exported
// Div/Erf/Add/Mul/Mul chain. The element order does not matter, so the tensor is viewed as 1-D.
class GeluErfKernel final : public Kernel {
 public:
  explicit GeluErfKernel(const KernelInit& init) : node_(init.node) { reject_fused_activation(node_); }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    require_float32(node_, x, "input");
    Tensor& y = ctx.allocate_output(0, DType::kFloat32, x.shape());
    if (y.numel() == 0) return;
    const Shape flat = {x.numel()};
    Plan& p = plans_.get({&flat}, [&] {
      Plan q;
      const memory::desc d = plain_desc(flat);
      using ef = dnnl::eltwise_forward;
      q.prim = ef(make_pd(node_, "gelu", [&] {
        return ef::primitive_desc(ef::desc(dnnl::prop_kind::forward_inference, dnnl::algorithm::eltwise_gelu_erf, d),
                                  base_attr(), dnnl_engine());
      }));
      q.src = unbound_memory(d);
      q.dst = unbound_memory(d);
      q.args = {{DNNL_ARG_SRC, q.src}, {DNNL_ARG_DST, q.dst}};
      return q;
    });
    p.src.set_data_handle(const_cast<void*>(x.raw()));
    p.dst.set_data_handle(y.raw());
    execute(p.prim, p.args);
  }

 private:
  struct Plan {
    dnnl::eltwise_forward prim;
    memory src, dst;
    std::unordered_map<int, memory> args;
  };
  const ir::Node node_;
  ShapeCache<Plan> plans_;
};

}  // namespace

std::unique_ptr<Kernel> make_gelu_erf(const KernelInit& init) { return std::make_unique<GeluErfKernel>(init); }

std::unique_ptr<Kernel> make_softmax(const KernelInit& init) { return std::make_unique<SoftmaxKernel>(init, false); }
std::unique_ptr<Kernel> make_log_softmax(const KernelInit& init) {
  return std::make_unique<SoftmaxKernel>(init, true);
}

}  // namespace slimquant::runtime::dnnl_kernels
