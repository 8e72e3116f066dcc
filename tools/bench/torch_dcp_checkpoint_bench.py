#!/usr/bin/env python3
"""torch.distributed.checkpoint (DCP) save time of per-rank optimizer state, and a plain
`dd conv=fsync` of the same bytes, for zrt-bench checkpoint's comparison.

Each of --world processes (torch.multiprocessing, gloo on localhost) holds what a zrt rank holds:
its shard, --elements fp32 values, of each of three tensors (master weights, Adam's two moments)
sharded over the ranks, as a ShardedTensor (FSDP's and DCP's way of saying "each rank writes its
own piece"). A plain tensor would not do: DCP's default planner writes plain tensors from the
coordinator only (the other ranks' tensors would silently be left out, and the save would write
1/world of zrt's bytes; measured so in an earlier version of this script). A save is DCP's
save_state_dict with a FileSystemWriter (one file per rank, fsync on), between two barriers: the
slowest rank's time. After the first save the files are checked: each rank's holds its bytes. The dd row is every rank running `dd if=/dev/zero bs=8M conv=fsync` of its
bytes at once. Repeats alternate DCP and dd; medians are printed, one line each:

    dcp_save median_s=S world=N bytes_per_rank=B torch=VERSION
    dd_fsync median_s=S world=N bytes_per_rank=B

Run by zrt-bench checkpoint --dcp (with the same bytes per rank as its own save), or by hand:

    /usr/bin/python3 tools/bench/torch_dcp_checkpoint_bench.py --world 2 --elements 65000000

DCP is torch.distributed.checkpoint from torch 2.0 on; torch 1.13 (Debian 12's python3-torch)
has the same code as torch.distributed._shard.checkpoint, whose dataclasses Python 3.11 refuses
to define (a class-level instance as a default): the import relaxes that check for its duration.
Exits 3 with a message when no DCP can be imported.
"""
import argparse
import dataclasses
import os
import shutil
import statistics
import subprocess
import sys
import time


def sharded_tensor_factory():
    """A function (local tensor, rank, world) -> a ShardedTensor of world equal row shards."""
    from torch.distributed._shard.sharded_tensor import Shard, init_from_local_shards

    def make(local, rank, world):
        n = local.numel()
        shard = Shard.from_tensor_and_offsets(local, shard_offsets=[rank * n], rank=rank)
        return init_from_local_shards([shard], world * n)

    return make


def import_dcp():
    """(save_state_dict, FileSystemWriter, sharded-tensor factory) of this torch, or exits 3
    saying why not."""
    try:
        import torch.distributed.checkpoint as dcp  # torch >= 2.0
        save = getattr(dcp, "save", None) or dcp.save_state_dict
        return save, dcp.FileSystemWriter, sharded_tensor_factory()
    except ImportError:
        pass
    original = dataclasses._get_field

    def lenient(cls, name, annotation, *rest):
        try:
            return original(cls, name, annotation, *rest)
        except ValueError:  # "mutable default ... is not allowed": give it a default_factory
            default = cls.__dict__.get(name)
            setattr(cls, name, dataclasses.field(default_factory=lambda d=default: d))
            return original(cls, name, annotation, *rest)

    dataclasses._get_field = lenient
    try:
        import torch.distributed._shard.checkpoint as dcp  # torch 1.13
        return dcp.save_state_dict, dcp.FileSystemWriter, sharded_tensor_factory()
    except ImportError as e:
        print(f"no torch.distributed.checkpoint in this torch: {e}", file=sys.stderr)
        sys.exit(3)
    finally:
        dataclasses._get_field = original


def rank_main(rank, args, results):
    import torch
    import torch.distributed as dist

    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(args.port)
    dist.init_process_group("gloo", rank=rank, world_size=args.world)
    torch.set_num_threads(1)
    save, writer, sharded = import_dcp()
    gen = torch.Generator().manual_seed(rank)
    state = {name: sharded(torch.randn(args.elements, generator=gen), rank, args.world)
             for name in ("master", "exp_avg", "exp_avg_sq")}
    nbytes = 3 * 4 * args.elements
    dcp_times, dd_times = [], []
    for r in range(args.repeats + 1):  # the first of each is a warm-up
        path = os.path.join(args.dir, f"dcp_{r}")
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
            os.makedirs(path)
        dist.barrier()
        start = time.perf_counter()
        if hasattr(writer, "__init__") and "single_file_per_rank" in writer.__init__.__code__.co_varnames:
            storage = writer(path, single_file_per_rank=True, sync_files=True)
        else:
            storage = writer(path)
        save(state_dict=state, storage_writer=storage)
        dist.barrier()
        elapsed = time.perf_counter() - start
        if r > 0:
            dcp_times.append(elapsed)
        if r == 0:
            # Every rank wrote its own bytes (one file each, nbytes of tensor data in it).
            sizes = sorted(os.path.getsize(os.path.join(path, f)) for f in os.listdir(path)
                           if f != ".metadata")
            if len(sizes) != args.world or sizes[0] < nbytes:
                raise RuntimeError(f"DCP wrote files of {sizes} bytes, not {args.world} of "
                                   f">= {nbytes}: the ranks' tensors were not all saved")
        dist.barrier()
        if rank == 0:
            shutil.rmtree(path, ignore_errors=True)
        # dd conv=fsync of the same bytes, every rank at once.
        target = os.path.join(args.dir, f"dd_rank{rank}.bin")
        dist.barrier()
        start = time.perf_counter()
        subprocess.run(["dd", "if=/dev/zero", f"of={target}", "bs=8M",
                        f"count={(nbytes + (8 << 20) - 1) // (8 << 20)}", "conv=fsync",
                        "status=none"], check=True)
        dist.barrier()
        elapsed = time.perf_counter() - start
        if r > 0:
            dd_times.append(elapsed)
        os.remove(target)
    if rank == 0:
        results.put((statistics.median(dcp_times), statistics.median(dd_times), nbytes,
                     torch.__version__))
    dist.destroy_process_group()


def main():
    parser = argparse.ArgumentParser(description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--world", type=int, default=2)
    parser.add_argument("--elements", type=int, required=True,
                        help="fp32 elements per tensor per rank (3 tensors per rank)")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--dir", default="/tmp/zrt_bench_dcp")
    parser.add_argument("--port", type=int, default=29517)
    args = parser.parse_args()
    import_dcp()  # fail early, in one process, if there is none
    import torch.multiprocessing as mp

    os.makedirs(args.dir, exist_ok=True)
    context = mp.get_context("spawn")
    results = context.SimpleQueue()
    mp.start_processes(rank_main, args=(args, results), nprocs=args.world, join=True,
                       start_method="spawn")
    dcp_s, dd_s, nbytes, version = results.get()
    print(f"dcp_save median_s={dcp_s:.4f} world={args.world} bytes_per_rank={nbytes} "
          f"torch={version}", flush=True)
    print(f"dd_fsync median_s={dd_s:.4f} world={args.world} bytes_per_rank={nbytes}", flush=True)


if __name__ == "__main__":
    main()
