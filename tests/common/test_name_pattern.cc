// The one rule by which config keys pick parameters by name (optimizer.no_weight_decay,
// model.frozen, model.trainable): globs with fnmatch's classes, whole names or components.
#include <catch2/catch.hpp>

#include "runtime/common/name_pattern.h"

using namespace zrt;

TEST_CASE("glob_match: stars, question marks and classes") {
  CHECK(glob_match("*", ""));
  CHECK(glob_match("a*c", "abbbc"));
  CHECK(glob_match("a?c", "abc"));
  CHECK_FALSE(glob_match("a?c", "ac"));
  CHECK(glob_match("*norm*", "input_layernorm"));
  CHECK_FALSE(glob_match("ln*", "kiln"));
  // Classes: one character of a set or range, '!' negates, ']' first is a member.
  CHECK(glob_match("layers.[0-9].mlp", "layers.7.mlp"));
  CHECK_FALSE(glob_match("layers.[0-9].mlp", "layers.17.mlp"));
  CHECK(glob_match("layers.1[0-5].*", "layers.15.attn"));
  CHECK_FALSE(glob_match("layers.1[0-5].*", "layers.16.attn"));
  CHECK(glob_match("x[13]", "x3"));
  CHECK_FALSE(glob_match("x[13]", "x2"));
  CHECK(glob_match("x[!13]", "x2"));
  CHECK_FALSE(glob_match("x[!13]", "x1"));
  CHECK(glob_match("x[]]", "x]"));
  CHECK(glob_match("x[a-cx-z]", "xy"));
  CHECK_FALSE(glob_match("x[a-cx-z]", "xm"));
  // A class after a star backtracks like any element.
  CHECK(glob_match("*.[0-9]", "a.b.c.4"));
  CHECK_FALSE(glob_match("*.[0-9]", "a.b.c.x"));
  // An unclosed '[' is literal.
  CHECK(glob_match("a[b", "a[b"));
  CHECK_FALSE(glob_match("a[b", "ab"));
  // A star in the text is text.
  CHECK(glob_match("a*", "a*"));
  CHECK_FALSE(glob_match("a?", "a"));
}

TEST_CASE("name_matches_pattern: whole names with a dot, components without one") {
  const std::string q = "model.layers.12.self_attn.q_proj.weight";
  CHECK(name_matches_pattern("self_attn", q));
  CHECK(name_matches_pattern("q_proj", q));
  CHECK_FALSE(name_matches_pattern("proj", q));  // a component is matched whole
  CHECK(name_matches_pattern("*proj", q));
  CHECK(name_matches_pattern("model.layers.1[0-5].*", q));
  CHECK_FALSE(name_matches_pattern("model.layers.[0-9].*", q));
  CHECK_FALSE(name_matches_pattern("layers.12.*", q));  // a dotted pattern spans the whole name
  CHECK(name_matches_pattern("*.layers.12.*", q));
  // Case is ignored on both sides.
  CHECK(name_matches_pattern("*NORM*", "bert.encoder.LayerNorm.weight"));
  CHECK(name_matches_pattern("MODEL.EMBED_TOKENS.WEIGHT", "model.embed_tokens.weight"));
  // The optimizer's default exemptions, through the same rule.
  CHECK(name_matches_pattern("ln*", "transformer.h.0.ln_1.weight"));
  CHECK(name_matches_pattern("bias", "transformer.h.0.attn.c_attn.bias"));
  CHECK_FALSE(name_matches_pattern("bias", "transformer.h.0.attn.c_attn.weight"));
}
