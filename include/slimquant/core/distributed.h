#pragma once
// The process group of a distributed run: the ranks of an `mpirun -np N slimquant ...` launch, or a
// group of one. The analysis, calibration and evaluation code uses only this interface, so it has
// no MPI of its own; without MPI at build time, or when the process was not started by an MPI
// launcher, every call is the trivial one-process version and MPI is never initialised (a plain run
// behaves, and costs, exactly as before).
//
// Every collective (barrier, all_reduce_sum, gather, broadcast) must be called by all ranks in the
// same order. A rank that fails calls abort(): MPI stops the other ranks instead of leaving them
// waiting in a collective.
#include <cstdint>
#include <string>
#include <vector>

namespace slimquant::distributed {

// Initialises MPI when this process was started by an MPI launcher (Open MPI's mpirun, or a PMI /
// PMIx launcher such as srun) and slimquant was built with MPI; otherwise does nothing. When
// several ranks share one machine and OMP_NUM_THREADS is not set, each rank's OpenMP pool takes its
// share of the cores instead of all of them. Idempotent.
void init(int* argc, char*** argv);
// Finalises MPI if init() started it. Called once at exit.
void finalize();
// Ends every rank of the job with `exit_code` (MPI_Abort); a plain exit when not distributed.
[[noreturn]] void abort(int exit_code);

bool built_with_mpi();
bool active();  // MPI is initialised (launched by mpirun), whatever the number of ranks
int rank();     // 0 when not distributed
int size();     // 1 when not distributed
inline bool is_root() { return rank() == 0; }

void barrier();
double all_reduce_sum(double value);
int64_t all_reduce_sum(int64_t value);
// Every rank's `bytes` at `root`, in rank order; the other ranks get an empty vector.
std::vector<std::string> gather(const std::string& bytes, int root = 0);
// `bytes` of `root` on every rank (the other ranks' argument is ignored).
std::string broadcast(const std::string& bytes, int root = 0);

// The contiguous block [begin, end) of `count` items that rank `r` of `n` takes: blocks differ in
// size by at most one, earlier ranks take the larger ones. Contiguous blocks keep batch order when
// results are merged in rank order.
struct Range {
  size_t begin = 0, end = 0;
};
Range block_of(size_t count, int r = rank(), int n = size());

}  // namespace slimquant::distributed
