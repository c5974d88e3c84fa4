#include "slimquant/core/tensor.h"

#include <algorithm>
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

int64_t shape_numel(const Shape& s) {
  int64_t n = 1;
  for (int64_t d : s) n *= d;
  return n;
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
  size_t rounded = std::max<size_t>(kAlign, (bytes + kAlign - 1) / kAlign * kAlign);
  void* p = std::aligned_alloc(kAlign, rounded);
  if (!p) fail(ErrorKind::kInternal, "out of memory allocating " + std::to_string(bytes) + " bytes");
  std::memset(p, 0, rounded);
  return std::shared_ptr<std::byte[]>(static_cast<std::byte*>(p), [](std::byte* q) { std::free(q); });
}

Tensor::Tensor(DType dtype, Shape shape) : dtype_(dtype), shape_(std::move(shape)) {
  for (int64_t d : shape_)
    SQ_CHECK(d >= 0, ErrorKind::kInvalidArgument, "negative dimension in shape " + shape_str(shape_));
  capacity_ = nbytes();
  storage_ = allocate_storage(capacity_);
}

Tensor::Tensor(DType dtype, Shape shape, std::shared_ptr<std::byte[]> storage, size_t capacity_bytes)
    : dtype_(dtype), shape_(std::move(shape)), storage_(std::move(storage)), capacity_(capacity_bytes) {
  SQ_CHECK(nbytes() <= capacity_, ErrorKind::kInternal,
           "tensor storage of " + std::to_string(capacity_) + " bytes too small for " +
               shape_str(shape_));
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
