#pragma once
// The one CPU engine and stream all oneDNN kernels share, and helpers that keep oneDNN v2 (2.6)
// specifics in one place.
#include <dnnl.hpp>

#include "slimquant/core/tensor.h"

namespace slimquant::runtime {

dnnl::engine& dnnl_engine();
dnnl::stream& dnnl_stream();

inline dnnl::memory::dims to_dnnl_dims(const Shape& s) { return dnnl::memory::dims(s.begin(), s.end()); }
dnnl::memory::data_type to_dnnl_type(DType t);
// Whether oneDNN's effective ISA (the CPU's, limited by DNNL_MAX_CPU_ISA) includes `isa`: the
// cpu_isa values are cumulative bit sets, an ISA holding every bit of the ones it extends.
bool effective_isa_includes(dnnl::cpu_isa isa);
// Plain row-major format tag for a given rank (a, ab, abc, ...).
dnnl::memory::format_tag plain_tag(size_t rank);

// Per-thread, grow-only scratch buffers (64-byte aligned) for data that lives only while one kernel
// runs: blocked copies of activations, runtime-reordered weights, oneDNN scratchpads. Sharing them
// across kernels keeps memory at one buffer per slot instead of one per layer. The pointer stays
// valid until the next call with the same slot on the same thread asks for more bytes.
enum class DnnlScratch { kScratchpad, kSrc, kDst, kWeights, kAux, kCount };
void* dnnl_scratch(DnnlScratch slot, size_t bytes);
// A oneDNN memory over scratch slot `slot`, sized for `desc`.
dnnl::memory dnnl_scratch_memory(DnnlScratch slot, const dnnl::memory::desc& desc);

}  // namespace slimquant::runtime
