// Chat templates of `prep` (src/data/README.md, "Chat templates"): a message list -> the text the
// model's own template renders (what transformers' apply_chat_template gives), as pieces marked
// trained or not. Each family is rendered natively (no jinja engine), checked against goldens
// rendered by jinja2 from the real tokenizer_config.json files (tests/data/test_chat.cpp):
//   plain   "<|ROLE|>\n" + content + "\n" per message (no tokenizer: the byte tokenizer's fallback)
//   chatml  "<|im_start|>ROLE\n" + content + "<|im_end|>\n" (Qwen2/2.5/3); Qwen3's think handling
//           when the template holds <think>
//   llama3  BOS + "<|start_header_id|>ROLE<|end_header_id|>\n\n" + trim(content) + "<|eot_id|>"
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
  std::string source;              // what chose it: "tokenizer_config.json PATH" or "prep.chat_template=..."
  std::string error;               // auto that found no usable template: thrown at the first "messages" record
};

const char* chat_family_name(ChatFamily f);  // "plain", "chatml", "llama3"

// choice: auto | chatml | llama3 | plain (prep.chat_template); tokenizer: the tokenizer.json path or
// "" (byte tokenizer). auto: plain without a tokenizer, else the template of tokenizer_config.json
// beside it, recognised by its markers (<|im_start|>, <|start_header_id|>); a template that is
// missing or not recognised leaves `error` set (naming the file and the choices), so that
// documents without messages still prep. chatml/llama3 need a tokenizer that has their tokens.
ChatTemplate choose_chat_template(const std::string& choice, const std::string& tokenizer);

// Recognises a jinja chat template's text: sets family and the variant flags and returns "", or
// returns why it is not recognised.
std::string recognise_chat_template(const std::string& jinja, ChatTemplate& out);

// Renders the messages (`where` = FILE:LINE names a message that the template cannot render:
// an unknown role, reasoning it has no place for). add_generation_prompt: end with the assistant
// header, as apply_chat_template(add_generation_prompt=True). Consecutive pieces with the same
// trained flag are merged.
std::vector<TextPiece> render_chat(const ChatTemplate& tpl, const std::vector<ChatMessage>& messages,
                                   bool add_generation_prompt, const std::string& where);

}  // namespace sb
