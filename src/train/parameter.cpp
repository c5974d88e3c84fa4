#include "slimquant/train/parameter.h"

#include <algorithm>

namespace slimquant::train {

void Parameter::zero_grad() {
  if (!grad.defined() || grad.shape() != value.shape() || grad.dtype() != value.dtype()) {
    grad = Tensor(value.dtype(), value.shape());
    return;
  }
  std::fill_n(static_cast<std::byte*>(grad.raw()), grad.nbytes(), std::byte{0});
}

}  // namespace slimquant::train
