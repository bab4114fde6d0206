// The run configuration: a TOML file plus `--set key=value` overrides, checked against one schema.
#pragma once
#include <cstdint>
#include <map>
#include <set>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <variant>
#include <vector>

namespace sb {

// Sources: a list of { path = "...", weight = number } tables (data.sources), held as its TOML text.
enum class KeyType { Int, Float, Bool, String, Sources };

// One entry of a Sources key: a dataset path and its (positive, finite) weight, not normalised.
struct SourceSpec {
  std::string path;
  double weight = 1;
};

// One known key: its type, default, bounds and a line of help. The schema is the single
// source of truth for validation, `--help` and src/config/KEYS.md (`sparsebalance keys --markdown`).
struct KeySpec {
  std::string key;                   // "section.name"
  KeyType type;
  std::string def;                   // default, as it would be written after --set
  double min = -1e300, max = 1e300;  // inclusive bounds for Int/Float
  std::vector<std::string> choices;  // allowed values for String (empty: any)
  std::string help;
  // Former names, still read as the current ones (issue 49 renamed the context-parallel "shard" to
  // "split"/"part"): a config or checkpoint written with them loads unchanged; KEYS.md lists them.
  std::string old_key;                                           // the key's former name, or ""
  std::vector<std::pair<std::string, std::string>> old_choices;  // {former value, the value it is now}
};

// The schema's "no upper bound" for Int keys (about 2^53, the largest integer a double holds
// exactly): KEYS.md and range errors print such a bound as inf.
inline constexpr double kNoUpperBound = 9.0e15;

const std::vector<KeySpec>& config_schema();
// The key by its name or its former name (KeySpec::old_key).
const KeySpec* find_key(std::string_view key);

using ConfigValue = std::variant<int64_t, double, bool, std::string>;

// A config file larger than this is refused (a TOML config is a few KiB; the limit keeps a wrong
// path, e.g. a data file, from being read into memory).
inline constexpr uint64_t kMaxConfigBytes = 1 << 20;

class Config {
 public:
  // Defaults only.
  Config();
  // Parse a TOML file (path may be empty: defaults), then apply overrides "key=value" in order.
  // Throws sb::Error naming the file/flag, the key and what was expected.
  static Config load(const std::string& path, std::span<const std::string> overrides = {});
  // Parse TOML text (e.g. the config stored in a checkpoint); `origin` names it in errors.
  static Config from_text(const std::string& text, const std::string& origin);

  void set(const std::string& key, const std::string& value, const std::string& origin);

  int64_t i(std::string_view key) const;
  double f(std::string_view key) const;
  bool b(std::string_view key) const;
  const std::string& s(std::string_view key) const;
  std::vector<SourceSpec> sources(std::string_view key) const;  // a Sources key; empty when not given
  // Whether the file or a --set named `key` (a default is not given; data.path vs data.sources:
  // a --set of one drops the other where the file gave it).
  bool given(std::string_view key) const { return given_.count(key) > 0; }

  // The effective configuration as TOML text (every key), stored in checkpoints.
  std::string to_toml() const;
  // The file this config came from ("" for defaults only).
  const std::string& source() const { return source_; }

 private:
  const ConfigValue& get(std::string_view key, KeyType t) const;
  std::map<std::string, ConfigValue, std::less<>> values_;
  std::set<std::string, std::less<>> given_, set_;  // named by the file or a --set; by a --set (set())
  std::string source_;
};

// Nearest known key by edit distance, for "did you mean" hints ("" when nothing is close).
std::string nearest_key(std::string_view key);
size_t edit_distance(std::string_view a, std::string_view b);

}  // namespace sb
