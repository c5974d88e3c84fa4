// Runs ONNX's backend node test cases (Debian's libonnx-testdata) for every op type the runtime
// registers and prints a table: op, cases, passed, not supported (with the reason), failed.
// Exit status is non-zero if any case of a claimed op fails. Usage:
//   slimquant_conformance [--data DIR] [--op OpType] [--verbose]
#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <iostream>
#include <map>
#include <set>

#include "slimquant/ir/onnx_io.h"
#include "slimquant/runtime/kernel.h"
#include "slimquant/runtime/session.h"

namespace fs = std::filesystem;
using namespace slimquant;

namespace {

struct Row {
  int cases = 0, passed = 0, unsupported = 0, failed = 0, deviating = 0;
  std::vector<std::string> notes;
};

// Cases whose data disagrees with the operator's specification or its own model, where ONNX
// Runtime behaves as we do: reported apart, with the reason, instead of as failures.
const std::map<std::string, std::string> kDataDeviations = {
    {"test_cast_FLOAT_to_BFLOAT16", "the data truncates to bfloat16; we and ONNX Runtime round to nearest even"},
    {"test_castlike_FLOAT_to_BFLOAT16", "the data feeds 'like' as [1], the model declares [3x4] (and truncates)"},
    {"test_castlike_FLOAT_to_BFLOAT16_expanded", "the data feeds 'like' as [1], the model declares [3x4]"},
    {"test_castlike_BFLOAT16_to_FLOAT", "the data feeds 'like' as [1], the model declares [3x4]"},
    {"test_castlike_BFLOAT16_to_FLOAT_expanded", "the data feeds 'like' as [1], the model declares [3x4]"},
};

std::string compare_tensors(const Tensor& got, const Tensor& want);

// Compares with the ONNX backend tests' style tolerance (rtol 1e-3, atol 1e-5); NaN == NaN.
// Sequences element by element (an empty one's element type is not in the data), optionals by
// presence.
std::string compare(const Tensor& got, const Tensor& want) {
  if (got.defined() != want.defined())
    return got.defined() ? "got a value, expected an empty optional" : "got an empty optional, expected a value";
  if (!want.defined()) return "";
  if (got.is_sequence() != want.is_sequence()) return got.is_sequence() ? "got a sequence, expected a tensor" : "got a tensor, expected a sequence";
  if (!want.is_sequence()) return compare_tensors(got, want);
  if (got.elements().size() != want.elements().size())
    return "sequence of " + std::to_string(got.elements().size()) + " != expected " + std::to_string(want.elements().size());
  for (size_t i = 0; i < want.elements().size(); ++i)
    if (std::string diff = compare_tensors(got.elements()[i], want.elements()[i]); !diff.empty())
      return "sequence element " + std::to_string(i) + ": " + diff;
  return "";
}

std::string compare_tensors(const Tensor& got, const Tensor& want) {
  if (got.shape() != want.shape()) return "shape " + shape_str(got.shape()) + " != expected " + shape_str(want.shape());
  if (got.dtype() != want.dtype())
    return std::string("dtype ") + dtype_name(got.dtype()) + " != expected " + dtype_name(want.dtype());
  if (dtype_is_float(want.dtype())) {
    Tensor g = got.cast(DType::kFloat64), w = want.cast(DType::kFloat64);
    const double* gp = g.data<double>();
    const double* wp = w.data<double>();
    for (int64_t i = 0; i < g.numel(); ++i) {
      if (std::isnan(wp[i]) && std::isnan(gp[i])) continue;
      if (std::isinf(wp[i]) && gp[i] == wp[i]) continue;
      if (!(std::abs(gp[i] - wp[i]) <= 1e-5 + 1e-3 * std::abs(wp[i])))
        return "element " + std::to_string(i) + ": got " + std::to_string(gp[i]) + ", expected " + std::to_string(wp[i]);
    }
    return "";
  }
  if (std::memcmp(got.raw(), want.raw(), want.nbytes()) != 0) {
    auto gv = got.to_int64_vector(), wv = want.to_int64_vector();
    for (size_t i = 0; i < gv.size(); ++i)
      if (gv[i] != wv[i])
        return "element " + std::to_string(i) + ": got " + std::to_string(gv[i]) + ", expected " + std::to_string(wv[i]);
  }
  return "";
}

std::vector<fs::path> sorted_files(const fs::path& dir, const std::string& prefix) {
  std::vector<fs::path> files;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().filename().string().rfind(prefix, 0) == 0) files.push_back(e.path());
  // input_10 after input_9
  std::sort(files.begin(), files.end(), [&](const fs::path& a, const fs::path& b) {
    auto num = [&](const fs::path& p) { return std::stoi(p.stem().string().substr(prefix.size())); };
    return num(a) < num(b);
  });
  return files;
}

// Returns "" on pass; throws slimquant::Error on unsupported/other errors.
std::string run_case(const fs::path& dir) {
  ir::Graph g = ir::load_onnx((dir / "model.onnx").string());
  // The node test data writes bfloat16 tensors as UINT16 holding the bits; read them as values.
  const std::map<std::string, int> stored = g.stored_float_types;
  auto as_declared = [&](const std::string& name, Tensor t) {
    const auto it = stored.find(name);
    if (it == stored.end() || it->second != kOnnxBFloat16 || t.dtype() != DType::kUInt16) return t;
    Tensor values(DType::kFloat32, t.shape());
    for (int64_t i = 0; i < t.numel(); ++i) values.data<float>()[i] = float_from_16bit(t.data<uint16_t>()[i], kOnnxBFloat16);
    return values;
  };
  // Sequence and optional values are stored as SequenceProto / OptionalProto.
  const std::set<std::string> sequences = g.sequence_values, optionals = g.optional_values;
  // The files are numbered in the graph's input (output) order, which says what each one holds.
  auto read_value = [&](const fs::path& file, std::string& name, const std::string& declared_name) {
    if (optionals.count(declared_name)) return ir::read_optional_pb(file.string(), &name);
    if (sequences.count(declared_name)) return ir::read_sequence_pb(file.string(), &name);
    return ir::read_tensor_pb(file.string(), &name);
  };
  std::vector<std::string> input_names;
  for (const auto& in : g.inputs) input_names.push_back(in.name);
  std::vector<std::string> output_names;
  for (const auto& o : g.outputs) output_names.push_back(o.name);
  runtime::Session session(std::move(g));
  for (const auto& e : fs::directory_iterator(dir)) {
    if (!e.is_directory() || e.path().filename().string().rfind("test_data_set_", 0) != 0) continue;
    std::map<std::string, Tensor> feeds;
    auto inputs = sorted_files(e.path(), "input_");
    for (size_t i = 0; i < inputs.size(); ++i) {
      std::string name;
      Tensor t = read_value(inputs[i], name, i < input_names.size() ? input_names[i] : "");
      if (name.empty() && i < input_names.size()) name = input_names[i];
      feeds[name] = as_declared(name, t);
    }
    auto result = session.run(feeds);
    auto outputs = sorted_files(e.path(), "output_");
    for (size_t i = 0; i < outputs.size(); ++i) {
      std::string name;
      Tensor want = read_value(outputs[i], name, i < output_names.size() ? output_names[i] : "");
      if (name.empty() && i < output_names.size()) name = output_names[i];
      want = as_declared(name, want);
      auto it = result.find(name);
      if (it == result.end()) return "output '" + name + "' missing";
      std::string diff = compare(it->second, want);
      if (!diff.empty()) return e.path().filename().string() + " output '" + name + "': " + diff;
    }
  }
  return "";
}

}  // namespace

int main(int argc, char** argv) {
  fs::path data = "/usr/share/libonnx-testdata/data/node";
  std::string only_op;
  bool verbose = false;
  for (int i = 1; i < argc; ++i) {
    std::string a = argv[i];
    if (a == "--data" && i + 1 < argc) data = argv[++i];
    else if (a == "--op" && i + 1 < argc) only_op = argv[++i];
    else if (a == "--verbose") verbose = true;
    else {
      std::cerr << "usage: slimquant_conformance [--data DIR] [--op OpType] [--verbose]\n";
      return 2;
    }
  }
  if (!fs::is_directory(data)) {
    std::cerr << "ONNX node test data not found at " << data << " (install Debian's libonnx-testdata)\n";
    return 2;
  }
  const auto& registry = runtime::KernelRegistry::instance();
  std::vector<std::string> ops = registry.op_types();
  std::set<std::string> claimed(ops.begin(), ops.end());

  std::vector<fs::path> cases;
  for (const auto& e : fs::directory_iterator(data))
    if (e.is_directory() && fs::exists(e.path() / "model.onnx")) cases.push_back(e.path());
  std::sort(cases.begin(), cases.end());

  std::map<std::string, Row> table;
  for (const auto& dir : cases) {
    const std::string name = dir.filename().string();
    // The case's op: the single node of the model; function-expanded cases are keyed by the ops
    // they contain, all of which must be claimed.
    std::string op;
    bool in_scope = true;
    try {
      ir::Graph g = ir::load_onnx((dir / "model.onnx").string());
      if (g.nodes.empty()) continue;
      const bool expanded = name.find("_expanded") != std::string::npos;
      for (const auto& n : g.nodes)
        if (!n.domain.empty() || !claimed.count(n.op_type)) in_scope = false;
      op = expanded ? "(expanded) " : "";
      op += g.nodes.size() == 1 || !expanded ? g.nodes[0].op_type : "function graphs";
      if (!expanded && g.nodes.size() == 1 && !claimed.count(g.nodes[0].op_type)) in_scope = false;
      if (!expanded && !claimed.count(g.nodes[0].op_type)) in_scope = false;
    } catch (const Error& e) {
      // A model we cannot import (e.g. sequence-typed inputs): list it under the claimed op its
      // directory is named after, so it is reported rather than silently skipped.
      in_scope = false;
      std::string lower_name = name;
      for (const auto& claimed_op : ops) {
        std::string lower_op;
        for (char ch : claimed_op) lower_op += static_cast<char>(std::tolower(static_cast<unsigned char>(ch)));
        if (lower_name.rfind("test_" + lower_op + "_", 0) == 0 || lower_name == "test_" + lower_op) {
          if (!only_op.empty() && claimed_op != only_op) break;
          Row& row = table[claimed_op];
          ++row.cases;
          (e.kind() == ErrorKind::kUnsupported ? row.unsupported : row.failed)++;
          row.notes.push_back(std::string(e.kind() == ErrorKind::kUnsupported ? "not supported " : "FAIL ") + name +
                              ": " + e.what());
          break;
        }
      }
    }
    if (!in_scope) continue;
    if (!only_op.empty() && op != only_op && op != "(expanded) " + only_op) continue;
    Row& row = table[op];
    ++row.cases;
    const auto deviation = kDataDeviations.find(name);
    auto fail_case = [&](const std::string& why) {
      if (deviation != kDataDeviations.end()) {
        ++row.deviating;
        row.notes.push_back("deviates " + name + ": " + deviation->second + " (" + why + ")");
      } else {
        ++row.failed;
        row.notes.push_back("FAIL " + name + ": " + why);
      }
    };
    try {
      std::string diff = run_case(dir);
      if (diff.empty()) {
        ++row.passed;
      } else {
        fail_case(diff);
      }
    } catch (const Error& e) {
      if (e.kind() == ErrorKind::kUnsupported) {
        ++row.unsupported;
        row.notes.push_back("not supported " + name + ": " + e.what());
      } else {
        fail_case(e.what());
      }
    } catch (const std::exception& e) {
      ++row.failed;
      row.notes.push_back("FAIL " + name + ": " + e.what());
    }
  }

  Row total;
  std::printf("%-34s %6s %7s %12s %7s %9s\n", "op", "cases", "passed", "unsupported", "failed", "deviates");
  for (const auto& [op, row] : table) {
    std::printf("%-34s %6d %7d %12d %7d %9d\n", op.c_str(), row.cases, row.passed, row.unsupported, row.failed,
                row.deviating);
    total.cases += row.cases;
    total.passed += row.passed;
    total.unsupported += row.unsupported;
    total.failed += row.failed;
    total.deviating += row.deviating;
  }
  std::printf("%-34s %6d %7d %12d %7d %9d\n", "TOTAL", total.cases, total.passed, total.unsupported, total.failed,
              total.deviating);
  for (const auto& [op, row] : table)
    for (const auto& note : row.notes)
      if (verbose || note.rfind("FAIL", 0) == 0 || note.rfind("not supported", 0) == 0 || note.rfind("deviates", 0) == 0)
        std::printf("  %s\n", note.c_str());
  // Claimed ops with no test data are listed so nobody mistakes silence for coverage.
  std::vector<std::string> untested;
  for (const auto& op : ops)
    if (!table.count(op)) untested.push_back(op);
  if (!untested.empty() && only_op.empty()) {
    std::printf("registered ops without node test data:");
    for (const auto& op : untested) std::printf(" %s", op.c_str());
    std::printf("\n");
  }
  return total.failed == 0 ? 0 : 1;
}
