#pragma once
// Factories of the detection / segmentation head kernels (NonMaxSuppression and RoiAlign in
// detection.cpp, GridSample in grid_sample.cpp); detection.cpp registers them.
#include <memory>

#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime::detection {

std::unique_ptr<Kernel> make_non_max_suppression(const KernelInit& init);
std::unique_ptr<Kernel> make_roi_align(const KernelInit& init);
std::unique_ptr<Kernel> make_grid_sample(const KernelInit& init);

}  // namespace slimquant::runtime::detection
