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

Record chat(const nlohmann::json& msgs, const std::string& where, const ChatTemplate& tpl) {
  if (!msgs.is_array() || msgs.empty())
    throw Error(where + ": field \"messages\" must be a non-empty array of {\"role\", \"content\"} objects");
  std::vector<ChatMessage> list;
  bool any_assistant = false;
  for (size_t i = 0; i < msgs.size(); ++i) {
    const auto& m = msgs[i];
    const std::string what = "message " + std::to_string(i);
    if (!m.is_object()) throw Error(where + ": " + what + " is " + m.type_name() + ", expected {\"role\", \"content\"}");
    ChatMessage msg;
    msg.role = string_field(m, "role", where, what);
    msg.content = string_field(m, "content", where, what);
    // Tool calls and tool turns: no renderer of prep writes them (refused, never dropped).
    for (const char* field : {"tool_calls", "tool_call_id", "function_call"})
      if (m.contains(field))
        throw Error(where + ": " + what + " has \"" + field + "\": tool calls are not rendered by prep's " +
                    chat_family_name(tpl.family) + " template");
    if (m.contains("reasoning_content") && !m["reasoning_content"].is_null())
      msg.reasoning = string_field(m, "reasoning_content", where, what), msg.has_reasoning = true;
    const bool assistant = msg.role == "assistant";
    if (assistant && msg.content.empty()) throw Error(where + ": " + what + " is an assistant turn with empty content");
    any_assistant |= assistant;
    list.push_back(std::move(msg));
  }
  // Roles are checked by the renderer (the template names them); an unknown one is refused there.
  Record r{render_chat(tpl, list, false, where), tpl.family != ChatFamily::Plain, true};
  if (!any_assistant) throw Error(where + ": field \"messages\" has no assistant turn (nothing to train)");
  return r;
}

}  // namespace

Record parse_record(const std::string& line, const std::string& where, const ChatTemplate& tpl) {
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
  if (j.contains("text")) return {{{string_field(j, "text", where, "the record"), true}}};
  if (j.contains("messages")) return chat(j["messages"], where, tpl);
  const std::string& prompt = string_field(j, "prompt", where, "the record");
  const std::string& response = string_field(j, "response", where, "the record");
  if (response.empty()) throw Error(where + ": field \"response\" is empty (nothing to train)");
  return {{{prompt, false}, {response, true}}};
}

}  // namespace sb
