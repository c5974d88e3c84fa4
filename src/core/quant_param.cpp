#include "slimquant/core/quant_param.h"

#include <limits>
#include <utility>
#include <string>

#include "slimquant/core/error.h"

namespace slimquant {

namespace {

template <typename T>
std::pair<int32_t, int32_t> range_of() {
  return {std::numeric_limits<T>::min(), std::numeric_limits<T>::max()};
}

std::pair<int32_t, int32_t> integer_range(DType t) {
  switch (t) {
    case DType::kUInt8: return range_of<uint8_t>();
    case DType::kInt8: return range_of<int8_t>();
    case DType::kUInt16: return range_of<uint16_t>();
    case DType::kInt16: return range_of<int16_t>();
    case DType::kInt32: return range_of<int32_t>();
    default: fail(ErrorKind::kUnsupported, std::string("no integer range for quantized type ") + dtype_name(t));
  }
}

}  // namespace

int32_t qmin_of(DType t) { return integer_range(t).first; }
int32_t qmax_of(DType t) { return integer_range(t).second; }

// A signed grid of fewer bits is symmetric (weights): 8-bit s8 keeps -128 (activations).
int32_t QuantParam::qmin() const {
  if (bits < 8 && dtype == DType::kInt8) return -((1 << (bits - 1)) - 1);
  return qmin_of(dtype);
}

int32_t QuantParam::qmax() const {
  if (bits < 8 && dtype == DType::kInt8) return (1 << (bits - 1)) - 1;
  return qmax_of(dtype);
}

}  // namespace slimquant
