// Failure scenarios for the multi-rank tests: each must end the whole job with a
// non-zero exit and a message naming the rank, never hang. Run by
// tests/mpi/expect_job_failure.cmake as `mpirun -n 2 mpi_comm_scenarios <scenario>`.
//   skip-collective  rank 1 never issues the all-reduce rank 0 waits for (2 s deadline)
//   abort-job        rank 1 hits an error and calls abort_job while rank 0 sits in a barrier
//   skip-recv        rank 1 never sends the activations rank 0 waits to receive (2 s)
//   skip-all-to-all  rank 1 never joins the all_to_all rank 0 waits for (2 s)
#include <chrono>
#include <cstdio>
#include <string>
#include <thread>
#include <vector>

#include "shardlm/comm/mpi_communicator.hpp"

int main(int argc, char** argv) {
  using namespace shardlm;
  const std::string scenario = argc > 1 ? argv[1] : "";
  CommOptions options;
  options.timeout_seconds = scenario.rfind("skip-", 0) == 0 ? 2.0 : 60.0;
  auto world = MpiCommunicator::create_world(options);
  std::vector<float> gradients(1024, 1.0f);

  if (scenario == "skip-collective") {
    if (world->rank() != 1)
      world->all_reduce(gradients.data(), gradients.size(), ReduceOp::sum, "gradients bucket 0")
          .wait();
    else
      std::this_thread::sleep_for(std::chrono::seconds(30));  // busy elsewhere; must be killed
  } else if (scenario == "skip-recv" || scenario == "skip-all-to-all") {
    if (world->rank() != 1) {
      std::vector<float> received(2 * 1024);
      if (scenario == "skip-recv")
        world->recv(gradients.data(), gradients.size(), 1, "activations micro 0").wait();
      else
        world->all_to_all(gradients.data(), received.data(), 512, "ulysses q").wait();
    } else {
      std::this_thread::sleep_for(std::chrono::seconds(30));  // busy elsewhere; must be killed
    }
  } else if (scenario == "abort-job") {
    if (world->rank() == 1) {
      std::this_thread::sleep_for(std::chrono::milliseconds(200));
      world->abort_job("loss became NaN at step 3");
    }
    world->barrier("end of step 3").wait();
  } else {
    std::fprintf(stderr, "unknown scenario '%s'\n", scenario.c_str());
    return 2;
  }
  world->finalize();
  std::printf("rank %d: scenario %s finished without failing\n", world->rank(), scenario.c_str());
  return 0;
}
