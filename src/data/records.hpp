// JSONL training records (src/data/README.md, "JSONL records and loss masks"): one JSON object
// per line in one of three forms, turned into the pieces of one document, each trained or not.
//   {"text": "..."}                              every token trained
//   {"prompt": "...", "response": "..."}         prompt then response; the response trained
//   {"messages": [{"role": R, "content": C}...]} rendered by the chat template (chat_template.hpp):
//       plain "<|R|>\n" + C + "\n", or the model's own (chatml, llama3); trained: the assistant turns
#pragma once
#include <string>
#include <vector>

#include "src/data/chat_template.hpp"

namespace sb {

struct Record {
  std::vector<TextPiece> pieces;
  // Tokenize the whole text at once (the model's own chat template: the ids apply_chat_template
  // gives); otherwise each piece on its own, so a piece boundary is a token boundary.
  bool whole = false;
  bool chat = false;  // a "messages" record
};

// Parses one line; errors name `where` (FILE:LINE), the field and what is expected. A "messages"
// record is rendered with `chat`.
Record parse_record(const std::string& line, const std::string& where, const ChatTemplate& chat = {});

}  // namespace sb
