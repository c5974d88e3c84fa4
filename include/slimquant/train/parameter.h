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
  // Multiplies the optimizer's learning rate for this parameter (PaddleSlim's ParamAttr
  // learning_rate, e.g. PACT's clip trained 1000x faster than the weights).
  float lr_scale = 1.0f;
  void zero_grad();
};

}  // namespace slimquant::train
