// Chat templates of `prep` (src/data/README.md, "Chat templates"): a message list -> the text the
// model's own template renders (what transformers' apply_chat_template gives), as pieces marked
// trained or not. Each family is rendered natively (no jinja engine), checked against goldens
// rendered by jinja2 from the real tokenizer_config.json files (tests/data/test_chat.cpp):
//   plain   "<|ROLE|>\n" + content + "\n" per message (no tokenizer: the byte tokenizer's fallback)
//   chatml  "<|im_start|>ROLE\n" + content + "<|im_end|>\n" (Qwen2/2.5/3); Qwen3's think handling
//           when the template holds <think>; Qwen2/2.5's default system turn when the first
//           message is not a system message
//   llama3  BOS + "<|start_header_id|>ROLE<|end_header_id|>\n\n" + trim(content) + "<|eot_id|>";
//           Llama 3.1/3.2/3.3's system block always, opening with its dated header (the date:
//           prep.chat_date, else 3.2's strftime_now = today in UTC, else 3.1's fixed date_string)
// Trained: each assistant turn's content (Qwen3: with its reasoning, when rendered) and its end
// token; headers, the empty think block, system/user turns and the generation prompt are not.
#pragma once
#include <string>
#include <vector>

namespace sb {

struct TextPiece {
  std::string text;
  bool trained = true;
};

struct ChatMessage {
  std::string role, content;
  std::string reasoning;       // "reasoning_content" (chatml with think handling only)
  bool has_reasoning = false;
};

enum class ChatFamily { Plain, ChatML, Llama3 };

struct ChatTemplate {
  ChatFamily family = ChatFamily::Plain;
  bool think = false;              // chatml: Qwen3's <think> handling of assistant turns
  bool always_generation = false;  // llama3: the template appends the assistant header even without add_generation_prompt
  std::string bos;                 // llama3: bos_token, first in the text
  // chatml (Qwen2, Qwen2.5): the system prompt the template writes when messages[0] is not a
  // system message ("You are Qwen, created by Alibaba Cloud. You are a helpful assistant."); "" none.
  std::string default_system;
  // llama3 (Llama 3.1, 3.2, 3.3): the system block is always written and opens with this header
  // ("Cutting Knowledge Date: December 2023\nToday Date: 26 Jul 2024\n\n"); "" none.
  std::string dated_header;
  std::string date, date_from;     // the date in it ("26 Jul 2024") and where it came from
  std::string source;              // what chose it: "tokenizer_config.json PATH" or "prep.chat_template=..."
  std::string error;               // auto that found no usable template: thrown at the first "messages" record
};

const char* chat_family_name(ChatFamily f);  // "plain", "chatml", "llama3"

// choice: auto | chatml | llama3 | plain (prep.chat_template); tokenizer: the tokenizer.json path or
// "" (byte tokenizer); date: the date of a dated Llama system block, as strftime("%d %b %Y") writes
// it ("26 Jul 2024"; apply_chat_template's date_string), "" = the template's own (Llama 3.2:
// strftime_now, today in UTC; Llama 3.1: its fixed date_string) (prep.chat_date). auto: plain without a tokenizer, else the template of tokenizer_config.json
// beside it, recognised by its markers (<|im_start|>, <|start_header_id|>); a template that is
// missing or not recognised leaves `error` set (naming the file and the choices), so that
// documents without messages still prep. chatml/llama3 need a tokenizer that has their tokens.
ChatTemplate choose_chat_template(const std::string& choice, const std::string& tokenizer, const std::string& date = "");

// Today's date in UTC as strftime("%d %b %Y") writes it in the C locale ("07 Dec 2026").
std::string chat_date_today();

// Recognises a jinja chat template's text: sets family and the variant flags and returns "", or
// returns why it is not recognised.
std::string recognise_chat_template(const std::string& jinja, ChatTemplate& out, const std::string& date = "");

// Renders the messages (`where` = FILE:LINE names a message that the template cannot render:
// an unknown role, reasoning it has no place for). add_generation_prompt: end with the assistant
// header, as apply_chat_template(add_generation_prompt=True). Consecutive pieces with the same
// trained flag are merged.
std::vector<TextPiece> render_chat(const ChatTemplate& tpl, const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt, const std::string& where);

}  // namespace sb
