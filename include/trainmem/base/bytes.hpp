// Byte figures: the one place a byte count is written in a unit (GiB, MiB, KiB; base layer, so
// the analytic notes and every report use it).
// Every table, line and plot label that shows bytes in a unit goes through format_bytes.
#pragma once
#include <cstdint>
#include <string>

namespace trainmem {

// A unit for byte figures: its size in bytes and its name.
struct ByteUnit {
  double bytes;
  const char* name;
};
constexpr ByteUnit kKiB{1024.0, "KiB"};
constexpr ByteUnit kMiB{1048576.0, "MiB"};
constexpr ByteUnit kGiB{1073741824.0, "GiB"};

// The unit of a report table whose largest value is `max_bytes`: GiB from 1 GiB up, else MiB.
ByteUnit table_unit(std::uint64_t max_bytes);
// The unit of a plot's byte labels (--timeline): GiB, MiB or KiB for `max_bytes`.
ByteUnit byte_unit_for(std::uint64_t max_bytes);

// `bytes` in `unit` as a number (figures compared or summed in a unit, e.g. against a
// published table).
double in_unit(std::uint64_t bytes, ByteUnit unit);

// `bytes` in `unit` with two decimals, e.g. "45.61".
std::string format_bytes(std::uint64_t bytes, ByteUnit unit);
// A signed figure (a saving, a margin): "-" before format_bytes of the magnitude when negative.
std::string format_signed_bytes(std::int64_t bytes, ByteUnit unit);
// format_bytes followed by the unit's name: "45.61 GiB".
std::string format_bytes_with_unit(std::uint64_t bytes, ByteUnit unit);
// In the largest unit (KiB ... PiB) that keeps the number at 1 or more, two decimals: "45.61 GiB",
// "512.00 KiB"; below 1 KiB the exact count: "12 B". For figures in a sentence.
std::string format_bytes_human(std::uint64_t bytes);

}  // namespace trainmem
