// Every file trainmem writes (report, timeline, dump, per-rank files) is written to a temporary
// name beside it and renamed onto its own name only when complete: a failed write (a full disk,
// a kill) leaves the old file or none, never a truncated one, and the message says why (the OS
// error). Paths that are not regular files (/dev/null, /dev/stdout, a FIFO) are written in
// place: renaming onto them would replace the device node.
#pragma once
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

namespace trainmem {

class AtomicFile {
 public:
  // Creates the temporary file beside `path`. `what` names the flag in messages ("--output").
  // InputError naming `what`, the path and the OS error when it cannot be created.
  AtomicFile(std::string path, std::string what);
  AtomicFile(const AtomicFile&) = delete;
  AtomicFile& operator=(const AtomicFile&) = delete;
  // Removes the temporary file unless commit() succeeded.
  ~AtomicFile();

  // Appends `n` bytes.
  void write(const void* data, std::size_t n);
  void write(const std::string& text) { write(text.data(), text.size()); }
  // Writes `n` bytes at `offset` (the file's append position is not moved).
  void write_at(const void* data, std::size_t n, std::uint64_t offset);
  // Reserves `bytes` on the disk now (posix_fallocate where the filesystem has it, else the
  // file is only sized): a disk too small fails here, before any work is done.
  void reserve(std::uint64_t bytes);
  // Flushes, closes and renames onto the path. Errors name the flag, path and OS error.
  void commit();

  const std::string& path() const { return path_; }

 private:
  [[noreturn]] void fail(const std::string& doing, int err);
  // Writes all `n` bytes, at `offset` (pwrite) or appended when it is negative.
  void put(const char* p, std::size_t n, std::int64_t offset);
  std::string path_, what_, temp_;
  int fd_ = -1;
  bool in_place_ = false;  // not a regular file: written directly
  std::uint64_t append_at_ = 0;
};

// Writes `text` to `path` through an AtomicFile.
void write_file_atomically(const std::string& path, const std::string& text,
                           const std::string& what);

// Whether two output paths name the same file (after resolving ., .., symbolic links and, for
// files that exist, hard links). Paths that are not regular files (/dev/null) never clash.
bool same_output_file(const std::string& a, const std::string& b);

// Exit 2 (InputError naming both flags) when two outputs of one command are the same file;
// empty paths are ignored. `outputs` holds (flag, path) pairs.
void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs);

}  // namespace trainmem
