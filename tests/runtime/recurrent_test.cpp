// LSTM / GRU / RNN kernels: what ONNX's node test data does not cover. Its cases are forward-only
// and all sequences are full length; here bidirectional runs with shorter sequences (Y is zero
// past a sequence's end, Y_h / Y_c hold its last valid step), batch-first layout, and the error
// messages for inputs of the wrong size are checked against a plain reference written from the
// ONNX equations one sequence at a time.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "kernel_test_util.h"
#include "slimquant/runtime/kernel.h"

namespace slimquant::runtime {
namespace {

using kernel_test::run_op;

ir::Node make_node(const std::string& op, const std::vector<std::string>& inputs, int64_t hidden,
                   const std::string& direction) {
  ir::Node n;
  n.op_type = op;
  n.name = "/rnn/" + op + "_0";
  n.inputs = inputs;
  n.outputs = {"Y", "Y_h"};
  if (op == "LSTM") n.outputs.push_back("Y_c");
  n.attrs["hidden_size"] = hidden;
  n.attrs["direction"] = direction;
  return n;
}

Tensor random_tensor(const Shape& s, std::mt19937& rng, float scale = 0.6f) {
  std::uniform_real_distribution<float> dist(-scale, scale);
  Tensor t(DType::kFloat32, s);
  for (float& v : t.values<float>()) v = dist(rng);
  return t;
}

int gates_of(const std::string& op) { return op == "LSTM" ? 4 : op == "GRU" ? 3 : 1; }

double sigmoid(double x) { return 1.0 / (1.0 + std::exp(-x)); }

// The ONNX equations with default activations, one batch entry and one direction at a time, in
// double. Inputs and outputs use layout 0; returns {Y, Y_h, Y_c}.
struct Reference {
  std::vector<double> y, y_h, y_c;
};
Reference reference(const std::string& op, bool linear_before_reset, const Tensor& x, const Tensor& w, const Tensor& r,
                    const Tensor& b, const std::vector<int32_t>& lens, const Tensor& h0, const Tensor& c0,
                    const Tensor& p, int64_t dirs) {
  const int64_t S = x.dim(0), N = x.dim(1), I = x.dim(2), H = r.dim(2), G = gates_of(op);
  Reference out;
  out.y.assign(static_cast<size_t>(S * dirs * N * H), 0.0);
  out.y_h.assign(static_cast<size_t>(dirs * N * H), 0.0);
  out.y_c = out.y_h;
  const float *X = x.data<float>(), *B = b.data<float>();
  for (int64_t d = 0; d < dirs; ++d) {
    const float* W = w.data<float>() + d * G * H * I;
    const float* R = r.data<float>() + d * G * H * H;
    const float* wb = B + d * 2 * G * H;
    const float* rb = wb + G * H;
    for (int64_t n = 0; n < N; ++n) {
      std::vector<double> h(H), c(H, 0.0);
      for (int64_t j = 0; j < H; ++j) h[j] = h0.data<float>()[(d * N + n) * H + j];
      if (c0.defined())
        for (int64_t j = 0; j < H; ++j) c[j] = c0.data<float>()[(d * N + n) * H + j];
      const int64_t len = lens[static_cast<size_t>(n)];
      for (int64_t s = 0; s < len; ++s) {
        const int64_t t = d == 1 ? len - 1 - s : s;
        const float* xt = X + (t * N + n) * I;
        // pre(g, row, hv): row `row` of gate g's X_t W^T + hv R^T (no bias).
        auto wx = [&](int64_t g, int64_t j) {
          double a = 0;
          for (int64_t k = 0; k < I; ++k) a += double(W[(g * H + j) * I + k]) * xt[k];
          return a;
        };
        auto rh = [&](int64_t g, int64_t j, const std::vector<double>& hv) {
          double a = 0;
          for (int64_t k = 0; k < H; ++k) a += double(R[(g * H + j) * H + k]) * hv[k];
          return a;
        };
        std::vector<double> nh(H), nc(H);
        if (op == "RNN") {
          for (int64_t j = 0; j < H; ++j) nh[j] = std::tanh(wx(0, j) + rh(0, j, h) + wb[j] + rb[j]);
        } else if (op == "GRU") {
          std::vector<double> z(H), rr(H), reset_h(H);
          for (int64_t j = 0; j < H; ++j) {
            z[j] = sigmoid(wx(0, j) + rh(0, j, h) + wb[j] + rb[j]);
            rr[j] = sigmoid(wx(1, j) + rh(1, j, h) + wb[H + j] + rb[H + j]);
            reset_h[j] = rr[j] * h[j];
          }
          for (int64_t j = 0; j < H; ++j) {
            const double cand = linear_before_reset
                                    ? std::tanh(wx(2, j) + rr[j] * (rh(2, j, h) + rb[2 * H + j]) + wb[2 * H + j])
                                    : std::tanh(wx(2, j) + rh(2, j, reset_h) + rb[2 * H + j] + wb[2 * H + j]);
            nh[j] = (1 - z[j]) * cand + z[j] * h[j];
          }
        } else {
          const float* P = p.data<float>() + d * 3 * H;
          for (int64_t j = 0; j < H; ++j) {
            auto pre = [&](int64_t g) { return wx(g, j) + rh(g, j, h) + wb[g * H + j] + rb[g * H + j]; };
            const double i = sigmoid(pre(0) + P[j] * c[j]);
            const double f = sigmoid(pre(2) + P[2 * H + j] * c[j]);
            nc[j] = f * c[j] + i * std::tanh(pre(3));
            const double o = sigmoid(pre(1) + P[H + j] * nc[j]);
            nh[j] = o * std::tanh(nc[j]);
          }
          c = nc;
        }
        h = nh;
        for (int64_t j = 0; j < H; ++j) out.y[static_cast<size_t>(((t * dirs + d) * N + n) * H + j)] = h[j];
      }
      for (int64_t j = 0; j < H; ++j) {
        out.y_h[static_cast<size_t>((d * N + n) * H + j)] = h[j];
        out.y_c[static_cast<size_t>((d * N + n) * H + j)] = c[j];
      }
    }
  }
  return out;
}

void expect_near_all(const Tensor& got, const std::vector<double>& want, const std::string& what) {
  ASSERT_EQ(static_cast<size_t>(got.numel()), want.size()) << what;
  const float* g = got.data<float>();
  for (size_t i = 0; i < want.size(); ++i) ASSERT_NEAR(g[i], want[i], 2e-5) << what << " element " << i;
}

// Bidirectional with sequence_lens {5, 3, 1, 0}: checks the kernel against the reference, then the
// two properties directly: Y is exactly zero past each sequence's end, and Y_h is Y at the last
// valid step (t = len - 1 forward, t = 0 backward), or initial_h for an empty sequence.
// An LSTM without P takes the kernel's fused path (default functions, no peepholes); with P the
// per-gate one.
void check_bidirectional_lengths(const std::string& op, bool linear_before_reset, bool peepholes = true) {
  SCOPED_TRACE(op + (linear_before_reset ? " linear_before_reset" : "") + (peepholes ? "" : " without P"));
  std::mt19937 rng(42);
  const int64_t S = 5, N = 4, I = 3, H = 6, D = 2, G = gates_of(op);
  const std::vector<int32_t> lens = {5, 3, 1, 0};
  Tensor x = random_tensor({S, N, I}, rng, 1.f), w = random_tensor({D, G * H, I}, rng),
         r = random_tensor({D, G * H, H}, rng), b = random_tensor({D, 2 * G * H}, rng),
         h0 = random_tensor({D, N, H}, rng), seq = Tensor::from_vector<int32_t>({N}, lens);
  Tensor c0, p;
  std::vector<std::string> names = {"X", "W", "R", "B", "sequence_lens", "initial_h"};
  std::vector<Tensor> inputs = {x, w, r, b, seq, h0};
  if (op == "LSTM") {
    c0 = random_tensor({D, N, H}, rng);
    p = random_tensor({D, 3 * H}, rng);
    names.push_back("initial_c");
    inputs.push_back(c0);
    if (peepholes) {
      names.push_back("P");
      inputs.push_back(p);
    } else {
      std::fill_n(p.data<float>(), p.numel(), 0.f);  // what the reference then uses
    }
  }
  ir::Node node = make_node(op, names, H, "bidirectional");
  if (linear_before_reset) node.attrs["linear_before_reset"] = int64_t{1};
  const std::vector<Tensor> out = run_op(node, 14, inputs);
  ASSERT_EQ(out[0].shape(), (Shape{S, D, N, H}));
  ASSERT_EQ(out[1].shape(), (Shape{D, N, H}));

  const Reference ref = reference(op, linear_before_reset, x, w, r, b, lens, h0, c0, p, D);
  expect_near_all(out[0], ref.y, "Y");
  expect_near_all(out[1], ref.y_h, "Y_h");
  if (op == "LSTM") expect_near_all(out[2], ref.y_c, "Y_c");

  const float* y = out[0].data<float>();
  const float* y_h = out[1].data<float>();
  auto y_at = [&](int64_t t, int64_t d, int64_t n, int64_t j) { return y[((t * D + d) * N + n) * H + j]; };
  for (int64_t n = 0; n < N; ++n) {
    const int64_t len = lens[static_cast<size_t>(n)];
    for (int64_t d = 0; d < D; ++d)
      for (int64_t j = 0; j < H; ++j) {
        for (int64_t t = len; t < S; ++t) EXPECT_EQ(y_at(t, d, n, j), 0.f) << "t=" << t << " d=" << d << " n=" << n;
        const float last = len == 0 ? h0.data<float>()[(d * N + n) * H + j] : y_at(d == 0 ? len - 1 : 0, d, n, j);
        EXPECT_EQ(y_h[(d * N + n) * H + j], last) << "Y_h d=" << d << " n=" << n;
      }
  }
}

TEST(Recurrent, LstmBidirectionalWithSequenceLengths) { check_bidirectional_lengths("LSTM", false); }
TEST(Recurrent, LstmWithoutPeepholesBidirectionalWithSequenceLengths) {
  check_bidirectional_lengths("LSTM", false, false);
}
TEST(Recurrent, GruBidirectionalWithSequenceLengths) { check_bidirectional_lengths("GRU", false); }
TEST(Recurrent, GruLinearBeforeResetBidirectionalWithSequenceLengths) { check_bidirectional_lengths("GRU", true); }
TEST(Recurrent, RnnBidirectionalWithSequenceLengths) { check_bidirectional_lengths("RNN", false); }

// One unit, one input, worked by hand: H_1 = tanh(0.5 * 1 + 0.3) = tanh(0.8), then
// H_2 = tanh(0.5 * -2 + 0.25 * tanh(0.8) + 0.3); reverse runs the two steps the other way.
TEST(Recurrent, RnnHandComputed) {
  ir::Node node = make_node("RNN", {"X", "W", "R", "B"}, 1, "bidirectional");
  const Tensor x = Tensor::from_vector<float>({2, 1, 1}, {1.f, -2.f});
  const Tensor w = Tensor::from_vector<float>({2, 1, 1}, {0.5f, 0.5f});
  const Tensor r = Tensor::from_vector<float>({2, 1, 1}, {0.25f, 0.25f});
  const Tensor b = Tensor::from_vector<float>({2, 2}, {0.1f, 0.2f, 0.1f, 0.2f});
  const std::vector<Tensor> out = run_op(node, 9, {x, w, r, b});
  const double fwd1 = std::tanh(0.8), fwd2 = std::tanh(-1.0 + 0.25 * fwd1 + 0.3);
  const double bwd2 = std::tanh(-0.7), bwd1 = std::tanh(0.5 + 0.25 * bwd2 + 0.3);
  const float* y = out[0].data<float>();  // [t][dir][batch=1][H=1]
  EXPECT_NEAR(y[0], fwd1, 1e-6);
  EXPECT_NEAR(y[1], bwd1, 1e-6);
  EXPECT_NEAR(y[2], fwd2, 1e-6);
  EXPECT_NEAR(y[3], bwd2, 1e-6);
  EXPECT_NEAR(out[1].data<float>()[0], fwd2, 1e-6);
  EXPECT_NEAR(out[1].data<float>()[1], bwd1, 1e-6);
}

// The fused rows of the default functions (sigmoid and tanh by a rational fit) against the per-gate
// passes (ew's exp-based functions), reached by naming tanh as ScaledTanh(1, 1): the same
// function. Inputs large enough that clip bounds some gates and others saturate; H = 21 leaves a
// vector tail.
TEST(Recurrent, FusedDefaultFunctionsMatchThePerGatePassesWithClip) {
  const int64_t S = 7, N = 3, I = 5, H = 21, D = 2;
  for (const auto& [op, lbr] : {std::pair{"LSTM", false}, std::pair{"GRU", false}, std::pair{"GRU", true}}) {
    SCOPED_TRACE(std::string(op) + (lbr ? " linear_before_reset" : ""));
    std::mt19937 rng(11);
    const int64_t G = gates_of(op);
    const Tensor x = random_tensor({S, N, I}, rng, 3.f), w = random_tensor({D, G * H, I}, rng, 1.5f),
                 r = random_tensor({D, G * H, H}, rng, 1.5f), b = random_tensor({D, 2 * G * H}, rng),
                 h0 = random_tensor({D, N, H}, rng);
    ir::Node fused = make_node(op, {"X", "W", "R", "B", "", "initial_h"}, H, "bidirectional");
    fused.attrs["clip"] = 2.5f;
    if (lbr) fused.attrs["linear_before_reset"] = int64_t{1};
    ir::Node per_gate = fused;
    per_gate.attrs["activations"] =
        std::string(op) == "LSTM"
            ? std::vector<std::string>{"Sigmoid", "ScaledTanh", "Tanh", "Sigmoid", "ScaledTanh", "Tanh"}
            : std::vector<std::string>{"Sigmoid", "ScaledTanh", "Sigmoid", "ScaledTanh"};
    const std::vector<Tensor> a = run_op(fused, 14, {x, w, r, b, Tensor(), h0});
    const std::vector<Tensor> e = run_op(per_gate, 14, {x, w, r, b, Tensor(), h0});
    ASSERT_EQ(a.size(), e.size());
    for (size_t k = 0; k < a.size(); ++k) {
      ASSERT_EQ(a[k].shape(), e[k].shape());
      float worst = 0.f;
      for (int64_t i = 0; i < a[k].numel(); ++i)
        worst = std::max(worst, std::fabs(a[k].data<float>()[i] - e[k].data<float>()[i]));
      EXPECT_LT(worst, 2e-6f) << "output " << k;
    }
  }
}

// layout = 1 is layout 0 with X, Y and the states transposed to batch first.
TEST(Recurrent, BatchFirstLayoutMatchesTransposedSequenceFirst) {
  std::mt19937 rng(3);
  const int64_t S = 4, N = 3, I = 5, H = 4, D = 2, G = 4;
  const Tensor x = random_tensor({S, N, I}, rng), w = random_tensor({D, G * H, I}, rng),
               r = random_tensor({D, G * H, H}, rng), h0 = random_tensor({D, N, H}, rng);
  const Tensor seq = Tensor::from_vector<int32_t>({N}, {4, 2, 3});
  Tensor xb(DType::kFloat32, {N, S, I}), h0b(DType::kFloat32, {N, D, H});
  for (int64_t t = 0; t < S; ++t)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t k = 0; k < I; ++k) xb.data<float>()[(n * S + t) * I + k] = x.data<float>()[(t * N + n) * I + k];
  for (int64_t d = 0; d < D; ++d)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < H; ++j) h0b.data<float>()[(n * D + d) * H + j] = h0.data<float>()[(d * N + n) * H + j];

  ir::Node seq_first = make_node("LSTM", {"X", "W", "R", "", "sequence_lens", "initial_h"}, H, "bidirectional");
  ir::Node batch_first = seq_first;
  batch_first.attrs["layout"] = int64_t{1};
  const std::vector<Tensor> a = run_op(seq_first, 14, {x, w, r, Tensor(), seq, h0});
  const std::vector<Tensor> b = run_op(batch_first, 14, {xb, w, r, Tensor(), seq, h0b});
  ASSERT_EQ(b[0].shape(), (Shape{N, S, D, H}));
  ASSERT_EQ(b[1].shape(), (Shape{N, D, H}));
  for (int64_t t = 0; t < S; ++t)
    for (int64_t d = 0; d < D; ++d)
      for (int64_t n = 0; n < N; ++n)
        for (int64_t j = 0; j < H; ++j)
          ASSERT_EQ(b[0].data<float>()[((n * S + t) * D + d) * H + j], a[0].data<float>()[((t * D + d) * N + n) * H + j]);
  for (int64_t d = 0; d < D; ++d)
    for (int64_t n = 0; n < N; ++n)
      for (int64_t j = 0; j < H; ++j) {
        ASSERT_EQ(b[1].data<float>()[(n * D + d) * H + j], a[1].data<float>()[(d * N + n) * H + j]);
        ASSERT_EQ(b[2].data<float>()[(n * D + d) * H + j], a[2].data<float>()[(d * N + n) * H + j]);
      }
}

// ---- errors ------------------------------------------------------------------------------------

template <typename Fn>
void expect_error(Fn&& fn, ErrorKind kind, const std::vector<std::string>& fragments) {
  try {
    fn();
    FAIL() << "no error thrown";
  } catch (const Error& e) {
    EXPECT_EQ(e.kind(), kind) << e.what();
    for (const std::string& f : fragments) EXPECT_NE(std::string(e.what()).find(f), std::string::npos) << e.what();
  }
}

TEST(Recurrent, WrongInputSizeNamesNodeAndSizes) {
  std::mt19937 rng(1);
  ir::Node node = make_node("GRU", {"X", "W", "R"}, 4, "forward");
  const Tensor x = random_tensor({2, 1, 5}, rng), w = random_tensor({1, 12, 3}, rng), r = random_tensor({1, 12, 4}, rng);
  expect_error([&] { run_op(node, 14, {x, w, r}); }, ErrorKind::kInvalidArgument,
               {"GRU '/rnn/GRU_0'", "X has input size 5", "expects input size 3"});
}

TEST(Recurrent, WrongStateShapeAndLengthsAreRejected) {
  std::mt19937 rng(2);
  ir::Node node = make_node("RNN", {"X", "W", "R", "", "sequence_lens", "initial_h"}, 4, "bidirectional");
  const Tensor x = random_tensor({3, 2, 2}, rng), w = random_tensor({2, 4, 2}, rng), r = random_tensor({2, 4, 4}, rng);
  const Tensor lens = Tensor::from_vector<int32_t>({2}, {3, 4});
  expect_error([&] { run_op(node, 14, {x, w, r, Tensor(), lens, random_tensor({2, 2, 4}, rng)}); },
               ErrorKind::kInvalidArgument, {"sequence_lens[1] = 4", "[0, 3]"});
  const Tensor ok_lens = Tensor::from_vector<int32_t>({2}, {3, 1});
  expect_error([&] { run_op(node, 14, {x, w, r, Tensor(), ok_lens, random_tensor({1, 2, 4}, rng)}); },
               ErrorKind::kInvalidArgument, {"initial_h has shape [1x2x4]", "expected [2x2x4]"});
}

TEST(Recurrent, BadAttributesAreRejectedAtCreation) {
  ir::Node unknown = make_node("LSTM", {"X", "W", "R"}, 4, "forward");
  unknown.attrs["activations"] = std::vector<std::string>{"Sigmoid", "Gelu", "Tanh"};
  expect_error([&] { run_op(unknown, 14, {}); }, ErrorKind::kUnsupported, {"activation 'Gelu'"});
  ir::Node count = make_node("GRU", {"X", "W", "R"}, 4, "bidirectional");
  count.attrs["activations"] = std::vector<std::string>{"Sigmoid", "Tanh", "Tanh"};
  expect_error([&] { run_op(count, 14, {}); }, ErrorKind::kInvalidModel, {"expects 4 activations", "got 3"});
  ir::Node direction = make_node("RNN", {"X", "W", "R"}, 4, "sideways");
  expect_error([&] { run_op(direction, 14, {}); }, ErrorKind::kInvalidModel, {"direction 'sideways'"});
}

}  // namespace
}  // namespace slimquant::runtime
