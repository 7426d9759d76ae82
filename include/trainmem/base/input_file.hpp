// The files trainmem reads (a config.json, --tokens, --weights, a report for `diff`): regular
// files only (a FIFO would block, /dev/zero never ends), each kind with a size cap, read once;
// JSON parsed strictly (a duplicate key, a number out of range or an over-long string is an
// InputError naming the file and the field, quoting at most ~100 characters of a value).
#pragma once
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

namespace trainmem {

// Size caps per kind of input file (docs/decisions.md, "Robust on any machine and against any
// input").
constexpr std::uint64_t kMaxConfigBytes = 16ull << 20;   // a config.json: 16 MiB
constexpr std::uint64_t kMaxReportBytes = 256ull << 20;  // a JSON report (diff): 256 MiB
constexpr std::uint64_t kMaxEventsBytes = 1ull << 30;    // an allocation sequence (replay): 1 GiB
constexpr std::uint64_t kMaxWeightsBytes = 4ull << 40;   // a .safetensors file: 4 TiB
constexpr std::uint64_t kMaxJsonString = 1024;           // one JSON key or string value
constexpr std::uint64_t kMaxReportString = 1ull << 20;   // ... in a report (diff): 1 MiB
constexpr std::size_t kMaxJsonDepth = 256;               // objects and arrays, nested

// Checks that `path` is a regular file of at most `max_bytes` and returns its size; InputError
// "<what> <path>: ..." naming the kind of file, the cap and what it is otherwise. Never blocks
// (a FIFO is refused from its stat, not opened).
std::uint64_t check_input_file(const std::string& path, const std::string& what,
                               std::uint64_t max_bytes);

// check_input_file, then the whole file read once.
std::string read_input_file(const std::string& path, const std::string& what,
                            std::uint64_t max_bytes);

// `text` cut to at most `max_chars` characters (with "... (N characters)" when cut): for
// echoing a value from a file in a message.
std::string clip(const std::string& text, std::size_t max_chars = 100);

// Parses `text` as JSON: InputError "<source>: ..." for invalid JSON (with the byte), a number
// out of range (with its field), a duplicate key in one object (naming it and its object), a key
// or string longer than kMaxJsonString characters (naming the field), nesting deeper than
// kMaxJsonDepth.
// `max_string` overrides kMaxJsonString (a report's long texts).
template <typename Json = nlohmann::json>
Json parse_json_strict(const std::string& text, const std::string& source,
                       std::uint64_t max_string = kMaxJsonString);

extern template nlohmann::json parse_json_strict<nlohmann::json>(const std::string&,
                                                                 const std::string&, std::uint64_t);
extern template nlohmann::ordered_json parse_json_strict<nlohmann::ordered_json>(const std::string&,
                                                                                 const std::string&,
                                                                                 std::uint64_t);

}  // namespace trainmem
