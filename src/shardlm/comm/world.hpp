// make_world_communicator: MPI when the process was started by an MPI launcher
// (mpirun -n N shardlm ...), the single-process communicator otherwise, so plain
// `shardlm train` never initialises MPI.
#pragma once

#include <memory>
#include <string>

#include "shardlm/comm/communicator.hpp"

namespace shardlm {

enum class CommBackend { automatic, single_process, mpi };

// True when an MPI launcher started this process: Open MPI's mpirun
// (OMPI_COMM_WORLD_SIZE), MPICH's Hydra (PMI_SIZE) or a PMIx launcher (PMIX_RANK).
bool launched_by_mpi_launcher();

// `automatic` chooses by launched_by_mpi_launcher(). Environment overrides, for
// debugging and measuring a job without new flags: SHARDLM_COMM_CHECK=1 turns on
// options.check_sequence; SHARDLM_COMM_OVERLAP=0 / 1 sets options.overlap.
std::unique_ptr<Communicator> make_world_communicator(CommOptions options = {},
                                                      CommBackend backend = CommBackend::automatic);

// Prints the line on stderr and ends the whole job: MPI_Abort where MPI is up (mpirun
// then kills every rank and exits non-zero), else _Exit(1). Legal from any thread under
// MPI_THREAD_MULTIPLE (what we ask for), and what Open MPI does in practice under
// SERIALIZED too, even while the communication thread is blocked inside a collective.
// Captures nothing, so a deadline handler that calls it may outlive its communicator.
[[noreturn]] void print_line_and_end_job(const std::string& line);

}  // namespace shardlm
