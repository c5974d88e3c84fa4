#include "runtime/dnnl_context.h"

#include <algorithm>
#include <array>
#include <memory>

#include "slimquant/runtime/session.h"

namespace slimquant::runtime {

dnnl::engine& dnnl_engine() {
  static dnnl::engine engine(dnnl::engine::kind::cpu, 0);
  return engine;
}

dnnl::stream& dnnl_stream() {
  static dnnl::stream stream(dnnl_engine());
  return stream;
}

bool effective_isa_includes(dnnl::cpu_isa isa) {
  const auto effective = static_cast<unsigned>(dnnl::get_effective_cpu_isa());
  const auto wanted = static_cast<unsigned>(isa);
  return (effective & wanted) == wanted;
}

dnnl::memory::data_type to_dnnl_type(DType t) {
  using dt = dnnl::memory::data_type;
  switch (t) {
    case DType::kFloat32: return dt::f32;
    case DType::kInt8: return dt::s8;
    case DType::kUInt8: return dt::u8;
    case DType::kInt32: return dt::s32;
    case DType::kFloat16: return dt::f16;
    default: fail(ErrorKind::kUnsupported, std::string("oneDNN has no data type for ") + dtype_name(t));
  }
}

dnnl::memory::format_tag plain_tag(size_t rank) {
  using tag = dnnl::memory::format_tag;
  switch (rank) {
    case 1: return tag::a;
    case 2: return tag::ab;
    case 3: return tag::abc;
    case 4: return tag::abcd;
    case 5: return tag::abcde;
    case 6: return tag::abcdef;
    default: fail(ErrorKind::kUnsupported, "oneDNN tensors of rank " + std::to_string(rank));
  }
}

namespace {

struct ScratchBuffer {
  std::shared_ptr<std::byte[]> data;
  size_t size = 0;
};

std::array<ScratchBuffer, static_cast<size_t>(DnnlScratch::kCount)>& scratch_buffers() {
  thread_local std::array<ScratchBuffer, static_cast<size_t>(DnnlScratch::kCount)> buffers;
  return buffers;
}

}  // namespace

void release_scratch_buffers() {
  for (ScratchBuffer& b : scratch_buffers()) b = ScratchBuffer();
}

void* dnnl_scratch(DnnlScratch slot, size_t bytes) {
  ScratchBuffer& b = scratch_buffers().at(static_cast<size_t>(slot));
  if (bytes > b.size) {
    // Grow geometrically so a slowly increasing sequence of requests does not reallocate each time.
    size_t size = std::max(bytes, b.size + b.size / 2);
    b.data = allocate_storage(size);
    b.size = size;
  }
  return b.data.get();
}

dnnl::memory dnnl_scratch_memory(DnnlScratch slot, const dnnl::memory::desc& desc) {
  return dnnl::memory(desc, dnnl_engine(), dnnl_scratch(slot, std::max<size_t>(desc.get_size(), 1)));
}

}  // namespace slimquant::runtime
