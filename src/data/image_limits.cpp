// Image size limits checked before decoding: a small compressed file can declare a huge canvas
// (a 875 KB PNG of 30000x30000 decodes to 2.7 GB, and 8 GB once converted to float), so the
// dimensions are read from the file header and checked before OpenCV allocates anything.
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>
#include <string>
#include <vector>

#include "data/preprocess.h"
#include "slimquant/core/error.h"

namespace slimquant::data::detail {

namespace {

uint32_t be16(const unsigned char* p) { return (uint32_t{p[0]} << 8) | p[1]; }
uint32_t be32(const unsigned char* p) { return (be16(p) << 16) | be16(p + 2); }
uint32_t le16(const unsigned char* p) { return (uint32_t{p[1]} << 8) | p[0]; }
uint32_t le32(const unsigned char* p) { return (le16(p + 2) << 16) | le16(p); }

// Reads `n` bytes at `offset`; false when the file is shorter.
bool read_at(std::ifstream& in, uint64_t offset, unsigned char* dst, size_t n) {
  in.clear();
  in.seekg(static_cast<std::streamoff>(offset));
  in.read(reinterpret_cast<char*>(dst), static_cast<std::streamsize>(n));
  return static_cast<size_t>(in.gcount()) == n;
}

// JPEG: walk the marker segments to the first start-of-frame (SOFn) and read its size.
std::optional<ImageDims> jpeg_dims(std::ifstream& in) {
  uint64_t pos = 2;
  unsigned char b[9];
  for (int segments = 0; segments < 100000; ++segments) {
    if (!read_at(in, pos, b, 2) || b[0] != 0xFF) return std::nullopt;
    const unsigned char marker = b[1];
    if (marker == 0xFF) {  // fill byte
      ++pos;
      continue;
    }
    if (marker == 0x01 || (marker >= 0xD0 && marker <= 0xD8)) {  // segments without a length
      pos += 2;
      continue;
    }
    if (!read_at(in, pos + 2, b, 7)) return std::nullopt;
    const bool sof = marker >= 0xC0 && marker <= 0xCF && marker != 0xC4 && marker != 0xC8 && marker != 0xCC;
    if (sof) return ImageDims{be16(b + 5), be16(b + 3)};
    if (marker == 0xD9 || marker == 0xDA) return std::nullopt;  // end of image / scan before any frame
    pos += 2 + be16(b);
  }
  return std::nullopt;
}

// TIFF: ImageWidth (256) and ImageLength (257) of the first image file directory.
std::optional<ImageDims> tiff_dims(std::ifstream& in, bool little) {
  auto u16 = [&](const unsigned char* p) { return little ? le16(p) : be16(p); };
  auto u32 = [&](const unsigned char* p) { return little ? le32(p) : be32(p); };
  unsigned char b[12];
  if (!read_at(in, 4, b, 4)) return std::nullopt;
  const uint64_t ifd = u32(b);
  if (!read_at(in, ifd, b, 2)) return std::nullopt;
  const uint32_t entries = u16(b);
  ImageDims d;
  for (uint32_t i = 0; i < entries && i < 4096; ++i) {
    if (!read_at(in, ifd + 2 + 12 * uint64_t{i}, b, 12)) return std::nullopt;
    const uint32_t tag = u16(b), type = u16(b + 2);
    const uint64_t value = type == 3 ? u16(b + 8) : u32(b + 8);  // SHORT or LONG
    if (tag == 256) d.width = value;
    if (tag == 257) d.height = value;
  }
  if (d.width == 0 && d.height == 0) return std::nullopt;
  return d;
}

// PNM (P1..P6): "Pn width height ..." with whitespace and # comments between the tokens.
std::optional<ImageDims> pnm_dims(const std::vector<unsigned char>& head) {
  size_t i = 2;
  uint64_t v[2] = {0, 0};
  for (uint64_t& x : v) {
    while (i < head.size() && (std::isspace(head[i]) || head[i] == '#')) {
      if (head[i] == '#')
        while (i < head.size() && head[i] != '\n') ++i;
      else
        ++i;
    }
    if (i >= head.size() || !std::isdigit(head[i])) return std::nullopt;
    while (i < head.size() && std::isdigit(head[i]) && x < (uint64_t{1} << 40)) x = x * 10 + (head[i++] - '0');
  }
  return ImageDims{v[0], v[1]};
}

}  // namespace

std::optional<ImageDims> read_image_header_dims(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) return std::nullopt;
  std::vector<unsigned char> h(1024);
  in.read(reinterpret_cast<char*>(h.data()), static_cast<std::streamsize>(h.size()));
  h.resize(static_cast<size_t>(in.gcount()));
  const size_t n = h.size();
  const unsigned char* p = h.data();
  static const unsigned char kPng[8] = {0x89, 'P', 'N', 'G', '\r', '\n', 0x1A, '\n'};
  if (n >= 24 && std::memcmp(p, kPng, 8) == 0 && std::memcmp(p + 12, "IHDR", 4) == 0) return ImageDims{be32(p + 16), be32(p + 20)};
  if (n >= 3 && p[0] == 0xFF && p[1] == 0xD8 && p[2] == 0xFF) return jpeg_dims(in);
  if (n >= 26 && p[0] == 'B' && p[1] == 'M') {
    if (le32(p + 14) == 12) return ImageDims{le16(p + 18), le16(p + 20)};
    const int32_t w = static_cast<int32_t>(le32(p + 18)), hgt = static_cast<int32_t>(le32(p + 22));
    return ImageDims{static_cast<uint64_t>(w < 0 ? -int64_t{w} : w), static_cast<uint64_t>(hgt < 0 ? -int64_t{hgt} : hgt)};
  }
  if (n >= 30 && std::memcmp(p, "RIFF", 4) == 0 && std::memcmp(p + 8, "WEBP", 4) == 0) {
    if (std::memcmp(p + 12, "VP8 ", 4) == 0) return ImageDims{le16(p + 26) & 0x3FFF, le16(p + 28) & 0x3FFF};
    if (std::memcmp(p + 12, "VP8L", 4) == 0) {
      const uint32_t bits = le32(p + 21);
      return ImageDims{(bits & 0x3FFF) + 1, ((bits >> 14) & 0x3FFF) + 1};
    }
    if (std::memcmp(p + 12, "VP8X", 4) == 0)
      return ImageDims{(le32(p + 24) & 0xFFFFFF) + 1, (le32(p + 27) & 0xFFFFFF) + 1};
    return std::nullopt;
  }
  if (n >= 8 && ((p[0] == 'I' && p[1] == 'I' && p[2] == 42 && p[3] == 0) || (p[0] == 'M' && p[1] == 'M' && p[2] == 0 && p[3] == 42)))
    return tiff_dims(in, p[0] == 'I');
  if (n >= 3 && p[0] == 'P' && p[1] >= '1' && p[1] <= '6') return pnm_dims(h);
  return std::nullopt;
}

void check_image_before_decoding(const std::string& path, const std::string& what) {
  std::error_code ec;
  const auto status = std::filesystem::status(path, ec);
  SQ_CHECK(status.type() != std::filesystem::file_type::not_found, ErrorKind::kIo,
           what + ": image file '" + path + "' does not exist");
  // A FIFO or device would block or never end; only regular files are decoded.
  SQ_CHECK(status.type() == std::filesystem::file_type::regular, ErrorKind::kInvalidData,
           what + ": image '" + path + "' is not a regular file");
  const std::optional<ImageDims> dims = read_image_header_dims(path);
  if (!dims) return;  // a format without a header we read: OpenCV decodes it, check_decoded_image checks after
  SQ_CHECK(dims->width > 0 && dims->height > 0, ErrorKind::kInvalidData,
           what + ": image '" + path + "' declares an empty size " + std::to_string(dims->width) + "x" +
               std::to_string(dims->height));
  const uint64_t pixels = dims->width * dims->height;  // both < 2^32: no overflow
  SQ_CHECK(pixels <= kMaxImagePixels, ErrorKind::kInvalidData,
           what + ": image '" + path + "' declares " + std::to_string(dims->width) + "x" + std::to_string(dims->height) +
               " pixels, more than the limit of " + std::to_string(kMaxImagePixels) +
               " (resize it before use); nothing was decoded");
}

void check_decoded_image(const cv::Mat& image, const std::string& path, const std::string& what) {
  const uint64_t pixels = static_cast<uint64_t>(image.rows) * static_cast<uint64_t>(image.cols);
  SQ_CHECK(pixels <= kMaxImagePixels, ErrorKind::kInvalidData,
           what + ": image '" + path + "' is " + std::to_string(image.cols) + "x" + std::to_string(image.rows) +
               " pixels, more than the limit of " + std::to_string(kMaxImagePixels) + " (resize it before use)");
}

}  // namespace slimquant::data::detail
