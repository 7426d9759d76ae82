// Files in and out (issue 26): outputs written whole or not at all (atomic_file.hpp), inputs
// that are regular files under a cap and strict JSON (input_file.hpp), two outputs that are one
// file refused. Each expectation is what a user would see: the file's content or absence, the
// folder's listing, the message naming the flag, file and field.
#include <fcntl.h>
#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <vector>

#include "trainmem/base/atomic_file.hpp"
#include "trainmem/base/error.hpp"
#include "trainmem/base/input_file.hpp"

namespace trainmem {
namespace {

namespace fs = std::filesystem;

class BaseFiles : public ::testing::Test {
 protected:
  void SetUp() override {
    dir_ = fs::temp_directory_path() /
           ("trainmem_base_files_" + std::to_string(::getpid()) + "_" +
            ::testing::UnitTest::GetInstance()->current_test_info()->name());
    fs::remove_all(dir_);
    fs::create_directories(dir_);
  }
  void TearDown() override {
    std::error_code ec;
    fs::permissions(dir_, fs::perms::owner_all, fs::perm_options::add, ec);
    fs::remove_all(dir_, ec);
  }
  std::string path(const std::string& leaf) const { return (dir_ / leaf).string(); }
  std::vector<std::string> listing() const {
    std::vector<std::string> out;
    for (const auto& e : fs::directory_iterator(dir_)) out.push_back(e.path().filename().string());
    std::sort(out.begin(), out.end());
    return out;
  }
  static std::string slurp(const std::string& p) {
    std::ifstream in(p, std::ios::binary);
    std::ostringstream s;
    s << in.rdbuf();
    return s.str();
  }
  static void spit(const std::string& p, const std::string& text) {
    std::ofstream out(p, std::ios::binary);
    out << text;
  }
  fs::path dir_;
};

std::string message_of(const std::function<void()>& f) {
  try {
    f();
  } catch (const InputError& e) {
    return e.what();
  }
  return "(no InputError)";
}

bool has(const std::string& text, const std::string& part) {
  return text.find(part) != std::string::npos;
}

// ------------------------------------------------------------------------------ outputs

TEST_F(BaseFiles, WritesWholeFileAndLeavesNoTemporary) {
  const std::string p = path("report.json");
  write_file_atomically(p, "{\"a\": 1}\n", "--output");
  EXPECT_EQ(slurp(p), "{\"a\": 1}\n");
  EXPECT_EQ(listing(), std::vector<std::string>{"report.json"});
  // Replacing keeps the name, replaces the content whole.
  write_file_atomically(p, "second", "--output");
  EXPECT_EQ(slurp(p), "second");
  EXPECT_EQ(listing(), std::vector<std::string>{"report.json"});
}

TEST_F(BaseFiles, AnUnfinishedFileLeavesTheOldOneUntouched) {
  const std::string p = path("report.json");
  spit(p, "old report");
  {
    AtomicFile f(p, "--output");
    f.write("half of a new rep");
    // Before commit the temporary sits beside the target, the target is the old file.
    EXPECT_EQ(listing().size(), 2u);
    EXPECT_EQ(slurp(p), "old report");
  }  // destroyed without commit: an exception's unwinding
  EXPECT_EQ(slurp(p), "old report");
  EXPECT_EQ(listing(), std::vector<std::string>{"report.json"});
}

TEST_F(BaseFiles, RandomAccessWritesAndReservation) {
  const std::string p = path("dump.safetensors");
  AtomicFile f(p, "--dump");
  f.reserve(12);
  f.write("abcd");
  f.write_at("WXYZ", 4, 8);
  f.write_at("mnop", 4, 4);
  f.commit();
  EXPECT_EQ(slurp(p), "abcdmnopWXYZ");
}

TEST_F(BaseFiles, ANonRegularPathIsWrittenInPlaceNotReplaced) {
  // /dev/null stays a device: renaming a file onto it would replace the node.
  struct stat before {};
  ASSERT_EQ(::stat("/dev/null", &before), 0);
  write_file_atomically("/dev/null", "discarded", "--output");
  struct stat after {};
  ASSERT_EQ(::stat("/dev/null", &after), 0);
  EXPECT_TRUE(S_ISCHR(after.st_mode));
  EXPECT_EQ(before.st_ino, after.st_ino);
}

TEST_F(BaseFiles, AFullDeviceSaysWhy) {
  // /dev/full answers every write with ENOSPC: the message names the flag, the path and the
  // OS's reason (a full disk behaves alike for a regular file, whose temporary is removed).
  if (::access("/dev/full", W_OK) != 0) GTEST_SKIP() << "no writable /dev/full on this machine";
  const std::string m = message_of([] {
    std::string big(1 << 16, 'x');
    write_file_atomically("/dev/full", big, "--timeline");
  });
  EXPECT_TRUE(has(m, "--timeline: /dev/full: writing failed: No space left on device")) << m;
}

TEST_F(BaseFiles, AFolderThatTakesNoFilesIsRefusedNamingTheFlag) {
  if (::geteuid() == 0) GTEST_SKIP() << "root writes into read-only folders";
  fs::permissions(dir_, fs::perms::owner_write, fs::perm_options::remove);
  const std::string m = message_of([&] { write_file_atomically(path("x.json"), "x", "--output"); });
  EXPECT_TRUE(has(m, "--output: ")) << m;
  EXPECT_TRUE(has(m, "Permission denied")) << m;
}

TEST_F(BaseFiles, AFolderAsOutputIsRefused) {
  const std::string m = message_of([&] { write_file_atomically(dir_.string(), "x", "--dump"); });
  EXPECT_TRUE(has(m, "--dump: " + dir_.string() + " is a folder")) << m;
}

TEST_F(BaseFiles, ASymbolicLinkKeepsPointingAtItsFile) {
  const std::string real = path("real.json"), link = path("link.json");
  spit(real, "old");
  fs::create_symlink(real, link);
  write_file_atomically(link, "new", "--output");
  EXPECT_TRUE(fs::is_symlink(link));
  EXPECT_EQ(slurp(real), "new");
}

TEST_F(BaseFiles, SameOutputFileSeesThroughSpellingsAndLinks) {
  const std::string a = path("a.json");
  EXPECT_TRUE(same_output_file(a, dir_.string() + "/./a.json"));
  EXPECT_TRUE(same_output_file(a, dir_.string() + "/sub/../a.json"));
  EXPECT_FALSE(same_output_file(a, path("b.json")));
  EXPECT_FALSE(same_output_file(a, ""));
  spit(a, "x");
  fs::create_hard_link(a, path("hard.json"));
  fs::create_symlink(a, path("soft.json"));
  EXPECT_TRUE(same_output_file(a, path("hard.json")));
  EXPECT_TRUE(same_output_file(path("soft.json"), a));
  EXPECT_FALSE(same_output_file("/dev/null", "/dev/null")) << "devices never clash";
  const std::string m = message_of([&] {
    check_distinct_outputs({{"--output", a}, {"--timeline", ""}, {"--dump", path("soft.json")}});
  });
  EXPECT_TRUE(has(m, "--output " + a + " and --dump " + path("soft.json") + " are the same file"))
      << m;
  EXPECT_NO_THROW(check_distinct_outputs({{"--output", a}, {"--timeline", path("t.json")}}));
}

// ------------------------------------------------------------------------------ inputs

TEST_F(BaseFiles, InputsMustBeRegularFilesUnderTheirCap) {
  const std::string fifo = path("pipe.json");
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  // Refused from its stat: nothing opens the FIFO, so nothing waits for a writer.
  EXPECT_EQ(message_of([&] { read_input_file(fifo, "--model", kMaxConfigBytes); }),
            "--model " + fifo + " is a FIFO (named pipe); give a regular file");
  EXPECT_EQ(message_of([&] { check_input_file("/dev/zero", "--tokens", 100); }),
            "--tokens /dev/zero is a character device; give a regular file");
  EXPECT_TRUE(has(message_of([&] { check_input_file(dir_.string(), "--weights", 100); }),
                  "is a folder; give a regular file"));
  // A sparse file: its size counts, not the blocks it uses.
  const std::string sparse = path("sparse.json");
  {
    const int fd = ::open(sparse.c_str(), O_CREAT | O_WRONLY, 0600);
    ASSERT_GE(fd, 0);
    ASSERT_EQ(::ftruncate(fd, off_t(3) << 30), 0);
    ::close(fd);
  }
  EXPECT_EQ(message_of([&] { read_input_file(sparse, "--model", kMaxConfigBytes); }),
            "--model " + sparse +
                " has 3221225472 bytes, above the 16 MiB allowed for this "
                "kind of file");
  EXPECT_TRUE(has(message_of([&] { check_input_file(path("missing"), "--tokens", 1); }),
                  "--tokens " + path("missing") + ": cannot read it: No such file or directory"));
  spit(path("ok.json"), "{}");
  EXPECT_EQ(read_input_file(path("ok.json"), "--model", kMaxConfigBytes), "{}");
}

TEST(StrictJson, DuplicateKeysAreRefusedNamingThem) {
  EXPECT_EQ(message_of([] { parse_json_strict(R"({"a": 1, "b": {"c": 2, "c": 3}})", "cfg.json"); }),
            "cfg.json: field b.c appears twice in one object (JSON keys must be unique; which "
            "one was meant?)");
  // The same key in two objects is fine.
  EXPECT_NO_THROW(parse_json_strict(R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 1}, {"x": 2}]})",
                                    "cfg.json"));
}

TEST(StrictJson, NumbersOutOfRangeNameTheirField) {
  const std::string m =
      message_of([] { parse_json_strict(R"({"rope_scaling": {"factor": 1e309}})", "cfg.json"); });
  EXPECT_TRUE(has(m, "cfg.json: field rope_scaling.factor: a number out of range")) << m;
  EXPECT_TRUE(has(m, "1e309")) << m;
  // The largest finite double and 64-bit integers are numbers like any other.
  const auto j =
      parse_json_strict(R"({"a": 1.7976931348623157e308, "b": 18446744073709551615})", "cfg.json");
  EXPECT_EQ(j["b"].get<std::uint64_t>(), 18446744073709551615ull);
}

TEST(StrictJson, LongStringsAndKeysAreRefusedWithAShortMessage) {
  const std::string long_key = "{\"" + std::string(10'000'000, 'k') + "\": 1}";
  const std::string m1 = message_of([&] { parse_json_strict(long_key, "cfg.json"); });
  EXPECT_LT(m1.size(), 400u) << "the message quotes at most ~100 characters";
  EXPECT_TRUE(has(m1, "a key of 10000000 characters (at most 1024)")) << m1;
  const std::string long_value = "{\"model_type\": \"" + std::string(5000, 'v') + "\"}";
  const std::string m2 = message_of([&] { parse_json_strict(long_value, "cfg.json"); });
  EXPECT_TRUE(has(m2, "cfg.json: field model_type: a string of 5000 characters (at most 1024)"))
      << m2;
  EXPECT_LT(m2.size(), 400u);
  // A report's longer texts: the caller raises the cap.
  EXPECT_NO_THROW(parse_json_strict(long_value, "report.json", kMaxReportString));
}

TEST(StrictJson, InvalidJsonSaysWhereWithoutTheLibrarysTag) {
  const std::string m = message_of([] { parse_json_strict("{\"a\": 1,,}", "cfg.json"); });
  EXPECT_TRUE(has(m, "cfg.json: not valid JSON at byte 9: parse error at line 1, column 9")) << m;
  EXPECT_FALSE(has(m, "[json.exception")) << m;
}

TEST(Clip, CutsLongTextsAndSaysHowLongTheyWere) {
  EXPECT_EQ(clip("short"), "short");
  EXPECT_EQ(clip(std::string(150, 'x')), std::string(100, 'x') + "... (150 characters)");
}

}  // namespace
}  // namespace trainmem
