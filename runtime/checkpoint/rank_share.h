// The tables of a checkpoint of an engine over several shard groups, assembled from every rank.
// No rank knows them alone: with expert parallelism a rank holds only its experts (their names
// differ from one expert-parallel position to the next), and only the ranks of one shard group
// write each unit's slices. Each rank describes the slices it writes (layout.h's RankShare,
// from describe_engine); the checkpointer gathers the encoded shares to rank 0, which merges
// them into the index's parameter, unit, slice and rank-file tables.
//
// Thread-safety: plain functions.
#pragma once

#include <string>
#include <vector>

#include "runtime/checkpoint/layout.h"

namespace zrt::checkpoint {

// The share's table rows as bytes (for the gather), and back; `where` names the sender in a
// decoding error.
std::string encode_share(const RankShare& share);
RankShare decode_share(const std::string& bytes, const std::string& where);

// Fills index.params, units, world (shares.size()) and rank_elements from every rank's share
// (shares[r]: rank r's). The units come in the order of the writers' plans (their local unit
// index), the copies of one local unit at the ranks holding different experts side by side, in
// rank order; each unit's parameters as its slice-0 writer lists them. InvalidArgument, naming
// the unit, when a slice is written twice or by no rank, when the writers disagree on a unit's
// size, or when a parameter name is in two units.
void merge_shares(CheckpointIndex& index, const std::vector<RankShare>& shares);

}  // namespace zrt::checkpoint
