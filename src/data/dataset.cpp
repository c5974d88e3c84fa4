#include "slimquant/data/dataset.h"

#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <cstdlib>

#include "data/preprocess.h"

namespace slimquant::data {

Tensor Dataset::sample(size_t index) const {
  Tensor t(DType::kFloat32, sample_shape());
  load(index, t.data<float>());
  return t;
}

const std::string& Dataset::text_label(size_t) const {
  fail(ErrorKind::kInvalidArgument, "data set '" + name() + "' has no text labels (npy:DIR with a labels.txt has them)");
}

std::string fashion_mnist_dir() {
  const char* env = std::getenv("SLIMQUANT_FASHION_MNIST_DIR");
  return env && *env ? std::string(env) : std::string("/usr/share/datasets/fashion-mnist");
}

namespace {

std::unique_ptr<Dataset> open_samples(const DataOptions& options) {
  const std::string& spec = options.spec;
  const size_t colon = spec.find(':');
  const std::string kind = spec.substr(0, colon);
  const std::string arg = colon == std::string::npos ? "" : spec.substr(colon + 1);
  const bool has_arg = colon != std::string::npos;

  if (options.channels != 0 && options.channels != 1 && options.channels != 3)
    fail(ErrorKind::kInvalidArgument,
         "channels must be 0 (as stored), 1 or 3 (got " + std::to_string(options.channels) + ")");
  if (options.resize && (options.resize->height <= 0 || options.resize->width <= 0))
    fail(ErrorKind::kInvalidArgument, "resize must be positive (got " +
                                          std::to_string(options.resize->height) + "x" +
                                          std::to_string(options.resize->width) + ")");

  if (kind == "fashion-mnist") {
    if (!has_arg || arg == "test") return detail::open_fashion_mnist(options, spec, false);
    if (arg == "train") return detail::open_fashion_mnist(options, spec, true);
    fail(ErrorKind::kInvalidArgument,
         "data set '" + spec + "': unknown Fashion-MNIST split '" + arg + "' (expected train or test)");
  }
  if (kind == "images" && !arg.empty()) return detail::open_image_list(options, spec, arg);
  if (kind == "npy" && !arg.empty()) return detail::open_npy_dir(options, spec, arg);
  fail(ErrorKind::kInvalidArgument,
       "unknown data set '" + spec +
           "' (expected fashion-mnist, fashion-mnist:train, fashion-mnist:test, images:LIST_FILE or "
           "npy:DIR)");
}

}  // namespace

std::unique_ptr<Dataset> open_dataset(const DataOptions& options) {
  const DType t = options.sample_dtype;
  SQ_CHECK(t == DType::kFloat32 || t == DType::kInt64 || t == DType::kInt32 || t == DType::kInt16 ||
               t == DType::kInt8 || t == DType::kUInt8,
           ErrorKind::kUnsupported,
           std::string("data set '") + options.spec + "': samples are fed as float32 or integers, not " +
               dtype_name(t));
  std::unique_ptr<Dataset> data = detail::with_side_inputs(open_samples(options), options);
  data->set_sample_dtype(t);
  return data;
}

namespace {

std::string_view trim(std::string_view s) {
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.front()))) s.remove_prefix(1);
  while (!s.empty() && std::isspace(static_cast<unsigned char>(s.back()))) s.remove_suffix(1);
  return s;
}

// Built with += rather than "'" + std::string(...): GCC 12 reports a false -Wrestrict for the latter.
std::string quoted(std::string_view s) {
  std::string out;
  out.reserve(s.size() + 2);
  out += '\'';
  out += s;
  out += '\'';
  return out;
}

[[noreturn]] void bad_value(std::string_view what, std::string_view text, const std::string& why) {
  fail(ErrorKind::kInvalidArgument, std::string(what) + " " + quoted(text) + ": " + why);
}

int64_t parse_positive(std::string_view item, std::string_view what, std::string_view text) {
  item = trim(item);
  int64_t v = 0;
  auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
  if (ec != std::errc() || end != item.data() + item.size() || item.empty())
    bad_value(what, text, quoted(item) + " is not an integer");
  if (v <= 0 || v > (1 << 20)) bad_value(what, text, "sizes must be between 1 and 1048576");
  return v;
}

}  // namespace

std::vector<float> parse_float_list(std::string_view text, std::string_view what) {
  std::string_view s = trim(text);
  // Accept the YAML/Python spelling "[0.5, 0.5, 0.5]" too.
  if (s.size() >= 2 && s.front() == '[' && s.back() == ']') s = trim(s.substr(1, s.size() - 2));
  if (s.empty()) bad_value(what, text, "expected comma-separated numbers");
  std::vector<float> out;
  while (true) {
    const size_t comma = s.find(',');
    std::string_view item = trim(s.substr(0, comma));
    float v = 0.f;
    auto [end, ec] = std::from_chars(item.data(), item.data() + item.size(), v);
    if (item.empty() || ec != std::errc() || end != item.data() + item.size() || !std::isfinite(v))
      bad_value(what, text, quoted(item) + " is not a finite number");
    out.push_back(v);
    if (comma == std::string_view::npos) break;
    s = s.substr(comma + 1);
  }
  return out;
}

ImageSize parse_image_size(std::string_view text, std::string_view what) {
  std::string_view s = trim(text);
  const size_t sep = s.find_first_of("xX,");
  if (sep == std::string_view::npos) {
    const int64_t v = parse_positive(s, what, text);
    return {v, v};
  }
  return {parse_positive(s.substr(0, sep), what, text), parse_positive(s.substr(sep + 1), what, text)};
}

ChannelOrder parse_channel_order(std::string_view text, std::string_view what) {
  std::string s(trim(text));
  std::transform(s.begin(), s.end(), s.begin(), [](unsigned char c) { return std::tolower(c); });
  if (s == "rgb") return ChannelOrder::kRgb;
  if (s == "bgr") return ChannelOrder::kBgr;
  bad_value(what, text, "expected rgb or bgr");
}

const char* channel_order_name(ChannelOrder order) {
  return order == ChannelOrder::kRgb ? "rgb" : "bgr";
}

}  // namespace slimquant::data
