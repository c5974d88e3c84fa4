// Registers the oneDNN FP32 kernels (one line per op).
#include "runtime/kernels/dnnl/dnnl_kernels.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {

void register_dnnl_kernels(KernelRegistry& r) {
  using namespace dnnl_kernels;
  r.add("Conv", make_conv, "", layouts::kConvolution);
  r.add("ConvTranspose", make_conv_transpose);
  r.add("Gemm", make_gemm);
  r.add("MatMul", make_matmul);
  r.add("MaxPool", make_max_pool, "", layouts::kPooling);
  r.add("AveragePool", make_average_pool, "", layouts::kPooling);
  r.add("GlobalAveragePool", make_global_average_pool, "", layouts::kChannelBlockedToPlain);
  r.add("GlobalMaxPool", make_global_max_pool, "", layouts::kChannelBlockedToPlain);
  r.add("BatchNormalization", make_batch_normalization);
  r.add("Softmax", make_softmax);
  r.add("LogSoftmax", make_log_softmax);
  r.add("LayerNormalization", make_layer_normalization);
  r.add("Gelu", make_gelu_erf, kGeluDomain, layouts::kPassthrough);
}

}  // namespace slimquant::runtime
