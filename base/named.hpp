// Enums with names (balance.target, balance.batching, simulate.preset, ...): one table of
// (value, name) pairs serves both directions, and a bad name's error names the key and every
// allowed name.
#pragma once
#include <cstddef>
#include <string>

#include "base/error.hpp"

namespace sb {

template <class E>
struct Named {
  E value;
  const char* name;
};

// The value named `s`, or sb::Error "<key> = "<s>": expected one of a, b, c".
template <class E, size_t N>
E parse_named(const Named<E> (&table)[N], const std::string& s, const char* key) {
  std::string names;
  for (const auto& n : table) {
    if (s == n.name) return n.value;
    names += (names.empty() ? "" : ", ") + std::string(n.name);
  }
  throw Error(std::string(key) + " = \"" + s + "\": expected one of " + names);
}

template <class E, size_t N>
const char* name_of(const Named<E> (&table)[N], E value) {
  for (const auto& n : table)
    if (n.value == value) return n.name;
  return "?";
}

}  // namespace sb
