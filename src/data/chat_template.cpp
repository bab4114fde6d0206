// Chat templates rendered natively. See chat_template.hpp; the jinja each renderer follows is the
// one of the real tokenizer_config.json files (Qwen3, Qwen2.5, Llama 3, Llama 3.2) in
// tests/data/golden/node_modules.
#include "src/data/chat_template.hpp"

#include <chrono>
#include <cstdio>
#include <ctime>
#include <filesystem>
#include <fstream>
#include <sstream>

#include <nlohmann/json.hpp>

#include "base/error.hpp"

namespace sb {

namespace fs = std::filesystem;

const char* chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::ChatML: return "chatml";
    case ChatFamily::Llama3: return "llama3";
    default: return "plain";
  }
}

namespace {

bool has(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// Python's str.isspace() for one code point: what jinja's `trim` (str.strip()) removes.
bool py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0d) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f || c == 0x3000;
}

// Decodes the code point at s[i] (valid UTF-8 or a lone byte), setting its length.
char32_t cp_at(const std::string& s, size_t i, size_t& len) {
  const auto b = uint8_t(s[i]);
  len = b < 0x80 ? 1 : b >= 0xf0 ? 4 : b >= 0xe0 ? 3 : b >= 0xc0 ? 2 : 1;
  if (len == 1 || i + len > s.size()) return len = 1, b;
  char32_t c = b & (0x7f >> len);
  for (size_t k = 1; k < len; ++k) c = (c << 6) | (uint8_t(s[i + k]) & 0x3f);
  return c;
}

// jinja's `trim` filter: Python's str.strip(), Unicode whitespace at both ends.
std::string py_strip(const std::string& s) {
  size_t b = 0, len = 0;
  while (b < s.size() && py_space(cp_at(s, b, len))) b += len;
  size_t e = s.size();
  while (e > b) {
    size_t k = e - 1;
    while (k > b && (uint8_t(s[k]) & 0xc0) == 0x80) --k;  // back to the lead byte
    if (!py_space(cp_at(s, k, len)) || k + len != e) break;
    e = k;
  }
  return s.substr(b, e - b);
}

std::string lstrip_nl(const std::string& s) {
  const size_t b = s.find_first_not_of('\n');
  return b == std::string::npos ? "" : s.substr(b);
}
std::string rstrip_nl(const std::string& s) {
  const size_t e = s.find_last_not_of('\n');
  return e == std::string::npos ? "" : s.substr(0, e + 1);
}

void push(std::vector<TextPiece>& out, std::string text, bool trained) {
  if (text.empty()) return;
  if (!out.empty() && out.back().trained == trained) out.back().text += text;
  else out.push_back({std::move(text), trained});
}

void check_roles(const ChatTemplate& tpl, const std::vector<ChatMessage>& msgs, const std::string& where) {
  for (size_t i = 0; i < msgs.size(); ++i) {
    const auto& m = msgs[i];
    if (m.role != "system" && m.role != "user" && m.role != "assistant")
      throw Error(where + ": message " + std::to_string(i) + " has role \"" + m.role + "\", expected system, user or " +
                  "assistant (the " + chat_family_name(tpl.family) + " template of prep renders no other)");
    if (m.has_reasoning && !(tpl.family == ChatFamily::ChatML && tpl.think))
      throw Error(where + ": message " + std::to_string(i) + " has \"reasoning_content\", which the " +
                  chat_family_name(tpl.family) + " template has no place for (only Qwen3's chatml template renders it)");
    if (m.has_reasoning && m.role != "assistant")
      throw Error(where + ": message " + std::to_string(i) + " has \"reasoning_content\" but role \"" + m.role +
                  "\" (only assistant turns reason)");
  }
}

// "<|ROLE|>\n" + content + "\n"; trained: an assistant turn's content and its newline.
void render_plain(const std::vector<ChatMessage>& msgs, bool gen, std::vector<TextPiece>& out) {
  for (const auto& m : msgs) {
    push(out, "<|" + m.role + "|>\n", false);
    push(out, m.content + "\n", m.role == "assistant");
  }
  if (gen) push(out, "<|assistant|>\n", false);
}

// Qwen3's template (and plain ChatML without think handling): the system prompt only when given;
// an assistant turn after the last user query is rendered with its think block (an empty one
// when it has no reasoning and is the last message), one before it without its reasoning.
void render_chatml(const ChatTemplate& tpl, const std::vector<ChatMessage>& msgs, bool gen,
                   std::vector<TextPiece>& out) {
  const size_t n = msgs.size();
  size_t last_query = n - 1;
  for (size_t k = n; k-- > 0;) {
    const auto& c = msgs[k].content;
    const bool tool_response = c.starts_with("<tool_response>") && c.ends_with("</tool_response>");
    if (msgs[k].role == "user" && !tool_response) {
      last_query = k;
      break;
    }
  }
  for (size_t i = 0; i < n; ++i) {
    const auto& m = msgs[i];
    if (i == 0 && m.role != "system" && !tpl.default_system.empty())  // Qwen2 / Qwen2.5
      push(out, "<|im_start|>system\n" + tpl.default_system + "<|im_end|>\n", false);
    if (m.role != "assistant") {  // system (first or not) and user turns
      push(out, "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n", false);
      continue;
    }
    std::string content = m.content, reasoning;
    if (tpl.think) {
      if (m.has_reasoning) {
        reasoning = m.reasoning;
      } else if (const size_t close = content.find("</think>"); close != std::string::npos) {
        // content.split('</think>')[-1].lstrip('\n'); [0].rstrip('\n').split('<think>')[-1].lstrip('\n')
        std::string before = rstrip_nl(content.substr(0, close));
        if (const size_t open = before.rfind("<think>"); open != std::string::npos) before = before.substr(open + 7);
        reasoning = lstrip_nl(before);
        content = lstrip_nl(content.substr(content.rfind("</think>") + 8));
      }
    }
    push(out, "<|im_start|>assistant\n", false);
    if (tpl.think && i > last_query && (i + 1 == n || !reasoning.empty())) {
      const std::string r = lstrip_nl(rstrip_nl(reasoning));
      const std::string block = "<think>\n" + r + "\n</think>\n\n";
      push(out, block, !r.empty());  // an empty think block is the template's, not the answer
      content = lstrip_nl(content);
    }
    push(out, content + "<|im_end|>", true);
    push(out, "\n", false);
  }
  if (gen) push(out, "<|im_start|>assistant\n", false);
}

// Llama 3's template: BOS first, every content trimmed, the assistant header appended at the end
// when asked for (always, in the templates that do so unconditionally).
void render_llama3(const ChatTemplate& tpl, const std::vector<ChatMessage>& msgs, bool gen,
                   std::vector<TextPiece>& out) {
  size_t first = 0;
  if (!tpl.dated_header.empty()) {  // Llama 3.1/3.2: the system block always, the first system message's text in it
    const bool sys = msgs[0].role == "system";
    push(out, tpl.bos + "<|start_header_id|>system<|end_header_id|>\n\n" + tpl.dated_header +
                  (sys ? py_strip(msgs[0].content) : "") + "<|eot_id|>", false);
    first = sys ? 1 : 0;
  }
  for (size_t i = first; i < msgs.size(); ++i) {
    const auto& m = msgs[i];
    const bool bos = i == 0 && tpl.dated_header.empty();  // else the system block had it
    push(out, (bos ? tpl.bos : "") + "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n", false);
    push(out, py_strip(m.content) + "<|eot_id|>", m.role == "assistant");
  }
  if (gen || tpl.always_generation) push(out, "<|start_header_id|>assistant<|end_header_id|>\n\n", false);
}

const char* const kMonths[12] = {"Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"};

// prep.chat_date: "DD Mon YYYY" (strftime's "%d %b %Y" in the C locale), a real day.
void check_chat_date(const std::string& d) {
  auto digit = [&](size_t i) { return d[i] >= '0' && d[i] <= '9'; };
  bool ok = d.size() == 11 && digit(0) && digit(1) && d[2] == ' ' && d[6] == ' ' && digit(7) && digit(8) &&
            digit(9) && digit(10);
  unsigned month = 0;
  for (unsigned m = 0; ok && m < 12; ++m)
    if (d.compare(3, 3, kMonths[m]) == 0) month = m + 1;
  if (ok && month) {
    const std::chrono::year_month_day ymd{std::chrono::year(std::stoi(d.substr(7))), std::chrono::month(month),
                                          std::chrono::day(unsigned(std::stoi(d.substr(0, 2))))};
    if (ymd.ok()) return;
  }
  throw Error("prep.chat_date: \"" + d + "\": expected a date as strftime(\"%d %b %Y\") writes it, like \"26 Jul 2024\" "
              "(two-digit day, English month abbreviation, four-digit year), or empty for today (UTC)");
}

std::string read_text(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

std::string chat_date_today() {
  const std::time_t now = std::time(nullptr);
  std::tm tm{};
  gmtime_r(&now, &tm);
  char buf[16];
  std::snprintf(buf, sizeof buf, "%02d %s %04d", tm.tm_mday, kMonths[tm.tm_mon], tm.tm_year + 1900);
  return buf;
}

std::string recognise_chat_template(const std::string& t, ChatTemplate& out, const std::string& date) {
  if (has(t, "<|im_start|>")) {
    // Qwen2 / Qwen2.5 write a system turn of their own when the first message is not one: the
    // literal '<|im_start|>system\nPROMPT<|im_end|>\n' of the template (its \n escaped or not).
    for (const std::string open : {"<|im_start|>system\\n", "<|im_start|>system\n"})
      for (size_t at = t.find(open); out.default_system.empty() && at != std::string::npos; at = t.find(open, at + 1)) {
        const size_t b = at + open.size(), e = t.find("<|im_end|>", b);
        if (e == std::string::npos) break;
        const std::string text = t.substr(b, e - b);
        if (!text.empty() && text.find_first_of("'\"+{}\\\n") == std::string::npos) out.default_system = text;
      }
    if (out.default_system.empty() && (has(t, "You are Qwen") || has(t, "You are a helpful assistant")))
      return "a ChatML template with a default system prompt that prep cannot read off it";
    out.family = ChatFamily::ChatML;
    out.think = has(t, "<think>");
    return "";
  }
  if (has(t, "<|start_header_id|>") && has(t, "<|eot_id|>")) {
    // Llama 3.1 / 3.2 / 3.3: a system block always, dated by apply_chat_template's date_string when
    // given (prep.chat_date), else by strftime_now (3.2: the day of rendering, which transformers
    // defines) or the template's fixed date_string (3.1, 3.3).
    if (has(t, "Cutting Knowledge") || has(t, "date_string") || has(t, "strftime_now")) {
      const std::string set = "set date_string = \"";
      const size_t b = t.find(set), e = b == std::string::npos ? b : t.find('"', b + set.size());
      if (!has(t, "Cutting Knowledge Date: December 2023\\n") || !has(t, "\"Today Date: \" + date_string"))
        return "a Llama 3.1/3.2-style template whose dated system header prep cannot read off it";
      if (!date.empty()) {
        out.date = date, out.date_from = "prep.chat_date";
      } else if (has(t, "strftime_now(\"%d %b %Y\")")) {
        out.date = chat_date_today(), out.date_from = "today in UTC, the template's strftime_now";
      } else if (e != std::string::npos) {
        out.date = t.substr(b + set.size(), e - b - set.size()), out.date_from = "the template's date_string";
      } else {
        return "a Llama 3.1/3.2-style template whose date prep cannot read off it";
      }
      out.dated_header = "Cutting Knowledge Date: December 2023\nToday Date: " + out.date + "\n\n";
    }
    out.family = ChatFamily::Llama3;
    out.always_generation = !has(t, "add_generation_prompt");
    return "";
  }
  return "neither ChatML (<|im_start|>) nor Llama 3 (<|start_header_id|>)";
}

ChatTemplate choose_chat_template(const std::string& choice, const std::string& tokenizer, const std::string& date) {
  ChatTemplate tpl;
  if (!date.empty()) check_chat_date(date);
  if (choice != "auto" && choice != "chatml" && choice != "llama3" && choice != "plain")
    throw Error("prep.chat_template: \"" + choice + "\": expected auto, chatml, llama3 or plain");
  if (choice == "plain" || (choice == "auto" && tokenizer.empty())) {
    tpl.source = choice == "plain" ? "prep.chat_template=plain" : "no tokenizer";
    return tpl;
  }
  if (tokenizer.empty())
    throw Error("prep.chat_template=" + choice + " needs a tokenizer that has its special tokens (--tokenizer "
                "tokenizer.json); the byte tokenizer takes plain");
  const std::string cfg_path = (fs::path(tokenizer).parent_path() / "tokenizer_config.json").string();
  std::string jinja, bos;
  bool have_cfg = fs::exists(cfg_path);
  if (have_cfg) {
    nlohmann::json cfg;
    try {
      cfg = nlohmann::json::parse(read_text(cfg_path));
    } catch (const nlohmann::json::parse_error& e) {
      throw Error(cfg_path + ": invalid JSON (" + e.what() + ")");
    }
    const auto& ct = cfg.contains("chat_template") ? cfg["chat_template"] : nlohmann::json();
    if (ct.is_string()) jinja = ct.get<std::string>();
    else if (ct.is_array())  // [{"name": "default", "template": ...}, ...]
      for (const auto& e : ct)
        if (e.is_object() && e.value("name", "") == "default" && e.contains("template") && e["template"].is_string())
          jinja = e["template"].get<std::string>();
    const auto& b = cfg.contains("bos_token") ? cfg["bos_token"] : nlohmann::json();
    if (b.is_string()) bos = b.get<std::string>();
    else if (b.is_object() && b.contains("content") && b["content"].is_string()) bos = b["content"].get<std::string>();
  }
  if (choice == "auto") {
    tpl.source = cfg_path;
    const std::string choices = "; choose one with --chat-template chatml|llama3|plain (prep.chat_template)";
    if (!have_cfg) tpl.error = cfg_path + ": not found, so prep.chat_template=auto cannot tell the model's chat template" + choices;
    else if (jinja.empty()) tpl.error = cfg_path + ": has no \"chat_template\"" + choices;
    else if (std::string why = recognise_chat_template(jinja, tpl, date); !why.empty())
      tpl.error = cfg_path + ": chat_template not recognised: " + why + choices;
  } else {
    tpl.source = "prep.chat_template=" + choice;
    ChatTemplate seen;  // the file's variant flags, when it holds this family
    if (!jinja.empty() && recognise_chat_template(jinja, seen, date).empty() &&
        seen.family == (choice == "chatml" ? ChatFamily::ChatML : ChatFamily::Llama3))
      tpl = seen, tpl.source = "prep.chat_template=" + choice + " (variant from " + cfg_path + ")";
    tpl.family = choice == "chatml" ? ChatFamily::ChatML : ChatFamily::Llama3;
  }
  if (tpl.family == ChatFamily::Llama3 && tpl.bos.empty()) tpl.bos = bos.empty() ? "<|begin_of_text|>" : bos;
  return tpl;
}

std::vector<TextPiece> render_chat(const ChatTemplate& tpl, const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt, const std::string& where) {
  if (!tpl.error.empty()) throw Error(where + ": a \"messages\" record needs the model's chat template: " + tpl.error);
  if (messages.empty()) throw Error(where + ": no messages to render");
  check_roles(tpl, messages, where);
  std::vector<TextPiece> out;
  switch (tpl.family) {
    case ChatFamily::ChatML: render_chatml(tpl, messages, add_generation_prompt, out); break;
    case ChatFamily::Llama3: render_llama3(tpl, messages, add_generation_prompt, out); break;
    default: render_plain(messages, add_generation_prompt, out);
  }
  return out;
}

}  // namespace sb
