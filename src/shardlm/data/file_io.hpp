// Atomic file writes for the data room: content goes to a temporary file next
// to the target, is fsynced, and is renamed over the target only when complete,
// so a failed write never leaves a half file behind.
#pragma once

#include <cstddef>
#include <string>

namespace shardlm::data_io {

class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);  // Error naming the path if it cannot be created
  ~AtomicFileWriter();                           // removes the temporary file unless committed
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes);
  void write_at(const void* data, size_t bytes, size_t offset);  // overwrite already-written bytes
  // Flushes, fsyncs and closes the temporary file; it is still not visible.
  void finish();
  // Renames the finished temporary file onto the target (and fsyncs the directory).
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string temp_path_;
  int fd_ = -1;
  bool committed_ = false;
};

// write + finish + commit in one call.
void write_file_atomically(const std::string& path, const void* data, size_t bytes);

// The whole file as bytes; Error naming the path (and `what` it should be) if unreadable.
std::string read_whole_file(const std::string& path, const std::string& what);

}  // namespace shardlm::data_io
