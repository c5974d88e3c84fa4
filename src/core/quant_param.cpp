#include "slimquant/core/quant_param.h"

#include <limits>
#include <string>

#include "slimquant/core/error.h"

namespace slimquant {

int32_t qmin_of(DType t) {
  switch (t) {
    case DType::kUInt8: return std::numeric_limits<uint8_t>::min();
    case DType::kInt8: return std::numeric_limits<int8_t>::min();
    case DType::kUInt16: return std::numeric_limits<uint16_t>::min();
    case DType::kInt16: return std::numeric_limits<int16_t>::min();
    case DType::kInt32: return std::numeric_limits<int32_t>::min();
    default: fail(ErrorKind::kUnsupported, std::string("no integer range for quantized type ") + dtype_name(t));
  }
}

int32_t qmax_of(DType t) {
  switch (t) {
    case DType::kUInt8: return std::numeric_limits<uint8_t>::max();
    case DType::kInt8: return std::numeric_limits<int8_t>::max();
    case DType::kUInt16: return std::numeric_limits<uint16_t>::max();
    case DType::kInt16: return std::numeric_limits<int16_t>::max();
    case DType::kInt32: return std::numeric_limits<int32_t>::max();
    default: fail(ErrorKind::kUnsupported, std::string("no integer range for quantized type ") + dtype_name(t));
  }
}

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
