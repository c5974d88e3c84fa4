#pragma once
// The execution-only erf GELU node: the plan's GELU fusion (session.cpp) writes it, oneDNN's JIT
// eltwise runs it (dnnl_kernels.h's make_gelu_erf), and INT8 lowering folds it into a fused node's
// activation. Its own domain keeps it away from ONNX's Gelu schema and kernel.
namespace slimquant::runtime::dnnl_kernels {

inline constexpr const char* kGeluDomain = "com.slimquant.exec";

}  // namespace slimquant::runtime::dnnl_kernels
