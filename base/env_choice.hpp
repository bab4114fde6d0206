// Switches read from the environment (SB_FUSE, SB_SELECT, SB_HEAD_LOGITS): one binary runs both
// sides of an A/B, so a mistyped value must stop the run rather than quietly measure the default.
#pragma once
#include <initializer_list>

namespace sb {

// The index in `choices` of environment variable `name`'s value; unset or empty: `fallback`. Any
// other value throws sb::Error "<name>='<value>': expected one of a, b, c".
int env_choice(const char* name, std::initializer_list<const char*> choices, int fallback);

}  // namespace sb
