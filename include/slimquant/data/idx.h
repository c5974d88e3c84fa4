#pragma once
// IDX files (the MNIST / Fashion-MNIST container): big-endian header and data, optionally gzipped.
#include <string>

#include "slimquant/core/tensor.h"

namespace slimquant::data {

// Reads a whole IDX file, gzipped or not (detected from the content, not the name). Supported
// element types: u8, i8, i16, i32, f32, f64. Throws kIo (missing/unreadable) or kInvalidData (bad
// magic number, sizes that disagree with the header).
Tensor read_idx(const std::string& path);

}  // namespace slimquant::data
