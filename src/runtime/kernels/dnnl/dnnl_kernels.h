#pragma once
// Factories of the oneDNN FP32 kernels (one file each: dnnl_conv.cpp, dnnl_matmul.cpp, ...);
// dnnl_register.cpp registers them.
#include <memory>

#include "runtime/fused_ops/gelu_erf.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::dnnl_kernels {

std::unique_ptr<Kernel> make_conv(const KernelInit& init);
std::unique_ptr<Kernel> make_conv_transpose(const KernelInit& init);
std::unique_ptr<Kernel> make_gemm(const KernelInit& init);
std::unique_ptr<Kernel> make_matmul(const KernelInit& init);
std::unique_ptr<Kernel> make_max_pool(const KernelInit& init);
std::unique_ptr<Kernel> make_average_pool(const KernelInit& init);
std::unique_ptr<Kernel> make_global_average_pool(const KernelInit& init);
std::unique_ptr<Kernel> make_global_max_pool(const KernelInit& init);
// GlobalAveragePool's arithmetic on a float32 [N, C, H, W] value (H * W > 0), plain or in `layout`
// (channel-blocked ones read in place, others through a plain copy): means[n * C + c].
void global_average_floats(const Tensor& x, const Layout* layout, float* means);
std::unique_ptr<Kernel> make_batch_normalization(const KernelInit& init);
std::unique_ptr<Kernel> make_softmax(const KernelInit& init);
std::unique_ptr<Kernel> make_log_softmax(const KernelInit& init);
std::unique_ptr<Kernel> make_layer_normalization(const KernelInit& init);

// Execution-only Gelu (erf form, domain kGeluDomain: runtime/fused_ops/gelu_erf.h) on oneDNN's JIT
// eltwise, for GELUs the plan recognises in exported graphs (runtime/fusions).
std::unique_ptr<Kernel> make_gelu_erf(const KernelInit& init);

// How Conv hands activations to oneDNN. kAuto picks per primitive (see dnnl_conv.cpp); the others
// exist so tests and benchmarks can compare the two layouts on the same shapes.
enum class ConvLayout { kAuto, kPlain, kBlocked };
void set_conv_layout_override(ConvLayout layout);  // process-wide; kAuto restores the default

}  // namespace slimquant::runtime::dnnl_kernels
