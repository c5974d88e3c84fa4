#include "data/preprocess.h"

#include <cmath>
#include <cstring>


namespace slimquant::data::detail {

Normalize resolve_normalize(const DataOptions& options, int64_t channels, const std::string& name) {
  auto expand = [&](const std::vector<float>& v, float fallback, const char* what) {
    if (v.empty()) return std::vector<float>(static_cast<size_t>(channels), fallback);
    if (v.size() == 1) return std::vector<float>(static_cast<size_t>(channels), v[0]);
    if (static_cast<int64_t>(v.size()) != channels)
      fail(ErrorKind::kInvalidArgument,
           std::string(what) + " has " + std::to_string(v.size()) + " values but data set '" + name +
               "' has " + std::to_string(channels) + " channel" + (channels == 1 ? "" : "s") +
               " (give 1 or " + std::to_string(channels) + " values)");
    return v;
  };
  Normalize n;
  n.mean = expand(options.mean, 0.f, "mean");
  std::vector<float> stddev = expand(options.stddev, 1.f, "stddev");
  n.inv_std.resize(stddev.size());
  for (size_t c = 0; c < stddev.size(); ++c) {
    if (!(stddev[c] > 0.f) || !std::isfinite(stddev[c]))
      fail(ErrorKind::kInvalidArgument, "stddev for channel " + std::to_string(c) + " of data set '" +
                                            name + "' must be positive and finite (got " +
                                            std::to_string(stddev[c]) + ")");
    if (!std::isfinite(n.mean[c]))
      fail(ErrorKind::kInvalidArgument,
           "mean for channel " + std::to_string(c) + " of data set '" + name + "' is not finite");
    n.inv_std[c] = 1.f / stddev[c];
    if (n.mean[c] != 0.f || stddev[c] != 1.f) n.identity = false;
  }
  return n;
}

namespace {

int interpolation_for(const cv::Size& from, const cv::Size& to) {
  // Area averaging is OpenCV's recommended filter for shrinking (no aliasing); bilinear otherwise.
  return to.width <= from.width && to.height <= from.height ? cv::INTER_AREA : cv::INTER_LINEAR;
}

}  // namespace

void image_to_chw(const cv::Mat& image, int out_channels, ImageSize size, ChannelOrder order,
                  const Normalize& norm, float* dst) {
  cv::Mat img = image;
  if (img.channels() == 1 && out_channels == 3) cv::cvtColor(img, img, cv::COLOR_GRAY2BGR);
  else if (img.channels() == 3 && out_channels == 1) cv::cvtColor(img, img, cv::COLOR_BGR2GRAY);
  SQ_CHECK(img.channels() == out_channels, ErrorKind::kInternal, "image_to_chw: channel mismatch");

  cv::Mat f;
  img.convertTo(f, CV_32F, 1.0 / 255.0);
  const cv::Size target(static_cast<int>(size.width), static_cast<int>(size.height));
  if (f.size() != target) {
    cv::Mat r;
    cv::resize(f, r, target, 0, 0, interpolation_for(f.size(), target));
    f = r;
  }
  if (!f.isContinuous()) f = f.clone();

  const int64_t plane = size.height * size.width;
  const float* src = f.ptr<float>();
  const int C = out_channels;
  for (int c = 0; c < C; ++c) {
    // OpenCV decodes colour as BGR: model channel 0 is R (source 2) for RGB order.
    const int sc = (C == 3 && order == ChannelOrder::kRgb) ? 2 - c : c;
    const float m = norm.mean[c], k = norm.inv_std[c];
    float* out = dst + c * plane;
    for (int64_t i = 0; i < plane; ++i) out[i] = (src[i * C + sc] - m) * k;
  }
}

void normalize_planar(float* data, int64_t channels, int64_t plane, const Normalize& norm) {
  if (norm.identity) return;
  for (int64_t c = 0; c < channels; ++c) {
    const float m = norm.mean[c], k = norm.inv_std[c];
    float* p = data + c * plane;
    for (int64_t i = 0; i < plane; ++i) p[i] = (p[i] - m) * k;
  }
}

void planar_resize_normalize(float* src, int64_t channels, ImageSize from, ImageSize size,
                             const Normalize& norm, float* dst) {
  const int64_t out_plane = size.height * size.width;
  if (from == size) {
    if (src != dst) std::memcpy(dst, src, sizeof(float) * channels * out_plane);
  } else {
    const cv::Size in_sz(static_cast<int>(from.width), static_cast<int>(from.height));
    const cv::Size out_sz(static_cast<int>(size.width), static_cast<int>(size.height));
    const int interp = interpolation_for(in_sz, out_sz);
    for (int64_t c = 0; c < channels; ++c) {
      // Wrap both planes without copies; cv::resize writes straight into dst.
      cv::Mat in(in_sz, CV_32F, src + c * from.height * from.width);
      cv::Mat out(out_sz, CV_32F, dst + c * out_plane);
      cv::resize(in, out, out_sz, 0, 0, interp);
    }
  }
  normalize_planar(dst, channels, out_plane, norm);
}

void check_finite(const float* data, size_t n, const std::string& name, size_t index,
                  const std::string& source) {
  // One branch-free pass over the exponent bits (vectorises); the element is located only on failure.
  uint32_t bad = 0;
  for (size_t i = 0; i < n; ++i) {
    uint32_t bits;
    std::memcpy(&bits, data + i, sizeof bits);
    bad |= static_cast<uint32_t>((bits & 0x7f800000u) == 0x7f800000u);
  }
  if (!bad) return;
  for (size_t i = 0; i < n; ++i) {
    if (!std::isfinite(data[i]))
      fail(ErrorKind::kInvalidData, name + ": sample " + std::to_string(index) + " (" + source +
                                        ") holds " + (std::isnan(data[i]) ? "NaN" : "Inf") +
                                        " at element " + std::to_string(i));
  }
}

void check_index(size_t index, size_t size, const std::string& name) {
  if (index >= size)
    fail(ErrorKind::kInvalidArgument, "sample index " + std::to_string(index) +
                                          " out of range for data set '" + name + "' (" +
                                          std::to_string(size) + " samples)");
}

}  // namespace slimquant::data::detail
