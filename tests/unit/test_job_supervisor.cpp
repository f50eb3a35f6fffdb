// run_supervised (comm/job_supervisor.hpp): a SIGTERM to the launcher reaches the job as
// SIGUSR1 first (a clean stop), as SIGTERM when the job has not ended after the grace
// period, and the job's exit status comes back. The "job" is a shell script.
#include <gtest/gtest.h>

#include <signal.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <string>
#include <thread>

#include "shardlm/comm/job_supervisor.hpp"

namespace shardlm {
namespace {

std::string read_all(const std::string& path) {
  std::ifstream in(path);
  std::stringstream text;
  text << in.rdbuf();
  return text.str();
}

// Runs `script` under run_supervised and sends this process SIGTERM once the script has
// written `ready` (it has set its traps).
JobExit run_and_signal(const std::string& script, const std::string& dir, double grace) {
  const std::string ready = dir + "/ready";
  std::thread signaller([ready] {
    for (int i = 0; i < 3000 && !std::ifstream(ready).good(); ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(10));
    ::kill(::getpid(), SIGTERM);
  });
  const JobExit exit = run_supervised({"bash", "-c", script}, {{"READY", ready}}, grace);
  signaller.join();
  return exit;
}

TEST(JobSupervisor, FirstSignalAsksTheJobToStopWithSigusr1) {
  char dir[] = "/tmp/shardlm-supervisor.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string log = std::string(dir) + "/log";
  const std::string script = "trap 'echo usr1 >> " + log + "; exit 75' USR1; "
                             "trap 'echo term >> " + log + "; exit 1' TERM; "
                             "touch \"$READY\"; for i in $(seq 1 600); do sleep 0.05; done; exit 3";
  const JobExit exit = run_and_signal(script, dir, 60.0);
  EXPECT_EQ(exit.stop_signal, SIGTERM);
  EXPECT_EQ(exit.status, 75);
  EXPECT_FALSE(exit.ended);
  EXPECT_EQ(read_all(log), "usr1\n");
  std::filesystem::remove_all(dir);
}

TEST(JobSupervisor, AJobThatDoesNotStopIsTerminatedAfterTheGracePeriod) {
  char dir[] = "/tmp/shardlm-supervisor.XXXXXX";
  ASSERT_NE(::mkdtemp(dir), nullptr);
  const std::string log = std::string(dir) + "/log";
  const std::string script = "trap 'echo usr1 >> " + log + "' USR1; "
                             "trap 'echo term >> " + log + "; exit 7' TERM; "
                             "touch \"$READY\"; for i in $(seq 1 600); do sleep 0.05; done; exit 3";
  const JobExit exit = run_and_signal(script, dir, 0.3);
  EXPECT_EQ(exit.stop_signal, SIGTERM);
  EXPECT_EQ(exit.status, 7);
  EXPECT_TRUE(exit.ended);
  EXPECT_EQ(read_all(log), "usr1\nterm\n");
  std::filesystem::remove_all(dir);
}

TEST(JobSupervisor, ExitStatusWithoutSignals) {
  const JobExit exit = run_supervised({"bash", "-c", "exit 5"}, {}, 1.0);
  EXPECT_EQ(exit.status, 5);
  EXPECT_EQ(exit.stop_signal, 0);
  EXPECT_FALSE(exit.ended);
}

}  // namespace
}  // namespace shardlm
