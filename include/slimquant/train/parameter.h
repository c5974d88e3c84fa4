#pragma once
// A trainable float tensor and its gradient. Gradients accumulate (backward adds), so callers
// zero them once per optimizer step.
#include <string>

#include "slimquant/core/tensor.h"

namespace slimquant::train {

struct Parameter {
  std::string name;
  Tensor value;
  Tensor grad;  // same shape as value; allocated (zeros) by zero_grad() when undefined
  void zero_grad();
};

}  // namespace slimquant::train
