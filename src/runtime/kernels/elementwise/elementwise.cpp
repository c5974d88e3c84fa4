// The elementwise family: arithmetic, comparison and logic with numpy broadcasting, unary math and
// activations, reductions, Cast, and QuantizeLinear / DequantizeLinear. Plain C++ loops written to
// vectorise (see elementwise_common.h for the broadcast walk).
#include "runtime/kernels/elementwise/elementwise_register.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {

void register_elementwise_kernels(KernelRegistry& r) {
  ew::register_binary_kernels(r);
  ew::register_unary_kernels(r);
  ew::register_reduce_kernels(r);
  ew::register_cast_kernels(r);
  ew::register_quantize_kernels(r);
}

}  // namespace slimquant::runtime
