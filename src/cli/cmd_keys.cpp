// sparsebalance keys: every config key with its type, default, bounds and meaning (the README's
// configuration table is this command's --markdown output).
#include <cstdio>
#include <sstream>

#include "src/cli/args.hpp"
#include "src/config/config.hpp"

namespace sb {

static std::string bounds(const KeySpec& k) {
  if (!k.choices.empty()) {
    std::string s;
    for (const auto& c : k.choices) s += (s.empty() ? "" : " \\| ") + c;
    return s;
  }
  if (k.type != KeyType::Int && k.type != KeyType::Float) return "";
  std::ostringstream os;
  os << k.min << " .. ";
  if (k.max >= 9e15) os << "inf"; else os << k.max;
  return os.str();
}

static int run_keys(const Args& args) {
  const bool md = args.has("markdown");
  const char* types[] = {"int", "float", "bool", "string"};
  if (md) std::printf("| key | type | default | allowed | meaning |\n|---|---|---|---|---|\n");
  for (const auto& k : config_schema()) {
    std::string def = k.type == KeyType::String ? "\"" + k.def + "\"" : k.def;
    if (md)
      std::printf("| `%s` | %s | `%s` | %s | %s |\n", k.key.c_str(), types[int(k.type)], def.c_str(), bounds(k).c_str(),
                  k.help.c_str());
    else
      std::printf("%-32s %-6s %-22s %s\n", k.key.c_str(), types[int(k.type)], def.c_str(), k.help.c_str());
  }
  return 0;
}

Command cmd_keys() {
  return {"keys",
          "list every config key: type, default, allowed values, meaning",
          "keys [--markdown]\n\nEvery key can be set in a TOML file ([section] name = value) or with --set section.name=value.\n",
          {{"markdown", 0, "print a Markdown table (as in README.md)", ""}},
          run_keys};
}

}  // namespace sb
