// Cast (target from the `to` attribute) and CastLike (target = dtype of input 1) between all our
// dtypes. Float to integer follows C++ conversion (truncation toward zero; out-of-range values are
// undefined in ONNX too); anything to bool is x != 0. float16 and bfloat16 are not dtypes of this
// runtime: the loader turns a Cast to them into a Cast to float32 that rounds to them
// (ir::kCastRoundsToAttr), which keeps their values (core/float16.h's vectorised rounding). String
// is rejected with kUnsupported when the plan is compiled.
#include <cstring>
#include <memory>

#include "runtime/kernels/elementwise/elementwise_common.h"
#include "runtime/kernels/elementwise/elementwise_math.h"
#include "runtime/kernels/elementwise/elementwise_register.h"
#include "slimquant/core/float16.h"

namespace slimquant::runtime::ew {
namespace {

void cast_into(const Tensor& x, Tensor& out) {
  dispatch_dtype(x.dtype(), [&](auto src_tag) {
    using S = decltype(src_tag);
    const Storage<S>* src = storage_ptr<S>(x.raw());
    dispatch_dtype(out.dtype(), [&](auto dst_tag) {
      using D = decltype(dst_tag);
      Storage<D>* dst = storage_ptr<D>(out.raw());
      parallel_range(x.numel(), [&](int64_t b, int64_t e) {
        if constexpr (std::is_same_v<D, bool>) {
          for (int64_t i = b; i < e; ++i) dst[i] = src[i] != Storage<S>(0);
        } else {
          for (int64_t i = b; i < e; ++i) dst[i] = static_cast<D>(src[i]);
        }
      });
    });
  });
}

// dtype for an ONNX type id, with the message the conformance table shows for the ones we lack.
DType target_dtype(const ir::Node& node, int64_t onnx_type) {
  switch (onnx_type) {
    case 10: case 16:  // float16, bfloat16
      fail(ErrorKind::kUnsupported, node.describe() + ": " + onnx_type_name(onnx_type) +
                                        " tensors are not supported");
    case 8:  // string
      fail(ErrorKind::kUnsupported, node.describe() + ": string tensors are not supported");
    default:
      break;
  }
  try {
    return dtype_from_onnx(static_cast<int>(onnx_type));
  } catch (const Error&) {
    fail(ErrorKind::kUnsupported,
         node.describe() + ": cast to " + onnx_type_name(onnx_type) + " is not supported");
  }
}

class CastKernel final : public Kernel {
 public:
  // to == kUndefined: CastLike, the target is input 1's dtype.
  CastKernel(const KernelInit& init, DType to)
      : node_(init.node), to_(to), rounds_to_(static_cast<int>(init.node.attr_int(ir::kCastRoundsToAttr, 0))) {
    reject_fused_activation(node_);
    SQ_CHECK(rounds_to_ == 0 || (is_onnx_16bit_float(rounds_to_) && to_ == DType::kFloat32), ErrorKind::kInvalidModel,
             node_.describe() + ": attribute " + ir::kCastRoundsToAttr + " must name float16 (10) or bfloat16 (16) on a "
                                "Cast to float");
  }

  void run(KernelContext& ctx) override {
    const Tensor& x = ctx.input(0);
    const DType to = to_ == DType::kUndefined ? ctx.input(1).dtype() : to_;
    if (rounds_to_ != 0) {
      Tensor& out = ctx.allocate_output(0, DType::kFloat32, x.shape());
      if (x.dtype() != DType::kFloat32) cast_into(x, out);
      const float* src = x.dtype() == DType::kFloat32 ? x.data<float>() : out.data<float>();
      float* dst = out.data<float>();
      const int type = rounds_to_;
      parallel_range(x.numel(), [&](int64_t b, int64_t e) { round_to_16bit_floats(src + b, dst + b, e - b, type); });
      return;
    }
    if (to == x.dtype()) {  // no conversion: share the storage
      ctx.set_output(0, x);
      return;
    }
    Tensor& out = ctx.allocate_output(0, to, x.shape());
    cast_into(x, out);
  }

 private:
  const ir::Node& node_;
  DType to_;
  int rounds_to_;  // ONNX type id of float16/bfloat16, or 0
};

}  // namespace

void register_cast_kernels(KernelRegistry& r) {
  r.add("Cast", [](const KernelInit& init) -> std::unique_ptr<Kernel> {
    SQ_CHECK(init.node.has_attr("to"), ErrorKind::kInvalidModel, init.node.describe() + ": missing attribute 'to'");
    return std::make_unique<CastKernel>(init, target_dtype(init.node, init.node.attr_int("to", 0)));
  });
  r.add("CastLike", [](const KernelInit& init) -> std::unique_ptr<Kernel> {
    return std::make_unique<CastKernel>(init, DType::kUndefined);
  });
}

}  // namespace slimquant::runtime::ew
