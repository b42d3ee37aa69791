// numbers.h: numbers as a person writes them, read strictly.
//
// strtod and CLI11 also read hex ("0x10" is 16, "0x1p-2" a quarter), "inf"
// and "nan", an empty string as 0, and strtoull wraps "-1" to 2^64-1 and
// clamps what is past it: a typo would become a value nobody meant. Every
// number of a flag or a hardware profile is read here: decimal, finite and
// in range, or nothing, and the caller says what is accepted.
#pragma once

#include <cstdint>
#include <optional>
#include <string>

namespace zf {

// [+-]digits[.digits][e[+-]digits] (".5" and "5." too), finite; else nullopt.
std::optional<double> decimal_number(const std::string& text);

// Decimal digits only (leading zeros are not octal), 0 .. 2^64-1; else nullopt.
std::optional<uint64_t> decimal_whole(const std::string& text);

}  // namespace zf
