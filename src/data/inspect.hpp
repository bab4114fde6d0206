// What `sparsebalance inspect` reports about a dataset: counts, length statistics, a log2
// length histogram and task counts, as JSON (the --json output) and as text.
#pragma once
#include <nlohmann/json.hpp>

#include "io/shard.hpp"

namespace sb {

// verify: stream every token and check ids < vocab_size first (throws on a bad one).
nlohmann::json dataset_report(const Dataset& ds, bool verify);
std::string format_dataset_report(const nlohmann::json& r);

// Document `doc` of the dataset as text (`inspect --decode`): byte shards decode themselves;
// BPE shards need the tokenizer.json they were made with (the sha256 they record must match).
std::string decode_document(const Dataset& ds, uint64_t doc, const std::string& tokenizer_path);

}  // namespace sb
