// Misc math kernels (normalization_misc.cpp, hardmax_cumsum.cpp, einsum.cpp): one line per op.
#include "runtime/kernels/math/misc_math_kernels.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {

void register_misc_math_kernels(KernelRegistry& r) {
  using namespace misc;
  r.add("InstanceNormalization", make_instance_normalization);
  r.add("LRN", make_lrn);
  r.add("MeanVarianceNormalization", make_mean_variance_normalization);
  r.add("Hardmax", make_hardmax);
  r.add("CumSum", make_cumsum);
  r.add("Einsum", make_einsum);
}

}  // namespace slimquant::runtime
