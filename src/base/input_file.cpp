// Input files: regular files under a size cap, read once; JSON parsed strictly.
#include "trainmem/base/input_file.hpp"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <set>
#include <vector>

#include "trainmem/base/error.hpp"

namespace trainmem {
namespace {

std::string kind_of(mode_t mode) {
  if (S_ISDIR(mode)) return "a folder";
  if (S_ISFIFO(mode)) return "a FIFO (named pipe)";
  if (S_ISCHR(mode)) return "a character device";
  if (S_ISBLK(mode)) return "a block device";
  if (S_ISSOCK(mode)) return "a socket";
  return "not a regular file";
}

std::string bytes_text(std::uint64_t b) {
  if (b >= (1ull << 40) && b % (1ull << 40) == 0) return std::to_string(b >> 40) + " TiB";
  if (b >= (1ull << 30) && b % (1ull << 30) == 0) return std::to_string(b >> 30) + " GiB";
  if (b >= (1ull << 20) && b % (1ull << 20) == 0) return std::to_string(b >> 20) + " MiB";
  return std::to_string(b) + " bytes";
}

}  // namespace

std::uint64_t check_input_file(const std::string& path, const std::string& what,
                               std::uint64_t max_bytes) {
  const std::string who = what + " " + clip(path, 200);
  struct stat st {};
  if (::stat(path.c_str(), &st) != 0)
    throw InputError(who + ": cannot read it: " + std::strerror(errno));
  if (!S_ISREG(st.st_mode))
    throw InputError(who + " is " + kind_of(st.st_mode) + "; give a regular file");
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes)
    throw InputError(who + " has " + std::to_string(size) + " bytes, above the " +
                     bytes_text(max_bytes) + " allowed for this kind of file");
  return size;
}

std::string read_input_file(const std::string& path, const std::string& what,
                            std::uint64_t max_bytes) {
  const std::string who = what + " " + clip(path, 200);
  check_input_file(path, what, max_bytes);
  // O_NONBLOCK: should the path have become a FIFO since the stat, open does not wait for a
  // writer; the fstat below then refuses it.
  const int fd = ::open(path.c_str(), O_RDONLY | O_NONBLOCK | O_CLOEXEC);
  if (fd < 0) throw InputError(who + ": cannot read it: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw InputError(who + " is not a regular file; give a regular file");
  }
  std::string out;
  const auto size = static_cast<std::uint64_t>(st.st_size);
  if (size > max_bytes) {
    ::close(fd);
    throw InputError(who + " has " + std::to_string(size) + " bytes, above the " +
                     bytes_text(max_bytes) + " allowed for this kind of file");
  }
  out.resize(static_cast<std::size_t>(size));
  std::size_t got = 0;
  while (got < out.size()) {
    const ssize_t n = ::read(fd, out.data() + got, out.size() - got);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const int err = errno;
      ::close(fd);
      throw InputError(who + ": reading it failed: " + std::strerror(err));
    }
    if (n == 0) break;  // the file shrank while being read
    got += static_cast<std::size_t>(n);
  }
  ::close(fd);
  out.resize(got);
  return out;
}

std::string clip(const std::string& text, std::size_t max_chars) {
  if (text.size() <= max_chars) return text;
  return text.substr(0, max_chars) + "... (" + std::to_string(text.size()) + " characters)";
}

namespace {

// The strict checks as a SAX pass over the text (depth, unique keys, string and key lengths),
// run before the document is built: nlohmann's callback parser is quadratic in the length of an
// array (38 s for a 300,000-element one where a plain parse takes 0.2 s), its SAX parser is not.
class StrictChecker {
 public:
  StrictChecker(const std::string& source, std::uint64_t max_string)
      : source_(source), max_string_(max_string) {}

  bool null() { return true; }
  bool boolean(bool) { return true; }
  bool number_integer(std::int64_t) { return true; }
  bool number_unsigned(std::uint64_t) { return true; }
  bool number_float(double, const std::string&) { return true; }
  bool binary(nlohmann::json::binary_t&) { return true; }
  bool string(std::string& value) {
    if (value.size() > max_string_)
      throw InputError(source_ + ": " + field() + ": a string of " + std::to_string(value.size()) +
                       " characters (at most " + std::to_string(max_string_) + "): \"" +
                       clip(value) + "\"");
    return true;
  }
  bool start_object(std::size_t) { return open(true); }
  bool start_array(std::size_t) { return open(false); }
  bool end_object() { return close(); }
  bool end_array() { return close(); }
  bool key(std::string& key) {
    if (frames_.empty()) return true;
    Frame& f = frames_.back();
    f.key = key;
    if (key.size() > max_string_)
      throw InputError(source_ + ": " + field() + ": a key of " + std::to_string(key.size()) +
                       " characters (at most " + std::to_string(max_string_) + ")");
    if (!f.seen.insert(key).second)
      throw InputError(source_ + ": " + field() +
                       " appears twice in one object (JSON keys must be unique; which one was "
                       "meant?)");
    return true;
  }
  // The lexer's and parser's errors (invalid JSON, a number out of range): rethrown as the
  // library's own exception, for parse_json_strict to word with the field.
  bool parse_error(std::size_t, const std::string&, const nlohmann::json::exception& e) {
    if (const auto* pe = dynamic_cast<const nlohmann::json::parse_error*>(&e)) throw *pe;
    if (const auto* oor = dynamic_cast<const nlohmann::json::out_of_range*>(&e)) throw *oor;
    throw InputError(source_ + ": " + field() + ": " + clip(e.what(), 200));
  }

  // "field a.b[]" of the value being read, or "the document".
  std::string field() const {
    std::string out;
    for (const auto& f : frames_) {
      if (!f.object) {
        out += "[]";
      } else if (!f.key.empty()) {
        out += (out.empty() ? "" : ".") + clip(f.key);
      }
    }
    return out.empty() ? std::string("the document") : "field " + out;
  }

 private:
  struct Frame {
    bool object = false;
    std::string key;
    std::set<std::string> seen;
  };
  bool open(bool object) {
    // Copies and comparisons of a parsed document recurse once per level: a bound keeps a
    // hostile file's nesting from overflowing the stack.
    if (frames_.size() >= kMaxJsonDepth)
      throw InputError(source_ + ": " + field() + ": nested more than " +
                       std::to_string(kMaxJsonDepth) + " levels deep");
    frames_.push_back(Frame{object, "", {}});
    return true;
  }
  bool close() {
    if (!frames_.empty()) frames_.pop_back();
    return true;
  }

  const std::string& source_;
  std::uint64_t max_string_;
  std::vector<Frame> frames_;
};

}  // namespace

template <typename Json>
Json parse_json_strict(const std::string& text, const std::string& source,
                       std::uint64_t max_string) {
  StrictChecker checker(source, max_string);
  try {
    nlohmann::json::sax_parse(text, &checker);
    return Json::parse(text);
  } catch (const nlohmann::json::parse_error& e) {
    // "[json.exception.parse_error.101] parse error at line 1, ...": the library's tag dropped.
    std::string msg = e.what();
    const auto close = msg.find("] ");
    if (msg.rfind("[json.exception", 0) == 0 && close != std::string::npos)
      msg = msg.substr(close + 2);
    throw InputError(source + ": not valid JSON at byte " + std::to_string(e.byte) + ": " +
                     clip(msg, 200));
  } catch (const nlohmann::json::out_of_range& e) {
    throw InputError(source + ": " + checker.field() + ": a number out of range (" +
                     clip(e.what(), 200) +
                     "); numbers must fit a 64-bit integer or a finite double");
  } catch (const nlohmann::json::exception& e) {
    throw InputError(source + ": " + checker.field() + ": " + clip(e.what(), 200));
  }
}

template nlohmann::json parse_json_strict<nlohmann::json>(const std::string&, const std::string&,
                                                          std::uint64_t);
template nlohmann::ordered_json parse_json_strict<nlohmann::ordered_json>(const std::string&,
                                                                          const std::string&,
                                                                          std::uint64_t);

}  // namespace trainmem
