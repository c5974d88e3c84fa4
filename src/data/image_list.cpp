// images:LIST_FILE — a text file with one "relative/path [label]" per line (paths relative to the
// list's directory). Images are decoded on demand with OpenCV; only the list is held in memory.
#include <charconv>
#include <cctype>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <optional>

#include "data/opencv.h"

#include "data/preprocess.h"

namespace slimquant::data::detail {

namespace {

namespace fs = std::filesystem;

struct Entry {
  std::string text;  // the path as written in the list
  std::string path;  // resolved
  size_t line = 0;
  int64_t label = 0;
};

std::string_view trim(std::string_view s) {
  while (!s.empty() && (s.front() == ' ' || s.front() == '\t')) s.remove_prefix(1);
  while (!s.empty() && (s.back() == ' ' || s.back() == '\t' || s.back() == '\r')) s.remove_suffix(1);
  return s;
}

// A trailing integer separated by whitespace is the label; everything before it is the path (so
// paths with spaces work as long as they do not end in " <digits>").
bool split_label(std::string_view line, std::string_view& path, int64_t& label) {
  const size_t ws = line.find_last_of(" \t");
  if (ws == std::string_view::npos) return false;
  std::string_view tail = line.substr(ws + 1);
  auto [end, ec] = std::from_chars(tail.data(), tail.data() + tail.size(), label);
  if (ec != std::errc() || end != tail.data() + tail.size()) return false;
  path = trim(line.substr(0, ws));
  return !path.empty();
}

class ImageList final : public Dataset {
 public:
  ImageList(const DataOptions& options, std::string name, const std::string& list_file)
      : name_(std::move(name)),
        list_file_(list_file),
        forced_(options.channels != 0),
        channels_(options.channels),
        order_(options.channel_order) {
    std::error_code ec;
    if (!fs::is_regular_file(list_file, ec))
      fail(ErrorKind::kIo, "image list " + list_file + " not found");
    std::ifstream in(list_file);
    if (!in) fail(ErrorKind::kIo, "image list " + list_file + ": cannot open");
    const fs::path base = fs::path(list_file).parent_path();

    std::string raw;
    size_t line_no = 0, first_line = 0;
    while (std::getline(in, raw)) {
      ++line_no;
      std::string_view line = trim(raw);
      if (line.empty() || line.front() == '#') continue;
      if (options.limit && entries_.size() == options.limit) break;
      Entry e;
      e.line = line_no;
      std::string_view path = line;
      const bool labelled = split_label(line, path, e.label);
      if (entries_.empty()) {
        has_labels_ = labelled;
        first_line = line_no;
      } else if (labelled != has_labels_) {
        fail(ErrorKind::kInvalidData,
             where(line_no) + ": '" + std::string(line) + "' " + (labelled ? "has a" : "has no") +
                 " label but line " + std::to_string(first_line) + " " +
                 (has_labels_ ? "has one" : "has none") + " (labels are all-or-none)");
      }
      e.text = std::string(path);
      const fs::path p(e.text);
      e.path = (p.is_absolute() ? p : base / p).string();
      if (!fs::is_regular_file(e.path, ec))
        fail(ErrorKind::kIo, where(line_no) + ": image '" + e.text + "' not found (looked at " +
                                 e.path + ")");
      entries_.push_back(std::move(e));
    }
    if (in.bad()) fail(ErrorKind::kIo, "image list " + list_file + ": read error");
    if (entries_.empty()) fail(ErrorKind::kInvalidData, "data set '" + name_ + "' is empty");

    // The first image fixes the channel count (unless forced) and the size (unless resized).
    const cv::Mat first = decode(entries_.front());
    if (!forced_) channels_ = first.channels();
    first_size_ = {first.rows, first.cols};
    out_size_ = options.resize.value_or(first_size_);
    resize_given_ = options.resize.has_value();
    norm_ = resolve_normalize(options, channels_, name_);
    shape_ = {channels_, out_size_.height, out_size_.width};
  }

  const std::string& name() const override { return name_; }
  size_t size() const override { return entries_.size(); }
  const Shape& sample_shape() const override { return shape_; }
  bool has_labels() const override { return has_labels_; }

  int64_t label(size_t index) const override {
    check_index(index, entries_.size(), name_);
    if (!has_labels_)
      fail(ErrorKind::kInvalidArgument, "data set '" + name_ + "' has no labels (" + list_file_ +
                                            " lists paths without labels)");
    return entries_[index].label;
  }

  void load(size_t index, float* dst) const override {
    check_index(index, entries_.size(), name_);
    const Entry& e = entries_[index];
    const cv::Mat img = decode(e);
    if (!forced_ && img.channels() != channels_)
      fail(ErrorKind::kInvalidData,
           where(e.line) + ": image '" + e.text + "' has " + std::to_string(img.channels()) +
               " channel(s) but the first image has " + std::to_string(channels_) +
               " (set channels to 1 or 3 to convert them all)");
    if (!resize_given_ && ImageSize{img.rows, img.cols} != first_size_)
      fail(ErrorKind::kInvalidData,
           where(e.line) + ": image '" + e.text + "' is " + std::to_string(img.rows) + "x" +
               std::to_string(img.cols) + " but the first image is " +
               std::to_string(first_size_.height) + "x" + std::to_string(first_size_.width) +
               " (images of different sizes need a resize, e.g. --resize " +
               std::to_string(first_size_.height) + "x" + std::to_string(first_size_.width) + ")");
    image_to_chw(img, channels_, out_size_, order_, norm_, dst);
    check_finite(dst, static_cast<size_t>(sample_numel()), name_, index, e.path);
  }

 private:
  std::string where(size_t line) const { return list_file_ + ":" + std::to_string(line); }

  cv::Mat decode(const Entry& e) const {
    // Grayscale files stay single-channel and colour files come as BGR; any conversion to the
    // requested channel count happens in image_to_chw with cvtColor, so it is the same arithmetic
    // for every file format (libpng's and libjpeg's own gray conversions differ from each other).
    const int flags = cv::IMREAD_ANYCOLOR;
    check_image_before_decoding(e.path, where(e.line));  // size limits before OpenCV allocates
    cv::Mat img;
    try {
      img = cv::imread(e.path, flags);
    } catch (const cv::Exception& ex) {
      fail(ErrorKind::kInvalidData, where(e.line) + ": cannot decode image '" + e.text + "': " + ex.what());
    }
    if (img.empty())
      fail(ErrorKind::kInvalidData,
           where(e.line) + ": cannot decode image '" + e.text + "' (" + e.path + ")");
    check_decoded_image(img, e.path, where(e.line));
    return img;
  }

  std::string name_;
  std::string list_file_;
  bool forced_;  // channels given in the options: every image is converted to that count
  int channels_;
  std::vector<Entry> entries_;
  bool has_labels_ = false;
  ImageSize first_size_, out_size_;
  bool resize_given_ = false;
  ChannelOrder order_;
  Normalize norm_;
  Shape shape_;
};

}  // namespace

std::unique_ptr<Dataset> open_image_list(const DataOptions& options, const std::string& name,
                                         const std::string& list_file) {
  return std::make_unique<ImageList>(options, name, list_file);
}

}  // namespace slimquant::data::detail
