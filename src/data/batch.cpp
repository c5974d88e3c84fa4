#include "slimquant/data/batch.h"

#include <cmath>
#include <exception>
#include <mutex>

#include "slimquant/core/tensor_slices.h"

namespace slimquant::data {

namespace {

// Samples stacked first ([n, ...sample]) moved to `axis` (one sample along axis 0 is each
// sample's slice there).
Tensor batch_on_axis(const Tensor& stacked, size_t axis) {
  if (axis == 0) return stacked;
  const int64_t n = stacked.dim(0);
  Shape one = stacked.shape();
  one.erase(one.begin());
  one.insert(one.begin() + static_cast<std::ptrdiff_t>(axis), 1);
  std::vector<Tensor> samples;
  samples.reserve(static_cast<size_t>(n));
  for (int64_t k = 0; k < n; ++k) samples.push_back(slice_along(stacked, 0, k, 1).reshaped(one));
  return concat_along(samples, axis);
}

}  // namespace

std::map<std::string, Tensor> Batch::feeds(const std::string& main_input) const {
  std::map<std::string, Tensor> f = side_inputs;
  f[main_input] = typed_inputs.defined() ? typed_inputs : inputs;
  return f;
}

namespace {

// Samples of an integer model input (token ids), loaded as float32: whole numbers in the type's
// range, converted exactly (float32 holds every integer up to 2^24, beyond any vocabulary).
Tensor as_integers(const Tensor& samples, DType dtype, const Dataset& data, size_t first) {
  const auto [lo, hi] = [&]() -> std::pair<double, double> {
    switch (dtype) {
      case DType::kInt32: return {-2147483648.0, 2147483647.0};
      case DType::kInt16: return {-32768.0, 32767.0};
      case DType::kInt8: return {-128.0, 127.0};
      case DType::kUInt8: return {0.0, 255.0};
      default: return {-9007199254740992.0, 9007199254740992.0};  // int64: what a double holds exactly
    }
  }();
  const float* v = samples.data<float>();
  const int64_t per = samples.dim(0) ? samples.numel() / samples.dim(0) : 1;
  for (int64_t i = 0; i < samples.numel(); ++i)
    SQ_CHECK(v[i] == std::nearbyint(v[i]) && v[i] >= lo && v[i] <= hi, ErrorKind::kInvalidData,
             "data set '" + data.name() + "', sample " + std::to_string(first + static_cast<size_t>(i / per)) +
                 " holds " + std::to_string(v[i]) + " for a model input of " + dtype_name(dtype) +
                 ": its values must be whole numbers in that type's range (token ids)");
  return samples.cast(dtype);
}

}  // namespace

BatchLoader::BatchLoader(const Dataset& dataset, size_t batch_size)
    : dataset_(dataset), batch_size_(batch_size) {
  SQ_CHECK(batch_size >= 1, ErrorKind::kInvalidArgument, "batch size must be at least 1");
}

size_t BatchLoader::num_batches() const {
  return (dataset_.size() + batch_size_ - 1) / batch_size_;
}

Batch BatchLoader::batch(size_t i) const {
  SQ_CHECK(i < num_batches(), ErrorKind::kInvalidArgument,
           "batch " + std::to_string(i) + " out of range for data set '" + dataset_.name() + "' (" +
               std::to_string(num_batches()) + " batches of " + std::to_string(batch_size_) + ")");
  const size_t first = i * batch_size_;
  return load_range(first, std::min(batch_size_, dataset_.size() - first));
}

Batch BatchLoader::load_range(size_t first, size_t count) const {
  SQ_CHECK(count >= 1 && first + count <= dataset_.size(), ErrorKind::kInvalidArgument,
           "samples [" + std::to_string(first) + ", " + std::to_string(first + count) +
               ") out of range for data set '" + dataset_.name() + "' (" +
               std::to_string(dataset_.size()) + " samples)");
  Shape shape = dataset_.sample_shape();
  shape.insert(shape.begin(), static_cast<int64_t>(count));
  Batch b;
  b.inputs = Tensor(DType::kFloat32, std::move(shape));
  b.first_index = first;
  float* out = b.inputs.data<float>();
  const size_t per = static_cast<size_t>(dataset_.sample_numel());

  // Decoding dominates for image files, so samples load in parallel. Exceptions must not cross
  // the OpenMP region: keep the one for the lowest sample index, which makes the error reported
  // the same as a sequential load would give.
  std::exception_ptr error;
  size_t error_index = count;
  std::mutex mu;
  const long n = static_cast<long>(count);
#pragma omp parallel for schedule(dynamic, 1) if (count > 1)
  for (long k = 0; k < n; ++k) {
    try {
      dataset_.load(first + static_cast<size_t>(k), out + static_cast<size_t>(k) * per);
    } catch (...) {
      std::lock_guard<std::mutex> lock(mu);
      if (static_cast<size_t>(k) < error_index) {
        error_index = static_cast<size_t>(k);
        error = std::current_exception();
      }
    }
  }
  if (error) std::rethrow_exception(error);
  if (dataset_.sample_dtype() != DType::kFloat32)
    b.typed_inputs = as_integers(b.inputs, dataset_.sample_dtype(), dataset_, first);

  const std::vector<SideInput>& sides = dataset_.side_inputs();
  for (size_t s = 0; s < sides.size(); ++s) {
    if (!sides[s].batched) {
      Tensor t(sides[s].dtype, sides[s].sample_shape);
      dataset_.load_side_input(s, first, t.raw());
      b.side_inputs[sides[s].name] = std::move(t);
      continue;
    }
    Shape side_shape = sides[s].sample_shape;
    side_shape.insert(side_shape.begin(), static_cast<int64_t>(count));
    Tensor t(sides[s].dtype, std::move(side_shape));
    const size_t row = t.nbytes() / count;
    for (size_t k = 0; k < count; ++k)
      dataset_.load_side_input(s, first + k, static_cast<std::byte*>(t.raw()) + k * row);
    b.side_inputs[sides[s].name] = batch_on_axis(t, sides[s].batch_axis);
  }

  if (dataset_.has_labels()) {
    b.labels.resize(count);
    for (size_t k = 0; k < count; ++k) b.labels[k] = dataset_.label(first + k);
  }
  if (dataset_.has_text_labels()) {
    b.texts.reserve(count);
    for (size_t k = 0; k < count; ++k) b.texts.push_back(dataset_.text_label(first + k));
  }
  return b;
}

bool BatchLoader::next(Batch& out) {
  if (next_ >= num_batches()) return false;
  out = batch(next_++);
  return true;
}

BatchLoader::iterator::iterator(const BatchLoader* loader, size_t index)
    : loader_(loader), index_(index) {
  if (loader_ && index_ < loader_->num_batches()) current_ = loader_->batch(index_);
}

BatchLoader::iterator& BatchLoader::iterator::operator++() {
  ++index_;
  current_ = loader_ && index_ < loader_->num_batches() ? loader_->batch(index_) : Batch{};
  return *this;
}

}  // namespace slimquant::data
