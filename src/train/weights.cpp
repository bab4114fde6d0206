#include "src/train/weights.hpp"

#include <algorithm>

#include "base/error.hpp"

namespace sb {

// "1 layers, d_model 16, vocab 259": what a parameter list describes, for a mismatch message.
static std::string describe(const std::vector<std::string>& names, const std::vector<std::vector<int64_t>>& shapes) {
  int layers = 0;
  std::string embed;
  for (size_t i = 0; i < names.size(); ++i) {
    if (names[i].find(".layers.") != std::string::npos && names[i].ends_with("input_layernorm.weight")) ++layers;
    if (names[i] == "model.embed_tokens.weight" && shapes[i].size() == 2)
      embed = ", vocab " + std::to_string(shapes[i][0]) + ", d_model " + std::to_string(shapes[i][1]);
  }
  return std::to_string(layers) + " layers" + embed;
}

static std::string shape_text(const std::vector<int64_t>& s) {
  std::string t = "[";
  for (size_t i = 0; i < s.size(); ++i) t += (i ? ", " : "") + std::to_string(s[i]);
  return t + "]";
}

void check_weights(const Checkpoint& ck, const std::string& path, const Model<float>& model) {
  const auto& ps = model.params();
  std::vector<std::string> cn, mn;
  std::vector<std::vector<int64_t>> cs, ms;
  for (const auto& t : ck.tensors) cn.push_back(t.name), cs.push_back(t.shape);
  for (const auto& p : ps) mn.push_back(p.name), ms.push_back(p.shape);
  const std::string both = " (the checkpoint's model: " + describe(cn, cs) + "; the configured model: " + describe(mn, ms) +
                           "; different [model] settings or data vocab_size?)";
  for (size_t i = 0; i < std::min(ps.size(), ck.tensors.size()); ++i)
    if (ck.tensors[i].name != ps[i].name || ck.tensors[i].shape != ps[i].shape)
      throw Error(path + ": parameter '" + ck.tensors[i].name + "' " + shape_text(ck.tensors[i].shape) +
                  " does not match the configured model's '" + ps[i].name + "' " + shape_text(ps[i].shape) + both);
  if (ck.tensors.size() != ps.size())
    throw Error(path + ": holds " + std::to_string(ck.tensors.size()) + " parameter tensors, the configured model has " +
                std::to_string(ps.size()) + both);
}

void load_weights(const Checkpoint& ck, const std::string& path, Model<float>& model) {
  check_weights(ck, path, model);
  model.weights() = ck.params;
}

}  // namespace sb
