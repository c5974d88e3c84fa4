// Registers the fused INT8 kernels (domain com.slimquant) that INT8 lowering produces.
#include "runtime/fused_ops/matmul_qb4w.h"
#include "runtime/kernels/integer/int8_common.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {
namespace {

// A QConv with a float32 output (a residual sum added after it, in real units) takes the
// QuantizeLinear after it; one whose output is already 8-bit has nothing left to quantize.
bool qconv_refuses(const ir::Node& n, Fold fold, int /*input*/) {
  return fold == Fold::kTensorQuantize && n.attr_int(int8::attr::kYType, 1) != static_cast<int64_t>(DType::kFloat32);
}
constexpr KernelFolds kQConvFolds{.tensor_quantize = true, .refuses = qconv_refuses};

}  // namespace

void register_int8_kernels(KernelRegistry& r) {
  int8::register_int8_onnx_schemas();
  r.add(int8::kQConv, int8::make_qconv, int8::kDomain, layouts::kConvolution, kQConvFolds);
  r.add(int8::kQGemm, int8::make_qgemm, int8::kDomain);
  r.add(int8::kQMatMul, int8::make_qmatmul, int8::kDomain);
  r.add(fused_ops::kMatMulQb4w, fused_ops::make_matmul_f32_qb4w, fused_ops::kMatMulQb4wDomain);  // weight-only 4-bit
}

}  // namespace slimquant::runtime
