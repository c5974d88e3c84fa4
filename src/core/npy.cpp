#include "slimquant/core/npy.h"

#include "slimquant/core/atomic_file.h"
#include "slimquant/core/float16.h"

#include <zlib.h>

#include <atomic>
#include <bit>
#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <limits>
#include <memory>
#include <string_view>
#include <unistd.h>

namespace slimquant {

static_assert(std::endian::native == std::endian::little,
              ".npy I/O copies little-endian bytes straight into tensors");

namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicSize = 6;
// Total header size (magic .. padding) is a multiple of this, as numpy >= 1.x writes it.
constexpr size_t kHeaderAlign = 64;

struct FileCloser {
  void operator()(std::FILE* f) const { std::fclose(f); }
};
using File = std::unique_ptr<std::FILE, FileCloser>;

File open_for_read(const std::string& path) {
  std::FILE* f = std::fopen(path.c_str(), "rb");
  if (!f) fail(ErrorKind::kIo, path + ": cannot open: " + std::strerror(errno));
  return File(f);
}

uint64_t file_size(const std::string& path) {
  std::error_code ec;
  uint64_t n = std::filesystem::file_size(path, ec);
  if (ec) fail(ErrorKind::kIo, path + ": cannot read size: " + ec.message());
  return n;
}

// ---- header text: a Python dict literal such as
//   {'descr': '<f4', 'fortran_order': False, 'shape': (3, 4), }
class HeaderParser {
 public:
  HeaderParser(std::string_view text, const std::string& what) : s_(text), what_(what) {}

  NpyHeader parse() {
    std::string descr;
    bool have_descr = false, have_order = false, have_shape = false;
    bool fortran = false;
    NpyHeader h;
    expect('{');
    while (true) {
      skip_ws();
      if (peek() == '}') break;
      std::string key = parse_string();
      skip_ws();
      expect(':');
      skip_ws();
      if (key == "descr") {
        if (peek() == '[') bad("structured dtypes are not supported");
        descr = parse_string();
        have_descr = true;
      } else if (key == "fortran_order") {
        fortran = parse_bool();
        have_order = true;
      } else if (key == "shape") {
        h.shape = parse_shape();
        have_shape = true;
      } else {
        bad("unexpected header key '" + key + "'");
      }
      skip_ws();
      if (peek() == ',') ++pos_;
    }
    if (!have_descr || !have_order || !have_shape)
      bad("header lacks one of 'descr', 'fortran_order', 'shape'");
    h.dtype = dtype_from_descr(descr);
    if (descr.size() == 3 && descr[1] == 'f' && descr[2] == '2') h.stored_float16 = true;
    if (fortran && h.shape.size() > 1)
      fail(ErrorKind::kInvalidData, what_ + ": fortran_order arrays are not supported");
    return h;
  }

 private:
  [[noreturn]] void bad(const std::string& why) const {
    fail(ErrorKind::kInvalidData, what_ + ": malformed .npy header (" + why + "): " + std::string(s_));
  }
  char peek() const {
    if (pos_ >= s_.size()) bad("unexpected end");
    return s_[pos_];
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t' || s_[pos_] == '\n')) ++pos_;
  }
  void expect(char c) {
    skip_ws();
    if (peek() != c) bad(std::string("expected '") + c + "'");
    ++pos_;
  }
  std::string parse_string() {
    char q = peek();
    if (q != '\'' && q != '"') bad("expected a quoted string");
    size_t end = s_.find(q, pos_ + 1);
    if (end == std::string_view::npos) bad("unterminated string");
    std::string out(s_.substr(pos_ + 1, end - pos_ - 1));
    pos_ = end + 1;
    return out;
  }
  bool parse_bool() {
    if (s_.substr(pos_, 4) == "True") { pos_ += 4; return true; }
    if (s_.substr(pos_, 5) == "False") { pos_ += 5; return false; }
    bad("fortran_order must be True or False");
  }
  Shape parse_shape() {
    Shape shape;
    expect('(');
    while (true) {
      skip_ws();
      if (peek() == ')') { ++pos_; break; }
      uint64_t v = 0;
      size_t start = pos_;
      while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
        v = v * 10 + static_cast<uint64_t>(s_[pos_] - '0');
        if (v > static_cast<uint64_t>(std::numeric_limits<int64_t>::max())) bad("dimension too large");
        ++pos_;
      }
      if (pos_ == start) bad("shape must be a tuple of non-negative integers");
      if (pos_ < s_.size() && s_[pos_] == 'L') ++pos_;  // Python 2 longs
      shape.push_back(static_cast<int64_t>(v));
      skip_ws();
      if (peek() == ',') ++pos_;
      else if (peek() != ')') bad("expected ',' or ')' in shape");
    }
    return shape;
  }
  DType dtype_from_descr(const std::string& d) const {
    auto unsupported = [&]() -> DType {
      fail(ErrorKind::kInvalidData, what_ + ": unsupported dtype '" + d + "'");
    };
    if (d.size() != 3) return unsupported();
    const char order = d[0], kind = d[1], size = d[2];
    if (order == '>' && size != '1')
      fail(ErrorKind::kInvalidData,
           what_ + ": big-endian dtype '" + d + "' is not supported (save it with .astype('<" +
               d.substr(1) + "'))");
    if (order != '<' && order != '|' && order != '=' && order != '>') return unsupported();
    switch (kind) {
      case 'f':
        if (size == '2') return DType::kUInt16;  // float16 bits, widened to float32 by the readers
        if (size == '4') return DType::kFloat32;
        if (size == '8') return DType::kFloat64;
        break;
      case 'i':
        if (size == '1') return DType::kInt8;
        if (size == '2') return DType::kInt16;
        if (size == '4') return DType::kInt32;
        if (size == '8') return DType::kInt64;
        break;
      case 'u':
        if (size == '1') return DType::kUInt8;
        if (size == '2') return DType::kUInt16;
        if (size == '4') return DType::kUInt32;
        if (size == '8') return DType::kUInt64;
        break;
      case 'b':
        if (size == '1') return DType::kBool;
        break;
      default: break;
    }
    return unsupported();
  }

  std::string_view s_;
  const std::string& what_;
  size_t pos_ = 0;
};

// The fixed part before the header text: magic, version, header length.
struct Prelude {
  size_t size = 0;         // bytes of magic + version + length field
  uint64_t text_size = 0;  // bytes of header text that follow
};

// `bytes` holds at least the first min(available, 12) bytes of the file.
Prelude parse_prelude(const unsigned char* bytes, size_t available, const std::string& what) {
  if (available < kMagicSize + 4 || std::memcmp(bytes, kMagic, kMagicSize) != 0)
    fail(ErrorKind::kInvalidData, what + ": not a .npy file (no \\x93NUMPY magic)");
  const int major = bytes[6], minor = bytes[7];
  Prelude p;
  if (major == 1) {
    p.size = 10;
    p.text_size = bytes[8] | (bytes[9] << 8);
  } else if (major == 2 || major == 3) {
    if (available < 12) fail(ErrorKind::kInvalidData, what + ": truncated .npy header");
    p.size = 12;
    p.text_size = uint64_t(bytes[8]) | uint64_t(bytes[9]) << 8 | uint64_t(bytes[10]) << 16 |
                  uint64_t(bytes[11]) << 24;
  } else {
    fail(ErrorKind::kInvalidData, what + ": unsupported .npy format version " +
                                      std::to_string(major) + "." + std::to_string(minor));
  }
  return p;
}

// Rejects sizes that overflow and data shorter than the header announces.
uint64_t checked_nbytes(const NpyHeader& h, uint64_t available, const std::string& what) {
  const uint64_t item = dtype_size(h.dtype);
  uint64_t numel = 1;
  for (int64_t d : h.shape) {
    if (d != 0 && numel > std::numeric_limits<uint64_t>::max() / item / static_cast<uint64_t>(d))
      fail(ErrorKind::kInvalidData, what + ": shape " + shape_str(h.shape) + " is too large");
    numel *= static_cast<uint64_t>(d);
  }
  const uint64_t need = numel * item;
  if (available < need)
    fail(ErrorKind::kInvalidData, what + ": truncated: header says " + std::to_string(numel) + " " +
                                      dtype_name(h.dtype) + " values, file holds " +
                                      std::to_string(available / item));
  return need;
}

// numpy stores bools as bytes; anything but 0/1 would be undefined behaviour as a C++ bool.
void normalize_bools(Tensor& t) {
  if (t.dtype() != DType::kBool) return;
  auto* p = static_cast<unsigned char*>(t.raw());
  for (int64_t i = 0, n = t.numel(); i < n; ++i) p[i] = p[i] != 0;
}

const char* descr_of(DType t) {
  switch (t) {
    case DType::kFloat32: return "<f4";
    case DType::kFloat64: return "<f8";
    case DType::kInt8: return "|i1";
    case DType::kUInt8: return "|u1";
    case DType::kInt16: return "<i2";
    case DType::kUInt16: return "<u2";
    case DType::kInt32: return "<i4";
    case DType::kUInt32: return "<u4";
    case DType::kInt64: return "<i8";
    case DType::kUInt64: return "<u8";
    case DType::kBool: return "|b1";
    default: break;
  }
  fail(ErrorKind::kUnsupported, std::string("cannot write dtype ") + dtype_name(t) + " to .npy");
}

std::string header_bytes(const Tensor& t, const char* descr) {
  std::string dict = std::string("{'descr': '") + descr +
                     "', 'fortran_order': False, 'shape': (";
  for (size_t i = 0; i < t.rank(); ++i) {
    if (i) dict += ", ";
    dict += std::to_string(t.dim(i));
  }
  if (t.rank() == 1) dict += ",";
  dict += "), }";
  // Version 1.0 has a 16-bit length; switch to 2.0 only when the header would not fit.
  auto padded = [&](size_t prelude) {
    size_t total = prelude + dict.size() + 1;  // + '\n'
    return (total + kHeaderAlign - 1) / kHeaderAlign * kHeaderAlign - prelude;
  };
  const bool v1 = padded(10) <= 0xFFFF;
  const size_t prelude = v1 ? 10 : 12;
  const size_t text_size = padded(prelude);
  std::string out(kMagic, kMagicSize);
  out += static_cast<char>(v1 ? 1 : 2);
  out += '\0';
  for (size_t i = 0; i < prelude - 8; ++i) out += static_cast<char>((text_size >> (8 * i)) & 0xFF);
  out += dict;
  out.append(text_size - dict.size() - 1, ' ');
  out += '\n';
  return out;
}

}  // namespace

NpyHeader read_npy_header(const std::string& path) {
  File f = open_for_read(path);
  const uint64_t total = file_size(path);
  unsigned char pre[12] = {};
  const size_t got = std::fread(pre, 1, sizeof pre, f.get());
  Prelude p = parse_prelude(pre, got, path);
  if (total < p.size + p.text_size) fail(ErrorKind::kInvalidData, path + ": truncated .npy header");
  std::string text(p.text_size, '\0');
  if (std::fseek(f.get(), static_cast<long>(p.size), SEEK_SET) != 0 ||
      std::fread(text.data(), 1, text.size(), f.get()) != text.size())
    fail(ErrorKind::kIo, path + ": cannot read header: " + std::strerror(errno));
  NpyHeader h = HeaderParser(text, path).parse();
  h.data_offset = p.size + p.text_size;
  checked_nbytes(h, total - h.data_offset, path);
  return h;
}

Tensor read_npy(const std::string& path) {
  NpyHeader h = read_npy_header(path);
  Tensor t(h.dtype, h.shape);
  File f = open_for_read(path);
  if (std::fseek(f.get(), static_cast<long>(h.data_offset), SEEK_SET) != 0 ||
      std::fread(t.raw(), 1, t.nbytes(), f.get()) != t.nbytes())
    fail(ErrorKind::kIo, path + ": read failed: " + std::strerror(errno));
  normalize_bools(t);
  return h.stored_float16 ? widen_float16(t) : t;
}

Tensor parse_npy(const void* bytes, size_t size, const std::string& what) {
  const auto* b = static_cast<const unsigned char*>(bytes);
  Prelude p = parse_prelude(b, size, what);
  if (size < p.size + p.text_size) fail(ErrorKind::kInvalidData, what + ": truncated .npy header");
  std::string_view text(reinterpret_cast<const char*>(b) + p.size, p.text_size);
  NpyHeader h = HeaderParser(text, what).parse();
  h.data_offset = p.size + p.text_size;
  const uint64_t n = checked_nbytes(h, size - h.data_offset, what);
  Tensor t(h.dtype, h.shape);
  if (n) std::memcpy(t.raw(), b + h.data_offset, n);
  normalize_bools(t);
  return h.stored_float16 ? widen_float16(t) : t;
}

Tensor widen_float16(const Tensor& bits) {
  SQ_CHECK(bits.dtype() == DType::kUInt16, ErrorKind::kInternal, "widen_float16: expects the uint16 bits");
  Tensor wide(DType::kFloat32, bits.shape());
  widen_float16(bits.data<uint16_t>(), bits.numel(), wide.data<float>());
  return wide;
}

void widen_float16(const uint16_t* bits, int64_t count, float* dst) {
  floats_from_16bit(bits, dst, count, kOnnxFloat16);
}

std::vector<std::byte> encode_npy(const Tensor& t) {
  SQ_CHECK(t.defined(), ErrorKind::kInvalidArgument, "encode_npy: undefined tensor");
  const std::string head = header_bytes(t, descr_of(t.dtype()));
  std::vector<std::byte> out(head.size() + t.nbytes());
  std::memcpy(out.data(), head.data(), head.size());
  if (t.nbytes()) std::memcpy(out.data() + head.size(), t.raw(), t.nbytes());
  return out;
}

void write_npy(const std::string& path, const Tensor& t) {
  SQ_CHECK(t.defined(), ErrorKind::kInvalidArgument, path + ": cannot write an undefined tensor");
  std::string bytes = header_bytes(t, descr_of(t.dtype()));
  bytes.append(static_cast<const char*>(t.raw()), t.nbytes());
  write_file_atomic(path, bytes);
}

void write_npy_float16(const std::string& path, const Tensor& t) {
  SQ_CHECK(t.defined() && t.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument,
           path + ": write_npy_float16 takes a float32 tensor");
  std::string bytes = header_bytes(t, "<f2");
  const size_t head = bytes.size();
  bytes.resize(head + static_cast<size_t>(t.numel()) * 2);
  std::vector<uint16_t> narrow(static_cast<size_t>(t.numel()));
  floats_to_16bit(t.data<float>(), narrow.data(), t.numel(), kOnnxFloat16);
  std::memcpy(bytes.data() + head, narrow.data(), narrow.size() * 2);
  write_file_atomic(path, bytes);
}

// ---- .npz: a zip archive of .npy members. We read the central directory (authoritative sizes,
// also when local headers defer them to data descriptors) and inflate deflated members with zlib.
namespace {

uint16_t le16(const unsigned char* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
uint32_t le32(const unsigned char* p) {
  return uint32_t(p[0]) | uint32_t(p[1]) << 8 | uint32_t(p[2]) << 16 | uint32_t(p[3]) << 24;
}
uint64_t le64(const unsigned char* p) { return uint64_t(le32(p)) | uint64_t(le32(p + 4)) << 32; }

// Deflate cannot expand data by more than 1032:1 (258-byte matches coded in 2 bits).
constexpr uint64_t kMaxDeflateRatio = 1032;

std::vector<unsigned char> read_whole(const std::string& path) {
  File f = open_for_read(path);
  std::vector<unsigned char> buf(file_size(path));
  if (!buf.empty() && std::fread(buf.data(), 1, buf.size(), f.get()) != buf.size())
    fail(ErrorKind::kIo, path + ": read failed: " + std::strerror(errno));
  return buf;
}

}  // namespace

std::vector<std::pair<std::string, Tensor>> read_npz(const std::string& path) {
  const std::vector<unsigned char> z = read_whole(path);
  auto bad = [&](const std::string& why) -> void {
    fail(ErrorKind::kInvalidData, path + ": not a valid .npz archive (" + why + ")");
  };
  // End of central directory: 22 bytes plus a comment of up to 64 KiB, searched from the end.
  constexpr uint32_t kEocd = 0x06054b50, kCentral = 0x02014b50, kLocal = 0x04034b50;
  // Whether [offset, offset + length) lies inside the archive (no overflow for hostile values).
  auto fits = [&](uint64_t offset, uint64_t length) { return offset <= z.size() && length <= z.size() - offset; };
  if (z.size() < 22) bad("too short");
  size_t eocd = std::string::npos;
  for (size_t i = z.size() - 22 + 1; i-- > 0 && z.size() - i <= 22 + 0xFFFF;)
    if (le32(&z[i]) == kEocd) { eocd = i; break; }
  if (eocd == std::string::npos) bad("no end-of-central-directory record");
  uint64_t entries = le16(&z[eocd + 10]);
  uint64_t cd_offset = le32(&z[eocd + 16]);
  // Zip64: the locator sits just before the classic record and points at the zip64 record.
  if ((entries == 0xFFFF || cd_offset == 0xFFFFFFFF) && eocd >= 20 &&
      le32(&z[eocd - 20]) == 0x07064b50) {
    const uint64_t rec = le64(&z[eocd - 20 + 8]);
    if (!fits(rec, 56) || le32(&z[rec]) != 0x06064b50) bad("bad zip64 record");
    entries = le64(&z[rec + 32]);
    cd_offset = le64(&z[rec + 48]);
  }
  std::vector<std::pair<std::string, Tensor>> out;
  uint64_t pos = cd_offset;
  // Members must not overlap (numpy writes them one after the other): directory entries sharing
  // one compressed stream would multiply what a small file inflates to.
  uint64_t previous_member_end = 0;
  for (uint64_t e = 0; e < entries; ++e) {
    if (!fits(pos, 46) || le32(&z[pos]) != kCentral) bad("bad central directory entry");
    const unsigned char* c = &z[pos];
    const uint16_t method = le16(c + 10);
    const uint32_t crc = le32(c + 16);
    uint64_t csize = le32(c + 20), usize = le32(c + 24);
    const uint16_t name_len = le16(c + 28), extra_len = le16(c + 30), comment_len = le16(c + 32);
    uint64_t local = le32(c + 42);
    if (!fits(pos, 46 + uint64_t(name_len) + extra_len)) bad("truncated central directory");
    std::string name(reinterpret_cast<const char*>(c + 46), name_len);
    // Zip64 extended information: only the fields whose classic value is all ones, in order.
    for (const unsigned char *x = c + 46 + name_len, *xe = x + extra_len; x + 4 <= xe;) {
      const uint16_t id = le16(x), len = le16(x + 2);
      if (x + 4 + len > xe) break;
      if (id == 0x0001) {
        const unsigned char* f = x + 4;
        const unsigned char* fe = f + len;
        if (usize == 0xFFFFFFFF && f + 8 <= fe) { usize = le64(f); f += 8; }
        if (csize == 0xFFFFFFFF && f + 8 <= fe) { csize = le64(f); f += 8; }
        if (local == 0xFFFFFFFF && f + 8 <= fe) { local = le64(f); f += 8; }
      }
      x += 4 + len;
    }
    pos += 46 + name_len + extra_len + comment_len;

    if (!fits(local, 30) || le32(&z[local]) != kLocal) bad("bad local header for " + name);
    const uint64_t data = local + 30 + le16(&z[local + 26]) + le16(&z[local + 28]);
    if (!fits(data, csize)) bad("member " + name + " is truncated");
    if (local < previous_member_end) bad("member " + name + " overlaps the member before it");
    previous_member_end = data + csize;
    const std::string what = path + "/" + name;
    std::vector<unsigned char> plain;
    const unsigned char* bytes = z.data() + data;
    if (method == 8) {
      // The directory's size is checked against what deflate can produce before anything is
      // allocated: a lying header must not turn a small file into gigabytes of zeroed memory.
      if (usize > csize * kMaxDeflateRatio + 64)
        bad("member " + name + " claims " + std::to_string(usize) + " bytes inflated from " +
            std::to_string(csize) + ", more than deflate can produce");
      plain.resize(usize);
      z_stream s{};
      if (inflateInit2(&s, -MAX_WBITS) != Z_OK) fail(ErrorKind::kInternal, "zlib inflateInit2 failed");
      // zlib counts in uInt; members over 4 GiB are inflated in slices.
      uint64_t in_left = csize, out_left = usize;
      s.next_in = const_cast<unsigned char*>(bytes);
      s.next_out = plain.data();
      int rc = Z_OK;
      while (rc == Z_OK) {
        const uInt in_chunk = static_cast<uInt>(std::min<uint64_t>(in_left, 1u << 30));
        const uInt out_chunk = static_cast<uInt>(std::min<uint64_t>(out_left, 1u << 30));
        s.avail_in = in_chunk;
        s.avail_out = out_chunk;
        rc = inflate(&s, Z_NO_FLUSH);
        in_left -= in_chunk - s.avail_in;
        out_left -= out_chunk - s.avail_out;
        if (rc == Z_OK && in_chunk == s.avail_in && out_chunk == s.avail_out) break;  // no progress
      }
      inflateEnd(&s);
      if (rc != Z_STREAM_END || out_left != 0) bad("member " + name + " does not inflate");
      bytes = plain.data();
    } else if (method != 0) {
      bad("member " + name + " uses compression method " + std::to_string(method));
    } else if (csize != usize) {
      bad("stored member " + name + " has mismatched sizes");
    }
    uLong actual_crc = crc32(0L, Z_NULL, 0);
    for (uint64_t off = 0; off < usize;) {
      const uInt n = static_cast<uInt>(std::min<uint64_t>(usize - off, 1u << 30));
      actual_crc = crc32(actual_crc, bytes + off, n);
      off += n;
    }
    if (actual_crc != crc) bad("member " + name + " fails its CRC check");
    if (name.size() > 4 && name.ends_with(".npy")) name.resize(name.size() - 4);
    out.emplace_back(name, parse_npy(bytes, usize, what));
  }
  return out;
}

}  // namespace slimquant
