#include "slimquant/data/idx.h"

#include <zlib.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <limits>
#include <vector>

namespace slimquant::data {

namespace {

// gzread reads plain files transparently, so one path serves .gz and raw IDX files.
std::vector<unsigned char> read_maybe_gzipped(const std::string& path) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec))
    fail(ErrorKind::kIo, path + ": file not found");
  gzFile f = gzopen(path.c_str(), "rb");
  if (!f) fail(ErrorKind::kIo, path + ": cannot open: " + std::strerror(errno));
  gzbuffer(f, 1 << 20);
  std::vector<unsigned char> out;
  constexpr size_t kChunk = 1 << 22;
  while (true) {
    const size_t old = out.size();
    out.resize(old + kChunk);
    const int n = gzread(f, out.data() + old, static_cast<unsigned>(kChunk));
    if (n < 0) {
      int code = 0;
      std::string why = gzerror(f, &code);
      gzclose(f);
      fail(ErrorKind::kInvalidData, path + ": corrupt gzip data: " + why);
    }
    out.resize(old + static_cast<size_t>(n));
    if (n == 0) break;
  }
  gzclose(f);
  return out;
}

uint32_t be32(const unsigned char* p) {
  return uint32_t(p[0]) << 24 | uint32_t(p[1]) << 16 | uint32_t(p[2]) << 8 | uint32_t(p[3]);
}

template <typename T>
void copy_big_endian(const unsigned char* src, T* dst, size_t n) {
  for (size_t i = 0; i < n; ++i) {
    unsigned char b[sizeof(T)];
    for (size_t k = 0; k < sizeof(T); ++k) b[k] = src[i * sizeof(T) + sizeof(T) - 1 - k];
    std::memcpy(dst + i, b, sizeof(T));
  }
}

}  // namespace

Tensor read_idx(const std::string& path) {
  const std::vector<unsigned char> buf = read_maybe_gzipped(path);
  if (buf.size() < 4 || buf[0] != 0 || buf[1] != 0)
    fail(ErrorKind::kInvalidData, path + ": not an IDX file (bad magic number)");
  DType dtype;
  switch (buf[2]) {
    case 0x08: dtype = DType::kUInt8; break;
    case 0x09: dtype = DType::kInt8; break;
    case 0x0B: dtype = DType::kInt16; break;
    case 0x0C: dtype = DType::kInt32; break;
    case 0x0D: dtype = DType::kFloat32; break;
    case 0x0E: dtype = DType::kFloat64; break;
    default:
      fail(ErrorKind::kInvalidData,
           path + ": not an IDX file (unknown element type 0x" +
               std::string(1, "0123456789abcdef"[buf[2] >> 4]) +
               std::string(1, "0123456789abcdef"[buf[2] & 15]) + ")");
  }
  const size_t rank = buf[3];
  if (rank == 0 || buf.size() < 4 + 4 * rank)
    fail(ErrorKind::kInvalidData, path + ": truncated IDX header");
  Shape shape(rank);
  uint64_t numel = 1;
  for (size_t i = 0; i < rank; ++i) {
    shape[i] = be32(&buf[4 + 4 * i]);
    numel *= static_cast<uint64_t>(shape[i]);  // < 2^32 per dim, rank <= 255: checked below
    if (numel > std::numeric_limits<uint32_t>::max() * uint64_t{64})
      fail(ErrorKind::kInvalidData, path + ": IDX shape " + shape_str(shape) + " is implausibly large");
  }
  const size_t item = dtype_size(dtype);
  const size_t offset = 4 + 4 * rank;
  const uint64_t have = (buf.size() - offset) / item;
  if (have != numel || (buf.size() - offset) % item != 0)
    fail(ErrorKind::kInvalidData, path + ": header says " + std::to_string(numel) + " " +
                                      dtype_name(dtype) + " values (shape " + shape_str(shape) +
                                      "), file holds " + std::to_string(buf.size() - offset) +
                                      " data bytes");
  Tensor t(dtype, shape);
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    if constexpr (sizeof(T) == 1) {
      std::memcpy(t.raw(), &buf[offset], numel);
    } else {
      copy_big_endian(&buf[offset], t.data<T>(), numel);
    }
  });
  return t;
}

}  // namespace slimquant::data
