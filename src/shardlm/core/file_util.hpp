// Small POSIX file helpers with one-line errors: durable writes (fsync), atomic
// replacement, positional reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>

namespace shardlm {

// An owned file descriptor.
class File {
 public:
  File() = default;
  static File open_read(const std::string& path);   // Error naming the path on failure
  static File create_write(const std::string& path);  // truncates
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  void write_all(const void* data, size_t bytes);  // Error (e.g. disk full) names the path
  void read_at(void* out, size_t bytes, int64_t offset) const;  // Error on short read
  void sync();                                     // fsync
  int64_t size() const;
  void close();
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

void fsync_directory(const std::string& dir);
// Writes `content` to path via path.tmp + fsync + rename + fsync(dir).
void write_file_atomic(const std::string& path, const std::string& content);
std::string read_text_file(const std::string& path);  // Error naming the path if unreadable

}  // namespace shardlm
