// Fashion-MNIST from Debian's dataset-fashion-mnist (gzipped IDX files). The raw uint8 images
// (47 MB for the training split) stay in memory; samples are converted on demand.
#include <filesystem>

#include "data/opencv.h"

#include "data/preprocess.h"
#include "slimquant/data/idx.h"

namespace slimquant::data::detail {

namespace {

class FashionMnist final : public Dataset {
 public:
  FashionMnist(const DataOptions& options, std::string name, bool train) : name_(std::move(name)) {
    namespace fs = std::filesystem;
    const std::string dir = fashion_mnist_dir();
    std::error_code ec;
    if (!fs::is_directory(dir, ec))
      fail(ErrorKind::kIo, "Fashion-MNIST not found at " + dir +
                               " (install Debian's dataset-fashion-mnist or set "
                               "SLIMQUANT_FASHION_MNIST_DIR)");
    const std::string prefix = train ? "train" : "t10k";
    images_ = read_idx(locate(dir, prefix + "-images-idx3-ubyte"));
    labels_ = read_idx(locate(dir, prefix + "-labels-idx1-ubyte"));
    const std::string images_file = dir + "/" + prefix + "-images-idx3-ubyte";
    if (images_.dtype() != DType::kUInt8 || images_.rank() != 3)
      fail(ErrorKind::kInvalidData, images_file + ": expected uint8 images [N, rows, cols], got " +
                                        dtype_name(images_.dtype()) + " " + shape_str(images_.shape()));
    if (labels_.dtype() != DType::kUInt8 || labels_.rank() != 1)
      fail(ErrorKind::kInvalidData, dir + "/" + prefix + "-labels-idx1-ubyte: expected uint8 labels [N], got " +
                                        dtype_name(labels_.dtype()) + " " + shape_str(labels_.shape()));
    if (labels_.dim(0) != images_.dim(0))
      fail(ErrorKind::kInvalidData, "Fashion-MNIST " + prefix + " split: " +
                                        std::to_string(images_.dim(0)) + " images but " +
                                        std::to_string(labels_.dim(0)) + " labels");
    size_ = static_cast<size_t>(images_.dim(0));
    if (options.limit) size_ = std::min(size_, options.limit);
    if (size_ == 0) fail(ErrorKind::kInvalidData, "data set '" + name_ + "' is empty");

    rows_ = images_.dim(1);
    cols_ = images_.dim(2);
    out_size_ = options.resize.value_or(ImageSize{rows_, cols_});
    channels_ = options.channels == 3 ? 3 : 1;
    order_ = options.channel_order;
    norm_ = resolve_normalize(options, channels_, name_);
    shape_ = {channels_, out_size_.height, out_size_.width};
  }

  const std::string& name() const override { return name_; }
  size_t size() const override { return size_; }
  const Shape& sample_shape() const override { return shape_; }
  bool has_labels() const override { return true; }

  int64_t label(size_t index) const override {
    check_index(index, size_, name_);
    return labels_.data<uint8_t>()[index];
  }

  void load(size_t index, float* dst) const override {
    check_index(index, size_, name_);
    const uint8_t* px = images_.data<uint8_t>() + index * rows_ * cols_;
    // A header over the shared pixels: no copy (OpenCV does not write through it).
    const cv::Mat img(static_cast<int>(rows_), static_cast<int>(cols_), CV_8UC1,
                      const_cast<uint8_t*>(px));
    image_to_chw(img, static_cast<int>(channels_), out_size_, order_, norm_, dst);
    check_finite(dst, static_cast<size_t>(sample_numel()), name_, index, "image " + std::to_string(index));
  }

 private:
  // Debian ships the .gz files; accept unpacked copies too.
  static std::string locate(const std::string& dir, const std::string& base) {
    std::error_code ec;
    const std::string gz = dir + "/" + base + ".gz";
    if (std::filesystem::exists(gz, ec)) return gz;
    const std::string raw = dir + "/" + base;
    if (std::filesystem::exists(raw, ec)) return raw;
    fail(ErrorKind::kIo, "Fashion-MNIST file " + gz + " not found");
  }

  std::string name_;
  Tensor images_, labels_;
  size_t size_ = 0;
  int64_t rows_ = 0, cols_ = 0, channels_ = 1;
  ImageSize out_size_;
  ChannelOrder order_ = ChannelOrder::kRgb;
  Normalize norm_;
  Shape shape_;
};

}  // namespace

std::unique_ptr<Dataset> open_fashion_mnist(const DataOptions& options, const std::string& name,
                                            bool train) {
  return std::make_unique<FashionMnist>(options, name, train);
}

}  // namespace slimquant::data::detail
