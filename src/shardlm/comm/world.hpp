// make_world_communicator: MPI when the process was started by an MPI launcher
// (mpirun -n N shardlm ...), the single-process communicator otherwise, so plain
// `shardlm train` never initialises MPI.
#pragma once

#include <memory>

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

}  // namespace shardlm
