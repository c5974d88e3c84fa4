#include "slimquant/core/tensor.h"

#include <algorithm>
#include <atomic>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <sstream>

namespace slimquant {

size_t dtype_size(DType t) {
  switch (t) {
#define SQ_SIZE(name, ctype, onnx_id, str) \
  case DType::name: return sizeof(ctype);
    SQ_DTYPES(SQ_SIZE)
#undef SQ_SIZE
    default: return 0;
  }
}

const char* dtype_name(DType t) {
  switch (t) {
#define SQ_NAME(name, ctype, onnx_id, str) \
  case DType::name: return str;
    SQ_DTYPES(SQ_NAME)
#undef SQ_NAME
    default: return "undefined";
  }
}

DType dtype_from_onnx(int onnx_type) {
  switch (onnx_type) {
#define SQ_FROM(name, ctype, onnx_id, str) \
  case onnx_id: return DType::name;
    SQ_DTYPES(SQ_FROM)
#undef SQ_FROM
    default: break;
  }
  static const char* kOnnxNames[] = {"UNDEFINED", "FLOAT",  "UINT8",     "INT8",      "UINT16",
                                     "INT16",     "INT32",  "INT64",     "STRING",    "BOOL",
                                     "FLOAT16",   "DOUBLE", "UINT32",    "UINT64",    "COMPLEX64",
                                     "COMPLEX128", "BFLOAT16"};
  std::string name = onnx_type >= 0 && onnx_type <= 16 ? kOnnxNames[onnx_type]
                                                       : "type id " + std::to_string(onnx_type);
  fail(ErrorKind::kUnsupported, "unsupported tensor element type " + name);
}

bool dtype_is_float(DType t) { return t == DType::kFloat32 || t == DType::kFloat64; }

const char* onnx_16bit_float_name(int onnx_type) { return onnx_type == kOnnxBFloat16 ? "bfloat16" : "float16"; }

// float16 through the compiler's IEEE binary16 type (F16C where the target has it, libgcc's exact
// soft conversion otherwise); bfloat16 is the top half of a float32.
float float_from_16bit(uint16_t bits, int onnx_type) {
  if (onnx_type == kOnnxBFloat16) {
    const uint32_t wide = static_cast<uint32_t>(bits) << 16;
    float v;
    std::memcpy(&v, &wide, sizeof v);
    return v;
  }
  _Float16 half;
  std::memcpy(&half, &bits, sizeof half);
  return static_cast<float>(half);
}

uint16_t float_to_16bit(float value, int onnx_type) {
  uint16_t bits;
  if (onnx_type == kOnnxBFloat16) {
    uint32_t wide;
    std::memcpy(&wide, &value, sizeof wide);
    if (std::isnan(value)) return static_cast<uint16_t>((wide >> 16) | 0x40);  // quiet, sign kept
    wide += 0x7FFF + ((wide >> 16) & 1);  // round to nearest even; carries into the exponent (to inf)
    return static_cast<uint16_t>(wide >> 16);
  }
  const _Float16 half = static_cast<_Float16>(value);
  std::memcpy(&bits, &half, sizeof bits);
  return bits;
}

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s)
    if (__builtin_mul_overflow(n, d, &n))
      fail(ErrorKind::kInvalidArgument, "the element count of shape " + shape_str(s) + " overflows 64 bits");
  return n;
}

namespace {

constexpr size_t kDefaultMaxTensorBytes = size_t{4} << 30;
std::atomic<size_t> max_tensor_bytes_override{0};

size_t max_tensor_bytes_from_environment() {
  const char* text = std::getenv("SLIMQUANT_MAX_TENSOR_BYTES");
  if (!text || !*text) return kDefaultMaxTensorBytes;
  const std::string value(text);
  unsigned long long bytes = 0;
  const auto [end, ec] = std::from_chars(value.data(), value.data() + value.size(), bytes);
  std::string suffix(end, value.data() + value.size());
  int shift = 0;
  if (suffix.size() == 1) {
    const size_t at = std::string("KMGT").find(static_cast<char>(std::toupper(static_cast<unsigned char>(suffix[0]))));
    if (at != std::string::npos) shift = 10 * static_cast<int>(at + 1), suffix.clear();
  }
  if (ec != std::errc() || !suffix.empty() || bytes == 0 || (shift && bytes > (~0ull >> shift)))
    fail(ErrorKind::kInvalidArgument, "SLIMQUANT_MAX_TENSOR_BYTES='" + value +
                                          "' is not a positive byte count (such as 8589934592 or 8G)");
  return static_cast<size_t>(bytes << shift);
}

}  // namespace

size_t max_tensor_bytes() {
  if (const size_t set = max_tensor_bytes_override.load(std::memory_order_relaxed)) return set;
  static const size_t from_environment = max_tensor_bytes_from_environment();
  return from_environment;
}

void set_max_tensor_bytes(size_t bytes) { max_tensor_bytes_override.store(bytes, std::memory_order_relaxed); }

size_t checked_tensor_bytes(DType dtype, const Shape& shape, const std::string& what, ErrorKind kind) {
  for (int64_t d : shape)
    if (d < 0) fail(kind, what + ": negative dimension in shape " + shape_str(shape));
  int64_t numel = 1;
  size_t bytes = 0;
  bool overflow = false;
  for (int64_t d : shape) overflow = overflow || __builtin_mul_overflow(numel, d, &numel);
  overflow = overflow || __builtin_mul_overflow(static_cast<size_t>(numel), dtype_size(dtype), &bytes);
  const size_t limit = max_tensor_bytes();
  if (overflow)
    fail(kind, what + ": shape " + shape_str(shape) + " has more elements than 64 bits can count");
  if (bytes > limit)
    fail(kind, what + " (" + dtype_name(dtype) + " " + shape_str(shape) + ") needs " + std::to_string(bytes) +
                   " bytes, more than the limit of " + std::to_string(limit) +
                   " bytes for one tensor (SLIMQUANT_MAX_TENSOR_BYTES)");
  return bytes;
}

std::string shape_str(const Shape& s) {
  std::ostringstream os;
  os << "[";
  for (size_t i = 0; i < s.size(); ++i) os << (i ? "x" : "") << s[i];
  os << "]";
  return os.str();
}

std::shared_ptr<std::byte[]> allocate_storage(size_t bytes) {
  constexpr size_t kAlign = 64;
  if (bytes > max_tensor_bytes())
    fail(ErrorKind::kInvalidArgument, "refusing to allocate " + std::to_string(bytes) + " bytes, more than the limit of " +
                                          std::to_string(max_tensor_bytes()) + " bytes for one buffer (SLIMQUANT_MAX_TENSOR_BYTES)");
  size_t rounded = std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) fail(ErrorKind::kInternal, "out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, rounded);
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  capacity_ = checked_tensor_bytes(dtype_, shape_, "a tensor");
  storage_ = allocate_storage(capacity_);
}

Tensor::Tensor(DType dtype, Shape shape, std::shared_ptr<std::byte[]> storage, size_t capacity_bytes)
    : dtype_(dtype), shape_(std::move(shape)), storage_(std::move(storage)), capacity_(capacity_bytes) {
  for (int64_t d : shape_)
    SQ_CHECK(d >= 0, ErrorKind::kInvalidArgument, "negative dimension in shape " + shape_str(shape_));
  size_t bytes = 0;
  SQ_CHECK(!__builtin_mul_overflow(static_cast<size_t>(numel()), dtype_size(dtype_), &bytes) && bytes <= capacity_, ErrorKind::kInternal,
           "tensor storage of " + std::to_string(capacity_) + " bytes too small for " +
               shape_str(shape_));
}

Tensor Tensor::sequence(DType element_type, std::vector<Tensor> elements) {
  SQ_CHECK(element_type != DType::kUndefined, ErrorKind::kInvalidArgument, "a sequence needs an element type");
  for (const Tensor& e : elements)
    SQ_CHECK(e.dtype() == element_type && !e.is_sequence(), ErrorKind::kInvalidArgument,
             std::string("a sequence of ") + dtype_name(element_type) + " tensors cannot hold a " +
                 (e.is_sequence() ? "sequence" : dtype_name(e.dtype())) + " element");
  Tensor t;
  t.dtype_ = element_type;
  t.shape_ = {0};
  t.elements_ = std::make_shared<const std::vector<Tensor>>(std::move(elements));
  return t;
}

const std::vector<Tensor>& Tensor::elements() const {
  SQ_CHECK(elements_ != nullptr, ErrorKind::kInvalidArgument,
           "expected a sequence, got a " + std::string(dtype_name(dtype_)) + " tensor of shape " + shape_str(shape_));
  return *elements_;
}

void Tensor::check_type(DType expected) const {
  if (dtype_ != expected)
    fail(ErrorKind::kInternal, std::string("tensor holds ") + dtype_name(dtype_) + ", accessed as " +
                                   dtype_name(expected));
}

std::vector<int64_t> Tensor::to_int64_vector() const {
  std::vector<int64_t> out(static_cast<size_t>(numel()));
  dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T* p = reinterpret_cast<const T*>(storage_.get());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<int64_t>(p[i]);
  });
  return out;
}

std::vector<float> Tensor::to_float_vector() const {
  std::vector<float> out(static_cast<size_t>(numel()));
  dispatch_dtype(dtype_, [&](auto tag) {
    using T = decltype(tag);
    const T* p = reinterpret_cast<const T*>(storage_.get());
    for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<float>(p[i]);
  });
  return out;
}

Tensor Tensor::reshaped(Shape shape) const {
  SQ_CHECK(shape_numel(shape) == numel(), ErrorKind::kInvalidArgument,
           "cannot reshape " + shape_str(shape_) + " to " + shape_str(shape));
  return Tensor(dtype_, std::move(shape), storage_, capacity_);
}

Tensor Tensor::clone() const {
  if (!defined()) return {};
  if (is_sequence()) {
    std::vector<Tensor> copies;
    for (const Tensor& e : elements()) copies.push_back(e.clone());
    return sequence(dtype_, std::move(copies));
  }
  Tensor t(dtype_, shape_);
  if (nbytes()) std::memcpy(t.raw(), raw(), nbytes());
  return t;
}

Tensor Tensor::cast(DType to) const {
  Tensor out(to, shape_);
  const int64_t n = numel();
  dispatch_dtype(dtype_, [&](auto src_tag) {
    using S = decltype(src_tag);
    const S* src = reinterpret_cast<const S*>(storage_.get());
    dispatch_dtype(to, [&](auto dst_tag) {
      using D = decltype(dst_tag);
      D* dst = out.data<D>();
      for (int64_t i = 0; i < n; ++i) {
        if constexpr (std::is_same_v<D, bool>) dst[i] = src[i] != S{};
        else dst[i] = static_cast<D>(src[i]);
      }
    });
  });
  return out;
}

}  // namespace slimquant

namespace slimquant {

Shape broadcast_shapes(const Shape& a, const Shape& b) {
  const size_t rank = std::max(a.size(), b.size());
  Shape out(rank);
  for (size_t i = 0; i < rank; ++i) {
    int64_t da = i < rank - a.size() ? 1 : a[i - (rank - a.size())];
    int64_t db = i < rank - b.size() ? 1 : b[i - (rank - b.size())];
    if (da != db && da != 1 && db != 1)
      fail(ErrorKind::kInvalidArgument,
           "shapes " + shape_str(a) + " and " + shape_str(b) + " cannot be broadcast together");
    out[i] = da == 1 ? db : da;
  }
  return out;
}

std::vector<int64_t> contiguous_strides(const Shape& s) {
  std::vector<int64_t> strides(s.size(), 1);
  for (int i = static_cast<int>(s.size()) - 2; i >= 0; --i) strides[i] = strides[i + 1] * s[i + 1];
  return strides;
}

int64_t normalize_axis(int64_t axis, int64_t rank, const std::string& what) {
  if (axis < -rank || axis >= rank)
    fail(ErrorKind::kInvalidArgument, what + ": axis " + std::to_string(axis) + " out of range for rank " +
                                          std::to_string(rank));
  return axis < 0 ? axis + rank : axis;
}

}  // namespace slimquant
