// NCCL stand-in: communicators and stream-ordered collectives over MPI (MPI_COMM_WORLD point to
// point, one tag per communicator), for the calls zrt makes.
//
// - Counts are elements: every buffer range (count x dtype size, x nranks where NCCL says so)
//   must lie inside a live device allocation, so a byte count passed as an element count runs
//   past the allocation and the call fails naming itself and the buffer.
// - Every message carries a header (collective sequence number, op, count, dtype, root, reduce
//   op); a rank whose header differs from its peer's (another op, count or order) fails the
//   collective with both sides' descriptions, reported through ncclCommGetAsyncError and
//   ncclGetLastError, as an asynchronous NCCL error would be.
// - In-place rules as documented: all-gather in place iff sendbuff == recvbuff + rank*sendcount,
//   reduce-scatter iff recvbuff == sendbuff + rank*recvcount; other overlaps are rejected.
// - Reductions sum in rank order with zrt's reduce_blocks (fp32 accumulation for 16-bit types).
// - Non-blocking communicators (config.blocking = 0): initialisation, split and finalize return
//   ncclInProgress and ncclCommGetAsyncError reports ncclInProgress once before ncclSuccess.
#include <mpi.h>
#include <nccl.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstring>
#include <memory>
#include <thread>
#include <vector>

#include <spdlog/spdlog.h>

#include "runtime/comm/reduce_kernels.h"
#include "tests/standin/standin_core.h"

using zrt::standin::Access;
using zrt::standin::MemKind;
using zrt::standin::Runtime;

namespace {

class NcclError : public std::runtime_error {
 public:
  NcclError(ncclResult_t code, const std::string& message)
      : std::runtime_error(message), code(code) {}
  ncclResult_t code;
};

[[noreturn]] void nccl_fail(ncclResult_t code, const std::string& call, const std::string& what) {
  throw NcclError(code, call + ": " + what);
}

constexpr int kBootTagBase = 1000;
constexpr int kCommTagBase = 4000000;
constexpr std::uint32_t kIdMagic = 0x5a4e4343;  // "ZNCC"

struct IdContent {
  std::uint32_t magic;
  int creator_world;
  int counter;
};

struct CommState {
  int rank = 0, nranks = 1, device = 0;
  std::vector<int> world;  // rank -> MPI_COMM_WORLD rank
  int tag = 0;             // collectives; tag + 1: host-side control (split)
  std::string name;
  bool blocking = true;
  std::atomic<bool> aborted{false};
  std::mutex mutex;
  ncclResult_t async_error = ncclSuccess;
  std::string async_message;
  int pending_polls = 0;       // ncclInProgress answers left (non-blocking init/finalize/split)
  std::uint64_t next_seq = 0;  // collectives issued (host)
  std::vector<std::uint64_t> p2p_seq_out, p2p_seq_in;  // per peer
  bool finalized = false;
};

struct CommHandle {
  std::shared_ptr<CommState> state;
};

std::atomic<int> g_counter{0};
thread_local std::string t_last_error;
thread_local int t_group_depth = 0;

ncclComm_t to_handle(CommHandle* h) {
  return reinterpret_cast<ncclComm_t>(h);
}
CommState& state_of(ncclComm_t comm, const std::string& call) {
  if (comm == nullptr) nccl_fail(ncclInvalidArgument, call, "comm is null");
  auto& s = *reinterpret_cast<CommHandle*>(comm)->state;
  return s;
}

ncclResult_t nccl_api(const char* call, const std::function<void()>& body,
                      CommState* comm = nullptr) {
  try {
    body();
    return ncclSuccess;
  } catch (const NcclError& e) {
    if (e.code == ncclInProgress) return ncclInProgress;  // a non-blocking call in progress
    spdlog::warn("NCCL stand-in: {}", e.what());
    t_last_error = e.what();
    return e.code;
  } catch (const zrt::standin::ApiError& e) {
    // A CUDA-side check (pointer range, stream order) of the call's buffers.
    spdlog::warn("NCCL stand-in: {}", e.what());
    t_last_error = e.what();
    return ncclInvalidArgument;
  } catch (const std::exception& e) {
    t_last_error = fmt::format("{}: {}", call, e.what());
    spdlog::warn("NCCL stand-in: {}", t_last_error);
    return ncclInternalError;
  }
  (void)comm;
}

void require_mpi(const std::string& call) {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized)
    nccl_fail(ncclSystemError, call, "the NCCL stand-in needs MPI to be initialised");
  int level = 0;
  MPI_Query_thread(&level);
  if (level < MPI_THREAD_MULTIPLE) {
    nccl_fail(ncclSystemError, call,
              "the NCCL stand-in needs MPI_THREAD_MULTIPLE (streams call MPI)");
  }
}

int world_rank() {
  int r = 0;
  MPI_Comm_rank(MPI_COMM_WORLD, &r);
  return r;
}

// Waits for `reqs`, polling so an abort (flag) can interrupt; returns false if aborted.
bool wait_all(std::vector<MPI_Request>& reqs, const std::atomic<bool>* aborted) {
  for (unsigned polls = 0;; ++polls) {
    int done = 0;
    MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &done, MPI_STATUSES_IGNORE);
    if (done) return true;
    if (aborted != nullptr && aborted->load()) {
      for (MPI_Request& r : reqs) {
        if (r != MPI_REQUEST_NULL) {
          MPI_Cancel(&r);
          MPI_Request_free(&r);
        }
      }
      return false;
    }
    if (polls > 64) std::this_thread::sleep_for(std::chrono::microseconds(polls < 4096 ? 20 : 200));
  }
}

std::size_t type_size(ncclDataType_t t, const std::string& call) {
  switch (t) {
    case ncclInt8:
    case ncclUint8:
      return 1;
    case ncclFloat16:
    case ncclBfloat16:
      return 2;
    case ncclInt32:
    case ncclUint32:
    case ncclFloat32:
      return 4;
    case ncclInt64:
    case ncclUint64:
    case ncclFloat64:
      return 8;
    default:
      nccl_fail(ncclInvalidArgument, call,
                fmt::format("datatype {} is not valid", static_cast<int>(t)));
  }
}

zrt::DType dtype_of(ncclDataType_t t, const std::string& call) {
  switch (t) {
    case ncclFloat32:
      return zrt::DType::kFloat32;
    case ncclBfloat16:
      return zrt::DType::kBFloat16;
    case ncclFloat16:
      return zrt::DType::kFloat16;
    case ncclInt32:
      return zrt::DType::kInt32;
    case ncclInt64:
      return zrt::DType::kInt64;
    default:
      nccl_fail(ncclInvalidArgument, call,
                fmt::format("datatype {} cannot be reduced by the stand-in", static_cast<int>(t)));
  }
}

zrt::ReduceOp redop_of(ncclRedOp_t op, ncclDataType_t t, const std::string& call) {
  const bool is_float = t == ncclFloat32 || t == ncclBfloat16 || t == ncclFloat16;
  if (op == ncclSum) return zrt::ReduceOp::kSum;
  if (op == ncclAvg && is_float) return zrt::ReduceOp::kAvg;
  if (op == ncclMax && !is_float) return zrt::ReduceOp::kMax;
  nccl_fail(ncclInvalidArgument, call,
            fmt::format("reduction op {} on datatype {} is not supported by the stand-in",
                        static_cast<int>(op), static_cast<int>(t)));
}

enum class OpKind : std::int32_t {
  kAllGather,
  kReduceScatter,
  kAllReduce,
  kBroadcast,
  kSend,
  kRecv
};
const char* op_name(OpKind k) {
  switch (k) {
    case OpKind::kAllGather:
      return "ncclAllGather";
    case OpKind::kReduceScatter:
      return "ncclReduceScatter";
    case OpKind::kAllReduce:
      return "ncclAllReduce";
    case OpKind::kBroadcast:
      return "ncclBroadcast";
    case OpKind::kSend:
      return "ncclSend";
    case OpKind::kRecv:
      return "ncclRecv";
  }
  return "?";
}

struct Header {
  std::uint64_t seq;
  std::int32_t op;  // OpKind (a send's header says kSend; the receiver expects that)
  std::int32_t dtype;
  std::int64_t count;
  std::int32_t root;
  std::int32_t redop;
  std::int32_t rank;
  std::int32_t pad;
};

std::string describe(const Header& h) {
  return fmt::format("{} #{} of {} elements (datatype {}{}{})", op_name(static_cast<OpKind>(h.op)),
                     h.seq, h.count, h.dtype, h.root >= 0 ? fmt::format(", root {}", h.root) : "",
                     h.redop >= 0 ? fmt::format(", op {}", h.redop) : "");
}

// One issued operation with everything its execution needs.
struct Op {
  OpKind kind;
  Header header;  // what this rank issued (seq: collective or per-peer p2p number)
  const void* send = nullptr;
  void* recv = nullptr;
  std::size_t count = 0;  // elements (per rank for all-gather/reduce-scatter)
  ncclDataType_t dtype = ncclFloat32;
  zrt::ReduceOp redop = zrt::ReduceOp::kSum;
  int root = 0, peer = -1;
};

struct Transfer {
  int peer;
  Header expect;  // header the peer must send (for receives)
  const void* send_data = nullptr;
  std::size_t send_bytes = 0;
  void* recv_data = nullptr;
  std::size_t recv_bytes = 0;
  bool sends = false, receives = false;
};

// Runs a batch of ops (one, or an ncclGroupStart/End group) on the calling stream's worker.
void execute(const std::shared_ptr<CommState>& c, const std::vector<Op>& ops) {
  const std::size_t nr = static_cast<std::size_t>(c->nranks);
  std::vector<std::vector<std::byte>> scratch(ops.size());
  std::vector<Transfer> transfers;
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const std::size_t elem = type_size(op.dtype, op_name(op.kind));
    const std::size_t bytes = op.count * elem;
    auto add = [&](int peer, const void* sd, std::size_t sb, void* rd, std::size_t rb, bool s,
                   bool r) {
      Header expect = op.header;
      expect.rank = peer;
      if (op.kind == OpKind::kRecv) expect.op = static_cast<std::int32_t>(OpKind::kSend);
      transfers.push_back(Transfer{peer, expect, sd, sb, rd, rb, s, r});
    };
    switch (op.kind) {
      case OpKind::kAllGather:
        for (int p = 0; p < c->nranks; ++p) {
          if (p == c->rank) continue;
          add(p, op.send, bytes, static_cast<std::byte*>(op.recv) + p * bytes, bytes, true, true);
        }
        break;
      case OpKind::kReduceScatter:
      case OpKind::kAllReduce: {
        const bool rs = op.kind == OpKind::kReduceScatter;
        scratch[i].resize(nr * bytes);
        for (int p = 0; p < c->nranks; ++p) {
          if (p == c->rank) continue;
          const void* mine_for_p =
              rs ? static_cast<const std::byte*>(op.send) + p * bytes : op.send;
          add(p, mine_for_p, bytes, scratch[i].data() + p * bytes, bytes, true, true);
        }
        break;
      }
      case OpKind::kBroadcast:
        if (c->rank == op.root) {
          for (int p = 0; p < c->nranks; ++p) {
            if (p != c->rank) add(p, op.send, bytes, nullptr, 0, true, false);
          }
        } else {
          add(op.root, nullptr, 0, op.recv, bytes, false, true);
        }
        break;
      case OpKind::kSend:
        add(op.peer, op.send, bytes, nullptr, 0, true, false);
        break;
      case OpKind::kRecv:
        add(op.peer, nullptr, 0, op.recv, bytes, false, true);
        break;
    }
  }
  // Phase 1: headers, validated before any payload is received.
  std::vector<Header> got(transfers.size());
  std::vector<MPI_Request> reqs;
  std::vector<Header> sent(transfers.size());
  for (std::size_t t = 0; t < transfers.size(); ++t) {
    const Transfer& tr = transfers[t];
    const int peer_world = c->world[static_cast<std::size_t>(tr.peer)];
    if (tr.sends) {
      sent[t] = tr.expect;
      sent[t].rank = c->rank;
      if (static_cast<OpKind>(sent[t].op) == OpKind::kRecv)
        sent[t].op = static_cast<std::int32_t>(OpKind::kSend);
      reqs.emplace_back();
      MPI_Isend(&sent[t], sizeof(Header), MPI_BYTE, peer_world, c->tag, MPI_COMM_WORLD,
                &reqs.back());
    }
    if (tr.receives) {
      reqs.emplace_back();
      MPI_Irecv(&got[t], sizeof(Header), MPI_BYTE, peer_world, c->tag, MPI_COMM_WORLD,
                &reqs.back());
    }
  }
  if (!wait_all(reqs, &c->aborted)) throw NcclError(ncclInvalidUsage, "aborted by ncclCommAbort");
  for (std::size_t t = 0; t < transfers.size(); ++t) {
    const Transfer& tr = transfers[t];
    if (!tr.receives) continue;
    Header mine = tr.expect;
    const Header& theirs = got[t];
    if (theirs.seq != mine.seq || theirs.op != mine.op || theirs.dtype != mine.dtype ||
        theirs.count != mine.count || theirs.root != mine.root || theirs.redop != mine.redop) {
      throw NcclError(ncclInvalidUsage,
                      fmt::format("collective mismatch on communicator '{}': rank {} issued {}, "
                                  "but rank {} issued {} (every rank must issue the same "
                                  "sequence, with the same counts and datatypes)",
                                  c->name, c->rank, describe(mine), tr.peer, describe(theirs)));
    }
  }
  // Phase 2: payloads.
  reqs.clear();
  for (const Transfer& tr : transfers) {
    const int peer_world = c->world[static_cast<std::size_t>(tr.peer)];
    if (tr.sends && tr.send_bytes > 0) {
      reqs.emplace_back();
      MPI_Isend(tr.send_data, static_cast<int>(tr.send_bytes), MPI_BYTE, peer_world, c->tag,
                MPI_COMM_WORLD, &reqs.back());
    }
    if (tr.receives && tr.recv_bytes > 0) {
      reqs.emplace_back();
      MPI_Irecv(tr.recv_data, static_cast<int>(tr.recv_bytes), MPI_BYTE, peer_world, c->tag,
                MPI_COMM_WORLD, &reqs.back());
    }
  }
  if (!wait_all(reqs, &c->aborted)) throw NcclError(ncclInvalidUsage, "aborted by ncclCommAbort");
  // Local parts, in issue order.
  for (std::size_t i = 0; i < ops.size(); ++i) {
    const Op& op = ops[i];
    const std::size_t elem = type_size(op.dtype, op_name(op.kind));
    const std::size_t bytes = op.count * elem;
    switch (op.kind) {
      case OpKind::kAllGather:
        std::memmove(static_cast<std::byte*>(op.recv) + c->rank * bytes, op.send, bytes);
        break;
      case OpKind::kReduceScatter:
      case OpKind::kAllReduce: {
        const bool rs = op.kind == OpKind::kReduceScatter;
        const void* mine = rs ? static_cast<const std::byte*>(op.send) + c->rank * bytes : op.send;
        std::memcpy(scratch[i].data() + c->rank * bytes, mine, bytes);
        zrt::reduce_blocks(scratch[i].data(), static_cast<std::int64_t>(op.count), c->nranks,
                           static_cast<std::int64_t>(op.count),
                           dtype_of(op.dtype, op_name(op.kind)), op.redop, op.recv);
        break;
      }
      case OpKind::kBroadcast:
        if (c->rank == op.root && op.send != op.recv) std::memmove(op.recv, op.send, bytes);
        break;
      default:
        break;
    }
  }
}

// Pending group: ops per (communicator, stream), flushed by ncclGroupEnd.
struct PendingBatch {
  std::shared_ptr<CommState> comm;
  cudaStream_t stream;
  std::vector<Op> ops;
  std::vector<Access> accesses;
};
thread_local std::vector<PendingBatch>* t_group = nullptr;

void enqueue_batch(PendingBatch batch, const std::string& call) {
  Runtime& rt = Runtime::get();
  std::lock_guard<std::mutex> lock(rt.mutex());
  auto* s = rt.stream(batch.stream, call);
  if (s->device != batch.comm->device) {
    nccl_fail(ncclInvalidArgument, call,
              fmt::format("stream is on device {} but communicator '{}' on device {}", s->device,
                          batch.comm->device, batch.comm->name));
  }
  std::string what = op_name(batch.ops.front().kind);
  if (batch.ops.size() > 1) what = fmt::format("NCCL group of {} ops", batch.ops.size());
  auto comm = batch.comm;
  auto ops = std::move(batch.ops);
  rt.enqueue(
      *s, call, fmt::format("{} on communicator '{}'", what, comm->name), batch.accesses,
      [comm, ops] {
        try {
          execute(comm, ops);
        } catch (const NcclError& e) {
          std::lock_guard<std::mutex> l(comm->mutex);
          if (comm->async_error == ncclSuccess) {
            comm->async_error = e.code == ncclInvalidUsage ? ncclInvalidUsage : ncclRemoteError;
            comm->async_message = e.what();
            spdlog::error("NCCL stand-in: asynchronous error on '{}': {}", comm->name, e.what());
          }
        }
      });
}

// Checks an op's buffers and issues it (now, or into the open group).
void issue(CommState& c, const std::shared_ptr<CommState>& shared, cudaStream_t stream, Op op,
           const std::string& call) {
  if (c.aborted)
    nccl_fail(ncclInvalidUsage, call, fmt::format("communicator '{}' was aborted", c.name));
  if (c.finalized)
    nccl_fail(ncclInvalidUsage, call, fmt::format("communicator '{}' was finalized", c.name));
  const std::size_t elem = type_size(op.dtype, call);
  const std::size_t bytes = op.count * elem;
  std::vector<Access> accesses;
  {
    Runtime& rt = Runtime::get();
    std::lock_guard<std::mutex> lock(rt.mutex());
    const auto dev = {MemKind::kDevice};
    auto check = [&](const char* arg, const void* p, std::size_t n, bool write) {
      rt.check_range(call, arg, p, n, dev);
      accesses.push_back(Access{p, n, write, arg});
    };
    const std::size_t all = bytes * static_cast<std::size_t>(c.nranks);
    auto overlaps = [](const void* a, std::size_t an, const void* b, std::size_t bn) {
      const auto x = reinterpret_cast<std::uintptr_t>(a), y = reinterpret_cast<std::uintptr_t>(b);
      return x < y + bn && y < x + an;
    };
    switch (op.kind) {
      case OpKind::kAllGather: {
        check("sendbuff", op.send, bytes, false);
        check("recvbuff", op.recv, all, true);
        const bool in_place = op.send == static_cast<const std::byte*>(op.recv) + c.rank * bytes;
        if (!in_place && overlaps(op.send, bytes, op.recv, all)) {
          nccl_fail(ncclInvalidArgument, call,
                    "sendbuff overlaps recvbuff but is not recvbuff + rank*sendcount (in place)");
        }
        break;
      }
      case OpKind::kReduceScatter: {
        check("sendbuff", op.send, all, false);
        check("recvbuff", op.recv, bytes, true);
        const bool in_place = op.recv == static_cast<const std::byte*>(op.send) + c.rank * bytes;
        if (!in_place && overlaps(op.send, all, op.recv, bytes)) {
          nccl_fail(ncclInvalidArgument, call,
                    "recvbuff overlaps sendbuff but is not sendbuff + rank*recvcount (in place)");
        }
        break;
      }
      case OpKind::kAllReduce:
        check("sendbuff", op.send, bytes, false);
        check("recvbuff", op.recv, bytes, true);
        if (op.send != op.recv && overlaps(op.send, bytes, op.recv, bytes)) {
          nccl_fail(ncclInvalidArgument, call, "sendbuff and recvbuff overlap without being equal");
        }
        break;
      case OpKind::kBroadcast:
        if (c.rank == op.root) check("sendbuff", op.send, bytes, false);
        check("recvbuff", op.recv, bytes, true);
        break;
      case OpKind::kSend:
        check("sendbuff", op.send, bytes, false);
        break;
      case OpKind::kRecv:
        check("recvbuff", op.recv, bytes, true);
        break;
    }
  }
  // Sequence numbers at issue time: the order the host issued them.
  if (op.kind == OpKind::kSend) {
    op.header.seq = c.p2p_seq_out[static_cast<std::size_t>(op.peer)]++;
  } else if (op.kind == OpKind::kRecv) {
    op.header.seq = c.p2p_seq_in[static_cast<std::size_t>(op.peer)]++;
  } else {
    op.header.seq = c.next_seq++;
  }
  if (t_group != nullptr) {
    for (PendingBatch& b : *t_group) {
      if (b.comm == shared && b.stream == stream) {
        b.ops.push_back(op);
        b.accesses.insert(b.accesses.end(), accesses.begin(), accesses.end());
        return;
      }
    }
    t_group->push_back(PendingBatch{shared, stream, {op}, accesses});
    return;
  }
  enqueue_batch(PendingBatch{shared, stream, {op}, accesses}, call);
}

Op make_op(OpKind kind, const void* send, void* recv, size_t count, ncclDataType_t dtype, int root,
           int peer, int redop, const std::string& call) {
  Op op;
  op.kind = kind;
  op.send = send;
  op.recv = recv;
  op.count = count;
  op.dtype = dtype;
  op.root = root;
  op.peer = peer;
  type_size(dtype, call);
  op.header = Header{0,
                     static_cast<std::int32_t>(kind),
                     static_cast<std::int32_t>(dtype),
                     static_cast<std::int64_t>(count),
                     root,
                     redop,
                     0,
                     0};
  return op;
}

ncclResult_t collective(const char* call, ncclComm_t comm, cudaStream_t stream,
                        const std::function<Op(CommState&)>& build) {
  return nccl_api(call, [&] {
    CommState& c = state_of(comm, call);
    auto shared = reinterpret_cast<CommHandle*>(comm)->state;
    Op op = build(c);
    if ((op.kind == OpKind::kSend || op.kind == OpKind::kRecv) &&
        (op.peer < 0 || op.peer >= c.nranks || op.peer == c.rank)) {
      nccl_fail(ncclInvalidArgument, call,
                fmt::format("peer {} invalid for rank {} of {}", op.peer, c.rank, c.nranks));
    }
    if (op.kind == OpKind::kBroadcast && (op.root < 0 || op.root >= c.nranks)) {
      nccl_fail(ncclInvalidArgument, call,
                fmt::format("root {} outside 0..{}", op.root, c.nranks - 1));
    }
    if (op.count == 0) return;
    issue(c, shared, stream, op, call);
  });
}

std::shared_ptr<CommState> make_comm(int rank, std::vector<int> world, int tag, std::string name,
                                     bool blocking) {
  auto c = std::make_shared<CommState>();
  c->rank = rank;
  c->nranks = static_cast<int>(world.size());
  c->world = std::move(world);
  c->tag = tag;
  c->name = std::move(name);
  c->blocking = blocking;
  c->device = Runtime::get().current_device();
  c->p2p_seq_out.assign(static_cast<std::size_t>(c->nranks), 0);
  c->p2p_seq_in.assign(static_cast<std::size_t>(c->nranks), 0);
  c->pending_polls = blocking ? 0 : 1;
  return c;
}

int comm_tag(int creator_world, int counter, const std::string& call) {
  int* ub = nullptr;
  int flag = 0;
  MPI_Comm_get_attr(MPI_COMM_WORLD, MPI_TAG_UB, &ub, &flag);
  const long tag = kCommTagBase + (static_cast<long>(creator_world) * 100000 + counter) * 2;
  if (!flag || tag + 1 > *ub || counter >= 100000) {
    nccl_fail(ncclSystemError, call,
              fmt::format("MPI tag space exhausted (tag {}, MPI_TAG_UB {})", tag, flag ? *ub : -1));
  }
  return static_cast<int>(tag);
}

}  // namespace

extern "C" {

const char* ncclGetErrorString(ncclResult_t result) {
  switch (result) {
    case ncclSuccess:
      return "no error";
    case ncclUnhandledCudaError:
      return "unhandled cuda error (run with NCCL_DEBUG=INFO for details)";
    case ncclSystemError:
      return "unhandled system error (run with NCCL_DEBUG=INFO for details)";
    case ncclInternalError:
      return "internal error - please report this issue to the NCCL developers";
    case ncclInvalidArgument:
      return "invalid argument (run with NCCL_DEBUG=WARN for details)";
    case ncclInvalidUsage:
      return "invalid usage (run with NCCL_DEBUG=WARN for details)";
    case ncclRemoteError:
      return "remote process exited or there was a network error";
    case ncclInProgress:
      return "NCCL operation in progress";
    default:
      return "unknown result code";
  }
}

const char* ncclGetLastError(ncclComm_t comm) {
  if (comm != nullptr) {
    auto& c = *reinterpret_cast<CommHandle*>(comm)->state;
    std::lock_guard<std::mutex> lock(c.mutex);
    if (!c.async_message.empty()) {
      thread_local std::string text;
      text = c.async_message;
      return text.c_str();
    }
  }
  return t_last_error.c_str();
}

ncclResult_t ncclGetUniqueId(ncclUniqueId* id) {
  return nccl_api("ncclGetUniqueId", [&] {
    if (id == nullptr) nccl_fail(ncclInvalidArgument, "ncclGetUniqueId", "uniqueId is null");
    require_mpi("ncclGetUniqueId");
    std::memset(id, 0, sizeof *id);
    const IdContent content{kIdMagic, world_rank(), g_counter.fetch_add(1)};
    std::memcpy(id->internal, &content, sizeof content);
  });
}

ncclResult_t ncclCommInitRankConfig(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank,
                                    ncclConfig_t* config) {
  return nccl_api("ncclCommInitRankConfig", [&] {
    const std::string call = "ncclCommInitRankConfig";
    if (comm == nullptr) nccl_fail(ncclInvalidArgument, call, "comm is null");
    *comm = nullptr;
    require_mpi(call);
    if (nranks < 1 || rank < 0 || rank >= nranks) {
      nccl_fail(ncclInvalidArgument, call, fmt::format("rank {} of {} ranks", rank, nranks));
    }
    IdContent content;
    std::memcpy(&content, id.internal, sizeof content);
    if (content.magic != kIdMagic)
      nccl_fail(ncclInvalidArgument, call, "the unique id was not made by ncclGetUniqueId");
    const int me = world_rank();
    const int boot_tag = kBootTagBase + 2 * (content.counter % 100000);
    // Bootstrap: members send (rank, world rank) to the id's creator, who answers with the table.
    std::vector<int> world(static_cast<std::size_t>(nranks), -1);
    std::int32_t mine[2] = {rank, me};
    if (me == content.creator_world) {
      world[static_cast<std::size_t>(rank)] = me;
      for (int i = 1; i < nranks; ++i) {
        std::int32_t got[2];
        MPI_Request req;
        MPI_Irecv(got, 2, MPI_INT32_T, MPI_ANY_SOURCE, boot_tag, MPI_COMM_WORLD, &req);
        std::vector<MPI_Request> reqs{req};
        wait_all(reqs, nullptr);
        if (got[0] < 0 || got[0] >= nranks || world[static_cast<std::size_t>(got[0])] != -1) {
          nccl_fail(
              ncclInvalidUsage, call,
              fmt::format("process {} joined as rank {}, which is out of range or taken ({} ranks)",
                          got[1], got[0], nranks));
        }
        world[static_cast<std::size_t>(got[0])] = got[1];
      }
      std::vector<MPI_Request> reqs;
      for (int r = 0; r < nranks; ++r) {
        if (world[static_cast<std::size_t>(r)] == me) continue;
        reqs.emplace_back();
        MPI_Isend(world.data(), nranks, MPI_INT, world[static_cast<std::size_t>(r)], boot_tag + 1,
                  MPI_COMM_WORLD, &reqs.back());
      }
      wait_all(reqs, nullptr);
    } else {
      std::vector<MPI_Request> reqs(2);
      MPI_Isend(mine, 2, MPI_INT32_T, content.creator_world, boot_tag, MPI_COMM_WORLD, &reqs[0]);
      MPI_Irecv(world.data(), nranks, MPI_INT, content.creator_world, boot_tag + 1, MPI_COMM_WORLD,
                &reqs[1]);
      wait_all(reqs, nullptr);
    }
    const bool blocking = config == nullptr || config->blocking != 0;
    std::string name = config != nullptr && config->commName != nullptr ? config->commName : "";
    auto state = make_comm(
        rank, world, comm_tag(content.creator_world, content.counter, call),
        name.empty() ? fmt::format("comm {}:{}", content.creator_world, content.counter) : name,
        blocking);
    *comm = to_handle(new CommHandle{state});
    if (!blocking) throw NcclError(ncclInProgress, "");  // reported as in progress, see below
  });
}

ncclResult_t ncclCommInitRank(ncclComm_t* comm, int nranks, ncclUniqueId id, int rank) {
  return ncclCommInitRankConfig(comm, nranks, id, rank, nullptr);
}

ncclResult_t ncclCommSplit(ncclComm_t comm, int color, int key, ncclComm_t* newcomm,
                           ncclConfig_t* config) {
  return nccl_api("ncclCommSplit", [&] {
    const std::string call = "ncclCommSplit";
    CommState& c = state_of(comm, call);
    if (newcomm == nullptr) nccl_fail(ncclInvalidArgument, call, "newcomm is null");
    *newcomm = nullptr;
    if (c.aborted) nccl_fail(ncclInvalidUsage, call, "parent was aborted");
    // Every parent rank exchanges (color, key, proposed counter) on the control tag.
    const int proposal = g_counter.fetch_add(1);
    std::int32_t mine[3] = {color, key, proposal};
    std::vector<std::int32_t> all(static_cast<std::size_t>(3 * c.nranks));
    std::vector<MPI_Request> reqs;
    for (int p = 0; p < c.nranks; ++p) {
      if (p == c.rank) continue;
      reqs.emplace_back();
      MPI_Isend(mine, 3, MPI_INT32_T, c.world[static_cast<std::size_t>(p)], c.tag + 1,
                MPI_COMM_WORLD, &reqs.back());
      reqs.emplace_back();
      MPI_Irecv(&all[static_cast<std::size_t>(3 * p)], 3, MPI_INT32_T,
                c.world[static_cast<std::size_t>(p)], c.tag + 1, MPI_COMM_WORLD, &reqs.back());
    }
    std::memcpy(&all[static_cast<std::size_t>(3 * c.rank)], mine, sizeof mine);
    wait_all(reqs, &c.aborted);
    if (color == NCCL_SPLIT_NOCOLOR) return;
    if (color < 0) nccl_fail(ncclInvalidArgument, call, fmt::format("color {} < 0", color));
    std::vector<std::pair<std::pair<int, int>, int>> members;  // ((key, parent rank), parent rank)
    for (int p = 0; p < c.nranks; ++p) {
      if (all[static_cast<std::size_t>(3 * p)] == color)
        members.push_back({{all[static_cast<std::size_t>(3 * p + 1)], p}, p});
    }
    std::sort(members.begin(), members.end());
    std::vector<int> world;
    int new_rank = -1;
    for (const auto& m : members) {
      if (m.second == c.rank) new_rank = static_cast<int>(world.size());
      world.push_back(c.world[static_cast<std::size_t>(m.second)]);
    }
    const int leader = members.front().second;
    const int counter = all[static_cast<std::size_t>(3 * leader + 2)];
    const bool blocking = config == nullptr || config->blocking != 0;
    std::string name = config != nullptr && config->commName != nullptr ? config->commName : "";
    auto state = make_comm(new_rank, world,
                           comm_tag(c.world[static_cast<std::size_t>(leader)], counter, call),
                           name.empty() ? fmt::format("split of {}", c.name) : name, blocking);
    *newcomm = to_handle(new CommHandle{state});
    if (!c.blocking) {
      std::lock_guard<std::mutex> lock(c.mutex);
      c.pending_polls = 1;
      throw NcclError(ncclInProgress, "");
    }
  });
}

ncclResult_t ncclCommUserRank(const ncclComm_t comm, int* rank) {
  return nccl_api("ncclCommUserRank", [&] {
    CommState& c = state_of(comm, "ncclCommUserRank");
    if (rank == nullptr) nccl_fail(ncclInvalidArgument, "ncclCommUserRank", "rank is null");
    *rank = c.rank;
  });
}

ncclResult_t ncclCommCount(const ncclComm_t comm, int* count) {
  return nccl_api("ncclCommCount", [&] {
    CommState& c = state_of(comm, "ncclCommCount");
    if (count == nullptr) nccl_fail(ncclInvalidArgument, "ncclCommCount", "count is null");
    *count = c.nranks;
  });
}

ncclResult_t ncclCommGetAsyncError(ncclComm_t comm, ncclResult_t* async_error) {
  return nccl_api("ncclCommGetAsyncError", [&] {
    CommState& c = state_of(comm, "ncclCommGetAsyncError");
    if (async_error == nullptr)
      nccl_fail(ncclInvalidArgument, "ncclCommGetAsyncError", "asyncError is null");
    std::lock_guard<std::mutex> lock(c.mutex);
    if (c.pending_polls > 0) {
      --c.pending_polls;
      *async_error = ncclInProgress;
      return;
    }
    *async_error = c.async_error;
  });
}

ncclResult_t ncclCommFinalize(ncclComm_t comm) {
  return nccl_api("ncclCommFinalize", [&] {
    CommState& c = state_of(comm, "ncclCommFinalize");
    if (c.finalized) nccl_fail(ncclInvalidUsage, "ncclCommFinalize", "already finalized");
    c.finalized = true;
    if (!c.blocking) {
      std::lock_guard<std::mutex> lock(c.mutex);
      c.pending_polls = 1;
      throw NcclError(ncclInProgress, "");
    }
  });
}

ncclResult_t ncclCommDestroy(ncclComm_t comm) {
  return nccl_api("ncclCommDestroy", [&] {
    state_of(comm, "ncclCommDestroy");
    delete reinterpret_cast<CommHandle*>(comm);  // pending work keeps the state alive
  });
}

ncclResult_t ncclCommAbort(ncclComm_t comm) {
  return nccl_api("ncclCommAbort", [&] {
    if (comm == nullptr) return;
    CommState& c = state_of(comm, "ncclCommAbort");
    c.aborted = true;
    delete reinterpret_cast<CommHandle*>(comm);
  });
}

ncclResult_t ncclGroupStart() {
  return nccl_api("ncclGroupStart", [&] {
    if (t_group_depth++ == 0) t_group = new std::vector<PendingBatch>();
  });
}

ncclResult_t ncclGroupEnd() {
  return nccl_api("ncclGroupEnd", [&] {
    if (t_group_depth == 0)
      nccl_fail(ncclInvalidUsage, "ncclGroupEnd", "no matching ncclGroupStart");
    if (--t_group_depth > 0) return;
    std::unique_ptr<std::vector<PendingBatch>> group(t_group);
    t_group = nullptr;
    for (PendingBatch& b : *group) enqueue_batch(std::move(b), "ncclGroupEnd");
  });
}

ncclResult_t ncclAllGather(const void* sendbuff, void* recvbuff, size_t sendcount,
                           ncclDataType_t datatype, ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclAllGather", comm, stream, [&](CommState&) {
    return make_op(OpKind::kAllGather, sendbuff, recvbuff, sendcount, datatype, -1, -1, -1,
                   "ncclAllGather");
  });
}

ncclResult_t ncclReduceScatter(const void* sendbuff, void* recvbuff, size_t recvcount,
                               ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                               cudaStream_t stream) {
  return collective("ncclReduceScatter", comm, stream, [&](CommState&) {
    Op o = make_op(OpKind::kReduceScatter, sendbuff, recvbuff, recvcount, datatype, -1, -1,
                   static_cast<int>(op), "ncclReduceScatter");
    o.redop = redop_of(op, datatype, "ncclReduceScatter");
    return o;
  });
}

ncclResult_t ncclAllReduce(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, ncclRedOp_t op, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective("ncclAllReduce", comm, stream, [&](CommState&) {
    Op o = make_op(OpKind::kAllReduce, sendbuff, recvbuff, count, datatype, -1, -1,
                   static_cast<int>(op), "ncclAllReduce");
    o.redop = redop_of(op, datatype, "ncclAllReduce");
    return o;
  });
}

ncclResult_t ncclBroadcast(const void* sendbuff, void* recvbuff, size_t count,
                           ncclDataType_t datatype, int root, ncclComm_t comm,
                           cudaStream_t stream) {
  return collective("ncclBroadcast", comm, stream, [&](CommState&) {
    return make_op(OpKind::kBroadcast, sendbuff, recvbuff, count, datatype, root, -1, -1,
                   "ncclBroadcast");
  });
}

ncclResult_t ncclSend(const void* sendbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclSend", comm, stream, [&](CommState&) {
    return make_op(OpKind::kSend, sendbuff, nullptr, count, datatype, -1, peer, -1, "ncclSend");
  });
}

ncclResult_t ncclRecv(void* recvbuff, size_t count, ncclDataType_t datatype, int peer,
                      ncclComm_t comm, cudaStream_t stream) {
  return collective("ncclRecv", comm, stream, [&](CommState&) {
    return make_op(OpKind::kRecv, nullptr, recvbuff, count, datatype, -1, peer, -1, "ncclRecv");
  });
}

}  // extern "C"
