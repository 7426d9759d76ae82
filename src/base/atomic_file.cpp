// Files written whole or not at all: a temporary name beside the target, renamed when complete.
#include "trainmem/base/atomic_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>
#include <vector>

#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

namespace fs = std::filesystem;

std::string os_error(int err) {
  return std::strerror(err);
}

// The folder a path's file lives in ("." for a bare name).
std::string folder_of(const std::string& path) {
  const fs::path p(path);
  return p.has_parent_path() ? p.parent_path().string() : std::string(".");
}

// The path a write to `path` lands on: symbolic links followed (also a dangling one, whose
// target the write creates), at most 40 of them; relative targets against the link's folder.
std::string follow_links(const std::string& path) {
  fs::path p(path);
  for (int hops = 0; hops < 40; ++hops) {
    std::error_code ec;
    if (!fs::is_symlink(fs::symlink_status(p, ec)) || ec) break;
    const fs::path target = fs::read_symlink(p, ec);
    if (ec) break;
    p = target.is_absolute() ? target : p.parent_path() / target;
  }
  return p.string();
}

mode_t current_umask() {
  const mode_t m = ::umask(0);
  ::umask(m);
  return m;
}

}  // namespace

AtomicFile::AtomicFile(std::string path, std::string what)
    : path_(std::move(path)), what_(std::move(what)) {
  if (path_.empty()) throw InputError(what_ + ": an empty path");
  struct stat st {};
  // A symbolic link (even a dangling one) keeps pointing where it did: its target is written.
  std::string target = follow_links(path_);
  if (::stat(target.c_str(), &st) == 0) {
    if (S_ISDIR(st.st_mode)) throw InputError(what_ + ": " + path_ + " is a folder, not a file");
    if (!S_ISREG(st.st_mode)) {
      // A device, a FIFO, a socket: written in place (renaming onto it would replace it).
      in_place_ = true;
      fd_ = ::open(path_.c_str(), O_WRONLY | O_CLOEXEC);
      if (fd_ < 0) fail("cannot open it for writing", errno);
      return;
    }
  }
  std::string templ =
      (fs::path(folder_of(target)) / ("." + fs::path(target).filename().string() + ".tmp-XXXXXX"))
          .string();
  std::vector<char> name(templ.begin(), templ.end());
  name.push_back('\0');
  fd_ = ::mkstemp(name.data());
  if (fd_ < 0) fail("cannot create a temporary file beside it", errno);
  temp_ = name.data();
  path_ = target;
  // mkstemp makes the file 0600; a report is as readable as any file the user creates.
  (void)::fchmod(fd_, 0666 & ~current_umask());
}

AtomicFile::~AtomicFile() {
  if (fd_ >= 0) ::close(fd_);
  if (!temp_.empty()) ::unlink(temp_.c_str());
}

void AtomicFile::fail(const std::string& doing, int err) {
  // The message first, then the clean-up: a failed write leaves no temporary file behind.
  const std::string msg = what_ + ": " + path_ + ": " + doing + ": " + os_error(err);
  if (fd_ >= 0) ::close(fd_);
  fd_ = -1;
  if (!temp_.empty()) ::unlink(temp_.c_str());
  temp_.clear();
  throw InputError(msg);
}

void AtomicFile::write_at(const void* data, std::size_t n, std::uint64_t offset) {
  if (fd_ < 0) throw Error(what_ + ": " + path_ + ": write after the file was closed");
  if (in_place_) {
    // Devices and pipes have no offsets: only a sequential stream of appends is meaningful.
    if (offset != append_at_)
      throw InputError(what_ + ": " + path_ +
                       " is not a regular file: this output is written out of order and needs one");
    write(data, n);
    return;
  }
  put(static_cast<const char*>(data), n, static_cast<std::int64_t>(offset));
}

void AtomicFile::write(const void* data, std::size_t n) {
  if (fd_ < 0) throw Error(what_ + ": " + path_ + ": write after the file was closed");
  append_at_ += n;
  put(static_cast<const char*>(data), n, -1);
}

void AtomicFile::put(const char* p, std::size_t n, std::int64_t offset) {
  while (n > 0) {
    const ssize_t got = offset < 0 ? ::write(fd_, p, n) : ::pwrite(fd_, p, n, offset);
    if (got < 0) {
      if (errno == EINTR) continue;
      fail("writing failed", errno);
    }
    if (got == 0) fail("writing failed", EIO);
    p += got;
    n -= static_cast<std::size_t>(got);
    if (offset >= 0) offset += got;
  }
}

void AtomicFile::reserve(std::uint64_t bytes) {
  if (in_place_ || bytes == 0) return;
  const int err = ::posix_fallocate(fd_, 0, static_cast<off_t>(bytes));
  if (err == 0) return;
  if (err != EOPNOTSUPP && err != EINVAL && err != ENOSYS)
    fail("cannot reserve " + std::to_string(bytes) + " bytes", err);
  if (::ftruncate(fd_, static_cast<off_t>(bytes)) != 0) fail("cannot size the file", errno);
}

void AtomicFile::commit() {
  if (fd_ < 0) throw Error(what_ + ": " + path_ + ": committed twice");
  if (!in_place_ && ::fsync(fd_) != 0 && errno != EINVAL && errno != EROFS)
    fail("writing failed", errno);
  const int fd = fd_;
  fd_ = -1;
  if (::close(fd) != 0) {
    const int err = errno;
    fail("writing failed on close", err);
  }
  if (in_place_) return;
  if (::rename(temp_.c_str(), path_.c_str()) != 0)
    fail("cannot rename the finished file onto it", errno);
  temp_.clear();
}

void write_file_atomically(const std::string& path, const std::string& text,
                           const std::string& what) {
  AtomicFile f(path, what);
  f.write(text);
  f.commit();
}

namespace {

// The path with ., .. and symbolic links resolved as far as they exist.
std::string resolved(const std::string& path) {
  std::error_code ec;
  const std::string p = follow_links(path);
  fs::path r = fs::weakly_canonical(fs::absolute(p, ec), ec);
  if (ec) return fs::absolute(p).lexically_normal().string();
  return r.string();
}

}  // namespace

bool same_output_file(const std::string& a, const std::string& b) {
  if (a.empty() || b.empty()) return false;
  struct stat sa {
  }, sb{};
  const bool ea = ::stat(a.c_str(), &sa) == 0, eb = ::stat(b.c_str(), &sb) == 0;
  if ((ea && !S_ISREG(sa.st_mode)) || (eb && !S_ISREG(sb.st_mode))) return false;
  if (ea && eb) return sa.st_dev == sb.st_dev && sa.st_ino == sb.st_ino;
  return resolved(a) == resolved(b);
}

void check_distinct_outputs(const std::vector<std::pair<std::string, std::string>>& outputs) {
  for (std::size_t i = 0; i < outputs.size(); ++i)
    for (std::size_t j = i + 1; j < outputs.size(); ++j)
      if (same_output_file(outputs[i].second, outputs[j].second))
        throw InputError(outputs[i].first + " " + outputs[i].second + " and " + outputs[j].first +
                         " " + outputs[j].second +
                         " are the same file: one would overwrite the other; give each its own");
}

}  // namespace trainmem
