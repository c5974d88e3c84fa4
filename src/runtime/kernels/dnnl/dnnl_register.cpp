// Registers the oneDNN FP32 kernels (one line per op).
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {
namespace {

using fused_ops::Activation;

// The activations the float kernels apply as oneDNN eltwise post-ops (GELU only after a MatMul's
// bias, fuse_matmul_bias; kScale only after a MatMul).
constexpr uint32_t kEltwiseActivations = folds::activation_bits(
    {Activation::kRelu, Activation::kClip, Activation::kLeakyRelu, Activation::kSigmoid, Activation::kTanh,
     Activation::kHardSigmoid, Activation::kHardSwish, Activation::kElu, Activation::kSwish});

// oneDNN 2.6's JIT injector gives a second eltwise_linear in one chain the first one's parameters
// (measured, see int8_common.cpp): no post-affine map after an activation that ends in a linear
// step, and no clamp after one that already clips (HardSigmoid, Clip), for the same reason.
bool conv_refuses(const ir::Node& n, Fold fold, int /*input*/) {
  const Activation kind = fused_ops::FusedActivation::parse(n).kind;
  if (fold == Fold::kPostAffine) return kind == Activation::kHardSigmoid;
  if (fold == Fold::kPostClamp) return kind == Activation::kHardSigmoid || kind == Activation::kClip;
  return false;
}

constexpr KernelFolds kConvFolds{.dequantized_inputs = 1u << fused_ops::kConvX, .activations = kEltwiseActivations,
                                 .post_affine = true, .post_clamp = true, .refuses = conv_refuses};
constexpr KernelFolds kLayerFolds{.activations = kEltwiseActivations};  // ConvTranspose, Gemm
// MatMul reads A and B through a Transpose (attention's head splits and K^T) and writes its result
// through one (the heads' merge) as strides.
constexpr KernelFolds kMatMulFolds{.transposed_inputs = 0b11, .activations = folds::activation_bits({Activation::kScale}),
                                   .transposed_output = true};
// The pools sum a squeeze-excitation input's codes (dequantizing each as ONNX would).
constexpr KernelFolds kGlobalPoolFolds{.dequantized_inputs = 1u << 0};
// Softmax writes the attention probabilities as the integer MatMul after it reads them.
constexpr KernelFolds kSoftmaxFolds{.tensor_quantize = true};

}  // namespace

void register_dnnl_kernels(KernelRegistry& r) {
  using namespace dnnl_kernels;
  r.add("Conv", make_conv, "", layouts::kConvolution, kConvFolds);
  r.add("ConvTranspose", make_conv_transpose, "", {}, kLayerFolds);
  r.add("Gemm", make_gemm, "", {}, kLayerFolds);
  r.add("MatMul", make_matmul, "", {}, kMatMulFolds);
  r.add("MaxPool", make_max_pool, "", layouts::kPooling);
  r.add("AveragePool", make_average_pool, "", layouts::kPooling);
  r.add("GlobalAveragePool", make_global_average_pool, "", layouts::kChannelBlockedToPlain, kGlobalPoolFolds);
  r.add("GlobalMaxPool", make_global_max_pool, "", layouts::kChannelBlockedToPlain, kGlobalPoolFolds);
  r.add("BatchNormalization", make_batch_normalization);
  r.add("Softmax", make_softmax, "", {}, kSoftmaxFolds);
  r.add("LogSoftmax", make_log_softmax);
  r.add("LayerNormalization", make_layer_normalization);
  r.add("Gelu", make_gelu_erf, kGeluDomain, layouts::kPassthrough);
}

}  // namespace slimquant::runtime
