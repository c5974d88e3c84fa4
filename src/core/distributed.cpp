// The one file that talks to MPI (docs/scale-out.md). SLIMQUANT_WITH_MPI is defined for this file
// only, by CMake, when MPI was found.
#include "slimquant/core/distributed.h"

#include <omp.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <iostream>
#include <thread>

#include "slimquant/core/error.h"

#ifndef SLIMQUANT_WITH_MPI
#define SLIMQUANT_WITH_MPI 0
#endif
#if SLIMQUANT_WITH_MPI
#include <mpi.h>
#endif

namespace slimquant::distributed {

namespace {

bool g_active = false;
int g_rank = 0, g_size = 1;

// Set by the launchers that start MPI processes: Open MPI's mpirun, PMI-1/2 (MPICH's hydra, srun
// --mpi=pmi2) and PMIx (srun --mpi=pmix, Open MPI 5).
bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(var)) return true;
  return false;
}

#if SLIMQUANT_WITH_MPI
// Ranks sharing this machine, from the launcher's environment (1 when it does not say).
int local_ranks() {
  for (const char* var : {"OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS", "SLURM_NTASKS_PER_NODE"})
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  return 1;
}

int checked_count(size_t n, const char* what) {
  SQ_CHECK(n <= static_cast<size_t>(INT_MAX), ErrorKind::kUnsupported,
           std::string("distributed ") + what + " of " + std::to_string(n) + " bytes: MPI messages are limited to 2 GiB");
  return static_cast<int>(n);
}
#endif

}  // namespace

bool built_with_mpi() { return SLIMQUANT_WITH_MPI != 0; }

void init(int* argc, char*** argv) {
  if (g_active || !launched_by_mpi()) return;
#if SLIMQUANT_WITH_MPI
  int provided = 0;
  // OpenMP threads never call MPI: only the main thread does.
  MPI_Init_thread(argc, argv, MPI_THREAD_FUNNELED, &provided);
  // Errors become exceptions of ours, not MPI's default of aborting without a message.
  MPI_Comm_set_errhandler(MPI_COMM_WORLD, MPI_ERRORS_RETURN);
  MPI_Comm_rank(MPI_COMM_WORLD, &g_rank);
  MPI_Comm_size(MPI_COMM_WORLD, &g_size);
  g_active = true;
  const int local = local_ranks();
  if (local > 1 && !std::getenv("OMP_NUM_THREADS")) {
    const int cores = static_cast<int>(std::max(1u, std::thread::hardware_concurrency()));
    omp_set_num_threads(std::max(1, cores / local));
  }
#else
  (void)argc;
  (void)argv;
  // Each process would run the whole job on its own and all but one would stop at the save_dir lock.
  const char* ranks = std::getenv("OMPI_COMM_WORLD_SIZE");
  if (ranks && std::atoi(ranks) > 1)
    std::cerr << "warning: started by mpirun, but this slimquant was built without MPI "
                 "(-DSLIMQUANT_WITH_MPI=OFF): every process runs the whole job alone" << std::endl;
#endif
}

void finalize() {
#if SLIMQUANT_WITH_MPI
  if (g_active) MPI_Finalize();
#endif
  g_active = false;
  g_rank = 0;
  g_size = 1;
}

void abort(int exit_code) {
#if SLIMQUANT_WITH_MPI
  if (g_active && g_size > 1) MPI_Abort(MPI_COMM_WORLD, exit_code);
#endif
  std::exit(exit_code);
}

bool active() { return g_active; }
int rank() { return g_rank; }
int size() { return g_size; }

#if SLIMQUANT_WITH_MPI
namespace {
void check(int rc, const char* call) {
  if (rc == MPI_SUCCESS) return;
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  fail(ErrorKind::kIo, std::string(call) + " failed on rank " + std::to_string(g_rank) + ": " + std::string(text, len));
}

template <typename T>
T sum_over_ranks(T value, MPI_Datatype type) {
  T out{};
  check(MPI_Allreduce(&value, &out, 1, type, MPI_SUM, MPI_COMM_WORLD), "MPI_Allreduce");
  return out;
}
}  // namespace
#endif

void barrier() {
#if SLIMQUANT_WITH_MPI
  if (g_size > 1) check(MPI_Barrier(MPI_COMM_WORLD), "MPI_Barrier");
#endif
}

double all_reduce_sum(double value) {
#if SLIMQUANT_WITH_MPI
  if (g_size > 1) return sum_over_ranks(value, MPI_DOUBLE);
#endif
  return value;
}

int64_t all_reduce_sum(int64_t value) {
#if SLIMQUANT_WITH_MPI
  if (g_size > 1) return sum_over_ranks(value, MPI_INT64_T);
#endif
  return value;
}

std::vector<std::string> gather(const std::string& bytes, int root) {
  if (g_size == 1) return {bytes};
#if SLIMQUANT_WITH_MPI
  const int n = checked_count(bytes.size(), "gather");
  std::vector<int> sizes(g_rank == root ? g_size : 0), offsets;
  check(MPI_Gather(&n, 1, MPI_INT, sizes.data(), 1, MPI_INT, root, MPI_COMM_WORLD), "MPI_Gather");
  std::string all;
  if (g_rank == root) {
    size_t total = 0;
    for (int s : sizes) offsets.push_back(static_cast<int>(total)), total += static_cast<size_t>(s);
    checked_count(total, "gather");
    all.resize(total);
  }
  check(MPI_Gatherv(bytes.data(), n, MPI_BYTE, all.data(), sizes.data(), offsets.data(), MPI_BYTE, root, MPI_COMM_WORLD),
        "MPI_Gatherv");
  std::vector<std::string> out;
  for (size_t r = 0; r < sizes.size(); ++r) out.push_back(all.substr(static_cast<size_t>(offsets[r]), static_cast<size_t>(sizes[r])));
  return out;
#else
  (void)root;
  return {bytes};
#endif
}

std::string broadcast(const std::string& bytes, int root) {
  if (g_size == 1) return bytes;
#if SLIMQUANT_WITH_MPI
  int n = g_rank == root ? checked_count(bytes.size(), "broadcast") : 0;
  check(MPI_Bcast(&n, 1, MPI_INT, root, MPI_COMM_WORLD), "MPI_Bcast");
  std::string out = g_rank == root ? bytes : std::string(static_cast<size_t>(n), '\0');
  check(MPI_Bcast(out.data(), n, MPI_BYTE, root, MPI_COMM_WORLD), "MPI_Bcast");
  return out;
#else
  (void)root;
  return bytes;
#endif
}

Range block_of(size_t count, int r, int n) {
  const size_t ranks = static_cast<size_t>(std::max(n, 1)), i = static_cast<size_t>(r);
  const size_t base = count / ranks, extra = count % ranks;
  const size_t begin = i * base + std::min(i, extra);
  return {begin, begin + base + (i < extra ? 1 : 0)};
}

}  // namespace slimquant::distributed
