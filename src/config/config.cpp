#include "src/config/config.hpp"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <optional>
#include <set>
#include <sstream>

#include <toml++/toml.h>

#include "base/error.hpp"
#include "base/input_file.hpp"
#include "src/config/schema.hpp"

namespace sb {

const std::vector<KeySpec>& config_schema() {
  static const std::vector<KeySpec> all = [] {
    std::vector<KeySpec> v;
    for (auto part : {schema_model_train(), schema_data(), schema_balance()})
      v.insert(v.end(), part.begin(), part.end());
    return v;
  }();
  return all;
}

const KeySpec* find_key(std::string_view key) {
  for (const auto& k : config_schema())
    if (k.key == key || (!k.old_key.empty() && k.old_key == key)) return &k;
  return nullptr;
}

size_t edit_distance(std::string_view a, std::string_view b) {
  std::vector<size_t> prev(b.size() + 1), cur(b.size() + 1);
  for (size_t j = 0; j <= b.size(); ++j) prev[j] = j;
  for (size_t i = 1; i <= a.size(); ++i) {
    cur[0] = i;
    for (size_t j = 1; j <= b.size(); ++j)
      cur[j] = std::min({prev[j] + 1, cur[j - 1] + 1, prev[j - 1] + (a[i - 1] != b[j - 1])});
    std::swap(prev, cur);
  }
  return prev[b.size()];
}

std::string nearest_key(std::string_view key) {
  std::string best;
  size_t best_d = SIZE_MAX;
  for (const auto& k : config_schema()) {
    // Compare against the full key and against its name within the section, so that a
    // misplaced key ("train.block_size") still finds its home ("attention.block_size").
    size_t d = edit_distance(key, k.key);
    auto dot = key.find('.');
    auto kdot = k.key.find('.');
    if (dot != std::string_view::npos && kdot != std::string::npos)
      d = std::min(d, edit_distance(key.substr(dot + 1), std::string_view(k.key).substr(kdot + 1)) + 1);
    if (d < best_d) best_d = d, best = k.key;
  }
  return best_d <= std::max<size_t>(3, key.size() / 3) ? best : "";
}

namespace {

const char* type_name(KeyType t) {
  switch (t) {
    case KeyType::Int: return "an integer";
    case KeyType::Float: return "a number";
    case KeyType::Bool: return "a boolean (true or false)";
    case KeyType::String: return "a string";
    case KeyType::Sources: return "a list of { path = \"...\", weight = number } tables";
  }
  return "?";
}

std::string fmt_num(double x) {
  std::ostringstream os;
  os << x;
  return os.str();
}

// Length of the printable UTF-8 character at s[i], or 0 where there is none: a control byte (NUL
// would cut a path short), a stray or truncated byte, an overlong form or a surrogate.
size_t text_char_at(const std::string& s, size_t i) {
  const auto c = static_cast<unsigned char>(s[i]);
  if (c < 0x20 || c == 0x7f) return 0;
  const size_t n = c < 0x80 ? 1 : (c >> 5) == 0x6 ? 2 : (c >> 4) == 0xe ? 3 : (c >> 3) == 0x1e ? 4 : 0;
  if (n == 0 || (n == 2 && c < 0xc2) || i + n > s.size()) return 0;
  uint32_t cp = n == 1 ? c : c & (0x7f >> n);
  for (size_t k = 1; k < n; ++k) {
    const auto d = static_cast<unsigned char>(s[i + k]);
    if ((d >> 6) != 0x2) return 0;
    cp = (cp << 6) | (d & 0x3f);
  }
  if ((n == 3 && cp < 0x800) || (n == 4 && (cp < 0x10000 || cp > 0x10ffff)) || (cp >= 0xd800 && cp <= 0xdfff))
    return 0;
  return n;
}

// String values must be such text (TOML files are UTF-8, and a `--set` value is written back into
// the checkpoint's TOML): the offset of the first byte that is not.
std::optional<size_t> bad_text_at(const std::string& s) {
  for (size_t i = 0, n; i < s.size(); i += n)
    if ((n = text_char_at(s, i)) == 0) return i;
  return std::nullopt;
}

// `s` fit for an error message: other bytes shown as \xNN (a NUL would end the message early).
std::string escaped(const std::string& s) {
  std::string out;
  for (size_t i = 0, n; i < s.size(); i += n) {
    if ((n = text_char_at(s, i)) > 0) {
      out.append(s, i, n);
    } else {
      char hex[8];
      std::snprintf(hex, sizeof hex, "\\x%02X", static_cast<unsigned char>(s[i]));
      out += hex;
      n = 1;
    }
  }
  return out;
}

[[noreturn]] void unknown_key(const std::string& origin, const std::string& key) {
  std::string msg = origin + ": unknown key '" + escaped(key) + "'";
  if (auto n = nearest_key(key); !n.empty()) msg += "; did you mean '" + n + "'?";
  msg += " (see README.md, 'Configuration')";
  throw Error(msg);
}

// Range and choice checks shared by TOML values and --set strings.
ConfigValue checked(const KeySpec& spec, ConfigValue v, const std::string& origin) {
  auto where = origin + ": '" + spec.key + "'";
  if (spec.type == KeyType::String) {
    if (auto at = bad_text_at(std::get<std::string>(v)))
      throw Error(where + " must be UTF-8 text without control characters; byte " +
                  std::to_string(*at) + " is not");
  }
  if (spec.type == KeyType::Int || spec.type == KeyType::Float) {
    double x = spec.type == KeyType::Int ? double(std::get<int64_t>(v)) : std::get<double>(v);
    if (!std::isfinite(x)) throw Error(where + " must be finite, got " + fmt_num(x));
    if (x < spec.min || x > spec.max) {
      // integers as typed (1e+08 read as another number); the real bounds, an integer's open upper
      // bound too (kNoUpperBound: KEYS.md writes "inf", but 2^63-1 must hear the number it is above)
      const std::string got = spec.type == KeyType::Int ? std::to_string(std::get<int64_t>(v)) : fmt_num(x);
      const std::string hi = spec.type == KeyType::Int ? std::to_string(int64_t(spec.max))
                             : spec.max >= kNoUpperBound ? "inf" : fmt_num(spec.max);
      const std::string lo = spec.type == KeyType::Int ? std::to_string(int64_t(spec.min)) : fmt_num(spec.min);
      throw Error(where + " = " + got + " is out of range: expected " + lo + " <= value <= " + hi);
    }
  }
  if (spec.type == KeyType::String)  // a former value reads as the one it became
    for (const auto& [old, now] : spec.old_choices)
      if (std::get<std::string>(v) == old) v = now;
  if (spec.type == KeyType::String && !spec.choices.empty()) {
    const auto& s = std::get<std::string>(v);
    if (std::find(spec.choices.begin(), spec.choices.end(), s) == spec.choices.end()) {
      std::string list;
      for (const auto& c : spec.choices) list += (list.empty() ? "" : ", ") + c;
      throw Error(where + " = \"" + s + "\" is not allowed: expected one of " + list);
    }
  }
  return v;
}

// A Sources value (data.sources): a non-empty array of { path, weight } tables, each path a
// non-empty string and each weight a positive finite number; returned as canonical TOML text.
std::string parse_sources(const KeySpec& spec, const toml::node& node, const std::string& origin) {
  const std::string expect = "expected " + std::string(type_name(KeyType::Sources)) +
                             ", e.g. [{ path = \"runs/long\", weight = 0.7 }, { path = \"runs/short\", weight = 0.3 }]";
  const auto* arr = node.as_array();
  if (!arr) {
    std::ostringstream got;
    got << node.type();
    throw Error(origin + ": '" + spec.key + "' must be a list, got a " + got.str() + "; " + expect);
  }
  if (arr->empty()) throw Error(origin + ": '" + spec.key + "' is an empty list; " + expect + " (or leave it out and set data.path)");
  toml::array out;
  for (size_t i = 0; i < arr->size(); ++i) {
    const std::string at = spec.key + "[" + std::to_string(i) + "]";
    const auto* t = (*arr)[i].as_table();
    if (!t) throw Error(origin + ": '" + at + "' must be a table { path = \"...\", weight = number }");
    for (auto&& [name, v] : *t)
      if (name.str() != "path" && name.str() != "weight")
        throw Error(origin + ": '" + at + "." + std::string(name.str()) + "' is not a key of a source: expected path and weight");
    const auto path = (*t)["path"].value_exact<std::string>();
    if (!path || path->empty())
      throw Error(origin + ": '" + at + ".path' " + (t->contains("path") ? "must be a non-empty string" : "is missing") +
                  ": expected the source's shard directory (or one shard file)");
    if (auto bad = bad_text_at(*path))
      throw Error(origin + ": '" + at + ".path' must be UTF-8 text without control characters; byte " + std::to_string(*bad) + " is not");
    const toml::node* w = t->get("weight");
    std::optional<double> x;
    if (w && w->is_integer()) x = double(*w->value<int64_t>());
    else if (w) x = w->value_exact<double>();
    if (!x || !std::isfinite(*x) || *x <= 0) {
      std::ostringstream got;
      if (!w) got << "nothing";
      else if (x) got << *x;
      else got << "a " << w->type();
      throw Error(origin + ": '" + at + ".weight' must be a positive finite number, got " + got.str() +
                  " (weights are relative: they are normalised to sum to 1)");
    }
    out.push_back(toml::table{{"path", *path}, {"weight", *x}});
  }
  std::ostringstream os;
  os << out;
  return os.str();
}

ConfigValue parse_string_value(const KeySpec& spec, const std::string& text, const std::string& origin) {
  auto bad = [&]() -> Error {
    return Error(origin + ": '" + spec.key + "' must be " + type_name(spec.type) + ", got '" + escaped(text) + "'");
  };
  switch (spec.type) {
    case KeyType::Int: {
      size_t pos = 0;
      long long x;
      // base 10: "010" is 10, not 8
      try { x = std::stoll(text, &pos, 10); } catch (...) { throw bad(); }
      if (pos != text.size()) throw bad();
      return checked(spec, int64_t(x), origin);
    }
    case KeyType::Float: {
      size_t pos = 0;
      double x;
      try { x = std::stod(text, &pos); } catch (...) { throw bad(); }
      if (pos != text.size()) throw bad();
      return checked(spec, x, origin);
    }
    case KeyType::Bool:
      if (text == "true" || text == "1") return true;
      if (text == "false" || text == "0") return false;
      throw bad();
    case KeyType::Sources: {  // --set data.sources='[{ path = "a", weight = 1 }]': parsed as TOML
      toml::table t;
      try {
        t = toml::parse("v = " + text, origin);
      } catch (const toml::parse_error& e) {
        throw Error(origin + ": '" + spec.key + "' must be " + type_name(spec.type) + " in TOML syntax: " +
                    std::string(e.description()));
      }
      return parse_sources(spec, *t.get("v"), origin);
    }
    case KeyType::String: {
      std::string s = text;  // accept --set k="quoted" as well as k=bare
      if (s.size() >= 2 && s.front() == '"' && s.back() == '"') s = s.substr(1, s.size() - 2);
      return checked(spec, s, origin);
    }
  }
  throw bad();
}

ConfigValue parse_toml_value(const KeySpec& spec, const toml::node& node, const std::string& origin) {
  auto bad = [&]() -> Error {
    std::ostringstream got;
    got << node.type();
    return Error(origin + ": '" + spec.key + "' must be " + type_name(spec.type) + ", got a " + got.str());
  };
  switch (spec.type) {
    case KeyType::Int:
      if (auto x = node.value_exact<int64_t>()) return checked(spec, *x, origin);
      throw bad();
    case KeyType::Float:
      if (node.is_integer()) return checked(spec, double(*node.value<int64_t>()), origin);
      if (auto x = node.value_exact<double>()) return checked(spec, *x, origin);
      throw bad();
    case KeyType::Bool:
      if (auto x = node.value_exact<bool>()) return *x;
      throw bad();
    case KeyType::String:
      if (auto x = node.value_exact<std::string>()) return checked(spec, *x, origin);
      throw bad();
    case KeyType::Sources:
      return parse_sources(spec, node, origin);
  }
  throw bad();
}

// The keys of one section; a sub-table ([model.rope_scaling] or rope_scaling.type = ...) names the
// keys below it (model.rope_scaling.type).
void apply_section(std::map<std::string, ConfigValue, std::less<>>& values, std::set<std::string, std::less<>>& given,
                   const std::string& prefix, const toml::table& tbl, const std::string& origin) {
  for (auto&& [name, val] : tbl) {
    std::string key = prefix + "." + std::string(name.str());
    if (const auto* sub = val.as_table(); sub && !find_key(key)) {
      apply_section(values, given, key, *sub, origin);
      continue;
    }
    const KeySpec* spec = find_key(key);
    if (!spec) unknown_key(origin, key);
    values[spec->key] = parse_toml_value(*spec, val, origin);  // a former name sets the key it became
    given.insert(spec->key);
  }
}

void apply_table(std::map<std::string, ConfigValue, std::less<>>& values, std::set<std::string, std::less<>>& given,
                 const toml::table& root, const std::string& origin) {
  for (auto&& [section, node] : root) {
    std::string sec(section.str());
    const auto* tbl = node.as_table();
    if (!tbl) {
      // A top-level scalar: maybe "steps = 3" meant for a section.
      unknown_key(origin, sec);
    }
    apply_section(values, given, sec, *tbl, origin);
  }
}

}  // namespace

static ConfigValue default_value(const KeySpec& k) {  // a Sources key's default is the empty list: not given
  return k.type == KeyType::Sources ? ConfigValue(k.def) : parse_string_value(k, k.def, "default");
}

Config::Config() {
  for (const auto& k : config_schema()) values_[k.key] = default_value(k);
}

void Config::set(const std::string& key, const std::string& value, const std::string& origin) {
  const KeySpec* spec = find_key(key);
  if (!spec) unknown_key(origin, key);
  const std::string& name = spec->key;  // a former name sets the key it became
  values_[name] = parse_string_value(*spec, value, origin);
  // data.path and data.sources name the data two ways, one at a time: a --set of one replaces the
  // other where a file (a config, a checkpoint's stored config) gave it; two --sets stay both given.
  const std::string other = name == "data.path" ? "data.sources" : name == "data.sources" ? "data.path" : "";
  if (!other.empty() && given_.count(other) && !set_.count(other)) {
    values_[other] = default_value(*find_key(other));
    given_.erase(other);
  }
  given_.insert(name), set_.insert(name);
}

Config Config::from_text(const std::string& text, const std::string& origin) {
  Config cfg;
  toml::table root;
  try {
    root = toml::parse(text, origin);
  } catch (const toml::parse_error& e) {
    std::ostringstream os;
    os << origin << ":" << e.source().begin.line << ":" << e.source().begin.column
       << ": invalid TOML: " << e.description();
    throw Error(os.str());
  }
  apply_table(cfg.values_, cfg.given_, root, origin);
  cfg.source_ = origin;
  return cfg;
}

Config Config::load(const std::string& path, std::span<const std::string> overrides) {
  Config cfg;
  if (!path.empty()) {
    // The input-file rule: a directory reads as an empty config, a FIFO blocks, /dev/zero never ends.
    cfg = from_text(read_input_file(path, "a TOML config file", kMaxConfigBytes), path);
  }
  for (const auto& ov : overrides) {
    auto eq = ov.find('=');
    if (eq == std::string::npos || eq == 0)
      throw Error("--set " + escaped(ov) + ": expected key=value, e.g. --set train.steps=100");
    cfg.set(ov.substr(0, eq), ov.substr(eq + 1), "--set " + escaped(ov));
  }
  return cfg;
}

const ConfigValue& Config::get(std::string_view key, KeyType t) const {
  auto it = values_.find(key);
  const KeySpec* spec = find_key(key);
  if (it == values_.end() || !spec || spec->type != t)
    throw std::logic_error("config key read with the wrong type or not in the schema: " + std::string(key));
  return it->second;
}

int64_t Config::i(std::string_view key) const { return std::get<int64_t>(get(key, KeyType::Int)); }
double Config::f(std::string_view key) const { return std::get<double>(get(key, KeyType::Float)); }
bool Config::b(std::string_view key) const { return std::get<bool>(get(key, KeyType::Bool)); }
const std::string& Config::s(std::string_view key) const {
  return std::get<std::string>(get(key, KeyType::String));
}

std::vector<SourceSpec> Config::sources(std::string_view key) const {
  auto it = values_.find(key);
  const KeySpec* spec = find_key(key);
  if (it == values_.end() || !spec || spec->type != KeyType::Sources)
    throw std::logic_error("config key read with the wrong type or not in the schema: " + std::string(key));
  std::vector<SourceSpec> out;
  toml::table t = toml::parse("v = " + std::get<std::string>(it->second));  // canonical: parse_sources wrote it
  for (const auto& e : *t["v"].as_array()) {
    const auto& st = *e.as_table();
    out.push_back({*st["path"].value<std::string>(), *st["weight"].value<double>()});
  }
  return out;
}

std::string Config::to_toml() const {
  toml::table root;
  // Exactly one of data.path and data.sources: a mixture's stored config names no data.path, so
  // reading it back (eval --checkpoint, resume's comparison) is not "both given".
  const bool mixture = !sources("data.sources").empty();
  for (const auto& [key, val] : values_) {
    const KeySpec* spec = find_key(key);
    if (spec->type == KeyType::Sources) {
      toml::table t = toml::parse("v = " + std::get<std::string>(val));
      if (t["v"].as_array()->empty()) continue;  // not given
      const auto dot = key.find('.');
      const std::string sec = key.substr(0, dot);
      if (!root.contains(sec)) root.insert(sec, toml::table{});
      root[sec].as_table()->insert_or_assign(key.substr(dot + 1), *t["v"].as_array());
      continue;
    }
    if (mixture && key == "data.path") continue;
    auto dot = key.find('.');
    std::string sec = key.substr(0, dot), name = key.substr(dot + 1);
    if (!root.contains(sec)) root.insert(sec, toml::table{});
    auto& tbl = *root[sec].as_table();
    std::visit([&](const auto& x) { tbl.insert_or_assign(name, x); }, val);
  }
  std::ostringstream os;
  os << root << "\n";
  return os.str();
}

}  // namespace sb
