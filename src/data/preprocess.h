#pragma once
// Shared per-sample preprocessing for the data set kinds (internal to src/data).
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "data/opencv.h"

#include "slimquant/data/dataset.h"

namespace slimquant::data::detail {

// Per-channel affine normalisation resolved for a known channel count:
// out = (x - mean[c]) * inv_std[c].
struct Normalize {
  std::vector<float> mean;
  std::vector<float> inv_std;
  bool identity = true;
};

// Expands 1-value mean/stddev to `channels`; throws kInvalidArgument naming the data set when the
// lengths fit neither 1 nor `channels`, or a stddev is not positive and finite.
Normalize resolve_normalize(const DataOptions& options, int64_t channels, const std::string& name);

// Decoded 8-bit image (1 channel, or 3 channels in OpenCV's BGR order; HWC) -> CHW float32 in dst:
// convert channels to out_channels, scale by 1/255, resize to `size` if it differs, reorder to
// `order`, normalise.
void image_to_chw(const cv::Mat& image, int out_channels, ImageSize size, ChannelOrder order,
                  const Normalize& norm, float* dst);

// Planar float sample [C, H, W] (in place in `src`): resize each plane to `size` into dst if it
// differs, then normalise per channel. src and dst may be the same buffer when no resize happens.
void planar_resize_normalize(float* src, int64_t channels, ImageSize from, ImageSize size,
                             const Normalize& norm, float* dst);

// Decoded image size limit: width x height at most this many pixels (10000 x 10000; README).
inline constexpr uint64_t kMaxImagePixels = 100'000'000;

// Width and height declared in an image file's header (PNG, JPEG, BMP, WebP, TIFF, PNM), read
// without decoding; nullopt for other formats or an unreadable header.
struct ImageDims {
  uint64_t width = 0, height = 0;
};
std::optional<ImageDims> read_image_header_dims(const std::string& path);

// Before cv::imread: the path must be a regular file (a FIFO or device would block), and a size
// declared in its header must be non-empty and within kMaxImagePixels. Throws kInvalidData (kIo
// when missing) naming `what` (e.g. "list.txt:3") and the file.
void check_image_before_decoding(const std::string& path, const std::string& what);
// After decoding, for the formats whose header is not read: the same pixel limit.
void check_decoded_image(const cv::Mat& image, const std::string& path, const std::string& what);

// Applies the normalisation in place on a planar [C, plane] buffer.
void normalize_planar(float* data, int64_t channels, int64_t plane, const Normalize& norm);

// Throws kInvalidData "<name>: sample <index> (<source>) holds NaN at element <e>" if any value is
// not finite.
void check_finite(const float* data, size_t n, const std::string& name, size_t index,
                  const std::string& source);

// Throws kInvalidArgument when index >= size.
void check_index(size_t index, size_t size, const std::string& name);

// Factories for the data set kinds; `name` is the spec, `arg` the part after the colon.
std::unique_ptr<Dataset> open_fashion_mnist(const DataOptions& options, const std::string& name,
                                            bool train);
std::unique_ptr<Dataset> open_image_list(const DataOptions& options, const std::string& name,
                                         const std::string& list_file);
std::unique_ptr<Dataset> open_npy_dir(const DataOptions& options, const std::string& name,
                                      const std::string& dir);
// `base` plus options.side_inputs (returned as is when there are none).
std::unique_ptr<Dataset> with_side_inputs(std::unique_ptr<Dataset> base, const DataOptions& options);

}  // namespace slimquant::data::detail
