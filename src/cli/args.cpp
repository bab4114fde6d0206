#include "src/cli/args.hpp"

#include <charconv>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "base/error.hpp"
#include "src/config/config.hpp"

namespace sb {

int64_t Args::integer(const std::string& name, int64_t lo, int64_t hi, const std::string& expected) const {
  const std::string text = get(name);
  int64_t x = 0;
  const auto [end, ec] = std::from_chars(text.data(), text.data() + text.size(), x, 10);
  if (text.empty() || ec != std::errc() || end != text.data() + text.size() || x < lo || x > hi)
    throw Error("--" + name + " '" + text + "': expected " + expected + ", an integer from " + std::to_string(lo) +
                " to " + std::to_string(hi));
  return x;
}

std::string Args::get(const std::string& name, const std::string& def) const {
  auto it = flags.find(name);
  return it == flags.end() || it->second.empty() ? def : it->second.back();
}

const std::vector<std::string>& Args::all(const std::string& name) const {
  static const std::vector<std::string> none;
  auto it = flags.find(name);
  return it == flags.end() ? none : it->second;
}

static std::vector<FlagSpec> with_common(const std::vector<FlagSpec>& flags, unsigned common) {
  auto all = flags;
  if (common & kSetFlag)
    all.push_back({"set", 1, "override a config key (repeatable), e.g. --set train.steps=100", "KEY=VALUE"});
  if (common & kSummaryFlag) all.push_back({"summary", 1, "write a JSON summary of the run to PATH", "PATH"});
  all.push_back({"help", 0, "print this help", ""});
  return all;
}

Args parse_args(std::span<char* const> argv, const std::vector<FlagSpec>& flags, const std::string& cmd,
                unsigned common) {
  const auto specs = with_common(flags, common);
  Args a;
  for (size_t i = 0; i < argv.size(); ++i) {
    std::string tok = argv[i];
    if (tok == "-h") tok = "--help";
    if (tok.rfind("--", 0) != 0 || tok.size() == 2) {
      a.positional.push_back(tok);
      continue;
    }
    std::string name = tok.substr(2), inline_val;
    bool has_inline = false;
    if (auto eq = name.find('='); eq != std::string::npos && name.rfind("set", 0) != 0) {
      inline_val = name.substr(eq + 1), name = name.substr(0, eq), has_inline = true;
    }
    const FlagSpec* spec = nullptr;
    for (const auto& s : specs)
      if (s.name == name) spec = &s;
    if (!spec) {
      std::string best;
      size_t best_d = SIZE_MAX;
      for (const auto& s : specs)
        if (size_t d = edit_distance(name, s.name); d < best_d) best_d = d, best = s.name;
      std::string msg = cmd + ": unknown flag --" + name;
      if (best_d <= 3) msg += "; did you mean --" + best + "?";
      throw Error(msg + " (see " + cmd + " --help)");
    }
    auto& vals = a.flags[name];
    if (spec->arity == 0) {
      if (has_inline) throw Error(cmd + ": flag --" + name + " takes no value");
      vals.push_back("");
      if (name == "help") a.help = true;
      continue;
    }
    if (has_inline) {
      vals.push_back(inline_val);
      continue;
    }
    size_t taken = 0;
    const size_t most = spec->arity == -1 ? SIZE_MAX : spec->arity == -2 ? 1 : size_t(spec->arity);
    while (i + 1 < argv.size() && taken < most) {
      std::string next = argv[i + 1];
      if (next.rfind("--", 0) == 0 && next.size() > 2) break;
      vals.push_back(next), ++i, ++taken;
    }
    if (taken == 0 && spec->arity == -2) vals.push_back("");
    if (taken == 0 && spec->arity != -2) throw Error(cmd + ": flag --" + name + " needs a value (" + spec->metavar + ")");
    if (name == "set") a.sets.push_back(vals.back());
  }
  return a;
}

std::string flags_help(const std::vector<FlagSpec>& flags, unsigned common) {
  std::string out = "options:\n";
  for (const auto& f : with_common(flags, common)) {
    std::string left = "  --" + f.name;
    if (f.arity != 0) left += " " + f.metavar + (f.arity == -1 ? "..." : "");
    if (left.size() < 30) left.resize(30, ' ');
    else left += "\n" + std::string(30, ' ');
    out += left + f.help + "\n";
  }
  return out;
}

void write_summary(const std::string& path, const nlohmann::json& j) {
  namespace fs = std::filesystem;
  fs::path p(path);
  std::error_code ec;
  if (p.has_parent_path()) fs::create_directories(p.parent_path(), ec);
  if (ec) throw Error(path + ": cannot create the directory of the summary (--summary): " + ec.message());
  std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp, std::ios::trunc);
    if (!out) throw Error(path + ": cannot write summary (--summary)");
    out << j.dump(2) << "\n";
    if (!out.flush()) throw Error(path + ": write failed (--summary)");
  }
  fs::rename(tmp, p, ec);
  if (ec) throw Error(path + ": cannot move summary into place: " + ec.message());
}

}  // namespace sb
