#pragma once
// Kernel factories of the "misc math" family: instance / local-response / mean-variance
// normalization (normalization_misc.cpp), Hardmax and CumSum (hardmax_cumsum.cpp), Einsum
// (einsum.cpp). misc_math_register.cpp maps op types to them.
#include <memory>

#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::misc {

std::unique_ptr<Kernel> make_instance_normalization(const KernelInit& init);
std::unique_ptr<Kernel> make_lrn(const KernelInit& init);
std::unique_ptr<Kernel> make_mean_variance_normalization(const KernelInit& init);
std::unique_ptr<Kernel> make_hardmax(const KernelInit& init);
std::unique_ptr<Kernel> make_cumsum(const KernelInit& init);
std::unique_ptr<Kernel> make_einsum(const KernelInit& init);

}  // namespace slimquant::runtime::misc
