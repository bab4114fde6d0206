// Synthetic long-context corpus generator. See synth.hpp.
#include "src/data/synth.hpp"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "base/error.hpp"
#include "base/input_file.hpp"

namespace sb {

// ---------------------------------------------------------------------------------------------
// Random numbers

uint64_t Rng::below(uint64_t n) {
  uint64_t limit = UINT64_MAX - UINT64_MAX % n, x;
  do x = next(); while (x >= limit);
  return x % n;
}
uint64_t Rng::range(uint64_t lo, uint64_t hi) { return lo + below(hi - lo + 1); }
double Rng::uniform() { return double(next() >> 11) * 0x1.0p-53; }
double Rng::normal() {
  double u1 = 1.0 - uniform(), u2 = uniform();  // u1 in (0, 1]: log is finite
  return std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2);
}

uint64_t mix_seed(uint64_t seed, uint64_t i) {
  uint64_t z = seed + 0x9e3779b97f4a7c15ULL * (i + 1);
  z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
  z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
  return z ^ (z >> 31);
}

// ---------------------------------------------------------------------------------------------
// Lengths

uint64_t sample_length(const std::string& preset, Rng& rng, uint64_t min_len, uint64_t max_len) {
  if (min_len < 1 || min_len > max_len)
    throw Error("prep: min_len " + std::to_string(min_len) + " and max_len " + std::to_string(max_len) +
                ": expected 1 <= min_len <= max_len");
  const double mx = double(max_len);
  auto log_normal = [&](double median, double sigma_log2) { return std::exp2(std::log2(median) + sigma_log2 * rng.normal()); };
  double len;
  if (preset == "fixed") {
    len = mx;
  } else if (preset == "uniform") {
    return rng.range(min_len, max_len);
  } else if (preset == "longalign") {
    // Long tail: most documents near max/16, a Pareto tail above max/8, and a few at max.
    double u = rng.uniform();
    if (u < 0.02) len = mx;
    else if (u < 0.10) len = mx / 8 * std::pow(1.0 - rng.uniform(), -1.0 / 1.5);
    else len = log_normal(mx / 16, 1.0);
  } else if (preset == "chatqa2") {
    // Bimodal: short chat-like turns and long documents.
    len = rng.uniform() < 0.6 ? log_normal(mx / 32, 0.5) : log_normal(mx / 2, 0.35);
  } else {
    throw Error("prep.preset = \"" + preset + "\": expected longalign, chatqa2, uniform or fixed");
  }
  return std::clamp<uint64_t>(uint64_t(std::llround(std::min(len, mx))), min_len, max_len);
}

// ---------------------------------------------------------------------------------------------
// Words and filler text

// The system word list includes slurs; filler text should not. Prefix match covers plurals.
static bool blocked(const std::string& w) {
  static const char* prefixes[] = {"nigg", "fag", "dyke", "kike", "spic", "chink", "wetback", "tranny",
                                   "retard", "cunt", "whore", "slut", "rape", "rapist", "gook", "coon"};
  for (const char* p : prefixes)
    if (w.rfind(p, 0) == 0) return true;
  return false;
}

SynthCorpus::SynthCorpus(const SynthOptions& opt) : opt_(opt) {
  if (!std::filesystem::exists(opt.dict))
    throw Error(opt.dict + ": word list not found (prep.dict); install it with `apt-get install wamerican` "
                "or point prep.dict at a file of one word per line");
  std::istringstream in(read_input_file(opt.dict, "a word list, one word per line (prep.dict, --dict)", kMaxTextInputBytes));
  for (std::string w; std::getline(in, w);) {
    bool ok = !w.empty() && w.size() <= 14 && !blocked(w);
    for (char c : w) ok &= c >= 'a' && c <= 'z';
    if (ok) words_.push_back(w);
  }
  if (words_.size() < 1000)
    throw Error(opt.dict + ": only " + std::to_string(words_.size()) +
                " lowercase alphabetic words; expected at least 1000 for the filler generator");
  // A seed-dependent Zipf ranking: frequent words recur as in real text (not trivially
  // compressible, not uniform noise either).
  Rng rng(mix_seed(opt.seed, 0xd1c7));
  for (size_t i = words_.size(); i > 1; --i) std::swap(words_[i - 1], words_[rng.below(i)]);
  words_.resize(std::min<size_t>(words_.size(), 30000));
  double acc = 0;
  // Zipf-Mandelbrot (q = 2.7): a flatter head than pure Zipf, so no one odd word dominates.
  for (size_t r = 0; r < words_.size(); ++r) zipf_cdf_.push_back(acc += 1.0 / (double(r) + 2.7));
  by_len_.resize(16);
  for (size_t i = 0; i < words_.size(); ++i) by_len_[words_[i].size()].push_back(uint32_t(i));
}

const std::string& SynthCorpus::word(Rng& rng) const {
  double u = rng.uniform() * zipf_cdf_.back();
  size_t i = std::upper_bound(zipf_cdf_.begin(), zipf_cdf_.end(), u) - zipf_cdf_.begin();
  return words_[std::min(i, words_.size() - 1)];
}

std::string SynthCorpus::sentence(Rng& rng) const {
  std::string s;
  uint64_t n = rng.range(6, 18);
  for (uint64_t k = 0; k < n; ++k) {
    if (k) s += rng.uniform() < 0.12 ? ", " : " ";
    s += word(rng);
  }
  s[0] = char(s[0] - 'a' + 'A');
  double u = rng.uniform();
  s += u < 0.9 ? "." : u < 0.95 ? "?" : "!";
  u = rng.uniform();
  s += u < 0.92 ? " " : u < 0.98 ? "\n" : "\n\n";
  return s;
}

// A last sentence of exactly n bytes, so documents hit their target length exactly.
std::string SynthCorpus::exact_tail(Rng& rng, uint64_t n) const {
  if (n < 4) return std::string(n, ' ');
  std::string out;
  auto exact_word = [&](size_t len) -> const std::string* {
    if (len >= by_len_.size() || by_len_[len].empty()) return nullptr;
    return &words_[by_len_[len][rng.below(by_len_[len].size())]];
  };
  while (true) {
    size_t sep = out.empty() ? 0 : 1;
    size_t room = n - out.size() - 2;  // keep two bytes for ". " (the next text starts a sentence)
    if (room <= sep) break;
    size_t avail = room - sep;
    const std::string* w = &word(rng);
    if (w->size() >= avail || avail <= 8) {  // finish with a word that fits exactly, if any
      w = exact_word(avail);
      if (w) out += std::string(sep, ' ') + *w;
      break;
    }
    out += std::string(sep, ' ') + *w;
  }
  if (!out.empty()) out[0] = char(out[0] - 'a' + 'A');
  out += '.';
  out.resize(n, ' ');
  return out;
}

std::string SynthCorpus::filler(Rng& rng, uint64_t n) const {
  std::string out;
  out.reserve(n);
  while (out.size() < n) {
    std::string s = sentence(rng);
    if (out.size() + s.size() <= n) out += s;
    else out += exact_tail(rng, n - out.size());
  }
  return out;
}

// ---------------------------------------------------------------------------------------------
// Tasks: evidence (needles) early or in the middle, question + answer at the very end.

SynthDoc SynthCorpus::assemble(Rng& rng, uint64_t len, const std::vector<std::string>& needles, double lo,
                               double hi, const std::vector<std::pair<std::string, std::string>>& qa,
                               uint8_t type) const {
  std::string tail;
  std::vector<std::pair<uint64_t, uint64_t>> spans;  // answer spans within tail
  for (const auto& [q, a] : qa) {
    tail += "\n" + q;
    spans.emplace_back(tail.size(), tail.size() + a.size());
    tail += a;
  }
  uint64_t overhead = tail.size();
  for (const auto& n : needles) overhead += n.size();
  if (overhead > len) return {"", {kTaskNone, 0, 0}, {}};  // does not fit: caller falls back
  uint64_t F = len - overhead;
  std::vector<uint64_t> cuts;
  for (size_t k = 0; k < needles.size(); ++k) cuts.push_back(uint64_t((lo + (hi - lo) * rng.uniform()) * double(F)));
  std::sort(cuts.begin(), cuts.end());
  SynthDoc d;
  d.text.reserve(len);
  uint64_t at = 0;
  for (size_t k = 0; k < needles.size(); ++k) {
    d.text += filler(rng, cuts[k] - at) + needles[k];
    at = cuts[k];
  }
  d.text += filler(rng, F - at) + tail;
  const uint64_t t0 = len - tail.size();
  for (const auto& [b, e] : spans) d.answers.emplace_back(t0 + b, t0 + e);
  d.task = {type, d.answers.back().first, d.answers.back().second};
  return d;
}

template <class Q>
std::vector<std::pair<std::string, std::string>> SynthCorpus::questions(uint64_t n, uint64_t ask, const Q& q) const {
  std::vector<std::pair<std::string, std::string>> qa;
  if (opt_.ask_all)
    for (uint64_t k = 0; k < n; ++k)
      if (k != ask) qa.push_back(q(k));
  qa.push_back(q(ask));
  return qa;
}

SynthDoc SynthCorpus::passkey(Rng& rng, uint64_t len) const {
  std::string key = std::to_string(rng.range(10000, 99999));
  return assemble(rng, len, {"The pass key is " + key + ". Remember it. "}, 0.05, 0.6,
                  {{"What is the pass key? The pass key is ", key}}, kTaskPasskey);
}

SynthDoc SynthCorpus::multikey(Rng& rng, uint64_t len) const {
  for (uint64_t n = std::clamp<uint64_t>(len / 1024, 2, 8); n >= 2; --n) {
    std::vector<std::string> keys, needles;
    while (keys.size() < n) {
      const auto& w = word(rng);
      if (std::find(keys.begin(), keys.end(), w) == keys.end()) keys.push_back(w);
    }
    std::vector<std::string> values;
    for (uint64_t k = 0; k < n; ++k) {
      values.push_back(std::to_string(rng.range(1000000, 9999999)));
      needles.push_back("The special magic number for " + keys[k] + " is " + values[k] + ". ");
    }
    uint64_t ask = rng.below(n);
    auto qa = questions(n, ask, [&](uint64_t k) {
      return std::pair{"What is the special magic number for " + keys[k] + "? The special magic number for " + keys[k] + " is ",
                       values[k]};
    });
    auto d = assemble(rng, len, needles, 0.0, 0.9, qa, kTaskMultikey);
    if (d.task.type) return d;
  }
  return {"", {}, {}};
}

SynthDoc SynthCorpus::kv_lookup(Rng& rng, uint64_t len) const {
  auto uuid = [&] {
    static const char* hex = "0123456789abcdef";
    std::string s;
    for (int g : {8, 4, 4, 4, 12}) {
      if (!s.empty()) s += '-';
      for (int i = 0; i < g; ++i) s += hex[rng.below(16)];
    }
    return s;
  };
  for (uint64_t n = std::clamp<uint64_t>(len / 2048, 2, 16); n >= 2; --n) {
    std::vector<std::string> keys, values;
    std::string block = "Here is a JSON object of key-value pairs:\n{";
    for (uint64_t k = 0; k < n; ++k) {
      keys.push_back(uuid()), values.push_back(uuid());
      block += (k ? ", \"" : "\"") + keys[k] + "\": \"" + values[k] + "\"";
    }
    block += "}\n";
    uint64_t ask = rng.below(n);
    auto qa = questions(n, ask, [&](uint64_t k) {
      return std::pair{"Which value is paired with the key \"" + keys[k] + "\" in the JSON object above? The value is ",
                       values[k]};
    });
    auto d = assemble(rng, len, {block}, 0.05, 0.5, qa, kTaskKvLookup);
    if (d.task.type) return d;
  }
  return {"", {}, {}};
}

SynthDoc SynthCorpus::doc(uint64_t i) const {
  Rng rng(mix_seed(opt_.seed, i));
  uint64_t len = sample_length(opt_.preset, rng, opt_.min_len, opt_.max_len);
  if (len >= kMinTaskLen) {
    SynthDoc d;
    switch (rng.below(3)) {
      case 0: d = passkey(rng, len); break;
      case 1: d = multikey(rng, len); break;
      default: d = kv_lookup(rng, len); break;
    }
    if (!d.task.type) d = passkey(rng, len);  // the chosen task is too big for this length
    if (d.task.type) return d;
  }
  return {filler(rng, len), {}, {}};
}

}  // namespace sb
