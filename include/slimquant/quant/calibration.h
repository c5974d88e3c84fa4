#pragma once
// The one calibration loop, for every caller: PostTrainingQuantization (and through it the CLI's
// `quantize` and the Python API), the CLI's `analyze` and QAT's initial ranges. It feeds batches
// from any source to PTQ::sample, with progress, resumption from a checkpoint and atomic saves of
// the observers while it runs, sharding across MPI ranks where the source allows it, and keeps the
// rows that the comparisons after calibration need (the first samples; samples held back after the
// calibrated ones).
#include <cstddef>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "slimquant/data/dataset.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/runtime/session.h"

namespace slimquant::quant {

using Feeds = std::map<std::string, Tensor>;

// One calibration sample per call (graph inputs by name, without the batch dimension, or with a
// batch dimension of 1); std::nullopt ends the data. The source documents' `sample_generator`.
// Samples are stacked along each input's batch axis (runtime::input_batch_axes: the first, or the
// batch axis a recurrent state [layers, batch, hidden] declares).
using SampleGenerator = std::function<std::optional<Feeds>()>;
// One calibration batch per call (graph inputs by name, each with the batch dimension on its batch
// axis, the first but for such states; the batches may differ in size); std::nullopt ends the
// data. The source documents' `data_loader` / `batch_generator`: batch_size does not apply,
// batch_nums counts these batches.
using BatchGenerator = std::function<std::optional<Feeds>()>;
// In a sample or batch of either generator, the name "" stands for the model's only input (the
// Python package's bare arrays); with several inputs every one must be named.

// Where calibration batches come from.
class CalibrationSource {
 public:
  virtual ~CalibrationSource() = default;
  // Batches the source holds, when known before reading (data sets); nullopt for generators,
  // which are read until they end.
  virtual std::optional<size_t> known_batches() const = 0;
  // Whether batch(i) may be asked in any order (and so be shared out between MPI ranks).
  virtual bool random_access() const = 0;
  // Batch i. A sequential source is asked for i = 0, 1, 2, ... in order and gives nullopt once it
  // has ended.
  virtual std::optional<Feeds> batch(size_t i) = 0;
  // Up to `rows` samples that follow the first `batches` batches (none when the data ends there).
  virtual Feeds rows_after(size_t batches, size_t rows) = 0;
  // The samples in the first `batches` batches.
  virtual size_t samples_in(size_t batches) const = 0;
  // How messages name the source: "'fmnist'", "the data_loader", "sample_generator".
  virtual std::string name() const = 0;
};

// Batches of `batch_size` samples of a data set, fed to the model input its samples are for
// (side inputs to theirs).
std::unique_ptr<CalibrationSource> dataset_calibration_source(const data::Dataset& data, size_t batch_size,
                                                              const std::vector<ir::ValueInfo>& model_inputs);
std::unique_ptr<CalibrationSource> batch_generator_calibration_source(BatchGenerator next,
                                                                      const std::vector<ir::ValueInfo>& model_inputs);
// Samples stacked into batches of `batch_size`.
std::unique_ptr<CalibrationSource> sample_generator_calibration_source(SampleGenerator next, size_t batch_size,
                                                                       const std::vector<ir::ValueInfo>& model_inputs);

struct CalibrationLoopOptions {
  std::optional<size_t> batch_nums;  // unset: every batch the source has
  // Resumes from this file when it holds a calibration of the same data, and saves the observers
  // there (atomically, at most about once a second, and at the end). Empty: no checkpoint.
  std::string checkpoint;
  std::string data_identity;  // what a resumed calibration must see again (PTQ::load_calibration_state)
  size_t first_rows = 0;      // leading rows of the first batch to keep (CalibrationRun::first_rows)
  // Rows to hold back after the calibrated ones, as a function of the samples calibrated on (0 or
  // unset: none).
  std::function<size_t(size_t calibrated_samples)> held_back_rows;
  std::string progress_label = "calibrate";
};

struct CalibrationRun {
  size_t batches = 0;             // batches observed in total, resumed ones included
  size_t samples = 0;             // samples observed in this run
  size_t resumed_batches = 0;     // batches taken from the checkpoint instead of being run again
  size_t calibrated_samples = 0;  // samples calibrated on, resumed and deferred ones included
  double seconds = 0;             // wall time of this run's calibration
  Feeds first_rows;               // the leading rows of the first batch (options.first_rows of them)
  // Samples the observers have not seen: those after the calibrated ones when the data has them,
  // else (held_back_rows set, data ending with the calibrated batches, two batches or more) the
  // leading rows of the last batch, which is then deferred_batch.
  Feeds held_back;
  // The last batch, not observed yet: finish_calibration observes it, after the comparisons that
  // run on held_back. run.batches and run.samples count it only then.
  std::optional<Feeds> deferred_batch;
  std::vector<std::string> warnings;
};

// Calibrates `ptq` (quantize() done) on the source. Throws kInvalidData when the source gives no
// batch, or when the checkpoint holds more batches than this run asks for.
CalibrationRun calibrate(PTQ& ptq, CalibrationSource& source, const CalibrationLoopOptions& options);

// Observes the batch calibrate() deferred (none: nothing to do). Call it after the comparisons on
// run.held_back and before anything that needs the final ranges.
void finish_calibration(PTQ& ptq, CalibrationRun& run);

// The first `count` rows (along each tensor's batch axis, runtime::input_batch_axes of the model's
// inputs) of every tensor of a batch (a scalar as it is).
Feeds leading_rows(const Feeds& batch, size_t count, const runtime::BatchAxes& axes);

}  // namespace slimquant::quant
