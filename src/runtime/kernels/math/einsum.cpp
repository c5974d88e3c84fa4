// Einsum: general Einstein summation over any number of operands.
//
// The equation is parsed once, when the kernel is created (a malformed one is a malformed node):
//   "bij,bjk->bik"  explicit output;   "ij,jk"  implicit output: the ellipsis dims, then the
//   letters that occur exactly once in the inputs, in character-code order (numpy's rule);
//   "ii->i" / "ii"  a repeated letter within one operand takes its diagonal (then sums: trace);
//   "...ij,...jk->...ik"  "..." stands for the leading dims of each operand, broadcast numpy-style
//   (right-aligned; a dim of size 1, labelled or not, broadcasts against any size).
//
// Evaluation, left to right: every operand is "prepared" by one strided copy that takes its
// diagonals, drops into a canonical dim order and broadcasts size-1 dims (stride 0), preceded by
// summing away the labels no other operand and not the output use. Two prepared operands are then
// one batched matrix product:
//   A[batch, M, K] x B[batch, K, N] -> C[batch, M, N]
// batch = labels both share and that are still needed (by the output or a later operand),
// K = labels both share and nothing later needs, M / N = labels only one of them has. When an
// operand is already stored as [batch, K, M] (or [batch, N, K]) the product reads it transposed
// instead of copying it. Float32 products run on oneDNN's sgemm; other types on a plain loop.
// The last intermediate is summed / permuted into the output order.
#include <oneapi/dnnl/dnnl.h>

#include <algorithm>
#include <cctype>
#include <memory>
#include <string>
#include <vector>

#include "runtime/kernels/elementwise/elementwise_math.h"
#include "runtime/kernels/math/misc_math_kernels.h"
#include "runtime/kernels/shape/shape_common.h"

namespace slimquant::runtime::misc {
namespace {

// Label ids: a letter is its character code; dim k (0-based, of the broadcast ellipsis dims) is
// kEllipsisBase + k. In a parsed term kEllipsisMarker stands where "..." was written.
constexpr int kEllipsisBase = 128;
constexpr int kEllipsisMarker = -1;

struct Term {
  std::vector<int> labels;  // letters, with kEllipsisMarker at the position of "..."
  bool has_ellipsis() const {
    return std::find(labels.begin(), labels.end(), kEllipsisMarker) != labels.end();
  }
  int64_t letter_count() const { return static_cast<int64_t>(labels.size()) - (has_ellipsis() ? 1 : 0); }
};

struct Equation {
  std::vector<Term> inputs;
  Term output;
};

std::string label_name(int label) {
  return label >= kEllipsisBase ? "(ellipsis dim " + std::to_string(label - kEllipsisBase) + ")"
                                : std::string(1, static_cast<char>(label));
}

// One comma-separated term: letters and at most one "...".
Term parse_term(const std::string& text, const std::string& equation, const std::string& who) {
  Term term;
  for (size_t i = 0; i < text.size(); ++i) {
    const char ch = text[i];
    if (std::isalpha(static_cast<unsigned char>(ch))) {
      term.labels.push_back(static_cast<unsigned char>(ch));
    } else if (ch == '.') {
      SQ_CHECK(text.compare(i, 3, "...") == 0, ErrorKind::kInvalidModel,
               who + ": equation '" + equation + "' has a '.' that is not part of an ellipsis '...'");
      SQ_CHECK(!term.has_ellipsis(), ErrorKind::kInvalidModel,
               who + ": equation '" + equation + "' has two ellipses in the term '" + text + "'");
      term.labels.push_back(kEllipsisMarker);
      i += 2;
    } else {
      fail(ErrorKind::kInvalidModel, who + ": equation '" + equation + "' has the invalid character '" +
                                         std::string(1, ch) + "' (terms are letters and '...')");
    }
  }
  return term;
}

Equation parse_equation(const std::string& raw, const std::string& who) {
  std::string eq;
  for (char ch : raw)
    if (!std::isspace(static_cast<unsigned char>(ch))) eq += ch;
  const size_t arrow = eq.find("->");
  SQ_CHECK(arrow == std::string::npos || eq.find("->", arrow + 2) == std::string::npos, ErrorKind::kInvalidModel,
           who + ": equation '" + raw + "' has more than one '->'");
  const std::string lhs = eq.substr(0, arrow);
  Equation e;
  size_t start = 0;
  while (true) {
    const size_t comma = lhs.find(',', start);
    e.inputs.push_back(parse_term(lhs.substr(start, comma - start), raw, who));
    if (comma == std::string::npos) break;
    start = comma + 1;
  }

  std::vector<int> count(kEllipsisBase, 0);
  bool any_ellipsis = false;
  for (const Term& t : e.inputs)
    for (int l : t.labels) {
      if (l == kEllipsisMarker) any_ellipsis = true;
      else ++count[l];
    }
  if (arrow != std::string::npos) {
    e.output = parse_term(eq.substr(arrow + 2), raw, who);
    std::vector<bool> seen(kEllipsisBase, false);
    for (int l : e.output.labels) {
      if (l == kEllipsisMarker) continue;
      SQ_CHECK(count[l] > 0, ErrorKind::kInvalidModel,
               who + ": equation '" + raw + "': output label '" + label_name(l) + "' is in no input term");
      SQ_CHECK(!seen[l], ErrorKind::kInvalidModel,
               who + ": equation '" + raw + "': output label '" + label_name(l) + "' appears twice");
      seen[l] = true;
    }
  } else {
    if (any_ellipsis) e.output.labels.push_back(kEllipsisMarker);
    for (int l = 0; l < kEllipsisBase; ++l)
      if (count[l] == 1) e.output.labels.push_back(l);
  }
  return e;
}

// An operand during evaluation: contiguous data whose dim d carries label labels[d] (an input may
// repeat a label: its diagonal; intermediates never do).
struct Operand {
  Tensor data;
  std::vector<int> labels;

  // Extent of `label` here, or -1 if the operand does not have it.
  int64_t size_of(int label) const {
    for (size_t d = 0; d < labels.size(); ++d)
      if (labels[d] == label) return data.dim(d);
    return -1;
  }
  bool has(int label) const { return size_of(label) >= 0; }
};

std::vector<int> unique_labels(const std::vector<int>& labels) {
  std::vector<int> out;
  for (int l : labels)
    if (std::find(out.begin(), out.end(), l) == out.end()) out.push_back(l);
  return out;
}

std::vector<int> concat(std::initializer_list<const std::vector<int>*> parts) {
  std::vector<int> out;
  for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
  return out;
}

// Whether `op` already is laid out as `target` with `sizes`: then preparing it costs no copy.
bool laid_out_as(const Operand& op, const std::vector<int>& target, const Shape& sizes) {
  return op.labels == target && op.data.shape() == sizes;
}

// The operand rearranged to dims `target` of extents `sizes`, by one strided copy: a target
// label's stride is the sum of the strides of the operand's dims carrying it (its diagonal), or 0
// where the operand lacks it or has extent 1 (broadcast).
Tensor gather(const Operand& op, const std::vector<int>& target, const Shape& sizes) {
  const std::vector<int64_t> src_strides = contiguous_strides(op.data.shape());
  std::vector<int64_t> strides(target.size(), 0);
  for (size_t t = 0; t < target.size(); ++t)
    for (size_t d = 0; d < op.labels.size(); ++d)
      if (op.labels[d] == target[t] && op.data.dim(d) == sizes[t]) strides[t] += src_strides[d];
  Tensor out(op.data.dtype(), sizes);
  shape::strided_copy(out.raw(), op.data.raw(), sizes, strides, dtype_size(op.data.dtype()));
  return out;
}

// out[i] = sum of the row in[i * len, (i + 1) * len); several partial sums so the loop vectorises.
template <typename T>
void sum_rows(const T* in, T* out, int64_t rows, int64_t len) {
  constexpr int kLanes = 8;
  for (int64_t r = 0; r < rows; ++r) {
    const T* x = in + r * len;
    T part[kLanes] = {};
    int64_t i = 0;
    for (; i + kLanes <= len; i += kLanes)
      for (int j = 0; j < kLanes; ++j) part[j] = ew::wrap_add(part[j], x[i + j]);
    for (; i < len; ++i) part[0] = ew::wrap_add(part[0], x[i]);
    for (int j = 1; j < kLanes; ++j) part[0] = ew::wrap_add(part[0], part[j]);
    out[r] = part[0];
  }
}

// The operand with dims `kept` (extents `kept_sizes`), every other label summed away.
template <typename T>
Operand reduce_to(const Operand& op, const std::vector<int>& kept, const Shape& kept_sizes) {
  std::vector<int> target = kept;
  Shape sizes = kept_sizes;
  int64_t summed = 1;
  for (int l : unique_labels(op.labels))
    if (std::find(kept.begin(), kept.end(), l) == kept.end()) {
      target.push_back(l);
      sizes.push_back(op.size_of(l));
      summed *= op.size_of(l);
    }
  Tensor arranged = laid_out_as(op, target, sizes) ? op.data : gather(op, target, sizes);
  if (target.size() == kept.size()) return {arranged, kept};
  Tensor out(dtype_of<T>, kept_sizes);
  sum_rows(arranged.data<T>(), out.data<T>(), out.numel(), summed);
  return {out, kept};
}

// c[b] = op(a[b]) x op(b[b]) for b < batch: a is [M, K] (ta: stored [K, M]), b is [K, N] (tb:
// stored [N, K]), c is [M, N]; all contiguous.
template <typename T>
void batched_matmul(const T* a, const T* b, T* c, int64_t batch, int64_t m, int64_t n, int64_t k, bool ta, bool tb) {
  if (m == 0 || n == 0) return;
  if (k == 0) {
    std::fill(c, c + batch * m * n, T(0));
    return;
  }
  for (int64_t i = 0; i < batch; ++i) {
    const T* ai = a + i * m * k;
    const T* bi = b + i * k * n;
    T* ci = c + i * m * n;
    if constexpr (std::is_same_v<T, float>) {
      const dnnl_status_t st = dnnl_sgemm(ta ? 'T' : 'N', tb ? 'T' : 'N', m, n, k, 1.f, ai, ta ? m : k, bi,
                                          tb ? k : n, 0.f, ci, n);
      SQ_CHECK(st == dnnl_success, ErrorKind::kInternal, "Einsum: oneDNN sgemm failed (status " + std::to_string(st) + ")");
    } else {
      // Row of c += a[r, p] * row p of b: a contiguous, vectorisable inner loop unless b is
      // stored transposed.
      for (int64_t r = 0; r < m; ++r) {
        T* crow = ci + r * n;
        std::fill(crow, crow + n, T(0));
        for (int64_t p = 0; p < k; ++p) {
          const T av = ta ? ai[p * m + r] : ai[r * k + p];
          if (tb) {
            for (int64_t j = 0; j < n; ++j) crow[j] = ew::wrap_add(crow[j], ew::wrap_mul(av, bi[j * k + p]));
          } else {
            const T* brow = bi + p * n;
            for (int64_t j = 0; j < n; ++j) crow[j] = ew::wrap_add(crow[j], ew::wrap_mul(av, brow[j]));
          }
        }
      }
    }
  }
}

// Contracts two operands into one whose labels are batch + M + N (see the header comment).
// needed[l]: label l is used by the output or by an operand still to come.
template <typename T>
Operand contract_pair(const Operand& a, const Operand& b, const std::vector<bool>& needed) {
  std::vector<int> batch, contracted, m_labels, n_labels;
  for (int l : unique_labels(a.labels)) {
    if (b.has(l)) (needed[l] ? batch : contracted).push_back(l);
    else if (needed[l]) m_labels.push_back(l);
  }
  for (int l : unique_labels(b.labels))
    if (!a.has(l) && needed[l]) n_labels.push_back(l);
  // A shared label takes the extent that is not 1 (the other is equal, or 1: broadcast).
  auto extents = [&](const std::vector<int>& labels, const Operand& owner) {
    Shape s;
    for (int l : labels) {
      const int64_t ea = a.size_of(l), eb = b.size_of(l);
      s.push_back(ea >= 0 && eb >= 0 ? (ea == 1 ? eb : ea) : owner.size_of(l));
    }
    return s;
  };
  const Shape batch_s = extents(batch, a), k_s = extents(contracted, a), m_s = extents(m_labels, a),
              n_s = extents(n_labels, b);

  auto concat_shape = [](std::initializer_list<const Shape*> parts) {
    Shape out;
    for (const auto* p : parts) out.insert(out.end(), p->begin(), p->end());
    return out;
  };
  // Read an operand transposed when that, and only that, avoids copying it.
  const std::vector<int> a_mk = concat({&batch, &m_labels, &contracted}), a_km = concat({&batch, &contracted, &m_labels});
  const std::vector<int> b_kn = concat({&batch, &contracted, &n_labels}), b_nk = concat({&batch, &n_labels, &contracted});
  const Shape a_mk_s = concat_shape({&batch_s, &m_s, &k_s}), a_km_s = concat_shape({&batch_s, &k_s, &m_s});
  const Shape b_kn_s = concat_shape({&batch_s, &k_s, &n_s}), b_nk_s = concat_shape({&batch_s, &n_s, &k_s});
  const bool ta = !laid_out_as(a, a_mk, a_mk_s) && laid_out_as(a, a_km, a_km_s);
  const bool tb = !laid_out_as(b, b_kn, b_kn_s) && laid_out_as(b, b_nk, b_nk_s);
  const Operand pa = ta ? reduce_to<T>(a, a_km, a_km_s) : reduce_to<T>(a, a_mk, a_mk_s);
  const Operand pb = tb ? reduce_to<T>(b, b_nk, b_nk_s) : reduce_to<T>(b, b_kn, b_kn_s);

  Operand c{Tensor(dtype_of<T>, concat_shape({&batch_s, &m_s, &n_s})), concat({&batch, &m_labels, &n_labels})};
  batched_matmul(pa.data.data<T>(), pb.data.data<T>(), c.data.data<T>(), shape_numel(batch_s), shape_numel(m_s),
                 shape_numel(n_s), shape_numel(k_s), ta, tb);
  return c;
}

class EinsumKernel final : public Kernel {
 public:
  explicit EinsumKernel(const KernelInit& init) : node_(init.node) {
    const std::string who = node_.describe();
    SQ_CHECK(node_.has_attr("equation"), ErrorKind::kInvalidModel, who + ": required attribute equation is missing");
    equation_text_ = node_.attr_string("equation", "");
    equation_ = parse_equation(equation_text_, who);
    SQ_CHECK(equation_.inputs.size() == node_.inputs.size(), ErrorKind::kInvalidModel,
             who + ": equation '" + equation_text_ + "' has " + std::to_string(equation_.inputs.size()) +
                 " input terms but the node has " + std::to_string(node_.inputs.size()) + " inputs");
  }

  void run(KernelContext& ctx) override {
    const DType dtype = ctx.input(0).dtype();
    switch (dtype) {
      case DType::kFloat32: run_typed<float>(ctx); break;
      case DType::kFloat64: run_typed<double>(ctx); break;
      case DType::kInt32: run_typed<int32_t>(ctx); break;
      case DType::kInt64: run_typed<int64_t>(ctx); break;
      case DType::kUInt32: run_typed<uint32_t>(ctx); break;
      case DType::kUInt64: run_typed<uint64_t>(ctx); break;
      default:
        fail(ErrorKind::kUnsupported, node_.describe() + ": input dtype " + dtype_name(dtype) +
                                          " is not supported (float32/64, int32/64, uint32/64 are)");
    }
  }

 private:
  template <typename T>
  void run_typed(KernelContext& ctx) {
    const std::string who = node_.describe() + " (equation '" + equation_text_ + "')";
    const size_t n_inputs = equation_.inputs.size();

    // Dims covered by each operand's "..."; all of them broadcast right-aligned over `ellipsis`.
    int64_t ellipsis = 0;
    std::vector<int64_t> ellipsis_dims(n_inputs, 0);
    for (size_t i = 0; i < n_inputs; ++i) {
      const Tensor& x = ctx.input(i);
      SQ_CHECK(x.dtype() == dtype_of<T>, ErrorKind::kInvalidArgument,
               who + ": input " + std::to_string(i) + " has dtype " + dtype_name(x.dtype()) + ", input 0 has " +
                   dtype_name(dtype_of<T>));
      const Term& term = equation_.inputs[i];
      const int64_t rank = static_cast<int64_t>(x.rank()), letters = term.letter_count();
      SQ_CHECK(term.has_ellipsis() ? rank >= letters : rank == letters, ErrorKind::kInvalidArgument,
               who + ": input " + std::to_string(i) + " of shape " + shape_str(x.shape()) + " has rank " +
                   std::to_string(rank) + " but its term names " + std::to_string(letters) + " dims" +
                   (term.has_ellipsis() ? " (plus '...')" : ""));
      ellipsis_dims[i] = rank - letters;
      ellipsis = std::max(ellipsis, ellipsis_dims[i]);
    }

    // Label every dim; check extents agree (equal, or 1 across operands: broadcast).
    std::vector<Operand> operands(n_inputs);
    std::vector<int64_t> extent(static_cast<size_t>(kEllipsisBase + ellipsis), -1);
    for (size_t i = 0; i < n_inputs; ++i) {
      Operand& op = operands[i];
      op.data = ctx.input(i);
      for (int l : equation_.inputs[i].labels) {
        if (l != kEllipsisMarker) {
          op.labels.push_back(l);
          continue;
        }
        for (int64_t j = 0; j < ellipsis_dims[i]; ++j)
          op.labels.push_back(kEllipsisBase + static_cast<int>(ellipsis - ellipsis_dims[i] + j));
      }
      for (size_t d = 0; d < op.labels.size(); ++d) {
        const int l = op.labels[d];
        const int64_t s = op.data.dim(d), own = op.size_of(l);
        SQ_CHECK(s == own, ErrorKind::kInvalidArgument,
                 who + ": label " + label_name(l) + " repeats in input " + std::to_string(i) + " with extents " +
                     std::to_string(own) + " and " + std::to_string(s) + " (a diagonal needs equal extents)");
        int64_t& e = extent[l];
        if (e == -1 || e == 1) e = s;
        else SQ_CHECK(s == 1 || s == e, ErrorKind::kInvalidArgument,
                      who + ": label " + label_name(l) + " has extent " + std::to_string(s) + " in input " +
                          std::to_string(i) + " but " + std::to_string(e) + " elsewhere");
      }
    }

    std::vector<int> out_labels;
    for (int l : equation_.output.labels) {
      if (l != kEllipsisMarker) {
        out_labels.push_back(l);
        continue;
      }
      for (int64_t j = 0; j < ellipsis; ++j) out_labels.push_back(kEllipsisBase + static_cast<int>(j));
    }
    SQ_CHECK(ellipsis == 0 || equation_.output.has_ellipsis(), ErrorKind::kInvalidArgument,
             who + ": the inputs' '...' covers " + std::to_string(ellipsis) +
                 " dims but the output has no '...' to put them in");
    Shape out_shape;
    for (int l : out_labels) out_shape.push_back(extent[l]);

    // needed_after[i][l]: label l is used by the output or by an operand after i.
    std::vector<bool> needed(extent.size(), false);
    for (int l : out_labels) needed[l] = true;
    std::vector<std::vector<bool>> needed_after(n_inputs);
    for (size_t i = n_inputs; i-- > 0;) {
      needed_after[i] = needed;
      for (int l : operands[i].labels) needed[l] = true;
    }

    Operand acc = std::move(operands[0]);
    for (size_t i = 1; i < n_inputs; ++i) acc = contract_pair<T>(acc, operands[i], needed_after[i]);
    // The result is fresh storage, or for an identity equation on one operand the input itself (a
    // view, as Identity gives).
    ctx.set_output(0, reduce_to<T>(acc, out_labels, out_shape).data);
  }

  const ir::Node& node_;
  std::string equation_text_;
  Equation equation_;
};

}  // namespace

std::unique_ptr<Kernel> make_einsum(const KernelInit& init) { return std::make_unique<EinsumKernel>(init); }

}  // namespace slimquant::runtime::misc
