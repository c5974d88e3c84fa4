// ONNX <-> Graph conversion using ONNX's own protobuf classes, checker and shape inference.
#include "slimquant/ir/onnx_io.h"

#include "slimquant/core/atomic_file.h"
#include "slimquant/core/float16.h"

#include <onnx/checker.h>
#include <onnx/onnx-data.pb.h>
#include <onnx/onnx_pb.h>
#include <onnx/shape_inference/implementation.h>

#include <fcntl.h>
#include <signal.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <memory>
#include <set>
#include <sstream>
#include <stdexcept>

namespace slimquant::ir {
namespace fs = std::filesystem;

namespace {

// An open descriptor, closed on scope exit.
struct FileDescriptor {
  int fd = -1;
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
};

// Opens `path` for reading only if it is a regular file. O_NONBLOCK keeps a FIFO from blocking the
// open itself; fstat on the opened descriptor (not the name) then refuses FIFOs, devices such as
// /dev/zero, sockets and directories, whose reads would hang or never end.
void open_regular_file(const std::string& path, const std::string& what, FileDescriptor& file, struct stat& st) {
  file.fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (file.fd < 0) fail(ErrorKind::kIo, "cannot open " + what + " '" + path + "': " + std::strerror(errno));
  if (::fstat(file.fd, &st) != 0) fail(ErrorKind::kIo, "cannot stat " + what + " '" + path + "': " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    fail(ErrorKind::kIo, what + " '" + path + "' is not a regular file (a device, FIFO, socket or directory)");
}

// Reads `length` bytes at `offset` into dst; the caller has checked the range against the size.
void read_exactly(int fd, int64_t offset, size_t length, void* dst, const std::string& what, const std::string& path) {
  auto* out = static_cast<char*>(dst);
  size_t done = 0;
  while (done < length) {
    const ssize_t n = ::pread(fd, out + done, length - done, static_cast<off_t>(offset + static_cast<int64_t>(done)));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) fail(ErrorKind::kIo, "cannot read " + what + " '" + path + "': " + std::strerror(errno));
    if (n == 0) fail(ErrorKind::kInvalidModel, what + " '" + path + "' is truncated");
    done += static_cast<size_t>(n);
  }
}

// Protobuf cannot parse a message over 2 GB, so a larger model file is refused before it is read.
constexpr int64_t kMaxProtobufBytes = 2147483647;

std::string read_file(const std::string& path, const std::string& what) {
  FileDescriptor file;
  struct stat st {};
  open_regular_file(path, what, file, st);
  if (st.st_size > kMaxProtobufBytes)
    fail(ErrorKind::kInvalidModel, what + " '" + path + "' has " + std::to_string(st.st_size) +
                                       " bytes, more than the 2 GB a protobuf message can hold");
  std::string bytes(static_cast<size_t>(st.st_size), '\0');
  read_exactly(file.fd, 0, bytes.size(), bytes.data(), what, path);
  return bytes;
}

// Copies typed repeated fields (int32_data etc.) into the tensor's storage; the count is checked.
template <typename Src>
void copy_typed(const Src& src, Tensor& t) {
  const int64_t n = t.numel();
  dispatch_dtype(t.dtype(), [&](auto tag) {
    using T = decltype(tag);
    T* dst = t.data<T>();
    for (int64_t i = 0; i < n; ++i) dst[i] = static_cast<T>(src.Get(static_cast<int>(i)));
  });
}

// A non-negative integer of an external_data entry (offset, length).
int64_t external_number(const std::string& tensor, const std::string& key, const std::string& text) {
  int64_t value = -1;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (ec != std::errc() || end != text.data() + text.size() || value < 0)
    fail(ErrorKind::kInvalidModel, "tensor '" + tensor + "': external data " + key + " '" + text +
                                       "' is not a non-negative integer");
  return value;
}

// External data must be a regular file inside the model's folder: `location` is relative, has no
// '..', and after resolving symlinks still lies under the folder, so a model cannot make us read
// (and copy into outputs or quantized models) files elsewhere such as /etc/passwd. The declared
// offset and length are checked against the shape and the file size before anything is allocated.
Tensor read_external_data(const onnx::TensorProto& p, DType dtype, const Shape& shape, size_t nbytes,
                          const std::string& base_dir) {
  const std::string& name = p.name();
  std::string location;
  int64_t offset = 0, length = -1;
  for (const auto& kv : p.external_data()) {
    if (kv.key() == "location") location = kv.value();
    else if (kv.key() == "offset") offset = external_number(name, "offset", kv.value());
    else if (kv.key() == "length") length = external_number(name, "length", kv.value());
  }
  if (location.empty()) fail(ErrorKind::kInvalidModel, "tensor '" + name + "': external data without location");
  const fs::path relative(location);
  const bool escapes = relative.is_absolute() || relative.has_root_name() || relative.has_root_directory() ||
                       std::any_of(relative.begin(), relative.end(), [](const fs::path& part) { return part == ".."; });
  if (escapes || location.find('\0') != std::string::npos)
    fail(ErrorKind::kInvalidModel, "tensor '" + name + "': external data location '" + location +
                                       "' is not a path inside the model's folder");
  std::error_code ec;
  const fs::path folder = fs::canonical(base_dir.empty() ? "." : base_dir, ec);
  if (ec) fail(ErrorKind::kIo, "cannot resolve the model's folder '" + base_dir + "': " + ec.message());
  const fs::path file = fs::canonical(folder / relative, ec);
  if (ec)
    fail(ErrorKind::kIo, "tensor '" + name + "': cannot open external data file '" + (folder / relative).string() +
                             "': " + ec.message());
  const fs::path inside = file.lexically_relative(folder);
  if (inside.empty() || *inside.begin() == "..")
    fail(ErrorKind::kInvalidModel, "tensor '" + name + "': external data location '" + location + "' resolves to '" +
                                       file.string() + "', outside the model's folder '" + folder.string() + "'");
  if (length >= 0 && static_cast<size_t>(length) != nbytes)
    fail(ErrorKind::kInvalidModel, "tensor '" + name + "': external data length " + std::to_string(length) +
                                       " does not match its shape " + shape_str(shape) + " (" + std::to_string(nbytes) +
                                       " bytes)");
  FileDescriptor fd;
  struct stat st {};
  open_regular_file(file.string(), "external data file", fd, st);
  int64_t end = 0;
  if (__builtin_add_overflow(offset, static_cast<int64_t>(nbytes), &end) || end > st.st_size)
    fail(ErrorKind::kInvalidModel, "tensor '" + name + "': external data file '" + file.string() + "' has " +
                                       std::to_string(st.st_size) + " bytes, fewer than offset " + std::to_string(offset) +
                                       " + " + std::to_string(nbytes) + " bytes of the tensor");
  Tensor t(dtype, shape);
  read_exactly(fd.fd, offset, nbytes, t.raw(), "external data file", file.string());
  return t;
}

// Values held in the typed repeated field that `dtype` is stored in.
int64_t typed_value_count(const onnx::TensorProto& p, DType dtype) {
  switch (dtype) {
    case DType::kFloat32: return p.float_data_size();
    case DType::kFloat64: return p.double_data_size();
    case DType::kInt64: return p.int64_data_size();
    case DType::kUInt32:
    case DType::kUInt64: return p.uint64_data_size();
    default: return p.int32_data_size();  // int8/16/32, uint8/16, bool
  }
}

// Every size a file declares is checked against the data it holds before the tensor is allocated.
// `dtype` is the storage read: the element type, or uint16 for the bits of a 16-bit float.
Tensor stored_tensor_from_proto(const onnx::TensorProto& p, DType dtype, const std::string& base_dir) {
  Shape shape(p.dims().begin(), p.dims().end());
  const size_t nbytes = checked_tensor_bytes(dtype, shape, "tensor '" + p.name() + "'", ErrorKind::kInvalidModel);
  const int64_t numel = static_cast<int64_t>(nbytes / dtype_size(dtype));
  if (p.data_location() == onnx::TensorProto::EXTERNAL) return read_external_data(p, dtype, shape, nbytes, base_dir);
  if (p.has_raw_data()) {
    if (p.raw_data().size() != nbytes)
      fail(ErrorKind::kInvalidModel, "tensor '" + p.name() + "' has " + std::to_string(p.raw_data().size()) +
                                         " bytes of raw data, its shape " + shape_str(shape) + " needs " +
                                         std::to_string(nbytes));
    Tensor t(dtype, shape);
    if (nbytes) std::memcpy(t.raw(), p.raw_data().data(), nbytes);
    return t;
  }
  if (numel == 0) return Tensor(dtype, shape);
  if (const int64_t held = typed_value_count(p, dtype); held != numel)
    fail(ErrorKind::kInvalidModel, "tensor '" + p.name() + "' holds " + std::to_string(held) + " values, its shape " +
                                       shape_str(shape) + " needs " + std::to_string(numel));
  Tensor t(dtype, shape);
  switch (dtype) {
    case DType::kFloat32: copy_typed(p.float_data(), t); break;
    case DType::kFloat64: copy_typed(p.double_data(), t); break;
    case DType::kInt64: copy_typed(p.int64_data(), t); break;
    case DType::kUInt32:
    case DType::kUInt64: copy_typed(p.uint64_data(), t); break;
    default: copy_typed(p.int32_data(), t); break;
  }
  return t;
}

// A float16/bfloat16 tensor (stored 2 bytes a value, or one value per int32_data entry) as float32.
Tensor widened_16bit_tensor(const onnx::TensorProto& p, const std::string& base_dir) {
  const Tensor bits = stored_tensor_from_proto(p, DType::kUInt16, base_dir);
  Tensor wide(DType::kFloat32, bits.shape());
  const uint16_t* src = bits.data<uint16_t>();
  float* dst = wide.data<float>();
  floats_from_16bit(src, dst, bits.numel(), p.data_type());
  return wide;
}

// ONNX's 4-bit integer types (IR version 10, opset 21): not dtypes here. Their tensors are held
// unpacked, one value a byte (Graph::stored_4bit_types), and packed again when saved.
constexpr int kOnnxUInt4 = 21;
constexpr int kOnnxInt4 = 22;
bool is_onnx_4bit(int onnx_type) { return onnx_type == kOnnxUInt4 || onnx_type == kOnnxInt4; }

// ONNX's layout: two values a byte, the first in the low nibble; an odd count leaves the last high
// nibble 0.
void unpack_4bit(const uint8_t* packed, int64_t count, bool is_signed, int8_t* out) {
  for (int64_t i = 0; i < count; ++i) {
    const int v = (packed[i / 2] >> (4 * (i & 1))) & 0xF;
    out[i] = static_cast<int8_t>(is_signed ? (v ^ 8) - 8 : v);
  }
}

std::string packed_4bit(const Tensor& t, const std::string& name) {
  const bool is_signed = t.dtype() == DType::kInt8;
  if (!is_signed && t.dtype() != DType::kUInt8)
    fail(ErrorKind::kInvalidModel, "initializer '" + name + "' is stored as a 4-bit type but holds " + dtype_name(t.dtype()));
  const auto* v = static_cast<const int8_t*>(t.raw());
  std::string bytes(static_cast<size_t>((t.numel() + 1) / 2), '\0');
  for (int64_t i = 0; i < t.numel(); ++i) {
    const int x = is_signed ? v[i] : static_cast<uint8_t>(v[i]);
    if (x < (is_signed ? -8 : 0) || x > (is_signed ? 7 : 15))
      fail(ErrorKind::kInvalidModel, "initializer '" + name + "' is stored as " + (is_signed ? "INT4" : "UINT4") +
                                         " but holds " + std::to_string(x) + " at element " + std::to_string(i));
    bytes[static_cast<size_t>(i / 2)] = static_cast<char>(bytes[static_cast<size_t>(i / 2)] | ((x & 0xF) << (4 * (i & 1))));
  }
  return bytes;
}

// A 4-bit tensor read (raw, external or int32_data: the packed bytes in each case) and unpacked to
// int8 (INT4) or uint8 (UINT4).
Tensor unpacked_4bit_tensor(const onnx::TensorProto& p, const std::string& base_dir) {
  const Shape shape(p.dims().begin(), p.dims().end());
  const bool is_signed = p.data_type() == kOnnxInt4;
  const DType dtype = is_signed ? DType::kInt8 : DType::kUInt8;
  checked_tensor_bytes(dtype, shape, "tensor '" + p.name() + "'", ErrorKind::kInvalidModel);
  const int64_t numel = shape_numel(shape);
  onnx::TensorProto bytes = p;
  bytes.clear_dims();
  bytes.add_dims((numel + 1) / 2);
  bytes.set_data_type(onnx::TensorProto::UINT8);
  const Tensor packed = stored_tensor_from_proto(bytes, DType::kUInt8, base_dir);
  Tensor t(dtype, shape);
  unpack_4bit(packed.data<uint8_t>(), numel, is_signed, static_cast<int8_t*>(t.raw()));
  return t;
}

Tensor tensor_from_proto(const onnx::TensorProto& p, const std::string& base_dir) {
  if (is_onnx_4bit(p.data_type())) return unpacked_4bit_tensor(p, base_dir);
  if (p.data_type() == onnx::TensorProto::STRING)
    fail(ErrorKind::kUnsupported, "tensor '" + p.name() + "': string tensors are not supported");
  if (is_onnx_16bit_float(p.data_type())) return widened_16bit_tensor(p, base_dir);
  DType dtype;
  try {
    dtype = dtype_from_onnx(p.data_type());
  } catch (const Error& e) {
    fail(ErrorKind::kUnsupported, "tensor '" + p.name() + "': " + e.what());
  }
  return stored_tensor_from_proto(p, dtype, base_dir);
}

void tensor_to_proto(const Tensor& t, const std::string& name, onnx::TensorProto* p) {
  p->set_name(name);
  p->set_data_type(static_cast<int>(t.dtype()));
  for (int64_t d : t.shape()) p->add_dims(d);
  p->set_raw_data(t.raw(), t.nbytes());
}

ValueInfo value_info_from_proto(const onnx::ValueInfoProto& v) {
  ValueInfo info;
  info.name = v.name();
  if (!v.has_type() || !v.type().has_tensor_type()) return info;
  const auto& tt = v.type().tensor_type();
  try {
    info.dtype = is_onnx_16bit_float(tt.elem_type()) ? DType::kFloat32
                 : tt.elem_type()                        ? dtype_from_onnx(tt.elem_type())
                                                         : DType::kUndefined;
  } catch (const Error&) {
    info.dtype = DType::kUndefined;  // reported when a kernel meets it
  }
  if (tt.has_shape()) {
    std::vector<Dim> dims;
    for (const auto& d : tt.shape().dim()) {
      Dim dim;
      if (d.has_dim_value()) dim.value = d.dim_value();
      else dim.param = d.dim_param();
      dims.push_back(dim);
    }
    info.dims = std::move(dims);
  }
  return info;
}

void value_info_to_proto(const ValueInfo& info, onnx::ValueInfoProto* v) {
  v->set_name(info.name);
  auto* tt = v->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(static_cast<int>(info.dtype == DType::kUndefined ? DType::kFloat32 : info.dtype));
  if (info.dims) {
    auto* shape = tt->mutable_shape();
    for (const Dim& d : *info.dims) {
      auto* dim = shape->add_dim();
      if (d.known()) dim->set_dim_value(d.value);
      else if (!d.param.empty()) dim->set_dim_param(d.param);
    }
  }
}

// What a graph's nodes inherit from the model: where external data lives, the opsets.
struct LoadScope {
  std::string base_dir;
  int64_t opset = 1;
  std::map<std::string, int64_t> extra_opsets;
};

void fill_graph_from_proto(const onnx::GraphProto& gp, const LoadScope& scope, Graph& g);

// Values a subgraph reads but does not define: the outer scope's, in first-use order.
void collect_captured(const Graph& sub, std::vector<std::string>& captured) {
  std::set<std::string> defined;
  for (const auto& [name, t] : sub.initializers) defined.insert(name);
  for (const auto& v : sub.inputs) defined.insert(v.name);
  for (const auto& n : sub.nodes) defined.insert(n.outputs.begin(), n.outputs.end());
  auto use = [&](const std::string& v) {
    if (!v.empty() && !defined.count(v) && std::find(captured.begin(), captured.end(), v) == captured.end())
      captured.push_back(v);
  };
  for (const auto& n : sub.nodes)
    for (const auto& in : n.inputs) use(in);
  for (const auto& o : sub.outputs) use(o.name);
}

// A node producing float16/bfloat16 values produces float32 here: a Cast to them rounds (the
// attribute says to which type), an op's `dtype` attribute (EyeLike, RandomNormal, ...) says float.
void held_in_float32(Node& n) {
  if (!n.domain.empty()) return;
  if (n.op_type == "Cast" && is_onnx_16bit_float(static_cast<int>(n.attr_int("to", 0)))) {
    n.attrs[kCastRoundsToAttr] = n.attr_int("to", 0);
    n.attrs["to"] = int64_t{onnx::TensorProto::FLOAT};
  }
  if (is_onnx_16bit_float(static_cast<int>(n.attr_int("dtype", 0)))) n.attrs["dtype"] = int64_t{onnx::TensorProto::FLOAT};
}

Node node_from_proto(const onnx::NodeProto& p, const LoadScope& scope) {
  const std::string& base_dir = scope.base_dir;
  Node n;
  n.name = p.name();
  n.op_type = p.op_type();
  n.domain = p.domain() == "ai.onnx" ? "" : p.domain();
  n.inputs.assign(p.input().begin(), p.input().end());
  n.outputs.assign(p.output().begin(), p.output().end());
  for (const auto& a : p.attribute()) {
    using A = onnx::AttributeProto;
    switch (a.type()) {
      case A::INT: n.attrs[a.name()] = static_cast<int64_t>(a.i()); break;
      case A::FLOAT: n.attrs[a.name()] = a.f(); break;
      case A::STRING: n.attrs[a.name()] = a.s(); break;
      case A::TENSOR: n.attrs[a.name()] = tensor_from_proto(a.t(), base_dir); break;
      case A::INTS: n.attrs[a.name()] = std::vector<int64_t>(a.ints().begin(), a.ints().end()); break;
      case A::FLOATS: n.attrs[a.name()] = std::vector<float>(a.floats().begin(), a.floats().end()); break;
      case A::STRINGS: n.attrs[a.name()] = std::vector<std::string>(a.strings().begin(), a.strings().end()); break;
      case A::GRAPH: {
        auto sub = std::make_shared<Graph>();
        fill_graph_from_proto(a.g(), scope, *sub);
        collect_captured(*sub, n.captured);
        n.attrs[a.name()] = std::shared_ptr<const Graph>(std::move(sub));
        break;
      }
      default:
        // Lists of subgraphs and sparse tensors: the op will be reported as unsupported by the
        // runtime; keep the node importable so `info` still works.
        break;
    }
  }
  n.inputs.insert(n.inputs.end(), n.captured.begin(), n.captured.end());
  held_in_float32(n);
  return n;
}

// Renames reads of outer value `from` to `to` inside a subgraph (and the subgraphs it nests).
void rename_outer_reads(Graph& g, const std::string& from, const std::string& to) {
  for (auto& n : g.nodes)
    for (auto& in : n.inputs)
      if (in == from) in = to;
  for (auto& o : g.outputs)
    if (o.name == from) o.name = to;
}

void graph_to_proto(const Graph& g, onnx::GraphProto* gp);

void node_to_proto(const Node& n, onnx::NodeProto* p) {
  p->set_name(n.name);
  p->set_op_type(n.op_type);
  if (!n.domain.empty()) p->set_domain(n.domain);
  for (size_t i = 0; i < n.declared_inputs(); ++i) p->add_input(n.inputs[i]);
  for (const auto& o : n.outputs) p->add_output(o);
  for (const auto& [key, value] : n.attrs) {
    auto* a = p->add_attribute();
    a->set_name(key);
    using A = onnx::AttributeProto;
    std::visit(
        [&](const auto& v) {
          using V = std::decay_t<decltype(v)>;
          if constexpr (std::is_same_v<V, int64_t>) { a->set_type(A::INT); a->set_i(v); }
          else if constexpr (std::is_same_v<V, float>) { a->set_type(A::FLOAT); a->set_f(v); }
          else if constexpr (std::is_same_v<V, std::string>) { a->set_type(A::STRING); a->set_s(v); }
          else if constexpr (std::is_same_v<V, Tensor>) { a->set_type(A::TENSOR); tensor_to_proto(v, "", a->mutable_t()); }
          else if constexpr (std::is_same_v<V, std::vector<int64_t>>) { a->set_type(A::INTS); for (auto x : v) a->add_ints(x); }
          else if constexpr (std::is_same_v<V, std::vector<float>>) { a->set_type(A::FLOATS); for (auto x : v) a->add_floats(x); }
          else if constexpr (std::is_same_v<V, std::vector<std::string>>) { a->set_type(A::STRINGS); for (const auto& x : v) a->add_strings(x); }
          else {
            // The branch reads outer values under the names it was loaded with; passes may have
            // renamed them outside since.
            a->set_type(A::GRAPH);
            Graph branch = *v;
            for (size_t k = 0; k < n.captured.size(); ++k) {
              const std::string& now = n.inputs[n.declared_inputs() + k];
              if (now != n.captured[k]) rename_outer_reads(branch, n.captured[k], now);
            }
            graph_to_proto(branch, a->mutable_g());
          }
        },
        value);
  }
}

onnx::ModelProto to_model_proto(const Graph& g) {
  onnx::ModelProto m;
  m.set_ir_version(g.ir_version);
  m.set_producer_name(g.producer_name.empty() ? "slimquant" : g.producer_name);
  m.set_producer_version(g.producer_version);
  if (!g.doc_string.empty()) m.set_doc_string(g.doc_string);
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(g.opset);
  for (const auto& [domain, version] : g.extra_opsets) {
    auto* o = m.add_opset_import();
    o->set_domain(domain);
    o->set_version(version);
  }
  for (const auto& [k, v] : g.metadata) {
    auto* e = m.add_metadata_props();
    e->set_key(k);
    e->set_value(v);
  }
  graph_to_proto(g, m.mutable_graph());
  return m;
}

void graph_to_proto(const Graph& g, onnx::GraphProto* gp) {
  gp->set_name(g.name.empty() ? "graph" : g.name);
  for (const auto& n : g.nodes) node_to_proto(n, gp->add_node());
  for (const auto& [name, t] : g.initializers) tensor_to_proto(t, name, gp->add_initializer());
  // Sequence and optional values are written back with their sequence / optional type.
  auto write = [&](const ValueInfo& v, onnx::ValueInfoProto* out) {
    value_info_to_proto(v, out);
    if (g.sequence_values.count(v.name)) {
      onnx::TypeProto tensor = out->type();
      *out->mutable_type()->mutable_sequence_type()->mutable_elem_type() = tensor;
    }
    if (!g.optional_values.count(v.name)) return;
    onnx::TypeProto inner = out->type();
    *out->mutable_type()->mutable_optional_type()->mutable_elem_type() = inner;
  };
  for (const auto& i : g.inputs) write(i, gp->add_input());
  for (const auto& o : g.outputs) write(o, gp->add_output());
  for (const auto& [name, v] : g.value_info)
    if (v.dtype != DType::kUndefined) value_info_to_proto(v, gp->add_value_info());
}

}  // namespace

int64_t library_opset() {
  const auto& known = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  const auto it = known.find("");
  return it == known.end() ? 1 : it->second.second;
}

namespace {
// The newest ai.onnx opset slimquant reads although its ONNX library (Debian's 1.12 knows 17) may
// not: between the library's opset and this one, the operators below changed their inputs,
// attributes or meaning, and a node of one of them is refused; every other operator's newer
// versions only widened its types (4-bit and 8-bit float types, strings), which the graph's dtypes
// already limit, or are new operators the runtime does not have. DequantizeLinear's opset-21
// block_size is implemented by the runtime (blocked scales).
constexpr int64_t kNewestOnnxOpset = 21;
// Whether a node of a newer opset uses what changed; a node that does not means what it meant in
// the library's opset, and its checks and shape inference there hold (an attribute the older
// schema lacks would not pass them, so a present one counts as used).
bool has_input(const Node& n, size_t i) { return n.inputs.size() > i && !n.inputs[i].empty(); }
// The reductions whose axes became an input in opset 18 (ReduceSum's did in 13).
const std::set<std::string>& reductions_with_axes_input_since_18() {
  static const std::set<std::string> ops = {"ReduceMax",    "ReduceMin",       "ReduceMean",
                                            "ReduceProd",   "ReduceL1",        "ReduceL2",
                                            "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare"};
  return ops;
}
// A graph and the graphs around it (a branch reads the initializers of the graphs it is in).
struct Scope {
  const Graph& graph;
  const Scope* outer = nullptr;
  bool is_initializer(const std::string& v) const {
    return graph.is_initializer(v) || (outer != nullptr && outer->is_initializer(v));
  }
};
// A constant axes input (in this graph or one around it) is written back as the attribute for the
// library's checks (libonnx_view); noop_with_empty_axes = 0 is the older meaning.
bool reads_axes_input(const Scope& scope, const Node& n) {
  return (has_input(n, 1) && !scope.is_initializer(n.inputs[1])) || n.attr_int("noop_with_empty_axes", 0) != 0;
}
bool pads_new_ways(const Scope&, const Node& n) { return has_input(n, 3) || n.attr_string("mode", "constant") == "wrap"; }
// A newer attribute at its default value means what its absence meant (exporters write them out);
// libonnx_view drops those for the library's older schema.
bool all_ones(const std::vector<int64_t>& v) {
  return std::all_of(v.begin(), v.end(), [](int64_t x) { return x == 1; });
}
bool resizes_new_ways(const Scope&, const Node& n) {
  return n.attr_int("antialias", 0) != 0 || n.attrs.count("axes") ||
         n.attr_string("keep_aspect_ratio_policy", "stretch") != "stretch" ||
         n.attr_string("coordinate_transformation_mode", "half_pixel") == "half_pixel_symmetric";
}
bool reduces_by_max_or_min(const Scope&, const Node& n) {
  const std::string r = n.attr_string("reduction", "none");
  return r == "max" || r == "min";
}
bool pools_new_ways(const Scope&, const Node& n) {
  return n.attr_int("ceil_mode", 0) != 0 || !all_ones(n.attr_ints("dilations"));
}
bool dilates(const Scope&, const Node& n) { return !all_ones(n.attr_ints("dilations")); }
bool quantizes_blocked(const Scope&, const Node& n) { return n.attrs.count("block_size") || n.attrs.count("output_dtype"); }
bool always(const Scope&, const Node&) { return true; }
bool never(const Scope&, const Node&) { return false; }

struct OpsetChange {
  const char* op;
  int64_t since;
  const char* what;
  // Reading a file of the newer opset: whether the node uses what changed (libonnx_view and the
  // kernels handle what it does not list).
  bool (*used_by)(const Scope&, const Node&);
  // Raising a graph to the newer opset: whether the node's older form can be neither kept nor
  // rewritten (rewrite_for_raised_opset rewrites the reductions' axes and Split's count).
  bool (*blocks_raising)(const Scope&, const Node&);
};
constexpr OpsetChange kOpsetChanges[] = {
    {"ReduceMax", 18, "axes became an input", reads_axes_input, never},
    {"ReduceMin", 18, "axes became an input", reads_axes_input, never},
    {"ReduceMean", 18, "axes became an input", reads_axes_input, never},
    {"ReduceProd", 18, "axes became an input", reads_axes_input, never},
    {"ReduceL1", 18, "axes became an input", reads_axes_input, never},
    {"ReduceL2", 18, "axes became an input", reads_axes_input, never},
    {"ReduceLogSum", 18, "axes became an input", reads_axes_input, never},
    {"ReduceLogSumExp", 18, "axes became an input", reads_axes_input, never},
    {"ReduceSumSquare", 18, "axes became an input", reads_axes_input, never},
    {"Split", 18, "num_outputs was added", never, never},
    {"Pad", 18, "an axes input and the wrap mode were added", pads_new_ways, never},
    {"Resize", 18, "antialias, axes, keep_aspect_ratio_policy and half_pixel_symmetric were added", resizes_new_ways, never},
    {"ScatterND", 18, "reduction max/min were added", reduces_by_max_or_min, never},
    {"ScatterElements", 18, "reduction max/min were added", reduces_by_max_or_min, never},
    {"LpPool", 18, "ceil_mode and dilations were added", pools_new_ways, never},
    {"AveragePool", 19, "dilations were added", dilates, never},
    {"GridSample", 20, "its modes were renamed and N-D inputs added", always, always},
    {"GroupNormalization", 21, "scale and bias became per channel", always, always},
    {"QuantizeLinear", 21, "block_size and output_dtype were added", quantizes_blocked, quantizes_blocked},
};

// The first node (in branches too) whose operator changed between opsets `from` (exclusive) and
// `to`: "node 'n' (ReduceMean): axes became an input in opset 18"; empty when none. Reading a
// file of opset `to`: only nodes that use the change count. Raising a graph to `to`: the nodes
// whose older form is neither valid there nor rewritten by rewrite_for_raised_opset.
enum class OpsetDirection { kReading, kRaising };
std::string changed_operator(const Graph& g, int64_t from, int64_t to, OpsetDirection direction,
                             const Scope* outer = nullptr) {
  const Scope scope{g, outer};
  for (const Node& n : g.nodes) {
    if (n.domain.empty() || n.domain == "ai.onnx")
      for (const OpsetChange& c : kOpsetChanges) {
        if (n.op_type != c.op || c.since <= from || c.since > to) continue;
        const bool counts = direction == OpsetDirection::kReading ? c.used_by(scope, n) : c.blocks_raising(scope, n);
        if (counts)
          return "node '" + n.name + "' (" + n.op_type + "): " + c.what + " in opset " + std::to_string(c.since);
      }
    for (const auto& [key, value] : n.attrs)
      if (const auto* branch = std::get_if<std::shared_ptr<const Graph>>(&value))
        if (std::string found = changed_operator(**branch, from, to, direction, &scope); !found.empty())
          return found;
  }
  return {};
}
}  // namespace

namespace {
// The older forms that are not valid in the newer opset, written in its form: a reduction's axes
// attribute becomes its input (opset 18); a Split without sizes states its count (opset 18 wants
// either), which also keeps the old meaning of equal parts.
void rewrite_for_raised_opset(Graph& g, int64_t from, int64_t to) {
  const bool crosses_18 = from < 18 && to >= 18;
  for (Node& n : g.nodes) {
    for (auto& [key, value] : n.attrs)
      if (auto* branch = std::get_if<std::shared_ptr<const Graph>>(&value)) {
        auto raised = std::make_shared<Graph>(**branch);
        rewrite_for_raised_opset(*raised, from, to);
        *branch = std::move(raised);
      }
    if (!crosses_18 || !(n.domain.empty() || n.domain == "ai.onnx")) continue;
    if (reductions_with_axes_input_since_18().count(n.op_type) && n.has_attr("axes")) {
      const std::string axes = g.unique_value_name(n.name + "_axes");
      const std::vector<int64_t> values = n.attr_ints("axes");
      g.initializers.emplace(axes, Tensor::from_vector<int64_t>({static_cast<int64_t>(values.size())}, values));
      n.attrs.erase("axes");
      n.inputs.resize(1);
      n.inputs.push_back(axes);
    } else if (n.op_type == "Split" && !has_input(n, 1) && !n.has_attr("num_outputs")) {
      n.attrs["num_outputs"] = static_cast<int64_t>(n.outputs.size());
    }
  }
}
}  // namespace

void libonnx_view(onnx::ModelProto& m) {
  const int64_t known = library_opset();
  bool capped = false;
  for (auto& op : *m.mutable_opset_import())
    if ((op.domain().empty() || op.domain() == "ai.onnx") && op.version() > known) {
      op.set_version(known);
      capped = true;
    }
  if (!capped) return;
  if (m.ir_version() > onnx::Version::IR_VERSION) m.set_ir_version(onnx::Version::IR_VERSION);
  // `enclosing`: the graphs around a branch, innermost last (a branch reads their initializers).
  std::function<void(onnx::GraphProto&, std::vector<const onnx::GraphProto*>)> strip =
      [&](onnx::GraphProto& gp, std::vector<const onnx::GraphProto*> enclosing) {
    auto initializer_in_scope = [&](const std::string& name) -> const onnx::TensorProto* {
      for (const auto& t : gp.initializer())
        if (t.name() == name) return &t;
      for (auto g = enclosing.rbegin(); g != enclosing.rend(); ++g)
        for (const auto& t : (*g)->initializer())
          if (t.name() == name) return &t;
      return nullptr;
    };
    for (auto& t : *gp.mutable_initializer())
      if (is_onnx_4bit(t.data_type())) {
        Tensor wide = unpacked_4bit_tensor(t, ".");
        t.set_data_type(static_cast<int>(wide.dtype()));
        t.set_raw_data(wide.raw(), wide.nbytes());
      }
    for (auto& n : *gp.mutable_node()) {
      // Reductions of opset 18+: a constant axes input back to the attribute they had before.
      if ((n.domain().empty() || n.domain() == "ai.onnx") && reductions_with_axes_input_since_18().count(n.op_type())) {
        auto* attrs = n.mutable_attribute();
        for (int i = attrs->size() - 1; i >= 0; --i)
          if (attrs->Get(i).name() == "noop_with_empty_axes" && attrs->Get(i).i() == 0) attrs->DeleteSubrange(i, 1);
        if (n.input_size() >= 2) {
          const onnx::TensorProto* axes = initializer_in_scope(n.input(1));
          if (axes || n.input(1).empty()) {
            onnx::AttributeProto* a = nullptr;
            if (axes) {
              a = n.add_attribute();
              a->set_name("axes");
              a->set_type(onnx::AttributeProto::INTS);
              for (int64_t v : tensor_from_proto(*axes, ".").to_int64_vector()) a->add_ints(v);
            }
            n.mutable_input()->DeleteSubrange(1, n.input_size() - 1);
          }
        }
      }
      // Split's opset-18 count: the number of outputs says it to the older schema (equal parts;
      // the kernel reads the count and makes the last part smaller when the axis does not divide).
      if ((n.domain().empty() || n.domain() == "ai.onnx") && n.op_type() == "Split") {
        auto* attrs = n.mutable_attribute();
        for (int i = attrs->size() - 1; i >= 0; --i)
          if (attrs->Get(i).name() == "num_outputs") attrs->DeleteSubrange(i, 1);
      }
      // Newer attributes at their default values (the opset check refused any other value).
      if (n.domain().empty() || n.domain() == "ai.onnx") {
        auto* attrs = n.mutable_attribute();
        for (int i = attrs->size() - 1; i >= 0; --i) {
          const onnx::AttributeProto& a = attrs->Get(i);
          const bool ones = std::all_of(a.ints().begin(), a.ints().end(), [](int64_t x) { return x == 1; });
          const bool default_valued =
              (n.op_type() == "Resize" && ((a.name() == "antialias" && a.i() == 0) ||
                                           (a.name() == "keep_aspect_ratio_policy" && a.s() == "stretch"))) ||
              (n.op_type() == "LpPool" && ((a.name() == "ceil_mode" && a.i() == 0) || (a.name() == "dilations" && ones))) ||
              (n.op_type() == "AveragePool" && a.name() == "dilations" && ones);
          if (default_valued) attrs->DeleteSubrange(i, 1);
        }
      }
      if (n.op_type() == "DequantizeLinear" || n.op_type() == "QuantizeLinear") {
        auto* attrs = n.mutable_attribute();
        for (int i = attrs->size() - 1; i >= 0; --i)
          if (attrs->Get(i).name() == "block_size" || attrs->Get(i).name() == "output_dtype") attrs->DeleteSubrange(i, 1);
      }
      std::vector<const onnx::GraphProto*> around = enclosing;
      around.push_back(&gp);
      for (auto& a : *n.mutable_attribute())
        if (a.has_g()) strip(*a.mutable_g(), around);
    }
  };
  strip(*m.mutable_graph(), {});
}

void raise_opset_beyond_library(Graph& graph, int64_t target_opset) {
  const int64_t known = library_opset();
  SQ_CHECK(target_opset <= kNewestOnnxOpset, ErrorKind::kUnsupported,
           "slimquant writes ai.onnx opsets up to " + std::to_string(kNewestOnnxOpset) + ", not " +
               std::to_string(target_opset));
  if (graph.opset < known) convert_opset(graph, known);
  rewrite_for_raised_opset(graph, graph.opset, target_opset);
  if (const std::string changed = changed_operator(graph, graph.opset, target_opset, OpsetDirection::kRaising);
      !changed.empty())
    fail(ErrorKind::kUnsupported, "cannot raise the model from opset " + std::to_string(graph.opset) + " to " +
                                      std::to_string(target_opset) + ": " + changed +
                                      ", which this converter does not rewrite");
  graph.opset = target_opset;
  if (graph.ir_version < 10) graph.ir_version = 10;  // opset 21 and INT4 came with IR version 10
}

namespace {
// An opset newer than the ONNX library knows has operator definitions nobody here has read (shape
// inference would guess from older ones and kernels would run the old semantics): refuse it, but
// for ai.onnx up to kNewestOnnxOpset, where the changes are known (changed_operator).
void check_opset_versions(const Graph& g) {
  const auto& known = onnx::OpSchemaRegistry::DomainToVersionRange::Instance().Map();
  auto check = [&](const std::string& domain, int64_t version) {
    if (version < 1)
      fail(ErrorKind::kInvalidModel, "the model imports opset " + std::to_string(version) + " of domain '" +
                                         (domain.empty() ? "ai.onnx" : domain) + "'; opset versions start at 1");
    const auto it = known.find(domain);
    if (domain.empty() && version <= kNewestOnnxOpset) return;
    if (domain.empty())
      fail(ErrorKind::kUnsupported, "the model uses opset " + std::to_string(version) +
                                        " of domain 'ai.onnx'; slimquant supports opsets up to " +
                                        std::to_string(kNewestOnnxOpset));
    if (it != known.end() && version > it->second.second)
      fail(ErrorKind::kUnsupported, "the model uses opset " + std::to_string(version) + " of domain '" +
                                        (domain.empty() ? "ai.onnx" : domain) + "'; slimquant supports opsets up to " +
                                        std::to_string(it->second.second));
  };
  check("", g.opset);
  for (const auto& [domain, version] : g.extra_opsets) check(domain, version);
}
}  // namespace

namespace {
// The usual storage of 16-bit weights in a float32 model: a float16/bfloat16 initializer read
// through a Cast to float. It is held as the float32 initializer the Cast produces (its stored type
// remembered), so that passes and kernels see a constant weight; save_onnx writes the same form.
// Casts to float of 16-bit graph inputs go too (the input is float32 here), so that a file saved
// and loaded again does not gather Casts; 16-bit outputs are rounded to their type.
void adopt_16bit_storage_casts(Graph& g) {
  std::vector<Node> kept;
  kept.reserve(g.nodes.size());
  std::set<std::string> sources;
  std::map<std::string, std::string> input_renames;  // a no-op Cast's output -> the value it reads
  std::map<std::string, std::string> middle_renames;  // a rounding Cast's output -> the no-op Cast's
  // Values that are float32 here although the file has them in 16 bits: 16-bit graph inputs and
  // what a Cast to a 16-bit type writes (a rounding Cast).
  std::set<std::string> float32_here;
  for (const auto& in : g.inputs)
    if (g.stored_float_types.count(in.name)) float32_here.insert(in.name);
  std::map<std::string, int> readers;
  std::set<std::string> produced;
  for (const Node& n : g.nodes) {
    if (n.domain.empty() && n.op_type == "Cast" && n.has_attr(kCastRoundsToAttr)) float32_here.insert(n.outputs[0]);
    for (const auto& in : n.inputs) ++readers[in];
    produced.insert(n.outputs.begin(), n.outputs.end());
  }
  for (Node& n : g.nodes) {
    const auto stored = g.stored_float_types.find(n.input(0));
    const bool storage_cast = n.domain.empty() && n.op_type == "Cast" && n.inputs.size() == 1 &&
                              n.outputs.size() == 1 && !n.has_attr(kCastRoundsToAttr) &&
                              n.attr_int("to", 0) == onnx::TensorProto::FLOAT && stored != g.stored_float_types.end() &&
                              g.is_initializer(n.inputs[0]) && !g.is_graph_output(n.outputs[0]) &&
                              !g.is_initializer(n.outputs[0]);
    // The Cast to float after a 16-bit input or a Cast to 16 bits (as save_onnx writes them, and
    // converters) is a no-op here.
    const bool input_cast = n.domain.empty() && n.op_type == "Cast" && n.inputs.size() == 1 && n.outputs.size() == 1 &&
                            !n.has_attr(kCastRoundsToAttr) && n.attr_int("to", 0) == onnx::TensorProto::FLOAT &&
                            float32_here.count(n.inputs[0]) && !g.is_graph_output(n.outputs[0]);
    if (input_cast) {
      // Readers of the Cast read its input; a Cast's output keeps the name the file gave the value
      // after the pair, so that saving again writes the same names.
      if (produced.count(n.inputs[0]) && readers[n.inputs[0]] == 1 && !g.is_graph_output(n.inputs[0]))
        middle_renames[n.inputs[0]] = n.outputs[0];
      else
        input_renames[n.outputs[0]] = n.inputs[0];
      continue;
    }
    if (!storage_cast) {
      kept.push_back(std::move(n));
      continue;
    }
    g.initializers[n.outputs[0]] = g.initializers.at(n.inputs[0]);
    g.stored_float_types[n.outputs[0]] = stored->second;
    sources.insert(n.inputs[0]);
  }
  g.nodes = std::move(kept);
  for (Node& n : g.nodes) {
    for (auto& in : n.inputs)
      if (const auto it = input_renames.find(in); it != input_renames.end()) in = it->second;
    for (auto& out : n.outputs)
      if (const auto it = middle_renames.find(out); it != middle_renames.end()) out = it->second;
  }
  // A 16-bit output holds 16-bit values: its producer's float32 result is rounded to them, unless
  // a Cast to that type writes it already.
  for (const ValueInfo& out : g.outputs) {
    const auto stored = g.stored_float_types.find(out.name);
    const int producer = g.producer(out.name);
    if (stored == g.stored_float_types.end() || producer < 0) continue;
    Node& writer = g.nodes[static_cast<size_t>(producer)];
    if (writer.domain.empty() && writer.op_type == "Cast" && writer.attr_int(kCastRoundsToAttr, 0) == stored->second)
      continue;
    const std::string wide = g.unique_value_name(out.name + "_float32");
    for (auto& o : writer.outputs)
      if (o == out.name) o = wide;
    for (Node& n : g.nodes)
      for (auto& in : n.inputs)
        if (in == out.name) in = wide;
    Node round;
    round.name = out.name + "_to_" + onnx_16bit_float_name(stored->second);
    round.op_type = "Cast";
    round.inputs = {wide};
    round.outputs = {out.name};
    round.attrs["to"] = int64_t{onnx::TensorProto::FLOAT};
    round.attrs[kCastRoundsToAttr] = int64_t{stored->second};
    g.nodes.push_back(std::move(round));
  }
  for (const std::string& source : sources)
    if (g.consumers(source).empty() && !g.is_graph_output(source)) {
      g.initializers.erase(source);
      g.stored_float_types.erase(source);
    }
}
}  // namespace

Graph parse_onnx(const std::string& bytes, const std::string& base_dir, const std::string& what) {
  onnx::ModelProto m;
  if (bytes.empty()) fail(ErrorKind::kInvalidModel, what + " is empty, not an ONNX model");
  if (!m.ParseFromString(bytes))
    fail(ErrorKind::kInvalidModel, what + " is not a valid ONNX model (protobuf parse failed: truncated or not ONNX)");
  if (!m.has_graph() || m.ir_version() <= 0)
    fail(ErrorKind::kInvalidModel, what + " is not a valid ONNX model (no graph or ir_version)");
  Graph g;
  g.ir_version = m.ir_version();
  g.producer_name = m.producer_name();
  g.producer_version = m.producer_version();
  g.doc_string = m.doc_string();
  g.opset = 0;
  for (const auto& op : m.opset_import()) {
    if (op.domain().empty() || op.domain() == "ai.onnx") g.opset = op.version();
    else g.extra_opsets[op.domain()] = op.version();
  }
  if (g.opset == 0) g.opset = 1;
  check_opset_versions(g);
  for (const auto& kv : m.metadata_props()) g.metadata[kv.key()] = kv.value();
  const LoadScope scope{base_dir, g.opset, g.extra_opsets};
  fill_graph_from_proto(m.graph(), scope, g);
  if (g.opset > library_opset())
    if (const std::string changed = changed_operator(g, library_opset(), g.opset, OpsetDirection::kReading);
        !changed.empty())
      fail(ErrorKind::kUnsupported, what + " uses opset " + std::to_string(g.opset) + ": " + changed +
                                        ", which slimquant does not implement (its ONNX library knows opsets up to " +
                                        std::to_string(library_opset()) + ")");
  adopt_16bit_storage_casts(g);
  // Exporters usually emit topological order, but the spec does not promise it to readers.
  g.topological_sort();
  g.validate();
  check_node_attributes(g);
  check_constant_input_types(g);
  return g;
}

namespace {

void fill_graph_from_proto(const onnx::GraphProto& gp, const LoadScope& scope, Graph& g) {
  const std::string& base_dir = scope.base_dir;
  g.opset = scope.opset;
  g.extra_opsets = scope.extra_opsets;
  g.name = gp.name();
  for (const auto& t : gp.initializer()) {
    g.initializers[t.name()] = tensor_from_proto(t, base_dir);
    if (is_onnx_16bit_float(t.data_type())) g.stored_float_types[t.name()] = t.data_type();
    if (is_onnx_4bit(t.data_type())) g.stored_4bit_types[t.name()] = t.data_type();
  }
  // optional(T) and seq(tensor) values are read as their tensor (element) type and remembered in
  // optional_values / sequence_values; maps and nested sequences are refused up front.
  // A value whose type is present but empty (exporters write If branch outputs so) is a tensor of
  // unknown type, as if it had none.
  auto typed = [](const onnx::ValueInfoProto& v) {
    return v.has_type() && v.type().value_case() != onnx::TypeProto::VALUE_NOT_SET;
  };
  auto as_tensor_type = [&](const onnx::ValueInfoProto& v) {
    if (!typed(v)) return v;
    const onnx::TypeProto* type = &v.type();
    const bool optional = type->has_optional_type();
    if (optional) type = &type->optional_type().elem_type();
    const bool sequence = type->has_sequence_type();
    if (sequence) type = &type->sequence_type().elem_type();
    if (!type->has_tensor_type()) return v;
    onnx::ValueInfoProto plain = v;
    *plain.mutable_type() = *type;
    if (optional) g.optional_values.insert(v.name());
    if (sequence) {
      g.sequence_values.insert(v.name());
      plain.mutable_type()->mutable_tensor_type()->clear_shape();  // elements' shapes may differ
    }
    return plain;
  };
  auto require_tensor = [&](const onnx::ValueInfoProto& v, const char* role) {
    if (typed(v) && !v.type().has_tensor_type())
      fail(ErrorKind::kUnsupported, std::string("graph ") + role + " '" + v.name() +
                                        "' is a map value or a sequence of non-tensors; only tensors, sequences of "
                                        "tensors and optional ones of both are supported");
    // String interfaces and types we lack: say so instead of misreading the data.
    const int elem_type = v.has_type() ? v.type().tensor_type().elem_type() : 0;
    if (is_onnx_16bit_float(elem_type)) {
      g.stored_float_types[v.name()] = elem_type;
    } else if (elem_type != 0) {
      try {
        dtype_from_onnx(v.type().tensor_type().elem_type());
      } catch (const Error& e) {
        fail(ErrorKind::kUnsupported, std::string("graph ") + role + " '" + v.name() + "': " + e.what());
      }
    }
  };
  for (const auto& given : gp.input()) {
    if (g.initializers.count(given.name())) continue;
    const onnx::ValueInfoProto v = as_tensor_type(given);
    require_tensor(v, "input");
    g.inputs.push_back(value_info_from_proto(v));
  }
  for (const auto& given : gp.output()) {
    const onnx::ValueInfoProto v = as_tensor_type(given);
    require_tensor(v, "output");
    g.outputs.push_back(value_info_from_proto(v));
  }
  for (const auto& v : gp.value_info()) g.value_info[v.name()] = value_info_from_proto(v);
  for (const auto& n : gp.node()) g.nodes.push_back(node_from_proto(n, scope));
}

}  // namespace

std::vector<ValueInfo> read_model_inputs(const std::string& path) {
  onnx::ModelProto m;
  std::error_code ec;
  if (!fs::is_regular_file(path, ec)) return {};
  try {
    if (!m.ParseFromString(read_file(path, "model file")) || !m.has_graph()) return {};
  } catch (const Error&) {
    return {};
  }
  std::set<std::string> initializers;
  for (const auto& t : m.graph().initializer()) initializers.insert(t.name());
  std::vector<ValueInfo> inputs;
  for (const auto& v : m.graph().input())
    if (!initializers.count(v.name())) inputs.push_back(value_info_from_proto(v));
  return inputs;
}

Graph load_onnx(const std::string& path) {
  if (!fs::exists(path)) fail(ErrorKind::kIo, "model file '" + path + "' does not exist");
  if (fs::is_directory(path)) fail(ErrorKind::kIo, "model path '" + path + "' is a directory, expected an .onnx file");
  std::string bytes = read_file(path, "model file");
  return parse_onnx(bytes, fs::path(path).parent_path().string(), "'" + path + "'");
}

namespace {

bool rounds_to_16bit(const Node& n) { return n.domain.empty() && n.op_type == "Cast" && n.has_attr(kCastRoundsToAttr); }

// Each rounding Cast back to the pair that means it in a file: Cast to the 16-bit type, Cast to float.
void write_rounding_casts_as_pairs(Graph& g) {
  std::vector<Node> nodes;
  nodes.reserve(g.nodes.size());
  for (Node& n : g.nodes) {
    for (auto& [key, value] : n.attrs)
      if (auto* branch = std::get_if<std::shared_ptr<const Graph>>(&value)) {
        auto copy = std::make_shared<Graph>(**branch);
        write_rounding_casts_as_pairs(*copy);
        value = std::shared_ptr<const Graph>(std::move(copy));
      }
    if (!rounds_to_16bit(n)) {
      nodes.push_back(std::move(n));
      continue;
    }
    const int64_t type = n.attr_int(kCastRoundsToAttr, kOnnxFloat16);
    const auto stored = g.stored_float_types.find(n.outputs[0]);
    if (stored != g.stored_float_types.end() && stored->second == type && g.is_graph_output(n.outputs[0])) {
      // It writes an output the file declares in that type: one Cast.
      n.attrs.erase(kCastRoundsToAttr);
      n.attrs["to"] = type;
      nodes.push_back(std::move(n));
      continue;
    }
    Node narrow = n;
    narrow.attrs.erase(kCastRoundsToAttr);
    narrow.attrs["to"] = type;
    narrow.outputs = {g.unique_value_name(n.outputs[0] + "_" + onnx_16bit_float_name(static_cast<int>(type)))};
    Node widen;
    widen.name = n.name.empty() ? "" : n.name + "_to_float";
    widen.op_type = "Cast";
    widen.inputs = narrow.outputs;
    widen.outputs = n.outputs;
    widen.attrs["to"] = int64_t{onnx::TensorProto::FLOAT};
    nodes.push_back(std::move(narrow));
    nodes.push_back(std::move(widen));
  }
  g.nodes = std::move(nodes);
}

Node cast_node(std::string name, std::string from, std::string to, int64_t type) {
  Node n;
  n.name = std::move(name);
  n.op_type = "Cast";
  n.inputs = {std::move(from)};
  n.outputs = {std::move(to)};
  n.attrs["to"] = type;
  return n;
}

// The model as its file stores it: what the model stores as float16/bfloat16 and this graph holds
// in float32 (Graph::stored_float_types, rounding Casts) is written back in that type.
onnx::ModelProto stored_model_proto_16bit(const Graph& graph) {
  const bool may_round = std::any_of(graph.nodes.begin(), graph.nodes.end(), rounds_to_16bit) ||
                            std::any_of(graph.nodes.begin(), graph.nodes.end(),
                                        [](const Node& n) { return !n.captured.empty(); });
  if (graph.stored_float_types.empty() && !may_round) return to_model_proto(graph);
  Graph g = graph;
  write_rounding_casts_as_pairs(g);
  auto rename_reads = [&](const std::string& from, const std::string& to) {
    for (Node& n : g.nodes)
      for (auto& in : n.inputs)
        if (in == from) in = to;
  };
  std::map<std::string, int> narrow_initializers, narrow_interface;
  for (const auto& [name, type] : graph.stored_float_types) {
    auto init = g.initializers.find(name);
    if (init != g.initializers.end()) {
      if (init->second.dtype() != DType::kFloat32 || g.is_graph_output(name)) continue;
      const std::string stored = g.unique_value_name(name + "_" + onnx_16bit_float_name(type));
      Tensor weight = init->second;
      g.initializers.erase(init);
      g.initializers[stored] = weight;
      g.nodes.push_back(cast_node("", stored, name, onnx::TensorProto::FLOAT));  // unnamed: bytes per weight
      narrow_initializers[stored] = type;
      continue;
    }
    auto input = std::find_if(g.inputs.begin(), g.inputs.end(), [&](const ValueInfo& v) { return v.name == name; });
    if (input != g.inputs.end() && input->dtype == DType::kFloat32) {
      if (g.is_graph_output(name)) continue;  // passed straight through: one type for both
      const std::string wide = g.unique_value_name(name + "_float32");
      rename_reads(name, wide);
      g.value_info.erase(name);
      g.nodes.push_back(cast_node(name + "_to_float", name, wide, onnx::TensorProto::FLOAT));
      narrow_interface[name] = type;
      continue;
    }
    auto output = std::find_if(g.outputs.begin(), g.outputs.end(), [&](const ValueInfo& v) { return v.name == name; });
    const int producer = g.producer(name);
    if (output != g.outputs.end() && producer >= 0 && g.nodes[static_cast<size_t>(producer)].op_type == "Cast" &&
        g.nodes[static_cast<size_t>(producer)].attr_int("to", 0) == type) {
      narrow_interface[name] = type;  // written by its own Cast (write_rounding_casts_as_pairs)
      continue;
    }
    if (output != g.outputs.end() && output->dtype == DType::kFloat32 && producer >= 0) {
      const std::string wide = g.unique_value_name(name + "_float32");
      rename_reads(name, wide);
      for (auto& out : g.nodes[static_cast<size_t>(producer)].outputs)
        if (out == name) out = wide;
      g.value_info.erase(name);
      g.nodes.push_back(cast_node(name + "_to_" + onnx_16bit_float_name(type), wide, name, type));
      narrow_interface[name] = type;
    }
  }
  g.topological_sort();
  onnx::ModelProto m = to_model_proto(g);
  auto* gp = m.mutable_graph();
  for (auto& t : *gp->mutable_initializer()) {
    const auto it = narrow_initializers.find(t.name());
    if (it == narrow_initializers.end()) continue;
    const Tensor& wide = g.initializers.at(t.name());
    std::vector<uint16_t> narrow(static_cast<size_t>(wide.numel()));
    floats_to_16bit(wide.data<float>(), narrow.data(), wide.numel(), it->second);
    std::string bits(reinterpret_cast<const char*>(narrow.data()), narrow.size() * 2);
    t.set_data_type(it->second);
    t.set_raw_data(std::move(bits));
  }
  for (auto* values : {gp->mutable_input(), gp->mutable_output()})
    for (auto& v : *values)
      if (const auto it = narrow_interface.find(v.name()); it != narrow_interface.end())
        v.mutable_type()->mutable_tensor_type()->set_elem_type(it->second);
  return m;
}

// 4-bit initializers (Graph::stored_4bit_types) packed; a model with them is IR version 10 at least.
onnx::ModelProto stored_model_proto(const Graph& graph) {
  onnx::ModelProto m = stored_model_proto_16bit(graph);
  if (graph.stored_4bit_types.empty()) return m;
  bool any = false;
  for (auto& t : *m.mutable_graph()->mutable_initializer()) {
    const auto it = graph.stored_4bit_types.find(t.name());
    if (it == graph.stored_4bit_types.end()) continue;
    const auto init = graph.initializers.find(t.name());
    if (init == graph.initializers.end()) continue;
    t.set_raw_data(packed_4bit(init->second, t.name()));
    t.set_data_type(it->second);
    any = true;
  }
  if (any && m.ir_version() < 10) m.set_ir_version(10);
  return m;
}

void check_model_proto(const onnx::ModelProto& given) {
  onnx::ModelProto m = given;
  libonnx_view(m);
  // A graph input or output of unknown rank (a tensor type without a shape, as some exporters write
  // outputs) is valid ONNX that ONNX Runtime loads, but onnx::checker insists on the field: the
  // checked copy gets an empty one, and the file is written as it came.
  for (auto* values : {m.mutable_graph()->mutable_input(), m.mutable_graph()->mutable_output()})
    for (auto& v : *values)
      if (v.type().has_tensor_type() && !v.type().tensor_type().has_shape())
        v.mutable_type()->mutable_tensor_type()->mutable_shape();
  try {
    onnx::checker::check_model(m);
  } catch (const std::exception& e) {
    fail(ErrorKind::kInvalidModel, std::string("onnx::checker rejects the model: ") + e.what());
  }
}

std::string serialized(const onnx::ModelProto& m) {
  std::string out;
  if (!m.SerializeToString(&out)) fail(ErrorKind::kInternal, "failed to serialize the model (larger than 2 GB?)");
  return out;
}

}  // namespace

std::string serialize_onnx(const Graph& graph) { return serialized(stored_model_proto(graph)); }

void check_onnx(const Graph& graph) { check_model_proto(stored_model_proto(graph)); }

void save_onnx(const Graph& graph, const std::string& path) {
  const onnx::ModelProto m = stored_model_proto(graph);
  check_model_proto(m);
  write_file_atomic(path, serialized(m));
}

namespace {
// ONNX 1.12's data propagators (Shape, Gather, Slice, ...) dereference their inputs' types without
// checking that inference found one: a Shape fed by a value of unknown type crashes the process.
// Infer without propagation first; propagate only when every propagating node's inputs are typed.
bool propagating_inputs_typed(const onnx::ModelProto& inferred, const onnx::ModelProto& original) {
  static const std::set<std::string> propagating = {"Shape", "Size",  "Cast", "Concat", "Gather", "Slice",
                                                    "Squeeze", "Unsqueeze", "Add", "Sub", "Mul", "Div"};
  std::set<std::string> typed;
  const auto& g = inferred.graph();
  for (const auto& v : g.input()) if (v.type().has_tensor_type()) typed.insert(v.name());
  for (const auto& v : g.value_info()) if (v.type().has_tensor_type()) typed.insert(v.name());
  for (const auto& v : g.output()) if (v.type().has_tensor_type()) typed.insert(v.name());
  for (const auto& t : original.graph().initializer()) typed.insert(t.name());
  for (const auto& n : g.node()) {
    if (!n.domain().empty() && n.domain() != "ai.onnx") continue;
    if (!propagating.count(n.op_type())) continue;
    for (const auto& in : n.input())
      if (in.empty() || !typed.count(in)) return false;
  }
  return true;
}

// ONNX's shape inference can crash the process on a malformed graph (ONNX 1.12's data propagators
// dereference types they assume; seen: a ViT export whose Concat axis was changed from 1 to -1), and
// a crash cannot be caught. Each inference pass therefore runs in a child process (fork: the
// model is shared copy-on-write) that sends back the inferred model without its initializers; a
// crash costs that pass's result, never the process.
enum class ChildOutcome { kDone, kThrew, kCrashed };
struct ChildResult {
  ChildOutcome outcome;
  std::string bytes;  // the inferred model (kDone) or the exception's message (kThrew)
};

std::string inferred_without_initializers(onnx::ModelProto model, const onnx::ShapeInferenceOptions& options) {
  onnx::shape_inference::InferShapes(model, onnx::OpSchemaRegistry::Instance(), options);
  model.mutable_graph()->clear_initializer();
  return model.SerializeAsString();
}

// The pass in this process: what the child runs, and the fallback when no child can be started.
ChildResult infer_in_process(const onnx::ModelProto& model, const onnx::ShapeInferenceOptions& options) {
  try {
    return {ChildOutcome::kDone, inferred_without_initializers(model, options)};
  } catch (const std::exception& e) {
    return {ChildOutcome::kThrew, e.what()};
  } catch (...) {
    return {ChildOutcome::kThrew, "unknown exception"};
  }
}

ChildResult infer_in_child(const onnx::ModelProto& model, const onnx::ShapeInferenceOptions& options) {
  onnx::OpSchemaRegistry::Instance();  // initialised here, never first in a child
  int fds[2];
  if (::pipe(fds) != 0) return infer_in_process(model, options);
  const pid_t pid = ::fork();
  if (pid < 0) {
    ::close(fds[0]);
    ::close(fds[1]);
    return infer_in_process(model, options);
  }
  if (pid == 0) {
    ::close(fds[0]);
    // A crash here is an expected outcome, reported by the exit status: no crash handler (a
    // sanitizer's would write a report and fail the sanitized test run) runs in the child.
    for (int sig : {SIGSEGV, SIGBUS, SIGFPE, SIGILL, SIGABRT}) ::signal(sig, SIG_DFL);
    const ChildResult result = infer_in_process(model, options);
    const std::string out = (result.outcome == ChildOutcome::kDone ? "D" : "T") + result.bytes;
    for (size_t done = 0; done < out.size();) {
      const ssize_t n = ::write(fds[1], out.data() + done, out.size() - done);
      if (n < 0 && errno == EINTR) continue;
      if (n <= 0) ::_exit(1);
      done += static_cast<size_t>(n);
    }
    ::_exit(0);  // no atexit handlers, no flushing of the parent's stdio buffers
  }
  ::close(fds[1]);
  std::string got;
  char buf[1 << 16];
  for (;;) {
    const ssize_t n = ::read(fds[0], buf, sizeof buf);
    if (n < 0 && errno == EINTR) continue;
    if (n <= 0) break;
    got.append(buf, static_cast<size_t>(n));
  }
  ::close(fds[0]);
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (!WIFEXITED(status) || WEXITSTATUS(status) != 0 || got.empty()) return {ChildOutcome::kCrashed, {}};
  return {got[0] == 'D' ? ChildOutcome::kDone : ChildOutcome::kThrew, got.substr(1)};
}

onnx::ModelProto parse_inferred(const ChildResult& result) {
  onnx::ModelProto inferred;
  if (!inferred.ParseFromString(result.bytes)) fail(ErrorKind::kInternal, "shape inference returned an unreadable model");
  return inferred;
}

// model becomes `inferred`, keeping its own initializers (moved, not copied).
void adopt_inferred(onnx::ModelProto& model, onnx::ModelProto&& inferred) {
  inferred.mutable_graph()->mutable_initializer()->Swap(model.mutable_graph()->mutable_initializer());
  model = std::move(inferred);
}

// Throws what ONNX throws; the caller decides whether that is fatal. Data propagation only refines
// shapes: when it crashes, the plain inference stands.
void infer_shapes_with_safe_propagation(onnx::ModelProto& model) {
  const onnx::ShapeInferenceOptions without(/*check_type=*/false, /*error_mode=*/0, /*data_prop=*/false);
  const ChildResult plain_result = infer_in_child(model, without);
  if (plain_result.outcome == ChildOutcome::kThrew) throw std::runtime_error(plain_result.bytes);
  if (plain_result.outcome == ChildOutcome::kCrashed)
    throw std::runtime_error("libonnx crashed while inferring the model's shapes: the graph is malformed "
                             "(onnx.checker.check_model(model, full_check=True) may say where)");
  onnx::ModelProto plain = parse_inferred(plain_result);
  if (!propagating_inputs_typed(plain, model)) {
    adopt_inferred(model, std::move(plain));
    return;
  }
  const onnx::ShapeInferenceOptions with(/*check_type=*/false, /*error_mode=*/0, /*data_prop=*/true);
  const ChildResult propagated = infer_in_child(model, with);
  if (propagated.outcome == ChildOutcome::kThrew) throw std::runtime_error(propagated.bytes);
  adopt_inferred(model, propagated.outcome == ChildOutcome::kDone ? parse_inferred(propagated) : std::move(plain));
}
}  // namespace

void infer_shapes_onnx(Graph& graph) {
  check_node_attributes(graph);
  onnx::ModelProto m = to_model_proto(graph);
  libonnx_view(m);
  try {
    infer_shapes_with_safe_propagation(m);
  } catch (const std::exception& e) {
    fail(ErrorKind::kInvalidModel, std::string("ONNX shape inference failed: ") + e.what());
  }
  for (const auto& v : m.graph().value_info()) {
    ValueInfo info = value_info_from_proto(v);
    graph.value_info[info.name] = info;
  }
  for (const auto& v : m.graph().output()) {
    ValueInfo info = value_info_from_proto(v);
    for (auto& o : graph.outputs)
      if (o.name == info.name && info.dims && (!o.dims || !o.fully_known())) o = info;
  }
}

}  // namespace slimquant::ir

namespace slimquant::ir {
Tensor read_tensor_pb(const std::string& path, std::string* name) {
  std::string bytes = read_file(path, "tensor file");
  onnx::TensorProto p;
  if (!p.ParseFromString(bytes)) fail(ErrorKind::kInvalidData, "'" + path + "' is not a serialized ONNX TensorProto");
  if (name) *name = p.name();
  return tensor_from_proto(p, fs::path(path).parent_path().string());
}

namespace {
Tensor sequence_from_proto(const onnx::SequenceProto& p, const std::string& base_dir, const std::string& what) {
  SQ_CHECK(p.elem_type() == onnx::SequenceProto::TENSOR || p.tensor_values_size() > 0 || p.elem_type() == 0,
           ErrorKind::kUnsupported, what + " is a sequence of non-tensors, which slimquant does not read");
  std::vector<Tensor> elements;
  for (const auto& t : p.tensor_values()) elements.push_back(tensor_from_proto(t, base_dir));
  // An empty sequence does not say its element type; float is ONNX's default (SequenceEmpty).
  const DType element_type = elements.empty() ? DType::kFloat32 : elements.front().dtype();
  return Tensor::sequence(element_type, std::move(elements));
}
}  // namespace

Tensor read_sequence_pb(const std::string& path, std::string* name) {
  std::string bytes = read_file(path, "sequence file");
  onnx::SequenceProto p;
  if (!p.ParseFromString(bytes)) fail(ErrorKind::kInvalidData, "'" + path + "' is not a serialized ONNX SequenceProto");
  if (name) *name = p.name();
  return sequence_from_proto(p, fs::path(path).parent_path().string(), "'" + path + "'");
}

Tensor read_optional_pb(const std::string& path, std::string* name) {
  std::string bytes = read_file(path, "optional file");
  onnx::OptionalProto p;
  if (!p.ParseFromString(bytes)) fail(ErrorKind::kInvalidData, "'" + path + "' is not a serialized ONNX OptionalProto");
  if (name) *name = p.name();
  const std::string base_dir = fs::path(path).parent_path().string();
  if (p.has_tensor_value()) return tensor_from_proto(p.tensor_value(), base_dir);
  if (p.has_sequence_value()) return sequence_from_proto(p.sequence_value(), base_dir, "'" + path + "'");
  SQ_CHECK(p.elem_type() == onnx::OptionalProto::UNDEFINED || p.elem_type() == onnx::OptionalProto::TENSOR ||
               p.elem_type() == onnx::OptionalProto::SEQUENCE,
           ErrorKind::kUnsupported, "'" + path + "' holds an optional map or sparse tensor");
  return Tensor();  // empty
}
}  // namespace slimquant::ir

namespace slimquant::ir {
Graph load_model(const std::string& model_dir, const std::string& model_filename, const std::string& params_filename) {
  fs::path dir(model_dir);
  if (!fs::is_directory(dir)) return load_onnx(model_dir);
  if (!params_filename.empty() && !fs::exists(dir / params_filename))
    fail(ErrorKind::kIo, "params file '" + (dir / params_filename).string() + "' does not exist");
  if (!model_filename.empty()) return load_onnx((dir / model_filename).string());
  std::vector<fs::path> candidates;
  for (const auto& e : fs::directory_iterator(dir))
    if (e.path().extension() == ".onnx") candidates.push_back(e.path());
  if (candidates.size() != 1)
    fail(ErrorKind::kInvalidArgument, "model directory '" + model_dir + "' holds " + std::to_string(candidates.size()) +
                                          " .onnx files; name one with model_filename");
  return load_onnx(candidates[0].string());
}
}  // namespace slimquant::ir

#include <onnx/version_converter/convert.h>

namespace slimquant::ir {
namespace {
// Before opset 13, Softmax / LogSoftmax / Hardmax coerce their input to 2-D at `axis`. ONNX's
// 12 -> 13 adapters need the input's rank to rewrite that; where shape inference cannot find it
// (a Reshape to a shape computed from Shape ops, as exporters write attention), state the old
// meaning explicitly: Flatten(axis) -> op(axis 1 of a 2-D value) -> Reshape to Shape(x). The
// Flatten output is declared 2-D, all the adapter needs.
void spell_out_coerced_softmax(Graph& graph) {
  Graph typed = graph;
  try {
    infer_shapes_onnx(typed);
  } catch (const Error&) {
  }
  auto has_rank = [&](const std::string& v) {
    for (const auto& in : typed.inputs)
      if (in.name == v) return in.dims.has_value();
    const auto it = typed.value_info.find(v);
    return it != typed.value_info.end() && it->second.dims.has_value();
  };
  std::vector<Node> nodes;
  for (const Node& n : graph.nodes) {
    const bool coerced = n.domain.empty() && (n.op_type == "Softmax" || n.op_type == "LogSoftmax" || n.op_type == "Hardmax");
    if (!coerced || n.inputs.empty() || has_rank(n.inputs[0])) {
      nodes.push_back(n);
      continue;
    }
    const std::string x = n.inputs[0], y = n.outputs.at(0);
    const std::string flat = graph.unique_value_name(y + "_2d"), soft = graph.unique_value_name(y + "_2d_out"),
                      shape = graph.unique_value_name(y + "_shape");
    graph.value_info[flat] = ValueInfo{flat, DType::kFloat32, std::vector<Dim>{Dim{}, Dim{}}};
    graph.value_info[soft] = ValueInfo{soft, DType::kUndefined, std::nullopt};  // reserves the name
    graph.value_info[shape] = ValueInfo{shape, DType::kUndefined, std::nullopt};
    Node f;
    f.op_type = "Flatten";
    f.name = n.name + "_flatten";
    f.inputs = {x};
    f.outputs = {flat};
    f.attrs["axis"] = n.attr_int("axis", 1);
    Node op = n;
    op.inputs = {flat};
    op.outputs = {soft};
    op.attrs["axis"] = int64_t{1};
    Node sh;
    sh.op_type = "Shape";
    sh.name = n.name + "_shape";
    sh.inputs = {x};
    sh.outputs = {shape};
    Node r;
    r.op_type = "Reshape";
    r.name = n.name + "_reshape";
    r.inputs = {soft, shape};
    r.outputs = {y};
    for (Node* add : {&f, &op, &sh, &r}) nodes.push_back(std::move(*add));
  }
  graph.nodes = std::move(nodes);
}
}  // namespace

void convert_opset(Graph& graph, int64_t target_opset) {
  if (graph.opset == target_opset) return;
  if (target_opset > library_opset()) return raise_opset_beyond_library(graph, target_opset);
  Graph source = graph;
  if (source.opset < 13 && target_opset >= 13) spell_out_coerced_softmax(source);
  check_node_attributes(source);
  onnx::ModelProto model = to_model_proto(source);
  libonnx_view(model);
  // Some adapters need the shapes of the values they rewrite: infer what ONNX can.
  try {
    infer_shapes_with_safe_propagation(model);
  } catch (const std::exception&) {
  }
  onnx::ModelProto converted;
  try {
    converted = onnx::version_conversion::ConvertVersion(model, static_cast<int>(target_opset));
  } catch (const std::exception& e) {
    fail(ErrorKind::kUnsupported, "cannot convert the model from opset " + std::to_string(graph.opset) + " to " +
                                      std::to_string(target_opset) + ": " + e.what());
  }
  std::string bytes;
  converted.SerializeToString(&bytes);
  Graph g = parse_onnx(bytes, ".", "converted model");
  g.metadata = graph.metadata;
  g.stored_float_types = graph.stored_float_types;
  graph = std::move(g);
}
}  // namespace slimquant::ir
