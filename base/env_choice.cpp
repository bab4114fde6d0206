#include "base/env_choice.hpp"

#include <cstdlib>
#include <string>

#include "base/error.hpp"

namespace sb {

int env_choice(const char* name, std::initializer_list<const char*> choices, int fallback) {
  const char* e = std::getenv(name);
  if (!e || !*e) return fallback;
  std::string all;
  int i = 0;
  for (const char* c : choices) {
    if (std::string(e) == c) return i;
    all += (i++ ? ", " : "") + std::string(c);
  }
  throw Error(std::string(name) + "='" + e + "': expected one of " + all);
}

}  // namespace sb
