// npy:DIR — either one batched array [N, ...] (any file name but labels.npy) or one .npy file per
// sample (sorted by name, identical shapes), plus an optional labels.npy of N integers and an
// optional labels.txt of N text labels (one UTF-8 line per sample, for text recognition). Samples are
// read from disk on demand (pread on the batched file), so large calibration sets need no RAM.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "data/preprocess.h"
#include "slimquant/core/npy.h"

namespace slimquant::data::detail {

namespace {

namespace fs = std::filesystem;

// Raw little-endian array elements -> float32; uint8 data is taken as pixels (scaled to [0,1]) when
// `uint8_pixels`, every other dtype as-is.
void to_float(DType dtype, const void* src, size_t n, float* dst, bool uint8_pixels) {
  if (dtype == DType::kFloat32) {
    if (src != dst) std::memcpy(dst, src, n * sizeof(float));
    return;
  }
  if (dtype == DType::kUInt8 && uint8_pixels) {
    const auto* p = static_cast<const uint8_t*>(src);
    for (size_t i = 0; i < n; ++i) dst[i] = static_cast<float>(p[i]) * (1.f / 255.f);
    return;
  }
  dispatch_dtype(dtype, [&](auto tag) {
    using T = decltype(tag);
    const auto* bytes = static_cast<const unsigned char*>(src);
    for (size_t i = 0; i < n; ++i) {
      if constexpr (std::is_same_v<T, bool>) {
        dst[i] = bytes[i] ? 1.f : 0.f;  // raw bytes: any non-zero is true
      } else {
        T v;
        std::memcpy(&v, bytes + i * sizeof(T), sizeof(T));
        dst[i] = static_cast<float>(v);
      }
    }
  });
}

class NpyDir final : public Dataset {
 public:
  NpyDir(const DataOptions& options, std::string name, const std::string& dir) : name_(std::move(name)) {
    std::error_code ec;
    if (!fs::is_directory(dir, ec)) fail(ErrorKind::kIo, "npy directory " + dir + " not found");
    std::vector<std::string> files;
    std::string labels_file, text_labels_file;
    for (const fs::directory_entry& e : fs::directory_iterator(dir, ec)) {
      if (e.path().filename() == "labels.txt" && e.is_regular_file(ec)) text_labels_file = e.path().string();
      if (!e.is_regular_file(ec) || e.path().extension() != ".npy") continue;
      if (e.path().filename() == "labels.npy") labels_file = e.path().string();
      else files.push_back(e.path().string());
    }
    if (ec) fail(ErrorKind::kIo, "npy directory " + dir + ": cannot list: " + ec.message());
    std::sort(files.begin(), files.end());
    if (files.empty()) fail(ErrorKind::kInvalidData, "data set '" + name_ + "' is empty");

    size_t total = 0;
    if (files.size() == 1) {
      // One batched array.
      batched_path_ = files.front();
      const NpyHeader h = read_npy_header(batched_path_);
      if (h.shape.empty())
        fail(ErrorKind::kInvalidData, batched_path_ + ": a batched array needs a leading sample "
                                                      "dimension, got a scalar");
      batched_dtype_ = h.dtype;
      batched_float16_ = h.stored_float16;
      data_offset_ = h.data_offset;
      stored_shape_.assign(h.shape.begin() + 1, h.shape.end());
      total = static_cast<size_t>(h.shape[0]);
      fd_.fd = ::open(batched_path_.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd_.fd < 0) fail(ErrorKind::kIo, batched_path_ + ": cannot open: " + std::strerror(errno));
    } else {
      // One sample per file: all headers are checked now, so a bad file fails before any work.
      NpyHeader first = read_npy_header(files.front());
      for (size_t i = 1; i < files.size(); ++i) {
        const NpyHeader h = read_npy_header(files[i]);
        if (h.shape != first.shape)
          fail(ErrorKind::kInvalidData, files[i] + ": shape " + shape_str(h.shape) + " differs from " +
                                            files.front() + "'s " + shape_str(first.shape) +
                                            " (per-sample files must all have one shape)");
      }
      stored_shape_ = first.shape;
      total = files.size();
      sample_files_ = std::move(files);
    }
    if (total == 0) fail(ErrorKind::kInvalidData, "data set '" + name_ + "' is empty");
    if (shape_numel(stored_shape_) == 0)
      fail(ErrorKind::kInvalidData, "data set '" + name_ + "': samples of shape " +
                                        shape_str(stored_shape_) + " hold no values");
    size_ = options.limit ? std::min(total, options.limit) : total;
    if (!labels_file.empty()) load_labels(labels_file, total);
    if (!text_labels_file.empty()) load_text_labels(text_labels_file, total);

    // Channels are the leading sample dimension of [C, H, W] data; other ranks have one channel.
    const bool chw = stored_shape_.size() == 3;
    channels_ = chw ? stored_shape_[0] : 1;
    if (options.channels != 0 && (!chw || channels_ != options.channels))
      fail(ErrorKind::kInvalidArgument,
           "data set '" + name_ + "': channels=" + std::to_string(options.channels) +
               " but its samples are " + shape_str(stored_shape_) +
               " (npy data is used as stored; channels must match its [C, H, W] layout)");
    shape_ = stored_shape_;
    if (options.resize) {
      if (stored_shape_.size() != 2 && !chw)
        fail(ErrorKind::kInvalidArgument, "data set '" + name_ + "': resize needs [H, W] or [C, H, W] "
                                              "samples, got " + shape_str(stored_shape_));
      from_ = {stored_shape_[stored_shape_.size() - 2], stored_shape_.back()};
      to_ = *options.resize;
      shape_[shape_.size() - 2] = to_.height;
      shape_.back() = to_.width;
      resize_ = !(from_ == to_);
    }
    norm_ = resolve_normalize(options, channels_, name_);
    // Fed to an integer model input (token ids, raw uint8 images), values are taken as stored.
    uint8_pixels_ = options.sample_dtype == DType::kFloat32;
  }

  const std::string& name() const override { return name_; }
  size_t size() const override { return size_; }
  const Shape& sample_shape() const override { return shape_; }
  bool has_labels() const override { return !labels_.empty(); }
  bool has_text_labels() const override { return !texts_.empty(); }

  const std::string& text_label(size_t index) const override {
    check_index(index, size_, name_);
    if (texts_.empty())
      fail(ErrorKind::kInvalidArgument, "data set '" + name_ + "' has no text labels (no labels.txt)");
    return texts_[index];
  }

  int64_t label(size_t index) const override {
    check_index(index, size_, name_);
    if (labels_.empty())
      fail(ErrorKind::kInvalidArgument, "data set '" + name_ + "' has no labels (no labels.npy)");
    return labels_[index];
  }

  void load(size_t index, float* dst) const override {
    check_index(index, size_, name_);
    const size_t n = static_cast<size_t>(shape_numel(stored_shape_));
    // Without a resize the converted sample goes straight into dst.
    std::vector<float> scratch(resize_ ? n : 0);
    float* stage = resize_ ? scratch.data() : dst;
    std::string source;
    if (!sample_files_.empty()) {
      source = sample_files_[index];
      const Tensor t = read_npy(source);
      if (t.shape() != stored_shape_)
        fail(ErrorKind::kInvalidData, source + ": shape changed to " + shape_str(t.shape()) +
                                          " since the data set was opened (was " +
                                          shape_str(stored_shape_) + ")");
      to_float(t.dtype(), t.raw(), n, stage, uint8_pixels_);
    } else {
      source = batched_path_ + " sample " + std::to_string(index);
      const size_t item = dtype_size(batched_dtype_);
      const size_t bytes = n * item;
      std::vector<unsigned char> raw;
      // float32 (4 bytes per value, like the stage) reads in place; others convert from a copy.
      void* target = batched_dtype_ == DType::kFloat32 ? static_cast<void*>(stage)
                                                       : (raw.resize(bytes), raw.data());
      read_at(target, bytes, data_offset_ + static_cast<uint64_t>(index) * bytes);
      if (batched_float16_) widen_float16(static_cast<const uint16_t*>(target), static_cast<int64_t>(n), stage);
      else to_float(batched_dtype_, target, n, stage, uint8_pixels_);
    }
    if (resize_) planar_resize_normalize(stage, channels_, from_, to_, norm_, dst);
    else normalize_planar(dst, channels_, static_cast<int64_t>(n) / channels_, norm_);
    check_finite(dst, static_cast<size_t>(sample_numel()), name_, index, source);
  }

 private:
  void read_at(void* dst, size_t bytes, uint64_t offset) const {
    auto* p = static_cast<unsigned char*>(dst);
    while (bytes > 0) {
      const ssize_t got = ::pread(fd_.fd, p, bytes, static_cast<off_t>(offset));
      if (got < 0 && errno == EINTR) continue;
      if (got <= 0)
        fail(ErrorKind::kIo, batched_path_ + ": read failed at byte " + std::to_string(offset) + ": " +
                                 (got == 0 ? "file shrank since it was opened" : std::strerror(errno)));
      p += got;
      bytes -= static_cast<size_t>(got);
      offset += static_cast<uint64_t>(got);
    }
  }

  void load_labels(const std::string& file, size_t total) {
    const Tensor t = read_npy(file);
    const bool column = t.rank() == 2 && t.dim(1) == 1;
    if (t.rank() != 1 && !column)
      fail(ErrorKind::kInvalidData, file + ": labels must have shape [N] (got " + shape_str(t.shape()) + ")");
    if (static_cast<size_t>(t.dim(0)) != total)
      fail(ErrorKind::kInvalidData, file + ": holds " + std::to_string(t.dim(0)) + " labels for " +
                                        std::to_string(total) + " samples");
    if (t.dtype() == DType::kBool)
      fail(ErrorKind::kInvalidData, file + ": labels must be integers (got bool)");
    if (dtype_is_float(t.dtype())) {
      // Accepted only when every value is a whole number (labels saved from a float array).
      const std::vector<float> v = t.to_float_vector();
      for (size_t i = 0; i < v.size(); ++i)
        if (!std::isfinite(v[i]) || v[i] != std::floor(v[i]))
          fail(ErrorKind::kInvalidData, file + ": label " + std::to_string(i) + " is " +
                                            std::to_string(v[i]) + ", not an integer");
    }
    labels_ = t.to_int64_vector();
    labels_.resize(size_);
  }

  // One line per sample; "\r\n" line ends are accepted and a final line end is optional.
  void load_text_labels(const std::string& file, size_t total) {
    std::ifstream in(file, std::ios::binary);
    if (!in) fail(ErrorKind::kIo, file + ": cannot open");
    std::string line;
    while (std::getline(in, line)) {
      if (!line.empty() && line.back() == '\r') line.pop_back();
      texts_.push_back(line);
    }
    if (in.bad()) fail(ErrorKind::kIo, file + ": read failed");
    if (texts_.size() != total)
      fail(ErrorKind::kInvalidData, file + ": holds " + std::to_string(texts_.size()) + " text labels (lines) for " +
                                        std::to_string(total) + " samples");
    texts_.resize(size_);
  }

  std::string name_;
  size_t size_ = 0;
  Shape stored_shape_;  // one sample as stored
  Shape shape_;         // one sample after resizing
  int64_t channels_ = 1;
  // Batched mode.
  std::string batched_path_;
  DType batched_dtype_ = DType::kUndefined;
  bool batched_float16_ = false;
  uint64_t data_offset_ = 0;
  struct Fd {
    int fd = -1;
    Fd() = default;
    Fd(const Fd&) = delete;
    Fd& operator=(const Fd&) = delete;
    ~Fd() {
      if (fd >= 0) ::close(fd);
    }
  } fd_;
  // Per-sample mode.
  std::vector<std::string> sample_files_;
  std::vector<int64_t> labels_;
  std::vector<std::string> texts_;
  bool resize_ = false;
  bool uint8_pixels_ = true;  // uint8 arrays are pixels, scaled to [0,1] (not for integer model inputs)
  ImageSize from_, to_;
  Normalize norm_;
};

}  // namespace

std::unique_ptr<Dataset> open_npy_dir(const DataOptions& options, const std::string& name,
                                      const std::string& dir) {
  return std::make_unique<NpyDir>(options, name, dir);
}

}  // namespace slimquant::data::detail
