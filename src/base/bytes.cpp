// Byte figures in a unit (see include/trainmem/base/bytes.hpp).
#include "trainmem/base/bytes.hpp"

#include <cstdio>

namespace trainmem {

ByteUnit table_unit(std::uint64_t max_bytes) {
  return max_bytes >= (std::uint64_t{1} << 30) ? kGiB : kMiB;
}

ByteUnit byte_unit_for(std::uint64_t max_bytes) {
  if (max_bytes >= (std::uint64_t{1} << 30)) return kGiB;
  if (max_bytes >= (std::uint64_t{1} << 20)) return kMiB;
  return kKiB;
}

double in_unit(std::uint64_t bytes, ByteUnit unit) {
  return static_cast<double>(bytes) / unit.bytes;
}

std::string format_bytes(std::uint64_t bytes, ByteUnit unit) {
  char buf[64];
  std::snprintf(buf, sizeof buf, "%.2f", in_unit(bytes, unit));
  return buf;
}

std::string format_signed_bytes(std::int64_t bytes, ByteUnit unit) {
  return (bytes < 0 ? "-" : "") + format_bytes(std::uint64_t(bytes < 0 ? -bytes : bytes), unit);
}

std::string format_bytes_with_unit(std::uint64_t bytes, ByteUnit unit) {
  return format_bytes(bytes, unit) + " " + unit.name;
}

std::string format_bytes_human(std::uint64_t bytes) {
  static const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB", "PiB"};
  if (bytes < 1024) return std::to_string(bytes) + " B";
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024.0 && u < 5) {
    v /= 1024.0;
    ++u;
  }
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.2f %s", v, units[u]);
  return buf;
}

}  // namespace trainmem
