#include "src/config/schema.hpp"

namespace sb {

std::vector<KeySpec> schema_data() {
  using T = KeyType;
  constexpr double BIG = 9.0e15;
  return {
      {"data.path", T::String, "runs/tiny/data", 0, 0, {}, "shard directory (or one shard file)"},
      {"data.seed", T::Int, "1234", 0, BIG, {}, "seed of the document shuffle"},
      {"data.val_fraction", T::Float, "0.05", 0, 0.9, {}, "fraction of documents held out for validation"},
      {"data.long_docs", T::String, "window", 0, 0, {"window", "reject"}, "documents longer than train.micro_batch_tokens: cut into windows, or reject with an error"},
  };
}

}  // namespace sb
