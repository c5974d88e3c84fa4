#include "slimquant/core/tensor.h"

#include "slimquant/core/float16.h"

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
    case DType::kFloat16: return 2;
    default: return 0;
  }
}

const char* dtype_name(DType t) {
  switch (t) {
#define SQ_NAME(name, ctype, onnx_id, str) \
  case DType::name: return str;
    SQ_DTYPES(SQ_NAME)
#undef SQ_NAME
    case DType::kFloat16: return "float16";
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

// The 16-bit float conversions are integer arithmetic on the float32 bits, without branches (a
// select is a mask), so that the array forms (float16.h) vectorise; they give the same bits as
// IEEE binary16 conversion with round to nearest even (tests/core/float16_test.cpp checks them
// against the compiler's _Float16). bfloat16 is the top half of a float32.
namespace {

constexpr uint32_t kAbsMask = 0x7FFFFFFFu;
constexpr uint32_t kFloatInf = 0x7F800000u;
constexpr uint32_t kFloatQuiet = 0x00400000u;   // the quiet bit of a float32 NaN
constexpr uint32_t kFloatHalf = 0x3F000000u;    // 0.5f: its ulp is 2^-24, float16's subnormal step
constexpr uint32_t kF16MinNormal = 0x38800000u; // 2^-14 as float32 bits
constexpr uint32_t kF16Overflow = 0x47800000u;  // 2^16: a rounded magnitude from here is infinity
constexpr uint32_t kRebias = 112u << 23;        // float32 exponent bias 127 - float16's 15

uint32_t bits_of(float v) {
  uint32_t w;
  std::memcpy(&w, &v, sizeof w);
  return w;
}
float float_of(uint32_t w) {
  float v;
  std::memcpy(&v, &w, sizeof v);
  return v;
}
uint32_t pick(bool c, uint32_t if_true, uint32_t if_false) {
  const uint32_t m = 0u - static_cast<uint32_t>(c);
  return (if_true & m) | (if_false & ~m);
}
// |v| < 2^-14 as a multiple of 2^-24 rounded to nearest even, by one float add at 0.5 (whose ulp
// is 2^-24; the default rounding mode). Exact under FTZ/DAZ too: an input they flush rounds to 0
// anyway, and the sum is never subnormal.
uint32_t f16_subnormal_steps(uint32_t abs_bits) { return bits_of(float_of(abs_bits) + 0.5f) - kFloatHalf; }

float f32_from_f16(uint16_t h) {
  const uint32_t mag = h & 0x7FFFu;
  const uint32_t normal = (mag << 13) + kRebias;
  const uint32_t special = (mag << 13) | kFloatInf | pick(mag > 0x7C00u, kFloatQuiet, 0u);  // inf, NaN
  const uint32_t subnormal = bits_of(float_of(kFloatHalf | mag) - 0.5f);                // mag * 2^-24
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  return float_of(sign | pick(mag >= 0x7C00u, special, pick(mag >= 0x0400u, normal, subnormal)));
}
uint16_t f16_from_f32(float v) {
  const uint32_t w = bits_of(v);
  const uint32_t a = w & kAbsMask;
  const uint32_t r = a + 0xFFFu + ((a >> 13) & 1u);  // round the 13 dropped bits to nearest even
  const uint32_t normal = pick(r >= kF16Overflow, 0x7C00u, (r - kRebias) >> 13);
  const uint32_t nan = 0x7E00u | ((a >> 13) & 0x3FFu);
  const uint32_t h = pick(a > kFloatInf, nan, pick(a >= kF16MinNormal, normal, f16_subnormal_steps(a)));
  return static_cast<uint16_t>(((w >> 16) & 0x8000u) | h);
}
// f32_from_f16(f16_from_f32(v)) without the detour.
float f16_rounded(float v) {
  const uint32_t w = bits_of(v);
  const uint32_t a = w & kAbsMask;
  const uint32_t r = (a + 0xFFFu + ((a >> 13) & 1u)) & ~0x1FFFu;
  const uint32_t normal = pick(r >= kF16Overflow, kFloatInf, r);
  const uint32_t subnormal = bits_of((float_of(a) + 0.5f) - 0.5f);  // as f16_subnormal_steps, times 2^-24
  const uint32_t nan = (a | kFloatQuiet) & ~0x1FFFu;
  return float_of((w & ~kAbsMask) | pick(a > kFloatInf, nan, pick(a >= kF16MinNormal, normal, subnormal)));
}

float f32_from_bf16(uint16_t b) { return float_of(static_cast<uint32_t>(b) << 16); }
uint16_t bf16_from_f32(float v) {
  const uint32_t w = bits_of(v);
  const uint32_t nan = (w >> 16) | 0x40u;                 // quiet, sign kept
  const uint32_t r = (w + 0x7FFFu + ((w >> 16) & 1u)) >> 16;  // nearest even; carries into the exponent (to inf)
  return static_cast<uint16_t>(pick((w & kAbsMask) > kFloatInf, nan, r));
}
float bf16_rounded(float v) {
  const uint32_t w = bits_of(v);
  const uint32_t nan = (w | kFloatQuiet) & 0xFFFF0000u;
  const uint32_t r = (w + 0x7FFFu + ((w >> 16) & 1u)) & 0xFFFF0000u;
  return float_of(pick((w & kAbsMask) > kFloatInf, nan, r));
}

}  // namespace

float float_from_16bit(uint16_t bits, int onnx_type) {
  return onnx_type == kOnnxBFloat16 ? f32_from_bf16(bits) : f32_from_f16(bits);
}

uint16_t float_to_16bit(float value, int onnx_type) {
  return onnx_type == kOnnxBFloat16 ? bf16_from_f32(value) : f16_from_f32(value);
}

void round_to_16bit_floats(const float* src, float* dst, int64_t count, int onnx_type) {
  if (onnx_type == kOnnxBFloat16)
    for (int64_t i = 0; i < count; ++i) dst[i] = bf16_rounded(src[i]);
  else
    for (int64_t i = 0; i < count; ++i) dst[i] = f16_rounded(src[i]);
}

void floats_from_16bit(const uint16_t* bits, float* dst, int64_t count, int onnx_type) {
  if (onnx_type == kOnnxBFloat16)
    for (int64_t i = 0; i < count; ++i) dst[i] = f32_from_bf16(bits[i]);
  else
    for (int64_t i = 0; i < count; ++i) dst[i] = f32_from_f16(bits[i]);
}

void floats_to_16bit(const float* src, uint16_t* dst, int64_t count, int onnx_type) {
  if (onnx_type == kOnnxBFloat16)
    for (int64_t i = 0; i < count; ++i) dst[i] = bf16_from_f32(src[i]);
  else
    for (int64_t i = 0; i < count; ++i) dst[i] = f16_from_f32(src[i]);
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
