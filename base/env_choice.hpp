// Switches read from the environment (SB_FUSE, SB_SELECT, SB_HEAD_LOGITS, SB_ATTN_KERNEL,
// SB_ATTN_BWD_VARIANT, SB_ATTN_BWD_CHUNK, SB_PHASE_TIMES): one binary runs both sides of an A/B, so a mistyped
// value must stop the run rather than quietly measure the default.
#pragma once
#include <cerrno>
#include <climits>
#include <cstddef>
#include <cstdlib>
#include <string>

#include "base/named.hpp"

namespace sb {

// The value that environment variable `name` names in `table`; unset or empty: `fallback`. Any
// other value throws parse_named's sb::Error: <name> = "<value>": expected one of a, b, c.
template <class E, size_t N>
E env_choice(const Named<E> (&table)[N], const char* name, E fallback) {
  const char* e = std::getenv(name);
  return e && *e ? parse_named(table, e, name) : fallback;
}

// The whole number in environment variable `name`; unset or empty: `fallback`. Anything else than
// a decimal integer in [lo, INT_MAX] throws sb::Error: <name> = "<value>": expected a whole number >= lo.
inline int env_int(const char* name, int fallback, int lo) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  errno = 0;
  char* end = nullptr;
  const long v = std::strtol(e, &end, 10);
  if (*end != '\0' || errno == ERANGE || v < lo || v > INT_MAX)
    throw Error(std::string(name) + " = \"" + e + "\": expected a whole number >= " + std::to_string(lo));
  return int(v);
}

}  // namespace sb
