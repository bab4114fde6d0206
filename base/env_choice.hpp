// Switches read from the environment (SB_FUSE, SB_SELECT, SB_HEAD_LOGITS): one binary runs both
// sides of an A/B, so a mistyped value must stop the run rather than quietly measure the default.
#pragma once
#include <cstddef>
#include <cstdlib>

#include "base/named.hpp"

namespace sb {

// The value that environment variable `name` names in `table`; unset or empty: `fallback`. Any
// other value throws parse_named's sb::Error: <name> = "<value>": expected one of a, b, c.
template <class E, size_t N>
E env_choice(const Named<E> (&table)[N], const char* name, E fallback) {
  const char* e = std::getenv(name);
  return e && *e ? parse_named(table, e, name) : fallback;
}

}  // namespace sb
