// Patterns over parameter names ("model.layers.3.mlp.up_proj.weight"), one rule for every key
// that picks parameters by name (optimizer.no_weight_decay, model.frozen, model.trainable):
// a pattern with a '.' is a glob over the whole name ("model.layers.[0-9].*"); a pattern
// without one is matched against each '.'-separated component ("bias", "*norm*", "mlp"), so a
// short word picks a kind of parameter wherever it sits. Matching ignores case ("LayerNorm" is
// a norm too).
#pragma once

#include <string>

namespace zrt {

// Glob match of the whole text: '*' any run of characters, '?' one character, '[...]' one of
// the listed characters or ranges ("[0-9]", "[13]"), '[!...]' one not listed. Case-sensitive;
// an unclosed '[' is an ordinary character.
bool glob_match(const std::string& pattern, const std::string& text);

// Whether parameter `name` matches `pattern` by the rule above.
bool name_matches_pattern(const std::string& pattern, const std::string& name);

}  // namespace zrt
