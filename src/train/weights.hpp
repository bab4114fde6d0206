// A checkpoint's weights against the configured model (resume, eval, generate, the conversion's tests).
#pragma once
#include <string>

#include "io/checkpoint.hpp"
#include "src/model/model.hpp"

namespace sb {

// Copy a checkpoint's parameters into `model` after checking names and shapes (errors name
// the file and the first tensor that differs).
void load_weights(const Checkpoint& ck, const std::string& path, Model<float>& model);
// load_weights' checks only (names and shapes against the model's), for weights read in place.
void check_weights(const Checkpoint& ck, const std::string& path, const Model<float>& model);

}  // namespace sb
