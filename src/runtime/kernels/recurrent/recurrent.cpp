// Recurrent layers: RNN, GRU and LSTM (ONNX opsets 7 to 14, forward inference, float32).
//
// Shapes as in the ONNX spec, with hidden size H and `dirs` = 2 for bidirectional, else 1:
//   X [seq, batch, input]          W [dirs, gates*H, input]   R [dirs, gates*H, H]
//   B [dirs, 2*gates*H] (W's bias, then R's)                  sequence_lens [batch] (int32)
//   initial_h, initial_c, Y_h, Y_c [dirs, batch, H]           P [dirs, 3*H] (LSTM peepholes)
//   Y [seq, dirs, batch, H]
// layout = 1 (opset 14) puts batch first: X [batch, seq, input], Y [batch, seq, dirs, H] and the
// states [batch, dirs, H]. Gate order inside W, R, B: RNN i; GRU z r h; LSTM i o f c; P: i o f.
//
//   RNN   H_t = f(X_t Wi^T + H_{t-1} Ri^T + Wbi + Rbi)
//   GRU   z = f(X_t Wz^T + H_{t-1} Rz^T + Wbz + Rbz)                     (r likewise)
//         h~ = g(X_t Wh^T + (r ⊙ H_{t-1}) Rh^T + Rbh + Wbh)             (linear_before_reset 0)
//         h~ = g(X_t Wh^T + r ⊙ (H_{t-1} Rh^T + Rbh) + Wbh)             (linear_before_reset 1)
//         H_t = (1 - z) ⊙ h~ + z ⊙ H_{t-1}
//   LSTM  i = f(X_t Wi^T + H_{t-1} Ri^T + Pi ⊙ C_{t-1} + Wbi + Rbi)     (f likewise with Pf;
//         c~ = g(X_t Wc^T + H_{t-1} Rc^T + Wbc + Rbc)                    input_forget 1: f = 1 - i)
//         C_t = f ⊙ C_{t-1} + i ⊙ c~
//         o = f(X_t Wo^T + H_{t-1} Ro^T + Po ⊙ C_t + Wbo + Rbo)
//         H_t = o ⊙ h(C_t)
// `clip` bounds the input of every gate activation to [-clip, clip]; C_t itself is not clipped.
//
// Computation: one GEMM projects the input of every time step for every direction at once
// (X [seq*batch, input] · W^T [input, dirs*gates*H]); each step then multiplies the hidden state
// by R^T with one GEMM (two for GRU with linear_before_reset = 0, whose candidate needs r first)
// and finishes the gates with vectorisable loops over rows of H: with the default functions (LSTM: no
// input_forget, no peepholes) two fused passes per row, otherwise a pass per gate and function.
//
// sequence_lens: batch entry b takes part in step t only while t < len[b]. Outside that range its
// state is left as it is and its Y rows are zero, so the forward pass keeps the state of the last
// valid step and the reverse pass starts from the initial state at step len[b] - 1. Y_h and Y_c
// are therefore simply the final states (a length of 0 leaves the initial state).
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <array>
#include <cctype>
#include <cmath>
#include <cstring>
#include <limits>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "runtime/kernels/elementwise/elementwise_math.h"
#include "runtime/kernels/register_all.h"

namespace slimquant::runtime {
namespace {

using ew::clamp_t;
using ew::select;

enum class Cell { kRnn, kGru, kLstm };

// Input and output slots (the same for the three ops up to the LSTM-only ones).
enum Input : size_t { kX = 0, kW, kR, kB, kSequenceLens, kInitialH, kInitialC, kPeepholes };
enum Output : size_t { kY = 0, kYh, kYc };

struct CellInfo {
  int gates;                                   // blocks of H rows in W and R
  std::vector<std::string> default_activations;  // one direction's activations: f[, g[, h]]
};

const CellInfo& cell_info(Cell cell) {
  static const CellInfo kRnn{1, {"Tanh"}};
  static const CellInfo kGru{3, {"Sigmoid", "Tanh"}};
  static const CellInfo kLstm{4, {"Sigmoid", "Tanh", "Tanh"}};
  switch (cell) {
    case Cell::kRnn: return kRnn;
    case Cell::kGru: return kGru;
    case Cell::kLstm: break;
  }
  return kLstm;
}

// ---- activation functions ----------------------------------------------------------------------

enum class ActKind {
  kRelu, kTanh, kSigmoid, kAffine, kLeakyRelu, kThresholdedRelu, kScaledTanh, kHardSigmoid, kElu,
  kSoftsign, kSoftplus
};

struct Activation {
  ActKind kind = ActKind::kTanh;
  float alpha = 0.f, beta = 0.f;
};

// The activation functions the ONNX recurrent ops name, with the defaults of the corresponding
// ONNX operators for the alpha / beta they take.
struct ActivationSpec {
  const char* name;
  ActKind kind;
  std::optional<float> alpha, beta;  // set when the function takes the parameter
};
constexpr float kNoParam = 0.f;
const std::array<ActivationSpec, 11> kActivationSpecs{{
    {"Relu", ActKind::kRelu, std::nullopt, std::nullopt},
    {"Tanh", ActKind::kTanh, std::nullopt, std::nullopt},
    {"Sigmoid", ActKind::kSigmoid, std::nullopt, std::nullopt},
    {"Affine", ActKind::kAffine, 1.f, 0.f},
    {"LeakyRelu", ActKind::kLeakyRelu, 0.01f, std::nullopt},
    {"ThresholdedRelu", ActKind::kThresholdedRelu, 1.f, std::nullopt},
    {"ScaledTanh", ActKind::kScaledTanh, 1.f, 1.f},
    {"HardSigmoid", ActKind::kHardSigmoid, 0.2f, 0.5f},
    {"Elu", ActKind::kElu, 1.f, std::nullopt},
    {"Softsign", ActKind::kSoftsign, std::nullopt, std::nullopt},
    {"Softplus", ActKind::kSoftplus, std::nullopt, std::nullopt},
}};

bool equals_ignoring_case(const std::string& a, const char* b) {
  const size_t n = std::strlen(b);
  if (a.size() != n) return false;
  for (size_t i = 0; i < n; ++i)
    if (std::tolower(static_cast<unsigned char>(a[i])) != std::tolower(static_cast<unsigned char>(b[i]))) return false;
  return true;
}

// x[0, n) = act(clip(x)). The switch sits outside the loops so that each loop vectorises.
SQ_AVX2_CLONES void activate(const Activation& a, std::optional<float> clip, float* x, int64_t n) {
  if (clip) {
    const float c = *clip;
    for (int64_t i = 0; i < n; ++i) x[i] = clamp_t(x[i], -c, c);
  }
  const float alpha = a.alpha, beta = a.beta;
  switch (a.kind) {
    case ActKind::kRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = select(x[i] > 0.f, x[i], 0.f);
      return;
    case ActKind::kTanh:
      for (int64_t i = 0; i < n; ++i) x[i] = ew::tanh_t(x[i]);
      return;
    case ActKind::kSigmoid:
      for (int64_t i = 0; i < n; ++i) x[i] = ew::sigmoid_t(x[i]);
      return;
    case ActKind::kAffine:
      for (int64_t i = 0; i < n; ++i) x[i] = alpha * x[i] + beta;
      return;
    case ActKind::kLeakyRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = select(x[i] < 0.f, alpha * x[i], x[i]);
      return;
    case ActKind::kThresholdedRelu:
      for (int64_t i = 0; i < n; ++i) x[i] = select(x[i] > alpha, x[i], 0.f);
      return;
    case ActKind::kScaledTanh:
      for (int64_t i = 0; i < n; ++i) x[i] = alpha * ew::tanh_t(beta * x[i]);
      return;
    case ActKind::kHardSigmoid:
      for (int64_t i = 0; i < n; ++i) x[i] = clamp_t(alpha * x[i] + beta, 0.f, 1.f);
      return;
    case ActKind::kElu:
      for (int64_t i = 0; i < n; ++i) x[i] = select(x[i] < 0.f, alpha * (ew::exp_t(x[i]) - 1.f), x[i]);
      return;
    case ActKind::kSoftsign:
      for (int64_t i = 0; i < n; ++i) x[i] = x[i] / (1.f + std::fabs(x[i]));
      return;
    case ActKind::kSoftplus:
      // log(1 + e^x) = max(x, 0) + log1p(e^-|x|): no overflow for large x.
      for (int64_t i = 0; i < n; ++i) x[i] = std::max(x[i], 0.f) + std::log1p(std::exp(-std::fabs(x[i])));
      return;
  }
}

// ---- fused cells for the default activations ----------------------------------------------------

// tanh for the fused gates: x * P(x^2) / Q(x^2) on [-9, 9] (a rational fit made for this kernel:
// relative error at most 3.4e-7 in float over the range; |tanh(9)| rounds to 1), result clamped to
// [-1, 1]. No exp: about 17 vector operations, where ew::tanh_t's exp form and special cases cost
// several times that in a loop that applies five functions per element. NaN propagates (clamp_t).
SQ_ELEMENT_FN float gate_tanh(float x) {
  const float xc = clamp_t(x, -9.f, 9.f);
  const float z = xc * xc;
  float p = 1.3765338202631483e-08f;
  p = p * z + 2.091183341690339e-05f;
  p = p * z + 0.0035142770502716303f;
  p = p * z + 0.13396863639354706f;
  p = p * z + 1.f;
  float q = 7.946500204525364e-07f;
  q = q * z + 0.00033159906161017716f;
  q = q * z + 0.02594839595258236f;
  q = q * z + 0.4673018753528595f;
  q = q * z + 1.f;
  return clamp_t(xc * p / q, -1.f, 1.f);
}
// sigmoid(x) = (1 + tanh(x / 2)) / 2: absolute error at most 1.7e-7 (what a gate needs; for x < -16
// the result is 0 rather than the tiny positive value).
SQ_ELEMENT_FN float gate_sigmoid(float x) { return 0.5f + 0.5f * gate_tanh(0.5f * x); }

// One batch row of an LSTM step with the default functions (f = sigmoid, g = h = tanh) and no
// peepholes. g holds H_{t-1} R^T (gate order i o f c) and becomes the gate values; xg is the input
// projection; clip is +inf when absent. Two passes, each of independent elements with one function
// deep: one pass doing all five functions per element ran at the latency of their chain (row_lstm
// 1.5x slower), and separate activate() passes per gate with ew's exp-based functions 2x slower.
// The pointers never alias (__restrict): without it GCC gives up on the runtime overlap checks
// these loops would need and runs them scalar.
SQ_AVX2_CLONES void lstm_default_row(float* __restrict g, const float* __restrict xg, const float* __restrict bias,
                                     float clip, float* __restrict c, float* __restrict h, int64_t H) {
  for (int64_t j = 0; j < 3 * H; ++j) g[j] = gate_sigmoid(clamp_t(g[j] + xg[j] + bias[j], -clip, clip));
  for (int64_t j = 3 * H; j < 4 * H; ++j) g[j] = gate_tanh(clamp_t(g[j] + xg[j] + bias[j], -clip, clip));
  const float *in = g, *out = g + H, *forget = g + 2 * H, *cand = g + 3 * H;
  for (int64_t j = 0; j < H; ++j) {
    const float c_new = forget[j] * c[j] + in[j] * cand[j];
    c[j] = c_new;
    h[j] = out[j] * gate_tanh(c_new);
  }
}

// GRU with the default functions (f = sigmoid, g = tanh), linear_before_reset = 1, after the single
// GEMM: g holds H_{t-1} R^T (z r h); bias: Wb + Rb for z and r, Wbh for h; rbh: Rbh.
SQ_AVX2_CLONES void gru_lbr_default_row(float* __restrict g, const float* __restrict xg, const float* __restrict bias,
                                        const float* __restrict rbh, float clip, float* __restrict h, int64_t H) {
  for (int64_t j = 0; j < 2 * H; ++j) g[j] = gate_sigmoid(clamp_t(g[j] + xg[j] + bias[j], -clip, clip));
  const float *update = g, *reset = g + H, *rec_h = g + 2 * H, *x_h = xg + 2 * H, *b_h = bias + 2 * H;
  for (int64_t j = 0; j < H; ++j) {
    const float cand = gate_tanh(clamp_t(x_h[j] + b_h[j] + reset[j] * (rec_h[j] + rbh[j]), -clip, clip));
    h[j] = (1.f - update[j]) * cand + update[j] * h[j];
  }
}

// GRU with the default functions, linear_before_reset = 0, first half: z and r in place in g (the
// first 2H values), and r ⊙ H_{t-1} into reset_h for the candidate's GEMM.
SQ_AVX2_CLONES void gru_gates_default_row(float* __restrict g, const float* __restrict xg,
                                          const float* __restrict bias, float clip, const float* __restrict h,
                                          float* __restrict reset_h, int64_t H) {
  for (int64_t j = 0; j < 2 * H; ++j) g[j] = gate_sigmoid(clamp_t(g[j] + xg[j] + bias[j], -clip, clip));
  for (int64_t j = 0; j < H; ++j) reset_h[j] = g[H + j] * h[j];
}

// Second half: the candidate from (r ⊙ H_{t-1}) Rh^T in g[2H, 3H), then H_t.
SQ_AVX2_CLONES void gru_update_default_row(const float* __restrict g, const float* __restrict xg,
                                           const float* __restrict bias, float clip, float* __restrict h, int64_t H) {
  for (int64_t j = 0; j < H; ++j) {
    const float update = g[j];
    const float cand = gate_tanh(clamp_t(g[2 * H + j] + xg[2 * H + j] + bias[2 * H + j], -clip, clip));
    h[j] = (1.f - update) * cand + update * h[j];
  }
}

// ---- attributes --------------------------------------------------------------------------------

enum class Direction { kForward, kReverse, kBidirectional };

struct RecurrentAttrs {
  Direction direction = Direction::kForward;
  int64_t num_directions = 1;
  std::optional<int64_t> hidden_size;  // absent: taken from R
  // Per direction, one entry per function the cell applies (f; f, g; f, g, h).
  std::vector<std::vector<Activation>> activations;
  std::optional<float> clip;
  bool batch_first = false;          // layout = 1
  bool input_forget = false;         // LSTM
  bool linear_before_reset = false;  // GRU
  // Every direction uses the cell's default functions (and LSTM's input_forget is off): the steps
  // take the fused rows above (an LSTM only without peepholes).
  bool default_functions = false;
  float clip_or_inf() const { return clip.value_or(std::numeric_limits<float>::infinity()); }
};

// Activations named by the node (or the cell's defaults), with their alpha / beta. The alpha and
// beta lists are consumed in order by the functions that take the parameter (what ONNX Runtime
// does); functions past the end of a list get their ONNX default.
std::vector<std::vector<Activation>> parse_activations(const ir::Node& node, Cell cell, int64_t num_directions) {
  const std::vector<std::string>& defaults = cell_info(cell).default_activations;
  const size_t per_direction = defaults.size();
  std::vector<std::string> names;
  if (auto it = node.attrs.find("activations"); it != node.attrs.end()) {
    const auto* list = std::get_if<std::vector<std::string>>(&it->second);
    SQ_CHECK(list != nullptr, ErrorKind::kInvalidModel,
             node.describe() + ": attribute 'activations' must be a list of strings");
    names = *list;
  } else {
    for (int64_t d = 0; d < num_directions; ++d) names.insert(names.end(), defaults.begin(), defaults.end());
  }
  // A bidirectional node may name one direction's functions only; both directions then use them.
  const bool shared = num_directions == 2 && names.size() == per_direction;
  SQ_CHECK(shared || names.size() == per_direction * static_cast<size_t>(num_directions), ErrorKind::kInvalidModel,
           node.describe() + ": expects " + std::to_string(per_direction * num_directions) +
               " activations (" + std::to_string(per_direction) + " per direction), got " +
               std::to_string(names.size()));

  const std::vector<float> alphas = node.attr_floats("activation_alpha");
  const std::vector<float> betas = node.attr_floats("activation_beta");
  size_t next_alpha = 0, next_beta = 0;
  std::vector<Activation> parsed;
  for (const std::string& name : names) {
    const auto spec = std::find_if(kActivationSpecs.begin(), kActivationSpecs.end(),
                                   [&](const ActivationSpec& s) { return equals_ignoring_case(name, s.name); });
    SQ_CHECK(spec != kActivationSpecs.end(), ErrorKind::kUnsupported,
             node.describe() + ": activation '" + name +
                 "' is not one of the ONNX recurrent activations (Relu, Tanh, Sigmoid, Affine, LeakyRelu, "
                 "ThresholdedRelu, ScaledTanh, HardSigmoid, Elu, Softsign, Softplus)");
    Activation a{spec->kind, kNoParam, kNoParam};
    if (spec->alpha) a.alpha = next_alpha < alphas.size() ? alphas[next_alpha++] : *spec->alpha;
    if (spec->beta) a.beta = next_beta < betas.size() ? betas[next_beta++] : *spec->beta;
    parsed.push_back(a);
  }
  std::vector<std::vector<Activation>> out;
  for (int64_t d = 0; d < num_directions; ++d) {
    const size_t first = shared ? 0 : static_cast<size_t>(d) * per_direction;
    out.emplace_back(parsed.begin() + static_cast<std::ptrdiff_t>(first),
                     parsed.begin() + static_cast<std::ptrdiff_t>(first + per_direction));
  }
  return out;
}

RecurrentAttrs parse_attrs(const ir::Node& node, Cell cell) {
  RecurrentAttrs a;
  const std::string direction = node.attr_string("direction", "forward");
  if (direction == "forward") a.direction = Direction::kForward;
  else if (direction == "reverse") a.direction = Direction::kReverse;
  else if (direction == "bidirectional") a.direction = Direction::kBidirectional;
  else fail(ErrorKind::kInvalidModel, node.describe() + ": direction '" + direction +
                                          "' is not one of forward, reverse, bidirectional");
  a.num_directions = a.direction == Direction::kBidirectional ? 2 : 1;

  if (node.has_attr("hidden_size")) {
    a.hidden_size = node.attr_int("hidden_size", 0);
    SQ_CHECK(*a.hidden_size > 0, ErrorKind::kInvalidModel,
             node.describe() + ": hidden_size must be positive (got " + std::to_string(*a.hidden_size) + ")");
  }
  const int64_t layout = node.attr_int("layout", 0);
  SQ_CHECK(layout == 0 || layout == 1, ErrorKind::kInvalidModel,
           node.describe() + ": layout must be 0 or 1 (got " + std::to_string(layout) + ")");
  a.batch_first = layout == 1;
  if (node.has_attr("clip")) {
    a.clip = node.attr_float("clip", 0.f);
    SQ_CHECK(*a.clip >= 0.f, ErrorKind::kInvalidModel,
             node.describe() + ": clip must not be negative (got " + std::to_string(*a.clip) + ")");
  }
  a.input_forget = cell == Cell::kLstm && node.attr_int("input_forget", 0) != 0;
  a.linear_before_reset = cell == Cell::kGru && node.attr_int("linear_before_reset", 0) != 0;
  a.activations = parse_activations(node, cell, a.num_directions);
  a.default_functions = cell != Cell::kRnn && !a.input_forget;
  for (const std::vector<Activation>& dir : a.activations)
    for (size_t k = 0; k < dir.size(); ++k)
      a.default_functions = a.default_functions && dir[k].kind == (k == 0 ? ActKind::kSigmoid : ActKind::kTanh);
  return a;
}

// ---- GEMM --------------------------------------------------------------------------------------

// C [m, n] (row stride ldc) = A [m, k] (row stride lda) · op(B): B^T with B stored as [n, k] (the
// layout of W as stored, which needs no reordering), or B stored as [k, n] (R^T, see below); row
// stride ldb either way.
enum class BLayout : char { kTransposed = 'T', kPlain = 'N' };
void gemm(BLayout b_layout, int64_t m, int64_t n, int64_t k, const float* a, int64_t lda, const float* b, int64_t ldb,
          float* c, int64_t ldc, const ir::Node& node) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    for (int64_t i = 0; i < m; ++i) std::fill_n(c + i * ldc, n, 0.f);
    return;
  }
  const dnnl_status_t st =
      dnnl_sgemm('N', static_cast<char>(b_layout), m, n, k, 1.f, a, lda, b, ldb, 0.f, c, ldc);
  SQ_CHECK(st == dnnl_success, ErrorKind::kInternal,
           node.describe() + ": oneDNN sgemm failed (status " + std::to_string(static_cast<int>(st)) + ")");
}

// R [dirs, gates*H, H] transposed per direction to [dirs, H, gates*H], the layout in which the
// per-step GEMMs run as A · B: oneDNN's sgemm of [batch, H] by [H, gates*H] took 26% less time at
// batch 1 and 4% less at batch 32 than A · B^T on R as stored (H = 128, LSTM, AMD Zen 3).
std::vector<float> transpose_recurrent_weights(const Tensor& r) {
  const int64_t dirs = r.dim(0), rows = r.dim(1), cols = r.dim(2);
  std::vector<float> out(static_cast<size_t>(r.numel()));
  const float* src = r.data<float>();
  for (int64_t d = 0; d < dirs; ++d)
    for (int64_t i = 0; i < rows; ++i)
      for (int64_t j = 0; j < cols; ++j)
        out[static_cast<size_t>((d * cols + j) * rows + i)] = src[(d * rows + i) * cols + j];
  return out;
}

// ---- the kernel --------------------------------------------------------------------------------

// Sizes of one run, read from the inputs.
struct Dims {
  int64_t seq = 0, batch = 0, input = 0, hidden = 0, dirs = 1, gates = 1;
  int64_t gate_width() const { return gates * hidden; }
};

class RecurrentKernel final : public Kernel {
 public:
  RecurrentKernel(const KernelInit& init, Cell cell)
      : node_(init.node), cell_(cell), attrs_(parse_attrs(init.node, cell)) {
    // A constant R is transposed once; run() checks its shape like any other.
    if (init.constant_input)
      if (const Tensor* r = init.constant_input(kR); r && r->dtype() == DType::kFloat32 && r->rank() == 3)
        constant_r_t_ = transpose_recurrent_weights(*r);
  }

  void run(KernelContext& ctx) override {
    const Dims d = check_inputs(ctx);
    const std::vector<int64_t> lengths = sequence_lengths(ctx, d);
    const float* x = ctx.input(kX).data<float>();
    const float* w = ctx.input(kW).data<float>();

    Tensor* y = requested(ctx, kY) ? &ctx.allocate_output(kY, DType::kFloat32, sequence_shape(d)) : nullptr;
    Tensor* y_h = requested(ctx, kYh) ? &ctx.allocate_output(kYh, DType::kFloat32, state_shape(d)) : nullptr;
    Tensor* y_c = cell_ == Cell::kLstm && requested(ctx, kYc)
                      ? &ctx.allocate_output(kYc, DType::kFloat32, state_shape(d))
                      : nullptr;

    // The input projection of all steps, batch entries and directions: row (t, b) holds
    // dirs * gates * H values, direction after direction. Rows follow X's order.
    const int64_t proj_width = d.dirs * d.gate_width();
    // (Not zero-filled: the GEMM writes every value.)
    const auto x_proj = std::make_unique_for_overwrite<float[]>(static_cast<size_t>(d.seq * d.batch * proj_width));
    gemm(BLayout::kTransposed, d.seq * d.batch, proj_width, d.input, x, d.input, w, d.input, x_proj.get(), proj_width,
         node_);

    std::vector<float> runtime_r_t;
    if (constant_r_t_.empty()) runtime_r_t = transpose_recurrent_weights(ctx.input(kR));
    const float* r_t = constant_r_t_.empty() ? runtime_r_t.data() : constant_r_t_.data();
    for (int64_t dir = 0; dir < d.dirs; ++dir)
      run_direction(ctx, d, dir, lengths, x_proj.get(), r_t + dir * d.hidden * d.gate_width(), y, y_h, y_c);
  }

 private:
  static bool requested(const KernelContext& ctx, size_t i) {
    const auto& names = ctx.node().outputs;
    return ctx.output_wanted(i) && i < names.size() && !names[i].empty();
  }

  Shape sequence_shape(const Dims& d) const {
    return attrs_.batch_first ? Shape{d.batch, d.seq, d.dirs, d.hidden} : Shape{d.seq, d.dirs, d.batch, d.hidden};
  }
  Shape state_shape(const Dims& d) const {
    return attrs_.batch_first ? Shape{d.batch, d.dirs, d.hidden} : Shape{d.dirs, d.batch, d.hidden};
  }
  // Element offsets of (direction, batch entry) in a state tensor, and of (t, direction, b) in Y.
  int64_t state_offset(const Dims& d, int64_t dir, int64_t b) const {
    return (attrs_.batch_first ? b * d.dirs + dir : dir * d.batch + b) * d.hidden;
  }
  int64_t sequence_offset(const Dims& d, int64_t t, int64_t dir, int64_t b) const {
    return (attrs_.batch_first ? (b * d.seq + t) * d.dirs + dir : (t * d.dirs + dir) * d.batch + b) * d.hidden;
  }
  int64_t x_row(const Dims& d, int64_t t, int64_t b) const { return attrs_.batch_first ? b * d.seq + t : t * d.batch + b; }

  void expect_shape(const Tensor& t, const Shape& want, const std::string& what, const std::string& meaning) const {
    SQ_CHECK(t.shape() == want, ErrorKind::kInvalidArgument,
             node_.describe() + ": " + what + " has shape " + shape_str(t.shape()) + ", expected " + shape_str(want) +
                 " (" + meaning + ")");
  }

  Dims check_inputs(const KernelContext& ctx) const {
    const Tensor& x = ctx.input(kX);
    const Tensor& w = ctx.input(kW);
    const Tensor& r = ctx.input(kR);
    SQ_CHECK(x.dtype() == DType::kFloat32, ErrorKind::kUnsupported,
             node_.describe() + ": X has dtype " + dtype_name(x.dtype()) + "; only float32 is implemented");
    const std::array<std::pair<size_t, const char*>, 6> float_inputs{
        {{kW, "W"}, {kR, "R"}, {kB, "B"}, {kInitialH, "initial_h"}, {kInitialC, "initial_c"}, {kPeepholes, "P"}}};
    for (const auto& [slot, name] : float_inputs) {
      const Tensor* t = ctx.optional_input(slot);
      SQ_CHECK(t == nullptr || t->dtype() == DType::kFloat32, ErrorKind::kInvalidModel,
               node_.describe() + ": " + name + " has dtype " + dtype_name(t ? t->dtype() : DType::kUndefined) +
                   " but X is float32 (X, W, R, B, initial_h, initial_c and P share one type)");
    }
    SQ_CHECK(x.rank() == 3, ErrorKind::kInvalidArgument,
             node_.describe() + ": X must have rank 3 (" +
                 (attrs_.batch_first ? "[batch, seq_length, input_size]" : "[seq_length, batch, input_size]") +
                 "), got shape " + shape_str(x.shape()));
    Dims d;
    d.seq = attrs_.batch_first ? x.dim(1) : x.dim(0);
    d.batch = attrs_.batch_first ? x.dim(0) : x.dim(1);
    d.input = x.dim(2);
    d.dirs = attrs_.num_directions;
    d.gates = cell_info(cell_).gates;
    SQ_CHECK(r.rank() == 3, ErrorKind::kInvalidArgument,
             node_.describe() + ": R must have rank 3 ([num_directions, " + std::to_string(d.gates) +
                 "*hidden_size, hidden_size]), got shape " + shape_str(r.shape()));
    d.hidden = attrs_.hidden_size.value_or(r.dim(2));
    SQ_CHECK(w.rank() == 3, ErrorKind::kInvalidArgument,
             node_.describe() + ": W must have rank 3 ([num_directions, " + std::to_string(d.gates) +
                 "*hidden_size, input_size]), got shape " + shape_str(w.shape()));
    SQ_CHECK(w.dim(2) == d.input, ErrorKind::kInvalidArgument,
             node_.describe() + ": X has input size " + std::to_string(d.input) + " (shape " + shape_str(x.shape()) +
                 ") but W of shape " + shape_str(w.shape()) + " expects input size " + std::to_string(w.dim(2)));
    const std::string dirs_meaning = "num_directions " + std::to_string(d.dirs) + ", hidden_size " +
                                     std::to_string(d.hidden) + ", " + std::to_string(d.gates) + " gate" +
                                     (d.gates > 1 ? "s" : "");
    expect_shape(w, {d.dirs, d.gate_width(), d.input}, "W", dirs_meaning);
    expect_shape(r, {d.dirs, d.gate_width(), d.hidden}, "R", dirs_meaning);
    if (const Tensor* b = ctx.optional_input(kB)) expect_shape(*b, {d.dirs, 2 * d.gate_width()}, "B", dirs_meaning);
    const Shape state = state_shape(d);
    const std::string state_meaning = attrs_.batch_first ? "[batch, num_directions, hidden_size]"
                                                         : "[num_directions, batch, hidden_size]";
    if (const Tensor* h0 = ctx.optional_input(kInitialH)) expect_shape(*h0, state, "initial_h", state_meaning);
    if (cell_ == Cell::kLstm) {
      if (const Tensor* c0 = ctx.optional_input(kInitialC)) expect_shape(*c0, state, "initial_c", state_meaning);
      if (const Tensor* p = ctx.optional_input(kPeepholes))
        expect_shape(*p, {d.dirs, 3 * d.hidden}, "P", "[num_directions, 3*hidden_size]");
    }
    return d;
  }

  // Per batch entry, the number of leading steps that are valid (seq when sequence_lens is absent).
  std::vector<int64_t> sequence_lengths(const KernelContext& ctx, const Dims& d) const {
    const Tensor* lens = ctx.optional_input(kSequenceLens);
    if (lens == nullptr) return std::vector<int64_t>(static_cast<size_t>(d.batch), d.seq);
    SQ_CHECK(lens->dtype() == DType::kInt32 || lens->dtype() == DType::kInt64, ErrorKind::kInvalidModel,
             node_.describe() + ": sequence_lens has dtype " + dtype_name(lens->dtype()) + ", expected int32");
    expect_shape(*lens, {d.batch}, "sequence_lens", "one length per batch entry");
    std::vector<int64_t> out = lens->to_int64_vector();
    for (size_t b = 0; b < out.size(); ++b)
      SQ_CHECK(out[b] >= 0 && out[b] <= d.seq, ErrorKind::kInvalidArgument,
               node_.describe() + ": sequence_lens[" + std::to_string(b) + "] = " + std::to_string(out[b]) +
                   " is outside [0, " + std::to_string(d.seq) + "] (seq_length)");
    return out;
  }

  // Copies direction `dir` of an optional state input into a [batch, H] buffer (zeros if absent).
  void load_state(const Tensor* initial, const Dims& d, int64_t dir, std::vector<float>& state) const {
    state.assign(static_cast<size_t>(d.batch * d.hidden), 0.f);
    if (initial == nullptr) return;
    const float* src = initial->data<float>();
    for (int64_t b = 0; b < d.batch; ++b)
      std::copy_n(src + state_offset(d, dir, b), d.hidden, state.data() + b * d.hidden);
  }
  void store_state(Tensor* out, const Dims& d, int64_t dir, const std::vector<float>& state) const {
    if (out == nullptr) return;
    float* dst = out->data<float>();
    for (int64_t b = 0; b < d.batch; ++b)
      std::copy_n(state.data() + b * d.hidden, d.hidden, dst + state_offset(d, dir, b));
  }

  void run_direction(KernelContext& ctx, const Dims& d, int64_t dir, const std::vector<int64_t>& lengths,
                     const float* x_proj, const float* r, Tensor* y, Tensor* y_h, Tensor* y_c) const {
    // r: this direction's R^T, [H, gates*H].
    const int64_t H = d.hidden, GH = d.gate_width(), proj_width = d.dirs * GH;
    const std::vector<Activation>& act = attrs_.activations[static_cast<size_t>(dir)];
    const bool reverse =
        attrs_.direction == Direction::kReverse || (attrs_.direction == Direction::kBidirectional && dir == 1);

    // Bias added to the projected input: Wb + Rb, except for GRU's candidate under
    // linear_before_reset, whose Rbh is added to H_{t-1} Rh^T before the reset gate scales it.
    std::vector<float> bias(static_cast<size_t>(GH), 0.f), recurrent_bias_h(static_cast<size_t>(H), 0.f);
    if (const Tensor* b = ctx.optional_input(kB)) {
      const float* wb = b->data<float>() + dir * 2 * GH;
      const float* rb = wb + GH;
      for (int64_t j = 0; j < GH; ++j) bias[j] = wb[j] + rb[j];
      if (attrs_.linear_before_reset) {
        for (int64_t j = 0; j < H; ++j) {
          bias[2 * H + j] = wb[2 * H + j];
          recurrent_bias_h[j] = rb[2 * H + j];
        }
      }
    }
    const float* peep = nullptr;
    if (const Tensor* p = ctx.optional_input(kPeepholes); p && cell_ == Cell::kLstm) peep = p->data<float>() + dir * 3 * H;

    std::vector<float> h, c;
    load_state(ctx.optional_input(kInitialH), d, dir, h);
    if (cell_ == Cell::kLstm) load_state(ctx.optional_input(kInitialC), d, dir, c);
    // gates: H_{t-1} R^T per batch entry, then the gate values in place. scratch: r ⊙ H_{t-1}
    // (GRU) or h(C_t) (LSTM).
    std::vector<float> gates(static_cast<size_t>(d.batch * GH)), scratch(static_cast<size_t>(d.batch * H));

    for (int64_t step = 0; step < d.seq; ++step) {
      const int64_t t = reverse ? d.seq - 1 - step : step;
      auto active = [&](int64_t b) { return t < lengths[static_cast<size_t>(b)]; };
      const bool any_active = std::any_of(lengths.begin(), lengths.end(), [&](int64_t len) { return t < len; });
      if (any_active) {
        auto x_gates = [&](int64_t b) { return x_proj + x_row(d, t, b) * proj_width + dir * GH; };
        switch (cell_) {
          case Cell::kRnn: rnn_step(d, act, r, bias, x_gates, active, h, gates); break;
          case Cell::kGru: gru_step(d, act, r, bias, recurrent_bias_h, x_gates, active, h, gates, scratch); break;
          case Cell::kLstm: lstm_step(d, act, r, bias, peep, x_gates, active, h, c, gates, scratch); break;
        }
      }
      if (y != nullptr) {
        float* out = y->data<float>();
        for (int64_t b = 0; b < d.batch; ++b) {
          float* row = out + sequence_offset(d, t, dir, b);
          if (active(b)) std::copy_n(h.data() + b * H, H, row);
          else std::fill_n(row, H, 0.f);
        }
      }
    }
    store_state(y_h, d, dir, h);
    store_state(y_c, d, dir, c);
  }

  template <typename XGates, typename Active>
  void rnn_step(const Dims& d, const std::vector<Activation>& act, const float* r, const std::vector<float>& bias,
                const XGates& x_gates, const Active& active, std::vector<float>& h, std::vector<float>& gates) const {
    const int64_t H = d.hidden;
    gemm(BLayout::kPlain, d.batch, H, H, h.data(), H, r, H, gates.data(), H, node_);
    for (int64_t b = 0; b < d.batch; ++b) {
      if (!active(b)) continue;
      float* g = gates.data() + b * H;
      const float* xg = x_gates(b);
      for (int64_t j = 0; j < H; ++j) g[j] += xg[j] + bias[j];
      activate(act[0], attrs_.clip, g, H);
      std::copy_n(g, H, h.data() + b * H);
    }
  }

  template <typename XGates, typename Active>
  void gru_step(const Dims& d, const std::vector<Activation>& act, const float* r, const std::vector<float>& bias,
                const std::vector<float>& recurrent_bias_h, const XGates& x_gates, const Active& active,
                std::vector<float>& h, std::vector<float>& gates, std::vector<float>& reset_h) const {
    const int64_t H = d.hidden, GH = d.gate_width();
    // z and r; under linear_before_reset the candidate's H_{t-1} Rh^T comes from the same GEMM.
    const int64_t first_gemm_cols = attrs_.linear_before_reset ? GH : 2 * H;
    gemm(BLayout::kPlain, d.batch, first_gemm_cols, H, h.data(), H, r, GH, gates.data(), GH, node_);
    if (attrs_.default_functions) {
      const float clip = attrs_.clip_or_inf();
      if (attrs_.linear_before_reset) {
        for (int64_t b = 0; b < d.batch; ++b)
          if (active(b))
            gru_lbr_default_row(gates.data() + b * GH, x_gates(b), bias.data(), recurrent_bias_h.data(), clip,
                                h.data() + b * H, H);
        return;
      }
      // Every row's r ⊙ H_{t-1} feeds the second GEMM (inactive rows are discarded below).
      for (int64_t b = 0; b < d.batch; ++b)
        gru_gates_default_row(gates.data() + b * GH, x_gates(b), bias.data(), clip, h.data() + b * H,
                              reset_h.data() + b * H, H);
      gemm(BLayout::kPlain, d.batch, H, H, reset_h.data(), H, r + 2 * H, GH, gates.data() + 2 * H, GH, node_);
      for (int64_t b = 0; b < d.batch; ++b)
        if (active(b))
          gru_update_default_row(gates.data() + b * GH, x_gates(b), bias.data(), clip, h.data() + b * H, H);
      return;
    }
    for (int64_t b = 0; b < d.batch; ++b) {
      // Every row's r ⊙ H_{t-1} feeds the second GEMM, so inactive rows are computed too (and
      // discarded below); their state is finite, so this is harmless.
      float* g = gates.data() + b * GH;
      const float* xg = x_gates(b);
      for (int64_t j = 0; j < 2 * H; ++j) g[j] += xg[j] + bias[j];
      activate(act[0], attrs_.clip, g, 2 * H);
      if (!attrs_.linear_before_reset) {
        const float* reset = g + H;
        const float* hb = h.data() + b * H;
        float* rh = reset_h.data() + b * H;
        for (int64_t j = 0; j < H; ++j) rh[j] = reset[j] * hb[j];
      }
    }
    if (!attrs_.linear_before_reset)
      gemm(BLayout::kPlain, d.batch, H, H, reset_h.data(), H, r + 2 * H, GH, gates.data() + 2 * H, GH, node_);
    for (int64_t b = 0; b < d.batch; ++b) {
      if (!active(b)) continue;
      float* g = gates.data() + b * GH;
      const float *xg = x_gates(b) + 2 * H, *bh = bias.data() + 2 * H, *update = g, *reset = g + H;
      float* cand = g + 2 * H;
      if (attrs_.linear_before_reset) {
        for (int64_t j = 0; j < H; ++j) cand[j] = xg[j] + bh[j] + reset[j] * (cand[j] + recurrent_bias_h[j]);
      } else {
        for (int64_t j = 0; j < H; ++j) cand[j] += xg[j] + bh[j];
      }
      activate(act[1], attrs_.clip, cand, H);
      float* hb = h.data() + b * H;
      for (int64_t j = 0; j < H; ++j) hb[j] = (1.f - update[j]) * cand[j] + update[j] * hb[j];
    }
  }

  template <typename XGates, typename Active>
  void lstm_step(const Dims& d, const std::vector<Activation>& act, const float* r, const std::vector<float>& bias,
                 const float* peep, const XGates& x_gates, const Active& active, std::vector<float>& h,
                 std::vector<float>& c, std::vector<float>& gates, std::vector<float>& cell_out) const {
    const int64_t H = d.hidden, GH = d.gate_width();
    gemm(BLayout::kPlain, d.batch, GH, H, h.data(), H, r, GH, gates.data(), GH, node_);
    if (attrs_.default_functions && peep == nullptr) {
      const float clip = attrs_.clip_or_inf();
      for (int64_t b = 0; b < d.batch; ++b)
        if (active(b))
          lstm_default_row(gates.data() + b * GH, x_gates(b), bias.data(), clip, c.data() + b * H, h.data() + b * H, H);
      return;
    }
    for (int64_t b = 0; b < d.batch; ++b) {
      if (!active(b)) continue;
      float* g = gates.data() + b * GH;
      const float* xg = x_gates(b);
      for (int64_t j = 0; j < GH; ++j) g[j] += xg[j] + bias[j];
      float *in = g, *out = g + H, *forget = g + 2 * H, *cand = g + 3 * H;
      float* cb = c.data() + b * H;
      if (peep != nullptr) {
        const float *p_in = peep, *p_forget = peep + 2 * H;
        for (int64_t j = 0; j < H; ++j) {
          in[j] += p_in[j] * cb[j];
          forget[j] += p_forget[j] * cb[j];
        }
      }
      activate(act[0], attrs_.clip, in, H);
      if (attrs_.input_forget) {
        for (int64_t j = 0; j < H; ++j) forget[j] = 1.f - in[j];
      } else {
        activate(act[0], attrs_.clip, forget, H);
      }
      activate(act[1], attrs_.clip, cand, H);
      for (int64_t j = 0; j < H; ++j) cb[j] = forget[j] * cb[j] + in[j] * cand[j];
      if (peep != nullptr) {
        const float* p_out = peep + H;
        for (int64_t j = 0; j < H; ++j) out[j] += p_out[j] * cb[j];
      }
      activate(act[0], attrs_.clip, out, H);
      float* hc = cell_out.data() + b * H;
      std::copy_n(cb, H, hc);
      activate(act[2], std::nullopt, hc, H);
      float* hb = h.data() + b * H;
      for (int64_t j = 0; j < H; ++j) hb[j] = out[j] * hc[j];
    }
  }

  const ir::Node& node_;
  Cell cell_;
  RecurrentAttrs attrs_;
  std::vector<float> constant_r_t_;  // a constant R, transposed (empty when R is computed)
};

}  // namespace

void register_recurrent_kernels(KernelRegistry& r) {
  r.add("RNN", [](const KernelInit& init) { return std::make_unique<RecurrentKernel>(init, Cell::kRnn); });
  r.add("GRU", [](const KernelInit& init) { return std::make_unique<RecurrentKernel>(init, Cell::kGru); });
  r.add("LSTM", [](const KernelInit& init) { return std::make_unique<RecurrentKernel>(init, Cell::kLstm); });
}

}  // namespace slimquant::runtime
