#include "slimquant/quant/calibration.h"

#include <algorithm>
#include <chrono>
#include <cstring>
#include <numeric>

#include "slimquant/core/distributed.h"
#include "slimquant/core/progress.h"
#include "slimquant/core/tensor_slices.h"
#include "slimquant/data/batch.h"
#include "slimquant/runtime/session.h"

namespace slimquant::quant {

namespace {

// Rows (samples) of a batch.
size_t rows_of(const Feeds& feeds, const runtime::BatchAxes& axes) {
  return static_cast<size_t>(runtime::batch_rows(feeds, axes));
}

// Gives the entry named "" (a bare array from a generator) the name of the model's only input.
Feeds name_inputs(Feeds feeds, const std::vector<ir::ValueInfo>& inputs, const char* source) {
  auto unnamed = feeds.find("");
  if (unnamed == feeds.end()) return feeds;
  SQ_CHECK(inputs.size() == 1 && feeds.size() == 1, ErrorKind::kInvalidArgument,
           std::string(source) + " gave an unnamed array, but the model has " + std::to_string(inputs.size()) +
               " inputs: give a dict of input name -> array");
  Tensor t = std::move(unnamed->second);
  feeds.clear();
  feeds[inputs[0].name] = std::move(t);
  return feeds;
}

// The rank stack_samples is given for a scalar model input (0 stands for an unknown rank).
constexpr size_t kScalarInput = SIZE_MAX;

// Stacks single samples (each input without a batch dimension, or with a batch dimension of 1)
// into one batch per input, along the input's batch axis; `ranks` holds each input's rank in the
// model (0 = unknown, kScalarInput: fed as is, one value for the batch).
Feeds stack_samples(const std::vector<Feeds>& samples, const std::map<std::string, size_t>& ranks,
                    const runtime::BatchAxes& axes) {
  Feeds batch;
  const auto& first = samples.front();
  for (const auto& [name, t0] : first) {
    auto rank_it = ranks.find(name);
    SQ_CHECK(rank_it != ranks.end(), ErrorKind::kInvalidArgument,
             "sample_generator gave '" + name + "', which is not an input of the model");
    if (rank_it->second == kScalarInput) {
      // A scalar input is fed as is: its samples must agree (a batch has one value of it).
      for (const Feeds& s : samples) {
        const auto it = s.find(name);
        SQ_CHECK(it != s.end() && it->second.numel() == 1 && it->second.dtype() == t0.dtype() &&
                     std::memcmp(it->second.raw(), t0.raw(), t0.nbytes()) == 0,
                 ErrorKind::kInvalidArgument,
                 "sample_generator: the scalar input '" + name +
                     "' differs between the samples of a batch (it is fed once per batch): use batch_size 1");
      }
      SQ_CHECK(t0.numel() == 1, ErrorKind::kInvalidArgument,
               "sample_generator: input '" + name + "' is a scalar in the model, not " + shape_str(t0.shape()));
      Tensor scalar(t0.dtype(), Shape{});
      std::memcpy(scalar.raw(), t0.raw(), t0.nbytes());
      batch[name] = std::move(scalar);
      continue;
    }
    const size_t axis = runtime::batch_axis_of(axes, name);
    const bool has_batch_dim = rank_it->second != 0 && t0.rank() == rank_it->second;
    SQ_CHECK(!has_batch_dim || t0.dim(axis) == 1, ErrorKind::kInvalidArgument,
             "sample_generator must give one sample per call; input '" + name + "' has batch dimension " +
                 std::to_string(t0.dim(axis)) + (axis ? " (axis " + std::to_string(axis) + ")" : ""));
    // Each sample with a batch dimension of 1 where its batch goes; joined there.
    Shape one = t0.shape();
    if (has_batch_dim) one.erase(one.begin() + static_cast<std::ptrdiff_t>(axis));
    one.insert(one.begin() + static_cast<std::ptrdiff_t>(std::min(axis, one.size())), 1);
    std::vector<Tensor> pieces;
    pieces.reserve(samples.size());
    for (size_t i = 0; i < samples.size(); ++i) {
      auto it = samples[i].find(name);
      SQ_CHECK(it != samples[i].end(), ErrorKind::kInvalidArgument,
               "sample_generator: sample lacks input '" + name + "' that the first sample had");
      const Tensor& t = it->second;
      SQ_CHECK(t.dtype() == t0.dtype() && t.numel() == t0.numel(), ErrorKind::kInvalidArgument,
               "sample_generator: samples of input '" + name + "' differ in dtype or shape (" + shape_str(t.shape()) +
                   " vs " + shape_str(t0.shape()) + ")");
      pieces.push_back(t.reshaped(one));
    }
    batch[name] = concat_along(pieces, std::min(axis, one.size() - 1));
  }
  return batch;
}

class DatasetSource final : public CalibrationSource {
 public:
  DatasetSource(const data::Dataset& data, size_t batch_size, const std::vector<ir::ValueInfo>& model_inputs)
      : loader_(data, batch_size) {
    std::vector<std::string> names;
    for (const auto& in : model_inputs) names.push_back(in.name);
    main_input_ = data::main_input_name(names, data);
    const runtime::BatchAxes axes = runtime::input_batch_axes(model_inputs);
    for (const data::SideInput& side : data.side_inputs()) {
      const size_t expected = runtime::batch_axis_of(axes, side.name);
      SQ_CHECK(!side.batched || side.batch_axis == expected, ErrorKind::kInvalidArgument,
               "side input '" + side.name + "' of '" + data.name() + "' is batched along axis " +
                   std::to_string(side.batch_axis) + ", but the model's batch axis for it is " +
                   std::to_string(expected) + ": set SideInputSpec::model_batch_axis (runtime::input_batch_axes)");
    }
  }
  std::optional<size_t> known_batches() const override { return loader_.num_batches(); }
  bool random_access() const override { return true; }
  std::optional<Feeds> batch(size_t i) override {
    if (i >= loader_.num_batches()) return std::nullopt;
    return loader_.batch(i).feeds(main_input_);
  }
  Feeds rows_after(size_t batches, size_t rows) override {
    const size_t first = samples_in(batches), size = loader_.dataset().size();
    if (first >= size || rows == 0) return {};
    return loader_.load_range(first, std::min(rows, size - first)).feeds(main_input_);
  }
  size_t samples_in(size_t batches) const override {
    return std::min(batches * loader_.batch_size(), loader_.dataset().size());
  }
  std::string name() const override { return "'" + loader_.dataset().name() + "'"; }

 private:
  data::BatchLoader loader_;
  std::string main_input_;
};

// Generators are read once, in order; rows_per_batch_ remembers what each batch held.
class SequentialSource : public CalibrationSource {
 public:
  explicit SequentialSource(const std::vector<ir::ValueInfo>& inputs) : axes_(runtime::input_batch_axes(inputs)) {}
  std::optional<size_t> known_batches() const override { return std::nullopt; }
  bool random_access() const override { return false; }
  std::optional<Feeds> batch(size_t i) override {
    SQ_CHECK(i == rows_per_batch_.size(), ErrorKind::kInternal, "a generator's batches are read in order");
    if (ended_) return std::nullopt;
    std::optional<Feeds> b = next_batch();
    if (!b || b->empty()) {
      ended_ = true;
      return std::nullopt;
    }
    rows_per_batch_.push_back(rows_of(*b, axes_));
    return b;
  }
  size_t samples_in(size_t batches) const override {
    const size_t n = std::min(batches, rows_per_batch_.size());
    return std::accumulate(rows_per_batch_.begin(), rows_per_batch_.begin() + static_cast<std::ptrdiff_t>(n), size_t{0});
  }

 protected:
  // The next batch; nullopt or an empty batch when the data has ended.
  virtual std::optional<Feeds> next_batch() = 0;
  bool ended_ = false;
  std::vector<size_t> rows_per_batch_;
  runtime::BatchAxes axes_;  // of the model's inputs
};

class BatchGeneratorSource final : public SequentialSource {
 public:
  BatchGeneratorSource(BatchGenerator next, const std::vector<ir::ValueInfo>& inputs)
      : SequentialSource(inputs), next_(std::move(next)), inputs_(inputs) {}
  Feeds rows_after(size_t batches, size_t rows) override {
    if (ended_ || rows == 0 || batches != rows_per_batch_.size()) return {};
    std::optional<Feeds> b = next_();
    if (!b) return {};
    return leading_rows(name_inputs(std::move(*b), inputs_, "batch_generator"), rows, axes_);
  }
  std::string name() const override { return "the data_loader"; }

 private:
  std::optional<Feeds> next_batch() override {
    std::optional<Feeds> b = next_();
    if (!b) return std::nullopt;
    return name_inputs(std::move(*b), inputs_, "batch_generator");
  }
  BatchGenerator next_;
  std::vector<ir::ValueInfo> inputs_;
};

class SampleGeneratorSource final : public SequentialSource {
 public:
  SampleGeneratorSource(SampleGenerator next, size_t batch_size, const std::vector<ir::ValueInfo>& inputs)
      : SequentialSource(inputs), next_(std::move(next)), batch_size_(batch_size), inputs_(inputs) {
    for (const auto& in : inputs) ranks_[in.name] = !in.dims ? 0 : in.dims->empty() ? kScalarInput : in.dims->size();
  }
  Feeds rows_after(size_t batches, size_t rows) override {
    if (ended_ || batches != rows_per_batch_.size()) return {};
    std::vector<Feeds> samples = read_samples(rows);
    return samples.empty() ? Feeds{} : stack_samples(samples, ranks_, axes_);
  }
  std::string name() const override { return "sample_generator"; }

 private:
  std::optional<Feeds> next_batch() override {
    std::vector<Feeds> samples = read_samples(batch_size_);
    // A short batch is the last one: the generator has ended.
    if (samples.size() < batch_size_) ended_next_ = true;
    if (samples.empty()) return std::nullopt;
    return stack_samples(samples, ranks_, axes_);
  }
  std::vector<Feeds> read_samples(size_t count) {
    std::vector<Feeds> samples;
    if (ended_next_) {
      ended_ = true;
      return samples;
    }
    while (samples.size() < count) {
      std::optional<Feeds> s = next_();
      if (!s) {
        ended_next_ = true;
        break;
      }
      samples.push_back(name_inputs(std::move(*s), inputs_, "sample_generator"));
    }
    return samples;
  }
  SampleGenerator next_;
  size_t batch_size_;
  std::vector<ir::ValueInfo> inputs_;
  std::map<std::string, size_t> ranks_;
  bool ended_next_ = false;  // the generator has ended; the batch that saw it is the last
};

}  // namespace

Feeds leading_rows(const Feeds& batch, size_t count, const runtime::BatchAxes& axes) {
  int64_t rows = static_cast<int64_t>(count);
  for (const auto& [name, t] : batch)  // a scalar is the same for every row
    if (t.rank() >= 1) rows = std::min(rows, t.dim(runtime::batch_axis_of(axes, name)));
  return runtime::feed_rows(batch, 0, rows, axes);
}

std::unique_ptr<CalibrationSource> dataset_calibration_source(const data::Dataset& data, size_t batch_size,
                                                              const std::vector<ir::ValueInfo>& model_inputs) {
  return std::make_unique<DatasetSource>(data, batch_size, model_inputs);
}
std::unique_ptr<CalibrationSource> batch_generator_calibration_source(BatchGenerator next,
                                                                      const std::vector<ir::ValueInfo>& model_inputs) {
  return std::make_unique<BatchGeneratorSource>(std::move(next), model_inputs);
}
std::unique_ptr<CalibrationSource> sample_generator_calibration_source(SampleGenerator next, size_t batch_size,
                                                                       const std::vector<ir::ValueInfo>& model_inputs) {
  SQ_CHECK(batch_size > 0, ErrorKind::kInvalidArgument, "batch_size must be at least 1");
  return std::make_unique<SampleGeneratorSource>(std::move(next), batch_size, model_inputs);
}

CalibrationRun calibrate(PTQ& ptq, CalibrationSource& source, const CalibrationLoopOptions& o) {
  CalibrationRun run;
  const runtime::BatchAxes axes = runtime::input_batch_axes(ptq.float_graph().inputs);
  const std::string& checkpoint = o.checkpoint;
  if (!checkpoint.empty()) {
    // Distributed: rank 0 alone keeps the checkpoint (it holds the first batches, the others are
    // merged after them), and the others skip what it resumed.
    if (distributed::is_root() && ptq.load_calibration_state(checkpoint, o.data_identity))
      run.resumed_batches = ptq.samples_seen();
    run.resumed_batches = std::stoul(distributed::broadcast(std::to_string(run.resumed_batches)));
  }

  // The batches to observe: known in advance for a data set, until batch_nums or the end otherwise.
  const bool bounded = o.batch_nums || source.known_batches();
  size_t total = o.batch_nums.value_or(0);  // 0: until the source ends
  if (const std::optional<size_t> available = source.known_batches()) {
    SQ_CHECK(*available > 0, ErrorKind::kInvalidData, "calibration data set " + source.name() + " is empty");
    total = o.batch_nums.value_or(*available);
    if (total > *available) {
      run.warnings.push_back("batch_nums is " + std::to_string(total) + " but " + source.name() + " holds only " +
                             std::to_string(*available) + " batches (" + std::to_string(source.samples_in(*available)) +
                             " samples): calibrating on all of them");
      total = *available;
    }
  }
  SQ_CHECK(!bounded || run.resumed_batches <= total, ErrorKind::kInvalidData,
           "calibration checkpoint '" + checkpoint + "' holds more batches than this run asks for");

  // Distributed (random-access sources): each rank observes one contiguous block of the remaining
  // batches, and the observers are merged in rank order, which is batch order (the result is the
  // one-process one). A sequential source is read whole by each process.
  const bool sharded = source.random_access() && distributed::size() > 1;
  // Rows to hold back from data that ends with the calibrated batches (a data set used whole, a
  // generator read to its end): its last batch is observed only after the comparisons
  // (finish_calibration), so that they run on samples the observers have not seen, and the
  // calibration ends as it would have. A data set's last batch is known in advance; a generator's
  // is the one read before it ends, so its batches are observed one read late. A checkpoint of
  // such a run holds the batches before the last, so that its resumption defers the same batch.
  const bool known_last = source.known_batches() && total == *source.known_batches();
  const bool defer_last_of_known = o.held_back_rows && known_last && total >= 2 && run.resumed_batches < total;
  const bool read_ahead = o.held_back_rows && !source.known_batches();
  const size_t observed_total = defer_last_of_known ? total - 1 : total;
  size_t first = run.resumed_batches, last = bounded ? observed_total : SIZE_MAX;
  if (sharded) {
    const distributed::Range mine = distributed::block_of(observed_total - run.resumed_batches);
    first = run.resumed_batches + mine.begin;
    last = run.resumed_batches + mine.end;
  }

  const auto start = std::chrono::steady_clock::now();
  auto last_save = start;
  auto after_batch = [&](size_t done) {
    // A rank's own share is not a prefix of the batches: a sharded calibration is saved only once
    // merged (nothing to save here), and resumes from a one-process checkpoint.
    if (checkpoint.empty() || done == total || distributed::size() > 1) return;
    // At most about once a second: the state is small, but a model with hundreds of observed
    // tensors and tiny batches should not spend its time writing.
    const auto now = std::chrono::steady_clock::now();
    if (now - last_save < std::chrono::seconds(1)) return;
    ptq.save_calibration_state(checkpoint, o.data_identity);
    last_save = now;
  };

  // The samples a fresh run compares on come from the first batch, also when it was resumed.
  auto keep_first_rows = [&](const Feeds& b) {
    if (o.first_rows > 0 && run.first_rows.empty()) run.first_rows = leading_rows(b, o.first_rows, axes);
  };
  if (source.random_access()) {
    if (o.first_rows > 0) run.first_rows = source.rows_after(0, o.first_rows);
  } else {
    for (size_t i = 0; i < run.resumed_batches; ++i) {  // a generator replays from its start
      std::optional<Feeds> skipped = source.batch(i);
      SQ_CHECK(skipped.has_value(), ErrorKind::kInvalidData,
               source.name() + " ended before the " + std::to_string(run.resumed_batches) +
                   " batches the calibration checkpoint holds");
      keep_first_rows(*skipped);
    }
  }

  Progress progress(o.progress_label, bounded ? run.resumed_batches + (last - first) : 0, "batches");
  progress.advance(run.resumed_batches);
  auto observe = [&](const Feeds& b, size_t batches_done) {
    ptq.sample(b);
    run.samples += rows_of(b, axes);
    progress.advance();
    after_batch(batches_done);
  };
  std::optional<Feeds> unobserved;  // read_ahead: the batch read last, observed once another follows
  size_t done = first;
  bool ended = false;
  for (; done < last; ++done) {
    std::optional<Feeds> b = source.batch(done);
    if (!b) {
      ended = true;
      break;
    }
    keep_first_rows(*b);
    if (!read_ahead) {
      observe(*b, done + 1);
      continue;
    }
    if (unobserved) observe(*unobserved, done);
    unobserved = std::move(b);
  }
  if (unobserved) {
    // The generator's last batch when it ended and another batch was observed before it.
    if (ended && done >= 2) run.deferred_batch = std::move(unobserved);
    else observe(*unobserved, done);
  }
  progress.finish();
  SQ_CHECK(done > 0 || source.known_batches(), ErrorKind::kInvalidData, source.name() + " gave no calibration batches");
  if (sharded) {
    ptq.merge_calibration_across_ranks();
    run.samples = static_cast<size_t>(distributed::all_reduce_sum(static_cast<int64_t>(run.samples)));
  }
  if (defer_last_of_known) {
    run.deferred_batch = source.batch(total - 1);
    SQ_CHECK(run.deferred_batch.has_value(), ErrorKind::kInternal, source.name() + " lost its last batch");
  }
  const size_t calibrated_batches = sharded || defer_last_of_known ? total : done;
  if (o.batch_nums && calibrated_batches < *o.batch_nums && !source.known_batches())
    run.warnings.push_back("batch_nums is " + std::to_string(*o.batch_nums) + " but " + source.name() + " ended after " +
                           std::to_string(calibrated_batches) + " batches: calibrated on those");
  run.calibrated_samples = source.samples_in(calibrated_batches);
  // Held back: what the calibration did not reach, else the last batch, observed after them.
  const size_t held_rows = o.held_back_rows ? o.held_back_rows(run.calibrated_samples) : 0;
  if (held_rows > 0 && run.deferred_batch)
    run.held_back = leading_rows(*run.deferred_batch, held_rows, axes);
  else if (held_rows > 0 && (source.known_batches() || (o.batch_nums && calibrated_batches == *o.batch_nums)))
    run.held_back = source.rows_after(calibrated_batches, held_rows);
  run.batches = ptq.samples_seen();
  ptq.release_calibration_buffers();
  run.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
  // The finished calibration is kept: a later step that fails resumes from it.
  if (!checkpoint.empty() && distributed::size() == 1 && run.batches > run.resumed_batches)
    ptq.save_calibration_state(checkpoint, o.data_identity);
  return run;
}

void finish_calibration(PTQ& ptq, CalibrationRun& run) {
  if (!run.deferred_batch) return;
  // Not saved to the checkpoint: a resumed run defers the same batch again (see calibrate).
  ptq.sample(*run.deferred_batch);
  run.samples += rows_of(*run.deferred_batch, runtime::input_batch_axes(ptq.float_graph().inputs));
  run.batches = ptq.samples_seen();
  run.deferred_batch.reset();
  ptq.release_calibration_buffers();
}

}  // namespace slimquant::quant
