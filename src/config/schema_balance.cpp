#include "src/config/schema.hpp"

namespace sb {

std::vector<KeySpec> schema_balance() {
  using T = KeyType;
  return {
      {"balance.batching", T::String, "sequential", 0, 0, {"sequential", "tokens", "quadratic", "sparse"}, "how the global batch is split over ranks x micro-batches"},
      {"balance.tuning", T::String, "fixed", 0, 0, {"fixed", "dst"}, "attention budgets: fixed k0, or dynamic sparsity tuning"},
  };
}

}  // namespace sb
