// The values of a model spec's key=value pairs ("llama:hidden_size=128,tie_word_embeddings=true")
// as each model family's config parses them: whole strings only ("12x" is not 12), every failure
// an InvalidArgument naming the family, the key and the value.
#pragma once

#include <string>

namespace zrt {

// An int in [-2^31 + 1, 2^31 - 1].
int spec_int(const char* family, const std::string& key, const std::string& value);
double spec_double(const char* family, const std::string& key, const std::string& value);
// "true"/"1" or "false"/"0".
bool spec_bool(const char* family, const std::string& key, const std::string& value);

}  // namespace zrt
