#pragma once
// Data sets for calibration, evaluation and QAT: a uniform view (`Dataset`) over Fashion-MNIST IDX
// files, image lists and .npy directories, with the usual image preprocessing applied per sample
// (scale to [0,1], resize, channel order, HWC->CHW, per-channel mean/std). Samples are produced
// on demand, so image folders never sit decoded in memory.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "slimquant/core/tensor.h"

namespace slimquant::data {

// Channel order the model expects. Decoded images are reordered to it; .npy data is taken as
// already being in the model's order.
enum class ChannelOrder { kRgb, kBgr };

struct ImageSize {
  int64_t height = 0;
  int64_t width = 0;
  bool operator==(const ImageSize&) const = default;
};

// A further model input fed with every sample, for models with several inputs (PaddleDetection's
// image + im_shape + scale_factor, a mask next to an image): the CLI's `--side-input NAME=FILE.npy`.
// With the input's rank R in the model known, an array of rank R holds one row per sample (N along
// the input's batch axis: [N, ...], or [layers, N, hidden] for a recurrent state) or one row for all
// samples (1 there); an array of rank R-1 is one sample for all. With the rank unknown the array
// must be [N, ...] or [1, ...]. Values keep the file's dtype.
struct SideInputSpec {
  std::string name;       // model input
  std::string path;       // .npy file
  size_t model_rank = 0;  // the input's rank in the model, 0 = unknown
  // The input's first dimension in the model when it is fixed and no axis shows itself as the
  // batch, else -1: fixed at more than one, that axis is not the batch, and an array of rank R
  // that starts with it is refused saying so.
  int64_t model_first_dim = -1;
  // The model input is a scalar (rank 0): the array holds its one value, fed as is to every batch.
  bool model_scalar = false;
  // The input's batch axis in the model (runtime::input_batch_axes gives it: 1 for an LSTM state
  // [layers, batch, hidden]); batches carry the input with their samples along it.
  size_t model_batch_axis = 0;
};

// Mirrors the CLI's data flags.
struct DataOptions {
  // "fashion-mnist" (= test split), "fashion-mnist:train", "fashion-mnist:test",
  // "images:LIST_FILE", "npy:DIR" (with labels.npy for class labels, labels.txt for text labels).
  std::string spec = "fashion-mnist";
  // 1 or C values each, applied as (x - mean[c]) / stddev[c] after pixels are scaled to [0,1].
  // Empty: mean 0 / stddev 1.
  std::vector<float> mean = {};
  std::vector<float> stddev = {};
  // Output spatial size (bilinear when enlarging, area averaging when shrinking).
  std::optional<ImageSize> resize = std::nullopt;
  ChannelOrder channel_order = ChannelOrder::kRgb;
  // Channels of decoded images: 0 = as stored (1 for grayscale files, 3 for colour), 1 or 3 =
  // convert (gray->3 replicates, colour->1 takes luminance). For npy data, must match if set.
  int channels = 0;
  // Use only the first `limit` samples; 0 = all.
  size_t limit = 0;
  // Further model inputs (see SideInputSpec); the data set's samples feed the one model input
  // not named here.
  std::vector<SideInputSpec> side_inputs = {};
  // The element type of that model input: float32, or an integer type (a text model's token ids),
  // whose samples are then fed as that type and must hold whole numbers in its range.
  DType sample_dtype = DType::kFloat32;
};

// A model input a data set feeds besides its samples (SideInputSpec, once opened).
struct SideInput {
  std::string name;
  DType dtype = DType::kFloat32;
  Shape sample_shape;  // one sample, without the batch dimension
  // false: the same tensor (of sample_shape) for every batch, without a batch dimension (a scalar
  // model input); batches then carry it as is.
  bool batched = true;
  // Where batches put their samples: the batch dimension is inserted into sample_shape here.
  size_t batch_axis = 0;
};

class Dataset {
 public:
  virtual ~Dataset() = default;
  // The spec it was opened from, for messages ("npy:calib", "fashion-mnist:test").
  virtual const std::string& name() const = 0;
  virtual size_t size() const = 0;
  // Shape of one preprocessed sample, e.g. {1, 28, 28} or {3, 224, 224}.
  virtual const Shape& sample_shape() const = 0;
  // Writes sample `index` (shape_numel(sample_shape()) float32 values) to dst. Thread-safe.
  // Throws kInvalidArgument for an index out of range and kInvalidData for unreadable samples and
  // samples holding NaN/Inf (naming the file and the sample).
  virtual void load(size_t index, float* dst) const = 0;
  virtual bool has_labels() const = 0;
  // Throws kInvalidArgument when the data set has no labels or index is out of range.
  virtual int64_t label(size_t index) const = 0;
  // Text labels (recognition: the line's text, UTF-8), from npy:DIR's labels.txt. Independent of
  // the class labels above. text_label throws kInvalidArgument when there are none or index is out
  // of range.
  virtual bool has_text_labels() const { return false; }
  virtual const std::string& text_label(size_t index) const;

  // Further model inputs each sample carries (empty for single-input data).
  virtual const std::vector<SideInput>& side_inputs() const;
  // Writes side input `which` of sample `index` (its dtype and sample_shape) to dst. Thread-safe.
  virtual void load_side_input(size_t which, size_t index, void* dst) const;

  // The element type the samples are fed to the model as (DataOptions::sample_dtype); load() gives
  // them as float32 either way.
  DType sample_dtype() const { return sample_dtype_; }
  void set_sample_dtype(DType dtype) { sample_dtype_ = dtype; }

  int64_t sample_numel() const { return shape_numel(sample_shape()); }
  // One sample as a float32 tensor of sample_shape().
  Tensor sample(size_t index) const;

 private:
  DType sample_dtype_ = DType::kFloat32;
};

// Opens the data set `options.spec` describes. Throws kInvalidArgument for a malformed spec or
// options that do not fit the data (mean/stddev length, channels), kIo for missing files and
// directories, kInvalidData for corrupt or empty data.
std::unique_ptr<Dataset> open_dataset(const DataOptions& options);

// The model input the data set's samples feed: the one input of `model_inputs` (in model order)
// that no side input names. Throws kInvalidArgument naming the inputs when a side input is not a
// model input, or when anything other than exactly one input is left for the samples.
std::string main_input_name(const std::vector<std::string>& model_inputs, const Dataset& data);

// "NAME=FILE.npy" -> {NAME, FILE.npy} (model_rank unset); kInvalidArgument naming `what` otherwise.
SideInputSpec parse_side_input(std::string_view text, std::string_view what);

// Where Debian's dataset-fashion-mnist puts the files; $SLIMQUANT_FASHION_MNIST_DIR overrides it.
std::string fashion_mnist_dir();

// ---- parsing helpers for the CLI and config files; errors are kInvalidArgument naming `what`
// (the flag, e.g. "--mean") and the offending text.

// "0.485,0.456,0.406" -> {0.485, 0.456, 0.406}; spaces around items are allowed.
std::vector<float> parse_float_list(std::string_view text, std::string_view what);
// "224x224" (height x width) or "224" (square).
ImageSize parse_image_size(std::string_view text, std::string_view what);
// "rgb" or "bgr" (case-insensitive).
ChannelOrder parse_channel_order(std::string_view text, std::string_view what);
const char* channel_order_name(ChannelOrder order);

}  // namespace slimquant::data
