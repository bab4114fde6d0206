// libFuzzer target: the config parser and its validation (Config::from_text, then `--set key=value`
// overrides as Config::load applies them). Input: TOML text, optionally followed by a line
// "--set" and then one override per line. Every rejection must be an sb::Error (a message naming
// the origin and key); anything else (another exception type, a signal) is a finding.
// A config that parses must survive its own round trip: from_text(to_toml()) gives the same text.
#include <cstdint>
#include <cstdlib>
#include <cstdio>
#include <string>
#include <vector>

#include "base/error.hpp"
#include "src/config/config.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  std::string in(reinterpret_cast<const char*>(data), size);
  std::string text = in, sets;
  if (auto p = in.find("\n--set\n"); p != std::string::npos) text = in.substr(0, p), sets = in.substr(p + 7);
  try {
    sb::Config cfg = sb::Config::from_text(text, "fuzz.toml");
    size_t a = 0;
    while (a < sets.size()) {
      size_t b = sets.find('\n', a);
      if (b == std::string::npos) b = sets.size();
      std::string ov = sets.substr(a, b - a);
      a = b + 1;
      auto eq = ov.find('=');
      if (eq == std::string::npos || eq == 0) continue;
      cfg.set(ov.substr(0, eq), ov.substr(eq + 1), "--set " + ov);
    }
    std::string t1 = cfg.to_toml();
    sb::Config again = sb::Config::from_text(t1, "roundtrip.toml");
    if (again.to_toml() != t1) {
      std::fprintf(stderr, "round trip changed the config:\n%s\n----\n%s\n", t1.c_str(), again.to_toml().c_str());
      std::abort();
    }
  } catch (const sb::Error&) {
    // expected: a clear rejection
  }
  return 0;
}
