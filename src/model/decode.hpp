// Generation (`sparsebalance generate`): the model continues a prompt one token at a time.
//
// Decoder<T> is the CPU model's forward with a KV cache: a forward over the prompt (all its rows at
// once, causal), then one row per new token against the cached keys and values of every layer, so
// a step costs O(length) instead of a whole forward. It computes what Model<T>::forward_logits
// computes with dense attention (same weights, same RoPE table, same kernels for the projections
// and norms), to float rounding: tests/train/test_model.cpp checks incremental logits against the
// full forward's on random weights.
//
// Sparse attention has no cache here: the gate pools each query block (attention.block_size rows,
// later rows included), so a row's selection depends on rows not yet generated; `generate` with
// sparse attention runs Model<T>::forward_logits over the whole sequence per token, which is what
// the model computes in training and eval.
//
// generate() is the loop over any next-logits function (the CPU decoder, a full forward per token,
// the GPU), greedy or sampled (temperature, top-p), stopping at a stop id or after max_new tokens.
#pragma once
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

#include "src/model/model.hpp"

namespace sb {

template <class T>
class Decoder {
 public:
  explicit Decoder(const Model<T>& model);  // keeps a reference: the model outlives the decoder
  // Appends `tokens` at positions len().. and returns the logits of their last `rows` rows
  // (rows x V, row-major; rows <= tokens.size()).
  std::vector<T> append(std::span<const int32_t> tokens, int rows = 1);
  int len() const { return len_; }

 private:
  const Model<T>& m_;
  RopeTable rope_;
  std::vector<std::vector<T>> k_, v_;  // (n_layers) x (len, Hkv*D): keys after RoPE, values
  int len_ = 0;
};

struct GenerateOptions {
  int max_new = 64;          // tokens generated at most
  double temperature = 0;    // 0: greedy (argmax, the lowest id on ties)
  double top_p = 1;          // sampling: the smallest set of likeliest tokens whose probability reaches top_p
  uint64_t seed = 0;         // sampling's generator (mt19937_64)
  std::vector<int32_t> stop;  // ids that end the generation (kept as its last token)
};

struct Generated {
  std::vector<int32_t> ids;       // the new tokens
  std::vector<double> logprobs;   // (ids) log p of each under the model (temperature 1, before top-p)
  bool stopped = false;           // ended at a stop id (else at max_new)
};

// next(seq, fresh): the logits (V) of the token after `seq`, whose last `fresh` tokens the function
// has not seen yet (the prompt first, then 1 per step).
using NextLogits = std::function<std::vector<float>(const std::vector<int32_t>& seq, int fresh)>;
Generated generate(const std::vector<int32_t>& prompt, const NextLogits& next, const GenerateOptions& o);

// The choice of one token from logits (V): greedy when temperature == 0, else softmax(logits / T)
// cut to top_p, drawn with u in [0, 1).
int32_t pick_token(std::span<const float> logits, double temperature, double top_p, double u);

}  // namespace sb
