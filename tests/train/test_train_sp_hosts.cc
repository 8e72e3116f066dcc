// Sequence parallelism over two nodes, at 4 ranks: sp 2 with the nodes taken from MPI across the
// two network-namespace hosts of tests/multinode (run_across_hosts.sh sets ZRT_EXPECT_NODES;
// ctest's multinode_netns_sp), or simulated here as nodes of 2 ranks (comm.ranks_per_node). The
// layout places each sp group within a node, so:
//  - Llama and GPT-2 train to the same float64 losses as on one node (test_train_sp's and
//    test_train_sp_gpt's golden), and sp 2 equals sp 1 of the same layout;
//  - no rank's all-to-alls send a byte to the other node (comm_sequence_parallel_inter_node_bytes,
//    the most any rank sent across nodes, is 0), while all their bytes, the formula's, go within
//    it; the engine's ZeRO traffic does cross the nodes (so the nodes really are two).
#include "tests/train/sp_test_support.h"

#include <cstdlib>

using namespace zrt;
using namespace zrt::test::sp;

namespace {

const fs::path kShared = fs::temp_directory_path() / "zrt_test_train_sp_hosts";

bool nodes_from_mpi() {
  return std::getenv("ZRT_EXPECT_NODES") != nullptr;
}

// Across hosts the nodes are MPI's; on one machine, two simulated nodes of 2 ranks.
Job two_node_job(int sp) {
  Job job;
  job.sp = sp;
  job.micro = sp;
  job.zero = R"({"stage": 2})";
  if (!nodes_from_mpi()) job.comm = R"({"ranks_per_node": 2})";
  return job;
}

// Metrics rows' comm_inter_node_bytes (the engine's traffic rank 0 sent to the other node).
std::vector<std::int64_t> engine_inter_node_bytes(const std::string& name) {
  std::vector<std::int64_t> bytes;
  std::ifstream in((kShared / "out" / name / "metrics.jsonl").string());
  std::string line;
  while (std::getline(in, line)) {
    const auto row = nlohmann::json::parse(line);
    if (row.contains("comm_inter_node_bytes")) {
      bytes.push_back(row["comm_inter_node_bytes"].get<std::int64_t>());
    }
  }
  return bytes;
}

}  // namespace

TEST_CASE("sp 2 over two nodes: one node's losses, no all-to-all byte between the nodes",
          "[sp][multinode]") {
  if (world_size() != 4) return;
  if (const char* expect = std::getenv("ZRT_EXPECT_NODES")) REQUIRE(std::atoi(expect) == 2);
  write_data(kShared);
  const std::vector<double> llama_want =
      read_golden(ZRT_SP_GOLDEN)["losses"].get<std::vector<double>>();
  const std::vector<double> gpt_want =
      read_golden(ZRT_SP_GPT2_GOLDEN)["losses"].get<std::vector<double>>();

  const Run sp1 = train_run(kShared, "llama_sp1", two_node_job(1));
  check_losses(sp1.losses, llama_want, 2e-5);

  struct Family {
    std::string type, preset;
    const std::vector<double>& want;
  };
  for (const Family& m :
       {Family{"llama", "llama-tiny", llama_want}, Family{"gpt2", "gpt2-tiny", gpt_want}}) {
    Job job = two_node_job(2);
    job.model_type = m.type;
    job.preset = m.preset;
    const std::string name = m.type + "_sp2";
    INFO(name);
    const Run r = train_run(kShared, name, job);
    REQUIRE(r.losses.size() == static_cast<std::size_t>(kSteps));
    check_losses(r.losses, m.want, 2e-5);
    if (m.type == "llama") check_losses(r.losses, sp1.losses, 1e-5);

    // The engine's reductions and gathers span the world, so they cross the nodes...
    for (std::int64_t bytes : engine_inter_node_bytes(name)) CHECK(bytes > 0);
    // ...and the sp groups' all-to-alls do not: rank 0 sends half of each payload to its peer in
    // the node, and no rank sends anything to the other node.
    REQUIRE(r.sequence_bytes.size() == static_cast<std::size_t>(kSteps));
    for (std::size_t s = 0; s < r.sequence_bytes.size(); ++s) {
      CHECK(r.sequence_bytes[s] > 0);
      CHECK(r.sequence_sent[s] == r.sequence_bytes[s] / 2);
      CHECK(r.sequence_inter_node[s] == 0);
    }
  }
}
