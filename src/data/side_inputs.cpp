// Side inputs: further model inputs fed next to a data set's samples (multi-input models). The
// arrays are read whole when the data set opens (they are small next to the samples: shapes,
// scale factors, masks), checked for NaN/Inf there, and copied row by row into batches.
#include <algorithm>
#include <cmath>
#include <cstring>

#include "data/preprocess.h"
#include "slimquant/core/npy.h"
#include "slimquant/core/tensor_slices.h"

namespace slimquant::data {

const std::vector<SideInput>& Dataset::side_inputs() const {
  static const std::vector<SideInput> kNone;
  return kNone;
}

void Dataset::load_side_input(size_t which, size_t, void*) const {
  fail(ErrorKind::kInvalidArgument,
       "data set '" + name() + "' has no side input " + std::to_string(which));
}

std::string main_input_name(const std::vector<std::string>& model_inputs, const Dataset& data) {
  auto list = [](const std::vector<std::string>& names) {
    std::string s;
    for (const auto& n : names) s += (s.empty() ? "'" : ", '") + n + "'";
    return s;
  };
  std::vector<std::string> fed_by_samples = model_inputs;
  for (const SideInput& side : data.side_inputs()) {
    auto it = std::find(fed_by_samples.begin(), fed_by_samples.end(), side.name);
    if (it == fed_by_samples.end())
      fail(ErrorKind::kInvalidArgument, "side input '" + side.name + "' is not an input of the model (its inputs: " +
                                            list(model_inputs) + ")");
    fed_by_samples.erase(it);
  }
  if (fed_by_samples.size() == 1) return fed_by_samples.front();
  if (fed_by_samples.empty())
    fail(ErrorKind::kInvalidArgument, "every model input (" + list(model_inputs) +
                                          ") is given as a side input: leave the one the data set '" + data.name() +
                                          "' feeds");
  fail(ErrorKind::kInvalidArgument,
       "the model has " + std::to_string(model_inputs.size()) + " inputs (" + list(model_inputs) +
           "); the data set '" + data.name() + "' feeds one of them (" + list({fed_by_samples.front()}) +
           "), so give " + list({fed_by_samples.begin() + 1, fed_by_samples.end()}) +
           " with --side-input NAME=FILE.npy (an array of one row per sample, or one for all)");
}

SideInputSpec parse_side_input(std::string_view text, std::string_view what) {
  const size_t eq = text.find('=');
  if (eq == std::string_view::npos || eq == 0 || eq + 1 == text.size())
    fail(ErrorKind::kInvalidArgument,
         std::string(what) + " '" + std::string(text) + "': expected NAME=FILE.npy");
  return {std::string(text.substr(0, eq)), std::string(text.substr(eq + 1)), 0};
}

namespace detail {

namespace {

// A data set plus side inputs. Each side array is either one row per sample or one row for all,
// rows lying along the model input's batch axis.
class WithSideInputs final : public Dataset {
 public:
  WithSideInputs(std::unique_ptr<Dataset> base, const DataOptions& options) : base_(std::move(base)) {
    for (const SideInputSpec& spec : options.side_inputs) add(spec, options.limit);
  }

  const std::string& name() const override { return base_->name(); }
  size_t size() const override { return base_->size(); }
  const Shape& sample_shape() const override { return base_->sample_shape(); }
  void load(size_t index, float* dst) const override { base_->load(index, dst); }
  bool has_labels() const override { return base_->has_labels(); }
  int64_t label(size_t index) const override { return base_->label(index); }
  bool has_text_labels() const override { return base_->has_text_labels(); }
  const std::string& text_label(size_t index) const override { return base_->text_label(index); }
  const std::vector<SideInput>& side_inputs() const override { return infos_; }

  void load_side_input(size_t which, size_t index, void* dst) const override {
    SQ_CHECK(which < arrays_.size(), ErrorKind::kInvalidArgument,
             "data set '" + name() + "' has no side input " + std::to_string(which));
    check_index(index, size(), name());
    const Array& a = arrays_[which];
    const size_t row = a.per_sample ? index : 0;
    if (a.row_axis == 0) {
      std::memcpy(dst, static_cast<const std::byte*>(a.values.raw()) + row * a.row_bytes, a.row_bytes);
      return;
    }
    // A row off the first axis is strided: gathered into one sample.
    const Tensor sample = slice_along(a.values, a.row_axis, static_cast<int64_t>(row), 1);
    std::memcpy(dst, sample.raw(), a.row_bytes);
  }

 private:
  struct Array {
    Tensor values;
    bool per_sample = false;
    size_t row_axis = 0;  // the axis of values that holds the rows (for one sample for all: 0)
    size_t row_bytes = 0;
  };

  void add(const SideInputSpec& spec, size_t limit) {
    for (const SideInput& seen : infos_)
      SQ_CHECK(seen.name != spec.name, ErrorKind::kInvalidArgument,
               "side input '" + spec.name + "' is given twice");
    const std::string who = "side input '" + spec.name + "' (" + spec.path + ")";
    Tensor t = read_npy(spec.path);
    const size_t n = size(), r = t.rank();
    Array a;
    Shape sample_shape;
    bool batched = true;
    if (spec.model_scalar) {
      // One value for every batch, fed without a batch dimension ([], [1], [1, 1] ... hold it).
      SQ_CHECK(t.numel() == 1, ErrorKind::kInvalidData,
               who + " has shape " + shape_str(t.shape()) + ", but the model input is a scalar: give one value");
      batched = false;
    } else if (spec.model_rank != 0 && r + 1 == spec.model_rank) {
      sample_shape = t.shape();  // one sample for all
    } else if (r >= 1 && (spec.model_rank == 0 || r == spec.model_rank)) {
      const size_t axis = spec.model_batch_axis;
      SQ_CHECK(axis < r, ErrorKind::kInvalidArgument,
               who + ": batch axis " + std::to_string(axis) + " for an array of rank " + std::to_string(r));
      const auto rows = static_cast<size_t>(t.dim(axis));
      // The model fixes this input's first axis at more than one and shows no other as the batch:
      // that axis is not the batch, and rows along it are not samples.
      if (spec.model_first_dim > 1 && t.dim(0) == spec.model_first_dim && rows != n)
        fail(ErrorKind::kUnsupported,
             who + " has shape " + shape_str(t.shape()) + ", and the model fixes that input's first axis at " +
                 std::to_string(spec.model_first_dim) +
                 ", so that axis is not its batch, while its declared shape shows no other (no one axis of dynamic "
                 "size, or of the batch size its other inputs fix): give the input a dynamic batch axis in the model "
                 "to feed it from a data set");
      a.per_sample = rows != 1 || n == 1;
      a.row_axis = axis;
      const std::string along = axis == 0 ? "" : " along its batch axis " + std::to_string(axis);
      if (a.per_sample && (limit == 0 ? rows != n : rows < n))
        fail(ErrorKind::kInvalidData, who + " has " + std::to_string(rows) + " rows" + along + " for the " +
                                          std::to_string(n) + " samples of '" + name() +
                                          "' (give one row per sample, or one for all)");
      sample_shape = t.shape();
      sample_shape.erase(sample_shape.begin() + static_cast<std::ptrdiff_t>(axis));
    } else {
      fail(ErrorKind::kInvalidData,
           who + " has shape " + shape_str(t.shape()) +
               (spec.model_rank ? "; the model input has rank " + std::to_string(spec.model_rank) +
                                      ": give [N, ...] (one row per sample), [1, ...] (one for all) or one sample"
                                : ": give [N, ...] (one row per sample) or [1, ...] (one for all)"));
    }
    if (dtype_is_float(t.dtype())) {
      const std::vector<float> v = t.to_float_vector();
      for (size_t i = 0; i < v.size(); ++i)
        SQ_CHECK(std::isfinite(v[i]), ErrorKind::kInvalidData,
                 who + " holds " + (std::isnan(v[i]) ? "NaN" : "Inf") + " at element " + std::to_string(i));
    }
    a.row_bytes = static_cast<size_t>(shape_numel(sample_shape)) * dtype_size(t.dtype());
    infos_.push_back({spec.name, t.dtype(), std::move(sample_shape), batched, batched ? spec.model_batch_axis : 0});
    a.values = std::move(t);
    arrays_.push_back(std::move(a));
  }

  std::unique_ptr<Dataset> base_;
  std::vector<SideInput> infos_;
  std::vector<Array> arrays_;
};

}  // namespace

std::unique_ptr<Dataset> with_side_inputs(std::unique_ptr<Dataset> base, const DataOptions& options) {
  if (options.side_inputs.empty()) return base;
  return std::make_unique<WithSideInputs>(std::move(base), options);
}

}  // namespace detail

}  // namespace slimquant::data
