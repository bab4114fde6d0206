// Command-line parsing shared by every subcommand: positional args, repeatable `--set key=value`,
// `--summary PATH`, `--help`, and each subcommand's own flags (unknown flags get a "did you mean").
#pragma once
#include <map>
#include <span>
#include <string>
#include <vector>

#include <nlohmann/json_fwd.hpp>

namespace sb {

struct FlagSpec {
  std::string name;  // without the leading "--"
  int arity;  // 0 = switch, 1 = one value, -1 = one or more values (until the next flag), -2 = optional value
  std::string help;
  std::string metavar = "VALUE";
};

struct Args {
  std::vector<std::string> positional;
  std::vector<std::string> sets;  // every --set key=value, in order
  std::map<std::string, std::vector<std::string>> flags;
  bool help = false;

  bool has(const std::string& name) const { return flags.count(name) > 0; }
  std::string get(const std::string& name, const std::string& def = "") const;
  const std::vector<std::string>& all(const std::string& name) const;
  // --NAME as an integer in lo..hi, or an error "--NAME 'TEXT': expected EXPECTED, an integer from
  // lo to hi" (a number past the range, 2^64 too, is refused, never wrapped or clamped).
  int64_t integer(const std::string& name, int64_t lo, int64_t hi, const std::string& expected) const;
};

// The common flags a command takes besides its own (--help always): --set, --summary.
enum CommonFlags : unsigned { kSetFlag = 1, kSummaryFlag = 2, kAllCommon = 3 };

// `cmd` names the subcommand in error messages ("sparsebalance prep synth").
// Adds --help and the `common` flags to `flags`: a common flag the command does not take is an
// unknown flag, not silently ignored.
Args parse_args(std::span<char* const> argv, const std::vector<FlagSpec>& flags, const std::string& cmd,
                unsigned common = kAllCommon);

// Help text listing `flags` plus the common ones the command takes.
std::string flags_help(const std::vector<FlagSpec>& flags, unsigned common = kAllCommon);

// A subcommand: name, one-line summary, usage text, flags and entry point.
struct Command {
  std::string name;
  std::string summary;
  std::string usage;  // full help body (printed under "usage: sparsebalance NAME ...")
  std::vector<FlagSpec> flags;
  int (*run)(const Args& args);
  unsigned common = kAllCommon;  // which of --set, --summary it takes
};

const std::vector<Command>& commands();

// Write JSON atomically (temporary file + rename) so a reader never sees half a summary.
void write_summary(const std::string& path, const nlohmann::json& j);

}  // namespace sb
