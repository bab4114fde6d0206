// `sparsebalance generate` on the committed transformers fixtures (tests/convert/fixtures): the
// greedy ids against a committed golden (generate_golden.json) and against the plain reference
// (a whole forward per token, argmax, no KV cache), the greedy choice at every prefix against
// transformers' own logits (golden.json), --prompt and --chat through the byte vocabulary, a
// checkpoint as the model, sampling's seed and top-p, and the refusals.
#include <gtest/gtest.h>

#include <nlohmann/json.hpp>

#include "io/checkpoint.hpp"
#include "src/data/tokenizer.hpp"
#include "src/hf/hf_convert.hpp"
#include "src/model/model.hpp"
#include "src/train/settings.hpp"
#include "src/train/weights.hpp"
#include "tests/convert/convert_test_util.hpp"

using namespace sb;
using json = nlohmann::json;

namespace {

const std::vector<std::string> kFixtures = {"llama", "qwen2", "llama31", "qwen3"};

json generate_json(const std::string& args) {
  sbtest::Run r = sbtest::run_program("generate " + args + " --json");
  EXPECT_EQ(r.rc, 0) << r.out;
  const size_t open = r.out.find('{');
  return json::parse(open == std::string::npos ? "{}" : r.out.substr(open));
}

std::string generate_error(const std::string& args) {
  sbtest::Run r = sbtest::run_program("generate " + args);
  EXPECT_NE(r.rc, 0) << "generate " << args << " succeeded";
  return r.out;
}

AttnSettings dense(int n_layers) {
  AttnSettings a;
  a.sparse = false, a.block_size = 4;
  a.k.assign(size_t(n_layers), 1);
  return a;
}

int32_t argmax(const float* row, int V) {  // the lowest id on ties, as generate
  int32_t best = 0;
  for (int v = 1; v < V; ++v)
    if (row[v] > row[best]) best = v;
  return best;
}

// The plain reference: the whole forward over the sequence for each new token, its last row's
// argmax, until `max_new` tokens or one of `stop`.
std::vector<int32_t> reference_greedy(const std::string& dir, std::vector<int32_t> seq, int max_new,
                                      const std::vector<int32_t>& stop) {
  HfImport im = import_hf(dir, Config(), {});
  Model<float> m(model_dims(im.cfg, 0));
  m.weights() = std::move(im.weights);
  const int V = m.shape().vocab;
  std::vector<int32_t> out;
  while (int(out.size()) < max_new) {
    PackedBatch b;
    b.add(std::vector<uint32_t>(seq.begin(), seq.end()));
    const std::vector<float> logits = m.forward_logits(b, dense(m.shape().n_layers), b.n() - 1);
    const int32_t next = argmax(logits.data(), V);
    out.push_back(next), seq.push_back(next);
    if (std::find(stop.begin(), stop.end(), next) != stop.end()) break;
  }
  return out;
}

}  // namespace

TEST(Generate, GreedyIdsEqualTheGoldenAndTheFullForward) {
  const json golden = json::parse(sbtest::slurp(sbtest::committed("generate_golden.json")));
  for (const std::string& name : kFixtures) {
    SCOPED_TRACE(name);
    const json& g = golden["cases"][name];
    const auto prompt = g["prompt_ids"].get<std::vector<int32_t>>();
    const auto want = g["ids"].get<std::vector<int32_t>>();
    const int max_new = g["max_new_tokens"];
    std::string ids;
    for (int32_t id : prompt) ids += (ids.empty() ? "" : ",") + std::to_string(id);
    const json got = generate_json(sbtest::committed(name) + " --ids " + ids + " --max-new-tokens " + std::to_string(max_new));
    EXPECT_EQ(got["ids"].get<std::vector<int32_t>>(), want);
    EXPECT_EQ(got["attention"], "dense");  // an HF directory's default
    EXPECT_EQ(reference_greedy(sbtest::committed(name), prompt, max_new, g["stop_ids"].get<std::vector<int32_t>>()), want);
    if (name != "llama") continue;
    // Sparse attention (a whole forward per token) gives a continuation of the same length.
    const json sp = generate_json(sbtest::committed(name) + " --ids " + ids + " --max-new-tokens 4 --set attention.mode=sparse");
    EXPECT_EQ(sp["attention"], "sparse");
    EXPECT_EQ(sp["ids"].size(), sp["stopped"] ? sp["ids"].size() : 4u);
  }
}

// The greedy token after every prefix of transformers' sequences (golden.json: its ids and its
// logits at each position) is the argmax of transformers' logits there.
TEST(Generate, GreedyChoiceEqualsTransformersAtEveryPrefix) {
  for (const std::string& name : kFixtures) {
    SCOPED_TRACE(name);
    const json g = json::parse(sbtest::slurp(sbtest::committed(name) + "/golden.json"));
    HfImport im = import_hf(sbtest::committed(name), Config(), {});
    Model<float> m(model_dims(im.cfg, 0));
    m.weights() = std::move(im.weights);
    const int V = m.shape().vocab;
    int compared = 0;
    for (size_t s = 0; s < g["ids"].size(); ++s) {
      PackedBatch b;
      b.add(g["ids"][s].get<std::vector<uint32_t>>());
      const std::vector<float> ours = m.forward_logits(b, dense(m.shape().n_layers), 0);  // (n, V)
      for (int t = 0; t < b.n(); ++t) {
        const auto row = g["logits"][s][t].get<std::vector<float>>();
        std::vector<float> sorted = row;
        std::sort(sorted.begin(), sorted.end());
        if (sorted[V - 1] - sorted[V - 2] < 1e-4f) continue;  // a near tie: float rounding may pick either
        EXPECT_EQ(argmax(ours.data() + size_t(t) * V, V), argmax(row.data(), V)) << "sequence " << s << " position " << t;
        ++compared;
      }
    }
    EXPECT_GE(compared, 15);
  }
}

// A byte-vocabulary model (make_fixtures.py's llama_bytes): --prompt is the text's bytes, --chat the
// plain template's user turn and assistant header; the text printed is the ids decoded; the
// checkpoint converted from it generates the same.
TEST(Generate, PromptChatAndCheckpoint) {
  sbtest::Scratch s;
  const std::string hf = sbtest::gen_dir() + "/llama_bytes";
  auto ids_of = [](const std::string& text) {
    const auto v = ByteTokenizer::encode(text);
    return std::vector<int32_t>(v.begin(), v.end());
  };
  const json plain = generate_json(hf + " --prompt 'Hello, world' --max-new-tokens 6");
  EXPECT_EQ(plain["prompt_ids"].get<std::vector<int32_t>>(), ids_of("Hello, world"));
  const json chat = generate_json(hf + " --prompt 'Hello, world' --chat --max-new-tokens 6");
  EXPECT_EQ(chat["prompt_ids"].get<std::vector<int32_t>>(), ids_of("<|user|>\nHello, world\n<|assistant|>\n"));
  auto out = chat["ids"].get<std::vector<uint32_t>>();
  if (chat["stopped"]) out.pop_back();
  const sbtest::Run text = sbtest::run_program("generate " + hf + " --prompt 'Hello, world' --chat --max-new-tokens 6");
  ASSERT_EQ(text.rc, 0) << text.out;
  EXPECT_TRUE(text.out.ends_with(ByteTokenizer::decode(out) + "\n")) << text.out;  // the bytes themselves, UTF-8 or not
  hf_to_checkpoint(hf, s / "ck.h5", {});
  const json ck = generate_json(s / "ck.h5" + " --prompt 'Hello, world' --chat --max-new-tokens 6 --set attention.mode=dense");
  EXPECT_EQ(ck["ids"], chat["ids"]);
}

TEST(Generate, SamplingFollowsSeedAndTopP) {
  const std::string m = sbtest::committed("llama") + " --ids 3,4,5 --max-new-tokens 12 --stop-id 0";
  const json a = generate_json(m + " --temperature 1.2 --seed 7"), b = generate_json(m + " --temperature 1.2 --seed 7");
  const json c = generate_json(m + " --temperature 1.2 --seed 8");
  EXPECT_EQ(a["ids"], b["ids"]);
  EXPECT_NE(a["ids"], c["ids"]);
  // A nucleus of one token is the greedy choice, whatever the temperature.
  EXPECT_EQ(generate_json(m + " --temperature 5 --top-p 1e-6 --seed 1")["ids"].get<std::vector<int32_t>>(),
            reference_greedy(sbtest::committed("llama"), {3, 4, 5}, 12, {0}));
}

// Each refusal (a process each, so few: the flag parser's own refusals, unknown flags and keys, are
// tested with the other commands).
TEST(Generate, RefusesBadFlagsNamingThem) {
  const std::string llama = sbtest::committed("llama");
  struct Case {
    std::string args, says;
  } cases[] = {
      {llama, "give the prompt as --prompt TEXT or as --ids 1,2,3"},
      {llama + " --prompt hi", "--prompt needs a tokenizer: this model has 96 tokens"},
      {llama + " --ids 1,x", "--ids '1,x': expected token ids"},
      {sbtest::gen_dir() + "/llama_bytes --prompt ''", "--prompt '': no tokens to continue"},
      {llama + " --ids 1,96", "prompt token id 96 is outside the model's vocabulary (96 tokens)"},
      {llama + " --ids 1 --temperature -1", "--temperature '-1': expected a number from 0 to 100"},
      {"/nonexistent/model --ids 1", "/nonexistent/model: does not exist (expected a checkpoint .h5 or an HF model directory)"},
      // make_fixtures.py's F32 weights hold 3.4e38 (to check bits survive): the logits overflow.
      {sbtest::gen_dir() + "/llama_f32_sharded --ids 1,2", "the model's logits are not finite after 2 tokens"},
#ifndef SB_WITH_CUDA
      {llama + " --ids 1 --set train.device=cuda", "--set train.device=cuda: this sparsebalance was built without CUDA"},
#endif
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.args);
    const std::string out = generate_error(c.args);
    EXPECT_NE(out.find(c.says), std::string::npos) << out;
  }
}
