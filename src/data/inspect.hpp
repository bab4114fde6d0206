// What `sparsebalance inspect` reports about a dataset: counts, length statistics, a log2
// length histogram and task counts, as JSON (the --json output) and as text.
#pragma once
#include <nlohmann/json.hpp>

#include "io/shard.hpp"

namespace sb {

// verify: stream every token and check ids < vocab_size first (throws on a bad one).
nlohmann::json dataset_report(const Dataset& ds, bool verify);
std::string format_dataset_report(const nlohmann::json& r);

}  // namespace sb
