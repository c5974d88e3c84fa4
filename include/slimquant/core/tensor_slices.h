#pragma once
// Copies along one axis of a tensor: what batching does to inputs whose samples lie on another
// axis than the first (a recurrent state [layers, batch, hidden]).
#include <cstddef>
#include <cstdint>
#include <vector>

#include "slimquant/core/tensor.h"

namespace slimquant {

// Entries [first, first + count) of `t` along `axis`, as a new tensor (kInvalidArgument when the
// axis or the range is out of bounds).
Tensor slice_along(const Tensor& t, size_t axis, int64_t first, int64_t count);

// Tensors of one dtype and rank that agree in every dimension but `axis`, joined along it in order
// (kInvalidArgument otherwise, or for none).
Tensor concat_along(const std::vector<Tensor>& parts, size_t axis);

// Copies `part` into `whole` at entries [first, first + part.dim(axis)) along `axis`: the two agree
// in dtype, rank and every other dimension (kInvalidArgument otherwise, or out of bounds).
void copy_along(const Tensor& part, Tensor& whole, size_t axis, int64_t first);

}  // namespace slimquant
