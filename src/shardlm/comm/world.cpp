#include "shardlm/comm/world.hpp"

#include <cstdio>
#include <cstdlib>
#include <string_view>

#include "shardlm/comm/mpi_communicator.hpp"
#include "shardlm/comm/mpi_include.hpp"
#include "shardlm/comm/single_process_communicator.hpp"

namespace shardlm {

void print_line_and_end_job(const std::string& line) {
  std::fflush(stdout);
  std::fprintf(stderr, "%s\n", line.c_str());
  std::fflush(stderr);
  int initialized = 0;
  int finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Abort(MPI_COMM_WORLD, 1);
  std::_Exit(1);
}

bool launched_by_mpi_launcher() {
  for (const char* name : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK"})
    if (std::getenv(name) != nullptr) return true;
  return false;
}

std::unique_ptr<Communicator> make_world_communicator(CommOptions options, CommBackend backend) {
  if (const char* check = std::getenv("SHARDLM_COMM_CHECK");
      check && std::string_view(check) == "1")
    options.check_sequence = true;
  if (const char* overlap = std::getenv("SHARDLM_COMM_OVERLAP"))
    options.overlap = std::string_view(overlap) != "0";
  if (backend == CommBackend::automatic)
    backend = launched_by_mpi_launcher() ? CommBackend::mpi : CommBackend::single_process;
  if (backend == CommBackend::mpi) return MpiCommunicator::create_world(options);
  return std::make_unique<SingleProcessCommunicator>(options);
}

}  // namespace shardlm
