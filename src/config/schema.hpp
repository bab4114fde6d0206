// The config keys, one function per area so each area keeps its own keys beside its code.
// src/config/KEYS.md, the key reference, is generated from these (`sparsebalance keys --markdown`).
#pragma once
#include <vector>

#include "src/config/config.hpp"

namespace sb {
std::vector<KeySpec> schema_model_train();  // [model] [train] [attention] [checkpoint] [log] [eval]
std::vector<KeySpec> schema_data();         // [data] [prep]
std::vector<KeySpec> schema_balance();      // [balance] [profile] [simulate]
}  // namespace sb
