// SIZE arguments of the command line (--budget, --device-budget, --overhead,
// TRAINMEM_HOST_MEMORY).
#pragma once
#include <cstdint>
#include <optional>
#include <string>

namespace trainmem::cli {

// Parses a byte size: a number with an optional unit, case-insensitive: B, KiB, MiB, GiB, TiB
// (powers of 1024), KB, MB, GB, TB (powers of 1000); K/M/G/T alone are binary. Fractions are
// allowed ("1.5GiB") and rounded down to a byte. Throws InputError naming `flag` and the
// accepted forms for anything else (negative, empty, unknown unit, > 2^64).
std::uint64_t parse_size(const std::string& text, const std::string& flag);

// The whole of `text` as a finite number ("0.1", "1.25", "5e-2"); nullopt for anything else
// (empty, trailing characters, out of range, inf, nan). The caller words the error.
std::optional<double> parse_number(const std::string& text);

}  // namespace trainmem::cli
