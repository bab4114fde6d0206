// JSONL training records (src/data/README.md, "JSONL records and loss masks"): one JSON object
// per line in one of three forms, turned into the pieces of one document, each trained or not.
//   {"text": "..."}                              every token trained
//   {"prompt": "...", "response": "..."}         prompt then response; the response trained
//   {"messages": [{"role": R, "content": C}...]} the plain chat template, one turn after another:
//       "<|R|>\n" + C + "\n"; R is system, user or assistant; trained: C + "\n" of assistant turns
#pragma once
#include <string>
#include <vector>

namespace sb {

struct TextPiece {
  std::string text;
  bool trained = true;
};

// Parses one line; errors name `where` (FILE:LINE), the field and what is expected.
std::vector<TextPiece> parse_record(const std::string& line, const std::string& where);

}  // namespace sb
