#pragma once
// Batching over a Dataset: consecutive samples stacked into one [n, ...sample_shape] float32
// tensor (the last batch may be smaller). Samples of a batch are loaded in parallel (OpenMP), which
// is what makes image decoding keep up with inference.
#include <cstddef>
#include <cstdint>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#include "slimquant/core/tensor.h"
#include "slimquant/data/dataset.h"

namespace slimquant::data {

struct Batch {
  Tensor inputs;                // [n, ...sample_shape], float32
  Tensor typed_inputs;          // the same as the data set's sample_dtype() when it is not float32
  std::vector<int64_t> labels;  // n labels, or empty when the data set has none
  std::vector<std::string> texts;  // n text labels, or empty when the data set has none
  size_t first_index = 0;       // data set index of inputs[0]
  // The data set's side inputs by model input name, each its sample_shape with n inserted at its
  // batch_axis ([n, ...] for most, [layers, n, hidden] for a recurrent state).
  std::map<std::string, Tensor> side_inputs;
  size_t size() const { return inputs.defined() ? static_cast<size_t>(inputs.dim(0)) : 0; }
  // Everything a model run needs: the samples as `main_input` (data::main_input_name), of the data
  // set's sample_dtype(), plus the side inputs.
  std::map<std::string, Tensor> feeds(const std::string& main_input) const;
};

class BatchLoader {
 public:
  // The data set must outlive the loader. batch_size must be >= 1 (kInvalidArgument otherwise).
  BatchLoader(const Dataset& dataset, size_t batch_size);

  size_t batch_size() const { return batch_size_; }
  size_t num_batches() const;
  const Dataset& dataset() const { return dataset_; }

  // Random access: batch i covers samples [i*batch_size, min((i+1)*batch_size, size)).
  Batch batch(size_t i) const;
  // Samples [first, first+count) of the data set as one batch.
  Batch load_range(size_t first, size_t count) const;

  // Sequential use: `while (loader.next(b)) ...`; reset() starts over.
  bool next(Batch& out);
  void reset() { next_ = 0; }

  // Range-for: `for (const Batch& b : loader)`; each batch is loaded when the iterator advances.
  class iterator {
   public:
    using iterator_category = std::input_iterator_tag;
    using value_type = Batch;
    using difference_type = std::ptrdiff_t;
    using pointer = const Batch*;
    using reference = const Batch&;

    iterator() = default;
    const Batch& operator*() const { return current_; }
    const Batch* operator->() const { return &current_; }
    iterator& operator++();
    bool operator==(const iterator& o) const { return index_ == o.index_; }

   private:
    friend class BatchLoader;
    iterator(const BatchLoader* loader, size_t index);
    const BatchLoader* loader_ = nullptr;
    size_t index_ = 0;
    Batch current_;
  };
  iterator begin() const { return iterator(this, 0); }
  iterator end() const { return iterator(nullptr, num_batches()); }

 private:
  const Dataset& dataset_;
  size_t batch_size_;
  size_t next_ = 0;
};

}  // namespace slimquant::data
