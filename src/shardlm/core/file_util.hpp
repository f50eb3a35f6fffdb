// Small POSIX file helpers with one-line errors: durable writes (fsync), atomic
// replacement (content goes to a temporary file next to the target, is fsynced, and
// is renamed over the target only when complete, so a failed write never leaves a
// half file behind), positional reads.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace shardlm {

// An owned file descriptor.
class File {
 public:
  File() = default;
  // Error naming the path (and what it should be, if given) on failure.
  static File open_read(const std::string& path, std::string_view expected = {});
  static File create_write(const std::string& path);  // truncates
  ~File();
  File(File&& other) noexcept;
  File& operator=(File&& other) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;

  void write_all(const void* data, size_t bytes);  // Error (e.g. disk full) names the path
  void write_zeros(size_t bytes);  // as write_all of zeros, as a hole in the file
  void write_at(const void* data, size_t bytes, int64_t offset);  // overwrite in place
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

// A file that appears at `path` only when commit() renames its finished temporary
// (path.tmp.<pid>) over it; destroyed uncommitted, the temporary is removed.
class AtomicFileWriter {
 public:
  explicit AtomicFileWriter(std::string path);  // Error naming the path if it cannot be created
  ~AtomicFileWriter();
  AtomicFileWriter(const AtomicFileWriter&) = delete;
  AtomicFileWriter& operator=(const AtomicFileWriter&) = delete;

  void write(const void* data, size_t bytes) { file_.write_all(data, bytes); }
  void write_at(const void* data, size_t bytes, int64_t offset) {
    file_.write_at(data, bytes, offset);
  }
  // Fsyncs and closes the temporary file; it is still not visible.
  void finish();
  // Renames the finished temporary file onto the target and fsyncs the directory.
  void commit();
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  std::string temp_path_;
  File file_;
  bool finished_ = false;
  bool committed_ = false;
};

// Creates DIR and its missing parents; returns the directories it created, outermost
// first (Error naming DIR when it cannot, or when a file of that name exists).
std::vector<std::string> create_directories_reporting(const std::string& dir);
// Removes directories create_directories_reporting made, innermost first, stopping at
// the first one that is not empty (a failed job leaves nothing it created behind).
void remove_created_directories(const std::vector<std::string>& created);

// Writes `content` to path through an AtomicFileWriter.
void write_file_atomic(const std::string& path, std::string_view content);
// Removes the temporaries that processes of this host which no longer run left in DIR
// (not below it): AtomicFileWriter's NAME.tmp.PID files and NAME-tmp-PID directories
// (export's). Call it only under the lock that keeps live writers of DIR out. Returns
// the paths removed.
std::vector<std::string> remove_temporaries_of_dead_processes(const std::string& dir);

// The whole file; Error naming the path (and what it should be, if given) if unreadable.
std::string read_text_file(const std::string& path, std::string_view expected = {});

}  // namespace shardlm
