// The values of a model spec's key=value pairs ("llama:hidden_size=128,tie_word_embeddings=true")
// as each model family's config parses them: whole strings only ("12x" is not 12), every failure
// an InvalidArgument naming the family, the key and the value.
#pragma once

#include <string>
#include <utility>
#include <vector>

namespace zrt {

// An int in [-2^31 + 1, 2^31 - 1].
int spec_int(const char* family, const std::string& key, const std::string& value);
double spec_double(const char* family, const std::string& key, const std::string& value);
// "true"/"1" or "false"/"0".
bool spec_bool(const char* family, const std::string& key, const std::string& value);

// The (key, value) pairs of "k1=v1,k2=v2" in order, empty items skipped; an item without '='
// throws InvalidArgument "<family> config: expected key=value, got '<item>'".
std::vector<std::pair<std::string, std::string>> spec_items(const char* family,
                                                            const std::string& items);

}  // namespace zrt
