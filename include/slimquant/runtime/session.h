#pragma once
// Session: a graph prepared for execution. Each distinct set of input shapes gets its own compiled
// plan (shapes bound, Shape chains folded, activations fused, kernels created with their weights
// prepacked), cached inside the Session, so a new batch size needs no new Session.
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "slimquant/ir/graph.h"
#include "slimquant/runtime/optimize.h"  // check_supported

namespace slimquant::runtime {

// Intermediate buffers that outlive a run, so that the next run reuses them.
class BufferPool;
// A pool for several sessions that never run at the same time (e.g. the per-layer sessions of a
// sensitivity analysis): they then hold the memory of one run between them, not one each.
std::shared_ptr<BufferPool> make_shared_buffer_pool();
// Gives the buffers of `pool` that nobody holds back to the allocator, whose large-buffer cache
// (core/tensor.h) still reuses them for any session's requests of about the same size, and maps
// no new memory while it holds freed buffers of other sizes. For a pool shared by runs that take
// turns (the layer sweep, between the paused base run and the layers' runs): the pool itself
// reuses a buffer only for a request of at most its size, so one run's idle buffers of sizes the
// other does not ask for would stay mapped under it.
void release_idle_buffers(BufferPool& pool);
// Gives back the calling thread's kernel scratch buffers (layout conversions, oneDNN scratchpads),
// which otherwise stay at their largest size for the next run. Between two runs, or in a value hook
// before other sessions run (their kernels then grow their own); the next kernel allocates again.
void release_scratch_buffers();

// Where the samples of a batch lie in each tensor: the axis of its batch, 0 for [batch, ...], 1 for
// a recurrent state [layers, batch, hidden]. A name not in the map has its batch first.
using BatchAxes = std::map<std::string, size_t>;

// Whether a model computes each sample of a batch on its own, so that a batch may run in parts and
// the parts' outputs be joined: proved node by node on the ONNX ops (sample_independence.cpp).
// Every value is either static (initializers, constants, shape arithmetic that does not depend on
// the batch size) or carries the batch along one axis, slice i depending on sample i alone;
// anything else (an op over the batch axis, a reshape merging it with another, an op the proof
// does not know) answers "no" and names the node. input_axes: the inputs' batch axes
// (input_batch_axes); scalar inputs are the same for every sample.
struct SampleIndependence {
  bool independent = false;
  std::string reason;     // when not independent: which node, and why
  BatchAxes output_axes;  // when independent: each output's batch axis (absent: 0)
};
SampleIndependence analyze_sample_independence(const ir::Graph& graph, const BatchAxes& input_axes);
// The same proof's by-product: values computed by nodes (shape arithmetic: sizes, Reshape targets,
// Slice bounds) that it knows element by element and that do not depend on the batch size, as
// int64 / int32 tensors. fold_batch_invariant_sizes (optimize.h) makes them constants where ONNX's
// shape inference lost the sizes (a dynamic batch through a Reshape), so that what reads them can
// be specialised.
std::map<std::string, Tensor> batch_invariant_sizes(const ir::Graph& graph, const BatchAxes& input_axes);

struct SessionOptions {
  // Fold constants, BatchNorm into Conv, drop Identity/Dropout at construction.
  bool optimize = true;
  // Fuse activations into Conv/Gemm in compiled plans, and (execution-only) a residual Add [+ Relu
  // | Clip] into the Conv/QConv producing one operand, MatMul + bias Add [+ erf GELU] into one
  // MatMul, other erf GELU chains into one pass. Fused-away intermediates are not seen by hooks
  // (requested outputs and fed values are never fused away); turn off when every intermediate
  // value must be observable (calibration).
  bool fuse_activations = true;
  // Let consecutive oneDNN convolutions exchange activations in the blocked layout they compute in
  // (reordering only where a plain reader needs them). Results equal the plain path's up to float
  // rounding; hooks and returned outputs are always plain. Off: every value plain (reference).
  bool blocked_layouts = true;
  // In blocked plans without hooks or observed values, a float32 map whose every reader quantizes
  // what it computes from it may be held in half precision where it is larger than half the core's
  // L2: the direct depthwise QConv's output into a squeeze-excitation's gate Mul (half the bytes
  // through L3; 2^-11 relative, where the gate's quantization step is 2^-8 of its range, so a code
  // moves by one at most, at a rounding boundary). Off: every float value float32.
  bool float16_storage = true;
  // Float 3x3 stride-1 convolutions wide enough to gain (ConvKernel: at least 64 output and 32
  // input channels, outputs of 8x8 or more) run on oneDNN's Winograd convolution where it has one
  // (AVX-512: F(2x2, 3x3) or F(4x4, 3x3), 2.25x or 4x fewer multiplies): ResNet-18's 56x56 and
  // 28x28 layers 1.4-1.6x faster.
  // Results differ from the direct kernel's by float rounding (relative 1e-6 on ResNet-18's
  // logits). Off: every convolution direct (oneDNN's default algorithm).
  bool winograd = true;
  int num_threads = 0;  // 0 = leave OpenMP's default
  size_t max_cached_plans = 8;
  // Feeds sharing a leading dimension are a batch of samples: run in parts when the model declares
  // a smaller batch or fails at this one (Session::run). Off where the leading dimension is not a
  // batch (the bodies of If / Loop / Scan), so a shape error stays an error.
  bool split_batches = true;
  // A batch of a model that computes each sample on its own (Session::samples_independent) runs in
  // parts of this many samples; 0: as many as keep one part's live values within a core's cache,
  // from one sample's measured peak, or more to amortize large weights, the smaller size timed
  // against the larger over a feed shape's first runs (PartChoice). Off with split_batches.
  int64_t samples_per_part = 0;
  // The proof, when the caller made it on the graph this one was rewritten from with ops the proof
  // does not know (lower_to_int8's QConv and QMatMul compute per sample as the QDQ ops they replace).
  std::optional<SampleIndependence> sample_independence;
  // null: the session's own pool. Sessions sharing one must not run concurrently.
  std::shared_ptr<BufferPool> buffer_pool;
};

// Called for every value a run produces or receives (graph inputs, intermediates, outputs). The
// tensor is only valid during the call: clone() it to keep it.
using ValueHook = std::function<void(const std::string& name, const Tensor& value)>;

struct RunOptions {
  // Values to return; empty = the graph outputs. Any intermediate value name may be requested.
  std::vector<std::string> outputs;
  ValueHook on_value;
  // Values on_value must see (never fused away, computed even when no output needs them) without
  // being returned: unlike outputs they are released after their last reader, so observing many
  // values costs no memory or allocations (calibration).
  std::vector<std::string> observe;
  // on_value may receive a value held in a blocked layout as is (no plain copy): the same shape
  // and dtype, but each slice along axis 0 (each sample) holds that sample's elements in another
  // order. Only for observers that depend on each sample's multiset of values, such as every
  // calibration observer; values whose layout would mix samples or pad still arrive plain.
  bool observe_in_any_layout = false;
  // The observed values are stored in the plain layout, so that on_value is shown each value itself
  // rather than a plain copy of a blocked one. For a hook that keeps values after it returns (the
  // streamed layer sweep holds them for later runs): a copy would sit beside the blocked original
  // the run still holds, twice the memory. Costs the blocked layout's speed at those values, and
  // values can differ from the blocked plan's by float rounding (oneDNN sums a plain destination in
  // another order).
  bool observed_plain = false;
  // false: the caller reads what it needs through on_value (calibration) and run returns nothing
  // when it runs a batch in parts, so outputs that cannot be joined (see join_rows) do not fail it.
  bool outputs_needed = true;
};

// The batch axis of `name` in `axes`.
size_t batch_axis_of(const BatchAxes& axes, const std::string& name);

// The dimension that stands for the batch in a model's inputs: the first dimension of the first
// input whose first dimension is not fixed (symbolic or dynamic), else of the first input of rank
// >= 1 (a model of fixed batch); Dim{} (unknown) when no input has a dimension.
ir::Dim batch_dimension(const std::vector<ir::ValueInfo>& inputs);
// The axis of `value` that carries the batch, when its declared shape shows it: the one axis
// named like a symbolic `batch`; else the first axis when fixed at the size of a fixed `batch`;
// else, the first axis being fixed at another size (so not the batch: an LSTM state [2, batch,
// 128]), the one axis fixed at the batch's size, or with the batch dynamic the one axis not fixed.
// nullopt for a scalar, an unknown rank, a first axis not fixed (taken as the batch by convention,
// but not shown to be), or no such axis.
std::optional<size_t> declared_batch_axis(const ir::ValueInfo& value, const ir::Dim& batch);
// The batch axes of a model's inputs (declared_batch_axis from batch_dimension); the others have
// it first. Every stage that batches, splits or stacks feeds reads them from here.
BatchAxes input_batch_axes(const std::vector<ir::ValueInfo>& inputs);
// The samples in a batch of feeds: the batch dimension of its first tensor of rank >= 1 (scalars
// are the same for every sample); 0 when it has none.
int64_t batch_rows(const std::map<std::string, Tensor>& feeds, const BatchAxes& axes);

// Rows [first, first + count) along each feed's batch axis (each must have at least first +
// count); a scalar feed (rank 0) is the same for every row and kept as is.
std::map<std::string, Tensor> feed_rows(const std::map<std::string, Tensor>& feeds, int64_t first, int64_t count,
                                        const BatchAxes& axes = {});
// The inverse for outputs: the outputs of a batch of `batch` samples run in parts of `part` (the
// last may be smaller) as one batch, each joined along its batch axis. Run one sample at a time,
// an output without a batch axis (a detector's [300x4] boxes of its one image) is stacked along a
// new first axis, one row per sample. Throws kInvalidArgument naming the output when neither
// applies: parts of several samples, or an output whose shape differs from sample to sample.
std::map<std::string, Tensor> join_rows(const std::vector<std::map<std::string, Tensor>>& parts, int64_t batch,
                                        int64_t part, const BatchAxes& axes = {});


// The batch rules every stage that feeds samples in batches shares (Session::run, QAT's steps):
// The batch the fed graph inputs declare, when all that declare one agree on a fixed value; else 0.
int64_t declared_batch(const ir::Graph& graph, const std::map<std::string, Tensor>& feeds);
// Whether a run's error is one a smaller batch may not meet (a kernel or a plan refusing the shape).
bool is_shape_error(const Error& e);
// The one line on stderr that says a stage splits batches: "slimquant: the model takes at most N
// samples per run (why): larger batches are run in parts of N" and `then` after a comma when given;
// once per process for the same text.
void print_batch_limit(int64_t limit, const std::string& why, const std::string& then = {});

class Plan;

// How a session cuts a batch of a model that computes each sample on its own, for one sample's feed
// shapes: the rule's part size (live values within a core's cache, weights amortized), and while a
// smaller one competes (the live values' size alone, where the weights rule raised it), which of
// the two each run takes. They alternate over six runs, each first untimed (its plans are made
// then), then timed twice; the smaller replaces the rule's only when its fastest run per sample is
// clearly faster, since single runs on a shared machine vary by a few percent.
struct PartChoice {
  int64_t part = 0;       // in use (past the batch: whole)
  int64_t candidate = 0;  // a smaller size timed against it (0: chosen)
  int runs = 0;           // runs while choosing
  double part_seconds = 0, candidate_seconds = 0;  // fastest timed run of each, per sample

  static constexpr int kChoosingRuns = 6;
  static constexpr double kClearlyFaster = 0.97;
  // Whether a run of `batch` samples is timed: two sizes compete and differ at this batch.
  bool choosing(int64_t batch) const;
  // The samples a part of the next run of `batch` takes (`batch`: whole).
  int64_t next(int64_t batch) const;
  // The run `next` was asked for took `seconds`.
  void note(int64_t batch, double seconds);
  // Whether the choice has started timing and has not decided yet.
  bool settling() const { return candidate != 0 && runs > 0; }
};

class Session {
 public:
  explicit Session(ir::Graph graph, SessionOptions options = {});
  ~Session();
  Session(Session&&) noexcept;
  Session& operator=(Session&&) noexcept;

  // feeds: graph inputs by name. Feeds may also name intermediate values: then only the part of the
  // graph downstream of them that the requested outputs need is executed (prefix reuse for
  // analysis); every other value that part reads must be fed too.
  // A batch larger than the model takes is run in parts, their outputs joined (join_rows): when its
  // inputs declare a fixed batch B (N a multiple of B), or when it fails at batch N with a shape
  // error and runs one sample at a time (a batch of 1 baked into the graph by an exporter, behind
  // a declared dynamic batch). A line on stderr says so, once per session.
  std::map<std::string, Tensor> run(const std::map<std::string, Tensor>& feeds, const RunOptions& options = {});
  // Convenience for single-input, single-output models.
  Tensor run_single(const Tensor& input);

  const ir::Graph& graph() const { return graph_; }  // after construction-time optimisation
  const std::vector<ir::ValueInfo>& inputs() const { return graph_.inputs; }
  std::vector<std::string> input_names() const;
  const std::vector<ir::ValueInfo>& outputs() const { return graph_.outputs; }
  const SessionOptions& options() const { return options_; }
  size_t cached_plan_count() const { return plans_.size(); }
  // Drops the compiled plans and the buffers they hold (the memory goes back to the system); the
  // next run compiles again. For a session whose work is done but which must stay alive.
  void release_plans();
  // The most samples one run of the model takes (see run), or 0 while none is known.
  int64_t batch_limit() const { return batch_limit_; }
  // Whether the model provably computes each sample on its own (proved op by op on the model as
  // loaded), so that run() may take a large batch in parts of a few samples, whose activations stay
  // in cache; when not, samples_dependence() names the node that mixes them (or that the proof does
  // not know).
  bool samples_independent() const { return samples_independent_; }
  const std::string& samples_dependence() const { return samples_dependence_; }
  // Whether run(feeds) is known to take the batch whole, in one pass of a plan, so that a hook sees
  // every value once: a batch of one sample, or a size run whole before and within any limit
  // learned since. false also while it is not known (a size not run yet).
  bool runs_whole(const std::map<std::string, Tensor>& feeds) const;
  // Whether the session is still timing part sizes for a batch it was given (PartChoice): runs
  // until then may take sizes it will not keep. A benchmark warms up until this is false.
  bool choosing_part_size() const;

 private:
  // pool: the buffer pool to run with instead of the plan's (a probe measuring its peak).
  std::map<std::string, Tensor> run_whole(const std::map<std::string, Tensor>& feeds, const RunOptions& options,
                                          BufferPool* pool = nullptr);
  std::map<std::string, Tensor> run_in_parts(const std::map<std::string, Tensor>& feeds, const RunOptions& options,
                                             int64_t batch, int64_t part);
  std::vector<std::map<std::string, Tensor>> run_parts(const std::map<std::string, Tensor>& feeds,
                                                       const RunOptions& options, int64_t batch, int64_t part);
  // The parts' outputs as one batch, each output joined along its batch axis.
  std::map<std::string, Tensor> join_parts(const std::vector<std::map<std::string, Tensor>>& parts,
                                           const std::map<std::string, Tensor>& feeds, int64_t batch, int64_t part) const;
  // The feeds' shared batch when the session may split it (split_batches), else -1.
  int64_t splittable_batch(const std::map<std::string, Tensor>& feeds) const;
  // Whether the model takes a batch of `batch` (tried once per size, without hooks).
  bool takes_batch(const std::map<std::string, Tensor>& feeds, const RunOptions& options, int64_t batch);
  void limit_batch(int64_t limit, const std::string& why);
  // The samples a run takes for speed (see samples_independent) and, while two sizes compete, the
  // choice to note the run's time in (else null).
  std::pair<int64_t, PartChoice*> speed_part(const std::map<std::string, Tensor>& feeds, const RunOptions& options,
                                             int64_t batch);
  // A batch in parts of `part` samples, each part's outputs copied into the whole batch's.
  std::map<std::string, Tensor> run_speed_parts(const std::map<std::string, Tensor>& feeds, const RunOptions& options,
                                                int64_t batch, int64_t part);
  int64_t batch_limit_ = 0;
  bool samples_independent_ = false;
  std::string samples_dependence_;
  BatchAxes sample_output_axes_;               // each output's batch axis, when samples_independent_
  std::map<std::string, PartChoice> speed_parts_;  // by the shapes of one sample's feeds
  std::set<int64_t> batches_taken_;
  ir::Graph graph_;
  BatchAxes input_axes_;  // of graph_'s inputs (input_batch_axes)
  SessionOptions options_;
  struct PlanEntry;
  std::vector<std::unique_ptr<PlanEntry>> plans_;  // most recently used last
};

}  // namespace slimquant::runtime
