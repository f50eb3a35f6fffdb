// The live progress line: redrawn in place on a terminal, plain lines otherwise.
#pragma once

#include <cstdint>
#include <string>

namespace shardlm {

class ProgressLine {
 public:
  // log_every: how often a plain line is printed when stdout is not a terminal.
  ProgressLine(int64_t total_steps, int64_t log_every);
  void update(int64_t step, double loss, double lr, double tokens_per_s, double eta_s);
  // Prints a message on its own line without breaking the progress line.
  void message(const std::string& text);
  void finish();

 private:
  int64_t total_steps_;
  int64_t log_every_;
  bool is_tty_;
  bool line_open_ = false;
};

// Whether a person watches this process's stdout, so a line may be redrawn in place.
// SHARDLM_STDOUT_TTY=1|0 decides when set (`launch` sets it from its own stdout). Else,
// under mpirun (OMPI_COMM_WORLD_SIZE set) the answer is no: Open MPI gives ranks a
// pseudo-terminal whatever mpirun's own stdout is, so isatty() says yes even when the
// log goes to a file. Else isatty(stdout).
bool stdout_is_watched();

std::string format_duration(double seconds);  // "1h02m", "3m05s", "12s"

}  // namespace shardlm
