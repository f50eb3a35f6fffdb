#include "shardlm/comm/launcher_watch.hpp"

#include <unistd.h>

#include <chrono>
#include <cstdio>
#include <mutex>
#include <thread>

namespace shardlm {

void exit_when_launcher_dies(const std::string& who) {
  static std::once_flag started;
  std::call_once(started, [&who] {
    const pid_t launcher = ::getppid();
    std::thread([launcher, who] {
      for (;;) {
        std::this_thread::sleep_for(std::chrono::milliseconds(200));
        if (::getppid() == launcher) continue;
        std::fflush(stdout);
        std::fprintf(stderr, "%s: the launcher that started this process (pid %d) is gone; exiting\n",
                     who.c_str(), static_cast<int>(launcher));
        std::fflush(stderr);
        ::_exit(1);
      }
    }).detach();
  });
}

}  // namespace shardlm
