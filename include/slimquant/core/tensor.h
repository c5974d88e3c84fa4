#pragma once
// Tensor: dtype + shape + contiguous row-major storage, shared between copies (cheap to pass
// around; clone() for a deep copy). Storage is 64-byte aligned for vector kernels.
// A Tensor may instead hold an ONNX sequence (Tensor::sequence: an ordered list of tensors of one
// element type), so that sessions, feeds, outputs and nested sessions carry sequences like any
// value; to tensor code it looks empty (shape [0], no storage), and only the ops taking
// sequences read its elements().
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "slimquant/core/error.h"

namespace slimquant {

// One source of truth for the dtypes we handle; values match ONNX TensorProto.DataType.
#define SQ_DTYPES(X)              \
  X(kFloat32, float, 1, "float32") \
  X(kUInt8, uint8_t, 2, "uint8")   \
  X(kInt8, int8_t, 3, "int8")      \
  X(kUInt16, uint16_t, 4, "uint16")\
  X(kInt16, int16_t, 5, "int16")   \
  X(kInt32, int32_t, 6, "int32")   \
  X(kInt64, int64_t, 7, "int64")   \
  X(kBool, bool, 9, "bool")        \
  X(kFloat64, double, 11, "float64") \
  X(kUInt32, uint32_t, 12, "uint32") \
  X(kUInt64, uint64_t, 13, "uint64")

enum class DType : int {
  kUndefined = 0,
#define SQ_DTYPE_ENUM(name, ctype, onnx_id, str) name = onnx_id,
  SQ_DTYPES(SQ_DTYPE_ENUM)
#undef SQ_DTYPE_ENUM
  // Storage only, inside a compiled plan: a float32 value held as IEEE half-precision bits where the
  // plan allows it (runtime::KernelLayouts::float16_outputs). Models never carry it (see below), and
  // kernels read it only at inputs that declare it; widen_float16 gives float32 back.
  kFloat16 = 10,
};

size_t dtype_size(DType t);
const char* dtype_name(DType t);
// Maps an ONNX TensorProto data type id; throws kUnsupported naming the type for ones we lack.
DType dtype_from_onnx(int onnx_type);
bool dtype_is_float(DType t);

// ONNX's 16-bit float types are not dtypes here. A model storing them (weights, inputs, outputs,
// Casts) is held and computed in float32 and written back in its stored type (ir::Graph::
// stored_float_types), as ONNX Runtime's CPU kernels also compute most fp16 nodes in float32.
inline constexpr int kOnnxFloat16 = 10;
inline constexpr int kOnnxBFloat16 = 16;
inline bool is_onnx_16bit_float(int onnx_type) { return onnx_type == kOnnxFloat16 || onnx_type == kOnnxBFloat16; }
// "float16" / "bfloat16".
const char* onnx_16bit_float_name(int onnx_type);
// Bits of a float16/bfloat16 value to float32 (exact).
float float_from_16bit(uint16_t bits, int onnx_type);
// float32 to float16/bfloat16 bits, rounding to nearest even (overflow to infinity, NaN kept NaN).
uint16_t float_to_16bit(float value, int onnx_type);
// value rounded to the nearest float16/bfloat16, as float32: what a Cast to that type keeps.
inline float round_to_16bit_float(float value, int onnx_type) {
  return float_from_16bit(float_to_16bit(value, onnx_type), onnx_type);
}

template <typename T> struct DTypeOf;
#define SQ_DTYPE_OF(name, ctype, onnx_id, str) \
  template <> struct DTypeOf<ctype> { static constexpr DType value = DType::name; };
SQ_DTYPES(SQ_DTYPE_OF)
#undef SQ_DTYPE_OF
template <typename T> inline constexpr DType dtype_of = DTypeOf<T>::value;

using Shape = std::vector<int64_t>;
// Element count; throws kInvalidArgument when the product overflows int64 (dims such as
// [2^32, 2^32] from a hostile file would otherwise wrap to a small count and a small buffer).
int64_t shape_numel(const Shape& s);
std::string shape_str(const Shape& s);

// The most bytes one tensor may take: SLIMQUANT_MAX_TENSOR_BYTES (a byte count, with an optional
// K/M/G/T suffix, powers of 1024), 4 GiB when unset. A larger tensor is refused before anything is
// allocated, so a shape from a careless or hostile model or input becomes an error naming it
// instead of an 8 GB write, swapping, or "out of memory".
size_t max_tensor_bytes();
// Overrides the limit for this process (tests, embedding applications); 0 restores the default.
void set_max_tensor_bytes(size_t bytes);
// Bytes a `dtype` tensor of `shape` needs: dims must be non-negative, the element count and byte
// size must not overflow, and the size must be within max_tensor_bytes(). Failures throw `kind`
// with a message starting with `what` (which names the tensor).
size_t checked_tensor_bytes(DType dtype, const Shape& shape, const std::string& what,
                            ErrorKind kind = ErrorKind::kInvalidArgument);

class Tensor {
 public:
  Tensor() = default;
  // Allocates zero-initialised storage; the size is checked first (checked_tensor_bytes).
  Tensor(DType dtype, Shape shape);
  // Wraps existing storage (at least numel * dtype_size bytes) without copying.
  Tensor(DType dtype, Shape shape, std::shared_ptr<std::byte[]> storage, size_t capacity_bytes);

  template <typename T>
  static Tensor from_vector(Shape shape, const std::vector<T>& values) {
    Tensor t(dtype_of<T>, std::move(shape));
    SQ_CHECK(static_cast<size_t>(t.numel()) == values.size(), ErrorKind::kInvalidArgument,
             "Tensor::from_vector: " + std::to_string(values.size()) + " values for shape " +
                 shape_str(t.shape()));
    std::copy(values.begin(), values.end(), t.data<T>());
    return t;
  }
  template <typename T>
  static Tensor scalar(T v) { return from_vector<T>({}, {v}); }
  // A sequence of `elements`, each of dtype `element_type` (checked).
  static Tensor sequence(DType element_type, std::vector<Tensor> elements);

  bool defined() const { return dtype_ != DType::kUndefined; }
  DType dtype() const { return dtype_; }
  const Shape& shape() const { return shape_; }
  int64_t dim(size_t i) const { return shape_.at(i); }
  size_t rank() const { return shape_.size(); }
  int64_t numel() const { return shape_numel(shape_); }
  size_t nbytes() const { return static_cast<size_t>(numel()) * dtype_size(dtype_); }
  size_t capacity_bytes() const { return capacity_; }

  void* raw() { return storage_.get(); }
  const void* raw() const { return storage_.get(); }
  template <typename T> T* data() {
    check_type(dtype_of<T>);
    return reinterpret_cast<T*>(storage_.get());
  }
  template <typename T> const T* data() const {
    check_type(dtype_of<T>);
    return reinterpret_cast<const T*>(storage_.get());
  }
  template <typename T> std::span<T> values() { return {data<T>(), static_cast<size_t>(numel())}; }
  template <typename T> std::span<const T> values() const {
    return {data<T>(), static_cast<size_t>(numel())};
  }
  // Values converted to int64 / float (any integer or float dtype); for small shape tensors.
  std::vector<int64_t> to_int64_vector() const;
  std::vector<float> to_float_vector() const;

  // Same storage, new shape with the same element count.
  Tensor reshaped(Shape shape) const;
  Tensor clone() const;
  // Element-wise conversion.
  Tensor cast(DType to) const;
  const std::shared_ptr<std::byte[]>& storage() const { return storage_; }

  bool is_sequence() const { return elements_ != nullptr; }
  // The elements of a sequence (dtype() is their type); throws kInvalidArgument for a tensor.
  const std::vector<Tensor>& elements() const;

 private:
  void check_type(DType expected) const;

  DType dtype_ = DType::kUndefined;
  Shape shape_;
  std::shared_ptr<std::byte[]> storage_;
  size_t capacity_ = 0;
  std::shared_ptr<const std::vector<Tensor>> elements_;  // non-null for a sequence
};

// 64-byte aligned, zeroed allocation; at most max_tensor_bytes() (kInvalidArgument above it).
// Buffers of 1 MiB or more are kept after release for reuse, up to SLIMQUANT_BUFFER_CACHE_MB
// (src/core/large_buffers.cpp).
std::shared_ptr<std::byte[]> allocate_storage(size_t bytes);
// Whether large buffers are kept for reuse (not with SLIMQUANT_BUFFER_CACHE_MB=0 or under
// AddressSanitizer), the bytes held now, and giving them back to the system.
bool large_buffers_reused();
size_t cached_buffer_bytes();
void release_cached_buffers();

// Calls f(T{}) with T the C++ type of dtype; throws kUnsupported for others.
template <typename F>
decltype(auto) dispatch_dtype(DType dtype, F&& f) {
  switch (dtype) {
#define SQ_DTYPE_CASE(name, ctype, onnx_id, str) \
  case DType::name: return f(ctype{});
    SQ_DTYPES(SQ_DTYPE_CASE)
#undef SQ_DTYPE_CASE
    default: break;
  }
  fail(ErrorKind::kUnsupported, std::string("unsupported dtype ") + dtype_name(dtype));
}

}  // namespace slimquant

namespace slimquant {
// Numpy-style multidirectional broadcast; throws kInvalidArgument if incompatible.
Shape broadcast_shapes(const Shape& a, const Shape& b);
// Row-major strides in elements.
std::vector<int64_t> contiguous_strides(const Shape& s);
// Maps a possibly negative axis into [0, rank); throws kInvalidArgument naming `what` otherwise.
int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& what);
}  // namespace slimquant
