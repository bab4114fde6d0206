// JSONL records -> document pieces. See records.hpp.
#include "src/data/records.hpp"

#include <nlohmann/json.hpp>

#include "base/error.hpp"

namespace sb {

namespace {

const std::string& string_field(const nlohmann::json& j, const char* name, const std::string& where,
                                const std::string& what) {
  if (!j.contains(name)) throw Error(where + ": " + what + " has no field \"" + name + "\"");
  if (!j[name].is_string())
    throw Error(where + ": " + what + "'s field \"" + name + "\" is " + j[name].type_name() + ", expected a string");
  return j[name].get_ref<const std::string&>();
}

std::vector<TextPiece> chat(const nlohmann::json& msgs, const std::string& where) {
  if (!msgs.is_array() || msgs.empty())
    throw Error(where + ": field \"messages\" must be a non-empty array of {\"role\", \"content\"} objects");
  std::vector<TextPiece> out;
  bool any_assistant = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const auto& m = msgs[i];
    const std::string what = "message " + std::to_string(i);
    if (!m.is_object()) throw Error(where + ": " + what + " is " + m.type_name() + ", expected {\"role\", \"content\"}");
    const std::string& role = string_field(m, "role", where, what);
    const std::string& content = string_field(m, "content", where, what);
    if (role != "system" && role != "user" && role != "assistant")
      throw Error(where + ": " + what + " has role \"" + role + "\", expected system, user or assistant");
    const bool assistant = role == "assistant";
    if (assistant && content.empty()) throw Error(where + ": " + what + " is an assistant turn with empty content");
    out.push_back({"<|" + role + "|>\n", false});
    out.push_back({content + "\n", assistant});
    any_assistant |= assistant;
  }
  if (!any_assistant) throw Error(where + ": field \"messages\" has no assistant turn (nothing to train)");
  return out;
}

}  // namespace

std::vector<TextPiece> parse_record(const std::string& line, const std::string& where) {
  nlohmann::json j;
  try {
    j = nlohmann::json::parse(line);
  } catch (const nlohmann::json::parse_error& e) {
    throw Error(where + ": invalid JSON (" + std::string(e.what()) + ")");
  }
  if (!j.is_object())
    throw Error(where + ": expected a JSON object with \"text\", \"prompt\" + \"response\" or \"messages\"");
  const int forms = int(j.contains("text")) + int(j.contains("prompt") || j.contains("response")) +
                    int(j.contains("messages"));
  if (forms != 1)
    throw Error(where + ": expected a JSON object with exactly one of \"text\", \"prompt\" + \"response\" or "
                "\"messages\" (found " + std::to_string(forms) + ")");
  if (j.contains("text")) return {{string_field(j, "text", where, "the record"), true}};
  if (j.contains("messages")) return chat(j["messages"], where);
  const std::string& prompt = string_field(j, "prompt", where, "the record");
  const std::string& response = string_field(j, "response", where, "the record");
  if (response.empty()) throw Error(where + ": field \"response\" is empty (nothing to train)");
  return {{prompt, false}, {response, true}};
}

}  // namespace sb
