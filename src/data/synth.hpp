// Synthetic long-context corpus: natural-looking filler text from a word-level generator over a
// real word list, with length presets and embedded retrieval tasks whose question and answer sit
// at the end of the document while the evidence sits far before it.
#pragma once
#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "io/shard.hpp"

namespace sb {

// std::mt19937_64 with our own distributions: std:: distributions differ between standard
// libraries, and a corpus must be the same bytes for a seed everywhere.
class Rng {
 public:
  explicit Rng(uint64_t seed) : eng_(seed) {}
  uint64_t next() { return eng_(); }
  uint64_t below(uint64_t n);                // uniform in [0, n), unbiased; n > 0
  uint64_t range(uint64_t lo, uint64_t hi);  // uniform in [lo, hi]
  double uniform();                          // [0, 1), 53 bits
  double normal();                           // standard normal (Box-Muller)

 private:
  std::mt19937_64 eng_;
};

// A well-mixed seed for item i of a stream (splitmix64), so each document is independent.
uint64_t mix_seed(uint64_t seed, uint64_t i);

struct SynthOptions {
  std::string preset = "longalign";  // longalign | chatqa2 | uniform | fixed
  uint64_t docs = 1000;
  uint64_t seed = 1;
  uint64_t max_len = 8192;           // tokens (= bytes)
  uint64_t min_len = 32;
  // Multi-key and key-value documents: ask the one question (the evaluated format) or every key in
  // turn, the asked one last (training documents with many retrievals each; prep.ask).
  bool ask_all = false;
  std::string dict = "/usr/share/dict/american-english";
};

struct SynthDoc {
  std::string text;
  TaskSpan task;  // answer span as byte (= token) offsets within text (the last question's)
  std::vector<std::pair<uint64_t, uint64_t>> answers;  // every answer span [begin, end), task's last
};

// Smallest document that carries a task; shorter ones are plain filler (task type 0).
inline constexpr uint64_t kMinTaskLen = 80;

// Target length of one document under a preset, in [min_len, max_len].
uint64_t sample_length(const std::string& preset, Rng& rng, uint64_t min_len, uint64_t max_len);

class SynthCorpus {
 public:
  explicit SynthCorpus(const SynthOptions& opt);  // loads and filters the word list
  SynthDoc doc(uint64_t i) const;                 // deterministic in (seed, i)
  const SynthOptions& options() const { return opt_; }

 private:
  const std::string& word(Rng& rng) const;
  std::string sentence(Rng& rng) const;
  std::string filler(Rng& rng, uint64_t n) const;  // exactly n bytes
  std::string exact_tail(Rng& rng, uint64_t n) const;
  SynthDoc passkey(Rng& rng, uint64_t len) const;
  SynthDoc multikey(Rng& rng, uint64_t len) const;
  SynthDoc kv_lookup(Rng& rng, uint64_t len) const;
  // qa: (question, answer) pairs asked in order at the end; the last one is the document's task.
  SynthDoc assemble(Rng& rng, uint64_t len, const std::vector<std::string>& needles, double lo, double hi,
                    const std::vector<std::pair<std::string, std::string>>& qa, uint8_t type) const;
  // The questions a document asks: (question(k), answer(k)) for k = ask, or every k with ask last.
  template <class Q>
  std::vector<std::pair<std::string, std::string>> questions(uint64_t n, uint64_t ask, const Q& q) const;

  SynthOptions opt_;
  std::vector<std::string> words_;                // shuffled by seed; rank = Zipf rank
  std::vector<double> zipf_cdf_;
  std::vector<std::vector<uint32_t>> by_len_;     // word indices by length, to end text exactly
};

}  // namespace sb
