// The compiled part of the Python package: thin bindings of the library's classes and functions
// (runtime::Session, quant::QuantConfig / PTQ / PostTrainingQuantization, the PTQ and QAT analyses,
// the target search and the layer statistics). The source documents' parameter handling lives in
// python/slimquant/*.py; this file only adapts types:
// - numpy arrays <-> Tensor: inputs are wrapped without a copy when they are C-contiguous and
//   64-byte aligned (the library's storage alignment), copied otherwise; outputs always share the
//   Tensor's storage (the array keeps it alive).
// - Python data (an iterable, or a callable returning an iterator) -> the library's generators,
//   one item per call, each a dict of input name -> array, an array, or a tuple/list whose first
//   element is one of those (array, label).
// - eval_function (a Python callable taking a Session) -> std::function<double(Session&)>.
// The GIL is released around all long C++ work and taken again for every call back into Python;
// a Python exception raised there travels through the C++ code as pybind11::error_already_set
// (the library saves its checkpoint after each finished step) and reaches the caller unchanged.
#include <pybind11/functional.h>
#include <pybind11/numpy.h>
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>
#include <pybind11/stl/filesystem.h>

#include <omp.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "slimquant/analysis/analysis_plots.h"
#include "slimquant/analysis/checkpoint.h"
#include "slimquant/analysis/ptq_analysis.h"
#include "slimquant/analysis/qat_analysis.h"
#include "slimquant/analysis/statistics.h"
#include "slimquant/analysis/target_search.h"
#include "slimquant/core/error.h"
#include "slimquant/core/progress.h"
#include "slimquant/data/dataset.h"
#include "slimquant/ir/onnx_io.h"
#include "slimquant/quant/lowering.h"
#include "slimquant/quant/observer.h"
#include "slimquant/quant/post_training_quantization.h"
#include "slimquant/quant/ptq.h"
#include "slimquant/quant/quant_config.h"
#include "slimquant/runtime/session.h"
#include "slimquant/train/qat.h"

namespace py = pybind11;
using namespace slimquant;

namespace {

// ---- numpy <-> Tensor

DType dtype_from_numpy(const py::dtype& dt, const std::string& what) {
  const char kind = dt.kind();
  const auto size = dt.itemsize();
  if (kind == 'f' && size == 4) return DType::kFloat32;
  if (kind == 'f' && size == 8) return DType::kFloat64;
  if (kind == 'b') return DType::kBool;
  if (kind == 'i' && size == 1) return DType::kInt8;
  if (kind == 'i' && size == 2) return DType::kInt16;
  if (kind == 'i' && size == 4) return DType::kInt32;
  if (kind == 'i' && size == 8) return DType::kInt64;
  if (kind == 'u' && size == 1) return DType::kUInt8;
  if (kind == 'u' && size == 2) return DType::kUInt16;
  if (kind == 'u' && size == 4) return DType::kUInt32;
  if (kind == 'u' && size == 8) return DType::kUInt64;
  fail(ErrorKind::kInvalidArgument,
       what + ": numpy dtype " + std::string(py::str(static_cast<const py::handle&>(dt))) + " is not supported (float32, float64, bool, int8..int64, uint8..uint64)");
}

py::dtype numpy_dtype(DType t) {
  switch (t) {
    case DType::kFloat32: return py::dtype::of<float>();
    case DType::kFloat64: return py::dtype::of<double>();
    case DType::kBool: return py::dtype::of<bool>();
    case DType::kInt8: return py::dtype::of<int8_t>();
    case DType::kInt16: return py::dtype::of<int16_t>();
    case DType::kInt32: return py::dtype::of<int32_t>();
    case DType::kInt64: return py::dtype::of<int64_t>();
    case DType::kUInt8: return py::dtype::of<uint8_t>();
    case DType::kUInt16: return py::dtype::of<uint16_t>();
    case DType::kUInt32: return py::dtype::of<uint32_t>();
    case DType::kUInt64: return py::dtype::of<uint64_t>();
    default: break;
  }
  fail(ErrorKind::kUnsupported, std::string("tensor dtype ") + dtype_name(t) + " has no numpy equivalent");
}

// Holds a Python object from C++ code that may run without the GIL: dropping it takes the GIL.
std::shared_ptr<py::object> hold(py::object o) {
  return std::shared_ptr<py::object>(new py::object(std::move(o)), [](py::object* p) {
    py::gil_scoped_acquire gil;
    delete p;
  });
}

// Any array-like (numpy array, list, torch CPU tensor via __array__) -> Tensor. GIL held.
Tensor to_tensor(py::handle obj, const std::string& what) {
  py::array any = py::array::ensure(obj);
  if (!any) {
    PyErr_Clear();
    fail(ErrorKind::kInvalidArgument, what + ": expected an array, got " + std::string(py::str(py::type::of(obj))));
  }
  const DType dtype = dtype_from_numpy(any.dtype(), what);
  py::array arr = py::array::ensure(any, py::array::c_style);
  Shape shape(arr.shape(), arr.shape() + arr.ndim());
  const size_t bytes = checked_tensor_bytes(dtype, shape, what);
  const void* data = arr.data();
  if (reinterpret_cast<uintptr_t>(data) % 64 == 0 && bytes > 0) {
    // No copy: the Tensor's storage keeps the array alive.
    auto keep = hold(arr);
    std::shared_ptr<std::byte[]> storage(static_cast<std::byte*>(const_cast<void*>(data)),
                                         [keep](std::byte*) mutable { keep.reset(); });
    return Tensor(dtype, std::move(shape), std::move(storage), bytes);
  }
  Tensor t(dtype, std::move(shape));
  if (bytes) std::memcpy(t.raw(), data, bytes);
  return t;
}

// Tensor -> numpy array sharing its storage.
py::array to_numpy(const Tensor& t) {
  std::vector<py::ssize_t> shape(t.shape().begin(), t.shape().end());
  if (!t.storage() || t.numel() == 0) return py::array(numpy_dtype(t.dtype()), shape);
  auto* owner = new std::shared_ptr<std::byte[]>(t.storage());
  py::capsule base(owner, [](void* p) { delete static_cast<std::shared_ptr<std::byte[]>*>(p); });
  return py::array(numpy_dtype(t.dtype()), shape, t.raw(), base);
}

// A session output as Python: an array, a list of arrays (a sequence) or None (an empty optional).
py::object output_to_python(const Tensor& t) {
  if (!t.defined()) return py::none();
  if (!t.is_sequence()) return to_numpy(t);
  py::list elements;
  for (const Tensor& e : t.elements()) elements.append(to_numpy(e));
  return elements;
}

// One item of user data -> feeds by input name ("" for a bare array: the model's only input).
std::map<std::string, Tensor> to_feeds(py::handle item, const std::string& what) {
  std::map<std::string, Tensor> feeds;
  if (py::isinstance<py::dict>(item)) {
    for (auto [k, v] : py::reinterpret_borrow<py::dict>(item)) {
      const std::string name = py::str(k);
      feeds[name] = to_tensor(v, what + " input '" + name + "'");
    }
    SQ_CHECK(!feeds.empty(), ErrorKind::kInvalidArgument, what + ": an empty dict");
    return feeds;
  }
  if (py::isinstance<py::tuple>(item) || py::isinstance<py::list>(item)) {
    py::sequence seq = py::reinterpret_borrow<py::sequence>(item);
    SQ_CHECK(py::len(seq) > 0, ErrorKind::kInvalidArgument, what + ": an empty tuple or list");
    // (array, label) or [array, label]: the label is not needed for calibration.
    py::object first = seq[0];
    if (py::isinstance<py::dict>(first) || py::hasattr(first, "__array__")) return to_feeds(first, what);
  }
  feeds[""] = to_tensor(item, what);
  return feeds;
}

// "" (a bare array) becomes the name of the model's only input.
std::map<std::string, Tensor> name_feeds(std::map<std::string, Tensor> feeds, const std::vector<ir::ValueInfo>& inputs) {
  auto it = feeds.find("");
  if (it == feeds.end()) return feeds;
  SQ_CHECK(inputs.size() == 1, ErrorKind::kInvalidArgument,
           "a bare array for a model with " + std::to_string(inputs.size()) + " inputs; give a dict of input name -> array");
  Tensor t = std::move(it->second);
  feeds.erase(it);
  feeds[inputs[0].name] = std::move(t);
  return feeds;
}

// Feeds for one session run: "" becomes the only input's name.
std::map<std::string, Tensor> named_feeds(py::handle item, const runtime::Session& s) {
  auto feeds = to_feeds(item, "Session.run");
  if (auto it = feeds.find(""); it != feeds.end()) {
    const auto names = s.input_names();
    SQ_CHECK(names.size() == 1, ErrorKind::kInvalidArgument,
             "Session.run: a bare array for a model with " + std::to_string(names.size()) +
                 " inputs; give a dict of input name -> array");
    Tensor t = std::move(it->second);
    feeds.erase(it);
    feeds[names[0]] = std::move(t);
  }
  return feeds;
}

// A Python data source (iterable, or callable returning an iterator) as a generator of feeds;
// each call to the result takes the GIL. The iteration starts at the first call.
std::function<std::optional<std::map<std::string, Tensor>>()> make_generator(py::object source, std::string what) {
  auto src = hold(std::move(source));
  auto it = std::make_shared<std::shared_ptr<py::object>>();
  return [src, it, what]() -> std::optional<std::map<std::string, Tensor>> {
    py::gil_scoped_acquire gil;
    if (!*it) {
      py::object s = *src;
      py::object iterable = (PyCallable_Check(s.ptr()) && !py::hasattr(s, "__iter__")) ? s() : s;
      *it = hold(py::reinterpret_steal<py::object>(PyObject_GetIter(iterable.ptr())));
      if (!**it) throw py::error_already_set();
    }
    py::object next = py::reinterpret_steal<py::object>(PyIter_Next((*it)->ptr()));
    if (!next) {
      if (PyErr_Occurred()) throw py::error_already_set();
      return std::nullopt;
    }
    return to_feeds(next, what);
  };
}

// ---- Session

// A Session owned by Python, or one the library lends to an eval_function for the duration of the
// call (then `borrowed` is cleared afterwards, so a kept reference fails clearly instead of
// touching freed memory).
struct SessionHandle {
  std::shared_ptr<runtime::Session> owned;
  runtime::Session* borrowed = nullptr;
  bool int8 = false;
  runtime::Session& get() const {
    if (owned) return *owned;
    SQ_CHECK(borrowed != nullptr, ErrorKind::kInvalidArgument,
             "this Session was lent to one eval_function call and is gone: keep results, not the session");
    return *borrowed;
  }
};

py::list value_infos(const std::vector<ir::ValueInfo>& values) {
  py::list out;
  py::object info_type = py::module_::import("slimquant._types").attr("ValueInfo");
  for (const auto& v : values) {
    py::object shape = py::none();
    if (v.dims) {
      py::list dims;
      for (const auto& d : *v.dims) {
        if (d.known()) dims.append(d.value);
        else if (!d.param.empty()) dims.append(d.param);
        else dims.append(py::none());
      }
      shape = dims;
    }
    py::object dtype = v.dtype == DType::kUndefined ? py::object(py::none()) : py::object(py::str(dtype_name(v.dtype)));
    out.append(info_type(v.name, dtype, shape));
  }
  return out;
}

std::shared_ptr<SessionHandle> make_session(const ir::Graph& graph, std::optional<bool> int8, int num_threads) {
  runtime::SessionOptions so;
  so.num_threads = num_threads;
  const bool qdq = quant::has_qdq_nodes(graph);
  const bool use_int8 = int8.value_or(qdq);
  SQ_CHECK(!use_int8 || qdq, ErrorKind::kInvalidArgument,
           "Session(int8=True): the model has no QuantizeLinear/DequantizeLinear nodes (not a QDQ model)");
  auto h = std::make_shared<SessionHandle>();
  py::gil_scoped_release release;
  h->owned = std::make_shared<runtime::Session>(use_int8 ? quant::make_int8_session(graph, so) : runtime::Session(graph, so));
  h->int8 = use_int8;
  return h;
}

// ---- eval_function

std::function<double(runtime::Session&)> wrap_eval_function(py::object fn) {
  SQ_CHECK(PyCallable_Check(fn.ptr()), ErrorKind::kInvalidArgument,
           "eval_function must be a callable taking a slimquant.Session and returning a float");
  auto f = hold(std::move(fn));
  return [f](runtime::Session& s) -> double {
    py::gil_scoped_acquire gil;
    auto handle = std::make_shared<SessionHandle>();
    handle->borrowed = &s;
    py::object result;
    try {
      result = (*f)(handle);
    } catch (...) {
      handle->borrowed = nullptr;
      throw;
    }
    handle->borrowed = nullptr;
    double v = 0;
    try {
      v = result.cast<double>();
    } catch (const py::cast_error&) {
      throw py::type_error("eval_function must return a float, got " + std::string(py::str(py::type::of(result))));
    }
    if (!std::isfinite(v)) throw py::value_error("eval_function returned " + std::to_string(v) + ", not a finite number");
    return v;
  };
}

py::object json_to_python(const nlohmann::json& j) {
  return py::module_::import("json").attr("loads")(j.dump());
}
nlohmann::json json_from_python(py::handle o) {
  return nlohmann::json::parse(std::string(py::str(py::module_::import("json").attr("dumps")(o))));
}

py::dict report_dict(const analysis::SensitivityReport& r) {
  py::dict d = json_to_python(r.to_json());
  d["seconds"] = r.seconds;
  d["batches_resumed"] = r.batches_resumed;
  return d;
}

// A data set over samples held in memory (the statistics mode and QAT read a Dataset): [N, ...]
// float32, with N class labels or none.
class ArrayDataset : public data::Dataset {
 public:
  ArrayDataset(std::string name, Tensor samples, std::vector<int64_t> labels = {})
      : name_(std::move(name)), samples_(std::move(samples)), labels_(std::move(labels)) {
    SQ_CHECK(samples_.rank() >= 1 && samples_.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument,
             name_ + ": samples must be a float32 array [N, ...]");
    SQ_CHECK(labels_.empty() || labels_.size() == size(), ErrorKind::kInvalidArgument,
             name_ + ": " + std::to_string(labels_.size()) + " labels for " + std::to_string(size()) + " samples");
    shape_.assign(samples_.shape().begin() + 1, samples_.shape().end());
  }
  const std::string& name() const override { return name_; }
  size_t size() const override { return static_cast<size_t>(samples_.dim(0)); }
  const Shape& sample_shape() const override { return shape_; }
  void load(size_t index, float* dst) const override {
    SQ_CHECK(index < size(), ErrorKind::kInvalidArgument, "sample index out of range");
    const size_t n = static_cast<size_t>(shape_numel(shape_));
    std::memcpy(dst, samples_.data<float>() + index * n, n * sizeof(float));
  }
  bool has_labels() const override { return !labels_.empty(); }
  int64_t label(size_t index) const override {
    SQ_CHECK(index < labels_.size(), ErrorKind::kInvalidArgument, name_ + " has no label for sample " + std::to_string(index));
    return labels_[index];
  }

 private:
  std::string name_;
  Tensor samples_;
  std::vector<int64_t> labels_;
  Shape shape_;
};

// (samples [N, ...] float32, labels [N] int64 or None) from Python -> a data set owning copies.
std::unique_ptr<data::Dataset> dataset_from_arrays(py::handle samples, py::handle labels, const std::string& name) {
  Tensor x = to_tensor(samples, name + " samples");
  SQ_CHECK(x.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument, name + ": samples must be float32");
  std::vector<int64_t> y;
  if (!labels.is_none()) {
    Tensor l = to_tensor(labels, name + " labels");
    SQ_CHECK(l.dtype() == DType::kInt64 && l.rank() == 1, ErrorKind::kInvalidArgument,
             name + ": labels must be a 1-D int64 array");
    y.assign(l.data<int64_t>(), l.data<int64_t>() + l.numel());
  }
  return std::make_unique<ArrayDataset>(name, x.clone(), std::move(y));
}

// Batches of the data (each [n, ...] for the single model input, float32) stacked into one data set.
std::unique_ptr<data::Dataset> dataset_from_batches(const std::vector<Tensor>& batches, const std::string& name) {
  SQ_CHECK(!batches.empty(), ErrorKind::kInvalidData, name + ": no batches");
  Shape shape = batches[0].shape();
  SQ_CHECK(!shape.empty(), ErrorKind::kInvalidArgument, name + ": batches need a batch dimension");
  int64_t n = 0;
  for (const auto& b : batches) {
    SQ_CHECK(b.rank() == shape.size() && std::equal(b.shape().begin() + 1, b.shape().end(), shape.begin() + 1),
             ErrorKind::kInvalidArgument, name + ": batches differ in sample shape");
    n += b.dim(0);
  }
  shape[0] = n;
  Tensor all(DType::kFloat32, shape);
  auto* dst = all.data<float>();
  for (const auto& b : batches) {
    Tensor f = b.dtype() == DType::kFloat32 ? b : b.cast(DType::kFloat32);
    std::memcpy(dst, f.raw(), f.nbytes());
    dst += f.numel();
  }
  return std::make_unique<ArrayDataset>(name, std::move(all));
}

// Limits this thread's OpenMP teams for one call into the engine (QATOptions::num_threads > 0), as
// the CLI's --threads does for the whole process: training runs many small parallel regions, which
// a busy machine slows down many times over with more threads than free cores.
class ThreadLimit {
 public:
  explicit ThreadLimit(int n) : previous_(omp_get_max_threads()), active_(n > 0) {
    if (active_) omp_set_num_threads(n);
  }
  ~ThreadLimit() {
    if (active_) omp_set_num_threads(previous_);
  }
  ThreadLimit(const ThreadLimit&) = delete;
  ThreadLimit& operator=(const ThreadLimit&) = delete;

 private:
  int previous_;
  bool active_;
};

// ---- errors

void register_errors(py::module_& m) {
  static py::exception<Error> base(m, "Error", PyExc_RuntimeError);
  auto sub = [&](const char* name, PyObject* extra) {
    py::tuple bases = extra ? py::make_tuple(base, py::handle(extra)) : py::make_tuple(base);
    const std::string qualified = std::string("slimquant.") + name;
    PyObject* cls = PyErr_NewException(qualified.c_str(), bases.ptr(), nullptr);
    m.add_object(name, py::handle(cls));
    return cls;
  };
  static PyObject* invalid_model = sub("InvalidModelError", nullptr);
  static PyObject* unsupported = sub("UnsupportedError", PyExc_NotImplementedError);
  static PyObject* invalid_argument = sub("InvalidArgumentError", PyExc_ValueError);
  static PyObject* invalid_data = sub("InvalidDataError", PyExc_ValueError);
  static PyObject* io = sub("IoError", nullptr);
  py::register_exception_translator([](std::exception_ptr p) {
    try {
      if (p) std::rethrow_exception(p);
    } catch (const Error& e) {
      PyObject* cls = base.ptr();
      switch (e.kind()) {
        case ErrorKind::kInvalidModel: cls = invalid_model; break;
        case ErrorKind::kUnsupported: cls = unsupported; break;
        case ErrorKind::kInvalidArgument: cls = invalid_argument; break;
        case ErrorKind::kInvalidData: cls = invalid_data; break;
        case ErrorKind::kIo: cls = io; break;
        case ErrorKind::kInternal: break;
      }
      PyErr_SetString(cls, e.what());
    }
  });
}

}  // namespace

PYBIND11_MODULE(_slimquant, m) {
  m.doc() = "slimquant's compiled core; use the `slimquant` package";
  register_errors(m);

  m.def("set_progress", &Progress::set_enabled, py::arg("enabled"),
        "Progress lines on stderr (default: on when stderr is a terminal, as in the CLI).");
  m.def("activation_algos", &quant::activation_algos);
  m.def("weight_algos", &quant::weight_algos);
  m.def("onnx_op_types_for", &quant::onnx_op_types_for, py::arg("name"),
        "The ONNX op types a source-document op name (conv2d, mul, ...) stands for; other names unchanged.");
  m.def("builtin_quantizable_op_types", [] {
    std::vector<std::string> out;
    for (const auto& [op, spec] : quant::builtin_op_specs()) out.push_back(op);
    return out;
  });

  // ---- models
  py::class_<ir::Graph>(m, "Model", "An ONNX model in memory (slimquant.load_model, PTQ.convert, ...).")
      .def("save", [](const ir::Graph& g, const std::string& path) {
             py::gil_scoped_release release;
             ir::save_onnx(g, path);
           }, py::arg("path"), "Writes the model as ONNX (atomically).")
      .def_property_readonly("inputs", [](const ir::Graph& g) { return value_infos(g.inputs); })
      .def_property_readonly("outputs", [](const ir::Graph& g) { return value_infos(g.outputs); })
      .def_readonly("metadata", &ir::Graph::metadata)
      .def_property_readonly("num_nodes", [](const ir::Graph& g) { return g.nodes.size(); })
      .def("__repr__", [](const ir::Graph& g) {
        return "<slimquant.Model: " + std::to_string(g.nodes.size()) + " nodes, " + std::to_string(g.inputs.size()) +
               " inputs>";
      });
  m.def("load_model", [](const std::string& model_dir, const std::string& model_filename, const std::string& params_filename) {
          py::gil_scoped_release release;
          return ir::load_model(model_dir, model_filename, params_filename);
        }, py::arg("model_dir"), py::arg("model_filename") = "", py::arg("params_filename") = "");

  py::class_<SessionHandle, std::shared_ptr<SessionHandle>>(m, "Session")
      .def(py::init([](const ir::Graph& g, std::optional<bool> int8, int num_threads) { return make_session(g, int8, num_threads); }),
           py::arg("model"), py::arg("int8") = py::none(), py::arg("num_threads") = 0)
      .def(py::init([](const std::filesystem::path& path, std::optional<bool> int8, int num_threads) {
             ir::Graph g;
             {
               py::gil_scoped_release release;
               g = ir::load_model(path.string());
             }
             return make_session(g, int8, num_threads);
           }),
           py::arg("model"), py::arg("int8") = py::none(), py::arg("num_threads") = 0,
           "A model ready to run: an .onnx path (or folder holding one) or a Model. int8=None runs a QDQ model "
           "with integer kernels (as deployed) and a float model in FP32; int8=False simulates a QDQ model in float.")
      .def("run", [](const SessionHandle& h, py::handle feeds, std::optional<std::vector<std::string>> output_names) {
             runtime::Session& s = h.get();
             std::map<std::string, Tensor> in = named_feeds(feeds, s);
             runtime::RunOptions ro;
             if (output_names) ro.outputs = *output_names;
             std::map<std::string, Tensor> out;
             {
               py::gil_scoped_release release;
               out = s.run(in, ro);
             }
             // In the graph's output order (or the order asked for), not the map's.
             std::vector<std::string> order = ro.outputs;
             if (order.empty())
               for (const auto& o : s.outputs()) order.push_back(o.name);
             py::dict result;
             for (const auto& name : order) result[py::str(name)] = output_to_python(out.at(name));
             return result;
           },
           py::arg("feeds"), py::arg("output_names") = py::none(),
           "Runs a batch: feeds is a dict of input name -> array (or one array for a single-input model); returns a "
           "dict of output name -> array (the graph outputs, or output_names: any intermediate value).")
      .def_property_readonly("inputs", [](const SessionHandle& h) { return value_infos(h.get().inputs()); })
      .def_property_readonly("outputs", [](const SessionHandle& h) { return value_infos(h.get().outputs()); })
      .def_property_readonly("input_names", [](const SessionHandle& h) { return h.get().input_names(); })
      .def_property_readonly("output_names", [](const SessionHandle& h) {
        std::vector<std::string> names;
        for (const auto& o : h.get().outputs()) names.push_back(o.name);
        return names;
      })
      .def_property_readonly("is_int8", [](const SessionHandle& h) { return h.int8; },
                             "True when it runs a QDQ model with integer kernels")
      .def_property_readonly("model", [](const SessionHandle& h) { return ir::Graph(h.get().graph()); },
                             "The model as the session runs it (after its optimisation passes)");

  // ---- quantization config
  py::class_<quant::QuantRule>(m, "QuantRule")
      .def(py::init([](std::string activation, std::string weight, bool quantize, std::string aq, std::string wq) {
             return quant::QuantRule{std::move(activation), std::move(weight), quantize, std::move(aq), std::move(wq)};
           }),
           py::arg("activation") = "emd", py::arg("weight") = "channel_wise_abs_max", py::arg("quantize") = true,
           py::arg("activation_quanter") = "", py::arg("weight_quanter") = "")
      .def_readwrite("activation", &quant::QuantRule::activation)
      .def_readwrite("weight", &quant::QuantRule::weight)
      .def_readwrite("quantize", &quant::QuantRule::quantize)
      .def_readwrite("activation_quanter", &quant::QuantRule::activation_quanter)
      .def_readwrite("weight_quanter", &quant::QuantRule::weight_quanter);

  py::class_<quant::QuantConfig>(m, "_QuantConfig")
      .def(py::init<quant::QuantRule>(), py::arg("rule") = quant::QuantRule{})
      .def("add_type_config", [](quant::QuantConfig& c, const std::vector<std::string>& v, quant::QuantRule r) { c.add_type_config(v, r); })
      .def("add_name_config", [](quant::QuantConfig& c, const std::vector<std::string>& v, quant::QuantRule r) { c.add_name_config(v, r); })
      .def("add_layer_config", [](quant::QuantConfig& c, const std::vector<std::string>& v, quant::QuantRule r) { c.add_layer_config(v, r); })
      .def_property("global_rule", [](const quant::QuantConfig& c) { return c.global(); },
                    [](quant::QuantConfig& c, const quant::QuantRule& r) { c.global() = r; })
      .def_readwrite("quantizable_op_type", &quant::QuantConfig::quantizable_op_type)
      .def_readwrite("is_full_quantize", &quant::QuantConfig::is_full_quantize)
      .def_readwrite("skip_tensor_list", &quant::QuantConfig::skip_tensor_list)
      .def_readwrite("skip_quant", &quant::QuantConfig::skip_quant)
      .def_readwrite("asymmetric_activations", &quant::QuantConfig::asymmetric_activations)
      .def_readwrite("weight_bits", &quant::QuantConfig::weight_bits)
      .def_property("deploy_backend", [](const quant::QuantConfig& c) { return std::string(quant::deploy_backend_name(c.deploy_backend)); },
                    [](quant::QuantConfig& c, const std::string& b) { c.deploy_backend = quant::parse_deploy_backend(b); })
      .def_property("hist_percent", [](const quant::QuantConfig& c) { return c.observer_options.hist_percent; },
                    [](quant::QuantConfig& c, float v) { c.observer_options.hist_percent = v; })
      .def_property("bins", [](const quant::QuantConfig& c) { return c.observer_options.bins; },
                    [](quant::QuantConfig& c, int v) { c.observer_options.bins = v; })
      .def_readwrite("bias_correction", &quant::QuantConfig::bias_correction)
      // add_qat_layer_mapping: quantize `op_type` as the built-in type `like` is quantized
      // (Paddle maps a layer class to its quantized class; in ONNX that is an op type to a spec).
      .def("add_qat_layer_mapping_like", [](quant::QuantConfig& c, const std::string& op_type, const std::string& like) {
        const auto types = quant::onnx_op_types_for(like);
        const auto& specs = quant::builtin_op_specs();
        SQ_CHECK(types.size() == 1 && specs.count(types[0]), ErrorKind::kInvalidArgument,
                 "add_qat_layer_mapping: target '" + like + "' is not an op type slimquant quantizes (give one such "
                 "type, e.g. 'MatMul', 'Conv', 'Add', or a spec dict)");
        c.add_qat_layer_mapping(op_type, specs.at(types[0]));
      })
      // ... or with an explicit spec: activation_inputs (-1: all inputs), weight_input (-1: none)
      // quantized per channel along weight_axis.
      .def("add_qat_layer_mapping_spec", [](quant::QuantConfig& c, const std::string& op_type, std::vector<int> activation_inputs,
                                            int weight_input, int64_t weight_axis, bool compute_op) {
        quant::OpQuantSpec spec;
        spec.activation_inputs = std::move(activation_inputs);
        spec.weight_input = weight_input;
        if (weight_input >= 0) spec.weight_axis = [weight_axis](const ir::Node&, const Tensor&) { return weight_axis; };
        spec.compute_op = compute_op;
        c.add_qat_layer_mapping(op_type, std::move(spec));
      })
      .def("validate", &quant::QuantConfig::validate)
      .def("fingerprint", &quant::QuantConfig::fingerprint);
  m.def("load_quant_config_yaml", [](const std::string& path) {
    std::map<std::string, std::string> extra;
    quant::QuantConfig c = quant::load_quant_config_yaml(path, quant::QuantConfig(), &extra);
    return std::make_pair(c, extra);
  });

  // ---- PTQ: quantize / sample / convert
  py::class_<quant::PTQ>(m, "_PTQ")
      .def(py::init<quant::QuantConfig>())
      .def("quantize", [](quant::PTQ& p, const ir::Graph& g) {
        py::gil_scoped_release release;
        p.quantize(g);
      })
      .def("sample", [](quant::PTQ& p, py::handle feeds) {
        auto f = name_feeds(to_feeds(feeds, "PTQ calibration batch"), p.float_graph().inputs);
        py::gil_scoped_release release;
        p.sample(f);
      })
      .def_property_readonly("samples_seen", &quant::PTQ::samples_seen)
      .def("convert", [](const quant::PTQ& p, std::optional<std::vector<std::string>> only) {
        std::optional<std::set<std::string>> layers;
        if (only) layers = std::set<std::string>(only->begin(), only->end());
        py::gil_scoped_release release;
        return p.convert(layers);
      }, py::arg("only_layers") = py::none())
      .def_property_readonly("layers", [](const quant::PTQ& p) {
        py::list out;
        for (const auto& l : p.layers())
          out.append(py::dict(py::arg("name") = l.name, py::arg("op_type") = l.op_type,
                              py::arg("activations") = l.activations, py::arg("weight") = l.weight,
                              py::arg("weight_observer") = l.weight_observer));
        return out;
      })
      .def_property_readonly("float_model", &quant::PTQ::float_graph)
      .def_property_readonly("warnings", &quant::PTQ::warnings);

  // ---- PostTrainingQuantization (seed 002)
  using Options = quant::PostTrainingQuantizationOptions;
  py::class_<Options>(m, "_PostTrainingQuantizationOptions")
      .def(py::init<>())
      .def_readwrite("model_dir", &Options::model_dir)
      .def_readwrite("model_filename", &Options::model_filename)
      .def_readwrite("params_filename", &Options::params_filename)
      .def_readwrite("batch_size", &Options::batch_size)
      .def_readwrite("batch_nums", &Options::batch_nums)
      .def_readwrite("algo", &Options::algo)
      .def_readwrite("weight_quantize_type", &Options::weight_quantize_type)
      .def_readwrite("weight_bits", &Options::weight_bits)
      .def_readwrite("deploy_backend", &Options::deploy_backend)
      .def_readwrite("quantizable_op_type", &Options::quantizable_op_type)
      .def_readwrite("is_full_quantize", &Options::is_full_quantize)
      .def_readwrite("hist_percent", &Options::hist_percent)
      .def_readwrite("skip_tensor_list", &Options::skip_tensor_list)
      .def_readwrite("skip_quant", &Options::skip_quant)
      .def_readwrite("asymmetric_activations", &Options::asymmetric_activations)
      .def_readwrite("bias_correction", &Options::bias_correction)
      .def_readwrite("mode", &Options::mode)
      .def_readwrite("block_size", &Options::block_size)
      .def_readwrite("weight_rounding", &Options::weight_rounding)
      .def_readwrite("int4_activations", &Options::int4_activations)
      .def_readwrite("is_use_cache_file", &Options::is_use_cache_file)
      .def_readwrite("cache_dir", &Options::cache_dir)
      .def_readwrite("fallback_sqnr_db", &Options::fallback_sqnr_db)
      .def_readwrite("fallback_max_float_fraction", &Options::fallback_max_float_fraction)
      .def_readwrite("config", &Options::config)
      .def("set_sample_generator", [](Options& o, py::object source) {
        o.sample_generator = make_generator(std::move(source), "sample_generator item");
      })
      .def("set_batch_generator", [](Options& o, py::object source) {
        o.batch_generator = make_generator(std::move(source), "data_loader item");
      });

  py::class_<quant::PostTrainingQuantization>(m, "_PostTrainingQuantization")
      .def(py::init<Options>())
      .def("quantize", [](quant::PostTrainingQuantization& p) {
        py::gil_scoped_release release;
        return p.quantize();
      }, py::return_value_policy::copy)
      .def("save_quantized_model", [](quant::PostTrainingQuantization& p, const std::string& path) {
        py::gil_scoped_release release;
        p.save_quantized_model(path);
      })
      .def_property_readonly("float_model", &quant::PostTrainingQuantization::float_graph)
      .def_property_readonly("quantized_model", &quant::PostTrainingQuantization::quantized_graph)
      .def_property_readonly("ptq", &quant::PostTrainingQuantization::ptq, py::return_value_policy::reference_internal)
      .def_property_readonly("warnings", &quant::PostTrainingQuantization::warnings)
      .def_property_readonly("report", [](const quant::PostTrainingQuantization& p) {
        const auto& r = p.report();
        return py::dict(py::arg("batches") = r.batches, py::arg("samples") = r.samples,
                        py::arg("resumed_batches") = r.resumed_batches, py::arg("seconds") = r.seconds);
      })
      .def_property_readonly("float_layers", [](const quant::PostTrainingQuantization& p) { return p.fallback().float_layers; })
      .def_property_readonly("algo_choice", [](const quant::PostTrainingQuantization& p) {
        const quant::ActivationAlgoChoice& c = p.algo_choice();
        py::list scores;
        for (const auto& s : c.scores)
          scores.append(py::dict(py::arg("algo") = s.algo, py::arg("channel_wise_conv_inputs") = s.channel_wise_conv_inputs,
                                 py::arg("sqnr_db") = s.sqnr_db, py::arg("agreement") = s.agreement));
        return py::dict(py::arg("chosen") = c.chosen, py::arg("channel_wise_conv_inputs") = c.channel_wise_conv_inputs,
                        py::arg("samples") = c.samples, py::arg("held_back") = c.held_back, py::arg("scores") = scores,
                        py::arg("description") = c.chosen.empty() ? std::string() : c.describe());
      });

  // ---- quantization-aware training (seed 003's QAT): the library's train::QAT
  py::class_<train::QATOptions>(m, "_QATOptions")
      .def(py::init<>())
      .def_readwrite("weight_quanter", &train::QATOptions::weight_quanter)
      .def_readwrite("act_quanter", &train::QATOptions::act_quanter)
      .def_readwrite("epochs", &train::QATOptions::epochs)
      .def_readwrite("batch_size", &train::QATOptions::batch_size)
      .def_readwrite("steps_per_epoch", &train::QATOptions::steps_per_epoch)
      .def_property("optimizer", [](const train::QATOptions& o) { return o.optimizer.type; },
                    [](train::QATOptions& o, const std::string& t) { o.optimizer.type = t; })
      .def_property("momentum", [](const train::QATOptions& o) { return o.optimizer.momentum; },
                    [](train::QATOptions& o, float v) { o.optimizer.momentum = v; })
      .def_property("nesterov", [](const train::QATOptions& o) { return o.optimizer.nesterov; },
                    [](train::QATOptions& o, bool v) { o.optimizer.nesterov = v; })
      .def_property("weight_decay", [](const train::QATOptions& o) { return o.optimizer.weight_decay; },
                    [](train::QATOptions& o, float v) { o.optimizer.weight_decay = v; })
      .def_readwrite("lr", &train::QATOptions::lr)
      .def_readwrite("lr_schedule", &train::QATOptions::lr_schedule)
      .def_readwrite("warmup_fraction", &train::QATOptions::warmup_fraction)
      .def_readwrite("distill", &train::QATOptions::distill)
      .def_readwrite("temperature", &train::QATOptions::temperature)
      .def_readwrite("calib_batches", &train::QATOptions::calib_batches)
      .def_readwrite("seed", &train::QATOptions::seed)
      .def_readwrite("num_threads", &train::QATOptions::num_threads)
      .def("add_quanter_spec", [](train::QATOptions& o, const std::string& name, const std::string& type,
                                  std::optional<float> init_value, std::optional<bool> per_channel, float lr_scale,
                                  bool symmetric, std::optional<bool> sign) {
        train::QuanterSpec spec;
        spec.type = type;
        spec.init_value = init_value;
        spec.per_channel = per_channel;
        spec.lr_scale = lr_scale;
        spec.symmetric = symmetric;
        spec.sign = sign;
        o.quanter_specs[name] = spec;
      }, py::arg("name"), py::arg("type"), py::arg("init_value") = py::none(), py::arg("per_channel") = py::none(),
         py::arg("lr_scale") = 1.0f, py::arg("symmetric") = false, py::arg("sign") = py::none());

  py::class_<train::QAT>(m, "_QAT")
      .def(py::init<quant::QuantConfig, train::QATOptions>())
      // calib_samples / calib_labels: arrays [N, ...] / [N] (labels may be None), or None for no calibration.
      .def("prepare", [](train::QAT& q, const ir::Graph& g, py::object calib_samples) {
        std::unique_ptr<data::Dataset> calib;
        if (!calib_samples.is_none()) calib = dataset_from_arrays(calib_samples, py::none(), "calibration_data");
        py::gil_scoped_release release;
        const ThreadLimit threads(q.options().num_threads);
        q.prepare(g, calib.get());
      }, py::arg("model"), py::arg("calibration_samples") = py::none())
      .def("set_training_options", &train::QAT::set_training_options)
      .def("fit", [](train::QAT& q, py::handle samples, py::handle labels, py::object on_epoch) {
        auto data = dataset_from_arrays(samples, labels, "training data");
        std::function<void(const train::EpochReport&)> report;
        if (!on_epoch.is_none()) {
          auto fn = hold(std::move(on_epoch));
          report = [fn](const train::EpochReport& r) {
            py::gil_scoped_acquire gil;
            (*fn)(py::dict(py::arg("epoch") = r.epoch, py::arg("steps") = r.steps, py::arg("mean_loss") = r.mean_loss,
                           py::arg("seconds") = r.seconds, py::arg("samples") = r.samples));
          };
        }
        py::gil_scoped_release release;
        const ThreadLimit threads(q.options().num_threads);
        q.fit(*data, report);
      }, py::arg("samples"), py::arg("labels"), py::arg("on_epoch") = py::none())
      .def("train_step", [](train::QAT& q, py::handle x, py::handle y, float lr) {
        data::Batch batch;
        batch.inputs = to_tensor(x, "train_step x");
        SQ_CHECK(batch.inputs.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument, "train_step: x must be float32");
        if (!y.is_none()) {
          Tensor l = to_tensor(y, "train_step y");
          SQ_CHECK(l.dtype() == DType::kInt64 && l.rank() == 1 && l.numel() == batch.inputs.dim(0),
                   ErrorKind::kInvalidArgument, "train_step: y must be 1-D int64 with one label per sample of x");
          batch.labels.assign(l.data<int64_t>(), l.data<int64_t>() + l.numel());
        }
        py::gil_scoped_release release;
        const ThreadLimit threads(q.options().num_threads);
        return q.train_step(batch, lr);
      }, py::arg("x"), py::arg("y"), py::arg("lr"))
      .def("simulate", [](train::QAT& q, py::handle x) {
        Tensor input = to_tensor(x, "QAT model input");
        SQ_CHECK(input.dtype() == DType::kFloat32, ErrorKind::kInvalidArgument, "QAT model input must be float32");
        Tensor out;
        {
          py::gil_scoped_release release;
          const ThreadLimit threads(q.options().num_threads);
          out = q.simulate(input);
        }
        return to_numpy(out);
      })
      .def("convert", [](train::QAT& q) {
        py::gil_scoped_release release;
        const ThreadLimit threads(q.options().num_threads);
        return q.convert();
      })
      .def("ptq_model", &train::QAT::ptq_graph)
      .def_property_readonly("calibrated", &train::QAT::calibrated)
      .def_property_readonly("optimizer_steps", [](train::QAT& q) { return q.optimizer().steps(); })
      .def_property_readonly("completed_epochs", &train::QAT::completed_epochs)
      .def_property_readonly("lr", [](const train::QAT& q) { return q.options().lr; })
      .def_property_readonly("input_name", &train::QAT::input_name)
      .def_property_readonly("output_name", &train::QAT::output_name)
      .def_property_readonly("float_model", &train::QAT::float_graph)
      .def_property_readonly("layers", [](const train::QAT& q) {
        py::list out;
        for (const auto& l : q.layers())
          out.append(py::dict(py::arg("name") = l.name, py::arg("op_type") = l.op_type,
                              py::arg("activations") = l.activations, py::arg("weight") = l.weight));
        return out;
      })
      // Per quantized tensor: the quanter's type, its trainable parameters and what it exports.
      .def_property_readonly("quanters", [](const train::QAT& q) {
        py::dict out;
        for (const auto& [tensor, quanter] : q.quanters()) {
          py::dict params;
          for (train::Parameter* p : quanter->parameters()) params[py::str(p->name)] = to_numpy(p->value.clone());
          py::dict d(py::arg("type") = quanter->name(), py::arg("is_weight") = quanter->init().is_weight,
                     py::arg("bits") = quanter->init().bits, py::arg("parameters") = params);
          try {
            const QuantParam e = quanter->export_params();
            d["scale"] = e.scale;
            d["zero_point"] = e.zero_point;
            d["dtype"] = std::string(dtype_name(e.dtype));
          } catch (const Error&) {
            d["scale"] = py::none();  // a quanter that initialises on its first batch has seen none yet
          }
          out[py::str(tensor)] = d;
        }
        return out;
      });

  // ---- analyses (seeds 000, 001) and the target search
  py::class_<analysis::SensitivityReport>(m, "_SensitivityReport")
      .def("to_dict", &report_dict)
      .def("to_text", &analysis::SensitivityReport::to_text);

  m.def("analyze_ptq",
        [](const quant::PTQ& ptq, py::object eval_function, bool higher_is_better, const std::string& save_dir,
           const std::string& checkpoint_name, py::object fingerprint_extra, int num_threads) {
          analysis::PtqAnalysisOptions o;
          o.save_dir = save_dir;
          o.checkpoint_name = checkpoint_name;
          o.num_threads = num_threads;
          o.fingerprint_extra = json_from_python(fingerprint_extra);
          auto fn = wrap_eval_function(std::move(eval_function));
          py::gil_scoped_release release;
          std::filesystem::create_directories(save_dir);
          // One analysis per save_dir at a time, as in the CLI.
          const analysis::DirectoryLock lock(save_dir, "save_dir");
          return analysis::analyze_ptq(ptq, fn, higher_is_better, o);
        },
        py::arg("ptq"), py::arg("eval_function"), py::arg("higher_is_better"), py::arg("save_dir"),
        py::arg("checkpoint_name"), py::arg("fingerprint_extra"), py::arg("num_threads") = 0);

  m.def("analyze_qat",
        [](const ir::Graph& quant_model, const ir::Graph& float_model, py::object eval_function, bool higher_is_better,
           const std::string& save_dir, const std::string& checkpoint_name, bool resume, std::optional<double> qat_metric,
           std::vector<std::string> quantizable_op_type, int num_threads) {
          analysis::QatAnalysisOptions o;
          o.save_dir = save_dir;
          o.checkpoint_name = checkpoint_name;
          o.resume = resume;
          o.qat_metric = qat_metric;
          o.quantizable_op_type = std::move(quantizable_op_type);
          o.num_threads = num_threads;
          auto fn = wrap_eval_function(std::move(eval_function));
          py::gil_scoped_release release;
          std::filesystem::create_directories(save_dir);
          const analysis::DirectoryLock lock(save_dir, "save_dir");
          return analysis::analyze_qat(quant_model, float_model, fn, higher_is_better, o);
        },
        py::arg("quant_model"), py::arg("float_model"), py::arg("eval_function"), py::arg("higher_is_better"),
        py::arg("save_dir"), py::arg("checkpoint_name"), py::arg("resume"), py::arg("qat_metric"),
        py::arg("quantizable_op_type"), py::arg("num_threads") = 0);

  m.def("search_target",
        [](const quant::PTQ& ptq, const analysis::SensitivityReport& ranking, py::object eval_function,
           bool higher_is_better, double target, const std::string& save_dir, const std::string& model_name,
           py::object timing_feeds, int num_threads, const std::string& fallback_mode) {
          analysis::TargetSearchOptions o;
          o.target = target;
          o.fallback = analysis::parse_fallback_mode(fallback_mode);
          o.save_dir = save_dir;
          o.model_name = model_name;
          o.num_threads = num_threads;
          std::optional<std::map<std::string, Tensor>> feeds;
          if (!timing_feeds.is_none())
            feeds = name_feeds(to_feeds(timing_feeds, "timing batch"), ptq.float_graph().inputs);
          auto fn = wrap_eval_function(std::move(eval_function));
          py::gil_scoped_release release;
          const analysis::DirectoryLock lock(save_dir, "save_dir");
          analysis::TargetSearchResult r = analysis::search_target(ptq, ranking, fn, higher_is_better, o, feeds ? &*feeds : nullptr);
          nlohmann::json j = r.to_json();
          j.update(r.timing_json());
          py::gil_scoped_acquire gil;
          return json_to_python(j);
        },
        py::arg("ptq"), py::arg("ranking"), py::arg("eval_function"), py::arg("higher_is_better"), py::arg("target"),
        py::arg("save_dir"), py::arg("model_name") = "target_model.onnx", py::arg("timing_feeds") = py::none(),
        py::arg("num_threads") = 0, py::arg("fallback_mode") = "float");

  m.def("write_analysis_histograms",
        [](const quant::PTQ& ptq, const analysis::SensitivityReport& report, py::object batches, size_t n,
           const std::string& save_dir) {
          auto source = hold(std::move(batches));
          analysis::CalibrationBatches for_each = [&](const auto& visit) {
            auto next = [&] {
              py::gil_scoped_acquire gil;  // copies a Python object
              return make_generator(*source, "data_loader item");
            }();
            while (auto feeds = next()) visit(name_feeds(std::move(*feeds), ptq.float_graph().inputs));
          };
          py::gil_scoped_release release;
          return analysis::write_analysis_histograms(ptq, report, for_each, n, save_dir);
        },
        py::arg("ptq"), py::arg("report"), py::arg("batches"), py::arg("n"), py::arg("save_dir"));

  m.def("layer_statistics",
        [](const quant::PTQ& ptq, py::object data, const std::string& save_dir, size_t batch_size, size_t max_batches) {
          auto next = make_generator(std::move(data), "data_loader item");
          std::vector<Tensor> batches;
          const auto& inputs = ptq.float_graph().inputs;
          SQ_CHECK(inputs.size() == 1, ErrorKind::kInvalidArgument,
                   "statistical_analyse needs a single-input model (this one has " + std::to_string(inputs.size()) + ")");
          {
            py::gil_scoped_release release;
            while (auto feeds = next()) {
              if (max_batches && batches.size() >= max_batches) break;
              auto it = feeds->find("");
              if (it == feeds->end()) it = feeds->find(inputs[0].name);
              SQ_CHECK(it != feeds->end(), ErrorKind::kInvalidArgument,
                       "data_loader item lacks the model input '" + inputs[0].name + "'");
              batches.push_back(it->second.clone());
            }
          }
          auto dataset = dataset_from_batches(batches, "data_loader");
          analysis::StatisticsOptions so;
          so.batch_size = batch_size;
          nlohmann::json j;
          {
            py::gil_scoped_release release;
            j = analysis::run_layer_statistics(ptq, *dataset, save_dir, so);
          }
          return json_to_python(j);
        },
        py::arg("ptq"), py::arg("data"), py::arg("save_dir"), py::arg("batch_size") = 64, py::arg("max_batches") = 0);
}
