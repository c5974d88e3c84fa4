#pragma once
// NCHW <-> NHWC copies for the tests of kernels that read and write channels-last (the direct
// depthwise convolution, the banded convolution).
#include <vector>

#include "runtime/kernels/shape/shape_common.h"
#include "slimquant/core/tensor.h"

namespace slimquant::test {

// t's dims permuted (shape::transpose_bytes): {0, 2, 3, 1} makes NCHW channels-last, {0, 3, 1, 2}
// undoes it.
inline Tensor permuted(const Tensor& t, const std::vector<int64_t>& perm) {
  Shape out_shape;
  for (int64_t d : perm) out_shape.push_back(t.dim(d));
  Tensor out(t.dtype(), out_shape);
  runtime::shape::transpose_bytes(out.raw(), t.raw(), t.shape(), perm, dtype_size(t.dtype()));
  return out;
}
inline Tensor to_channels_last(const Tensor& t) { return permuted(t, {0, 2, 3, 1}); }
inline Tensor from_channels_last(const Tensor& t) { return permuted(t, {0, 3, 1, 2}); }

}  // namespace slimquant::test
