#!/usr/bin/env python3
"""Expert parallelism on the CPU backend: tokens/s of a small Mixtral at autoep_size 1, 2 and 4
beside the dense Llama of the same active size (its MLP as wide as the k experts a token runs),
and the expert-parallel all-to-all bytes a rank sends per step against docs/multi-node.md's
formula. Every variant runs zrt-train through tools/zrt-run at the same world size, the variants
interleaved in each repeat so that a change in the machine's load touches all of them; the
figures are medians over the repeats of each run's median step (the first step left out).

  tools/bench/moe_ep_cpu.py --build build --data /path/to/data [--ranks 4] [--repeats 3]

The data directory holds kjv_train_*.bin and kjv_val_*.bin (tools/prepare-corpus).
"""
import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

C, LAYERS, HEADS, KV_HEADS, HEAD_DIM, VOCAB, SEQ = 128, 4, 4, 2, 32, 256, 128
EXPERTS, TOP_K, EXPERT_WIDTH = 8, 2, 128
MICRO_BATCH = 4


def model_block(moe):
    common = {"hidden_size": C, "num_hidden_layers": LAYERS, "num_attention_heads": HEADS,
              "num_key_value_heads": KV_HEADS, "head_dim": HEAD_DIM, "vocab_size": VOCAB,
              "max_position_embeddings": SEQ, "rope_theta": 10000, "rms_norm_eps": 1e-5,
              "tie_word_embeddings": False}
    if moe:
        return dict(common, type="mixtral", intermediate_size=EXPERT_WIDTH,
                    num_experts=EXPERTS, num_experts_per_tok=TOP_K, router_aux_loss_coef=0.02)
    return dict(common, type="llama", intermediate_size=TOP_K * EXPERT_WIDTH)


def config(out_dir, data, ranks, steps, moe, ep):
    c = {
        "train_micro_batch_size_per_gpu": MICRO_BATCH,
        "gradient_accumulation_steps": 1,
        "train_batch_size": MICRO_BATCH * ranks,
        "gradient_clipping": 1.0,
        "zero_optimization": {"stage": 2},
        "optimizer": {"type": "AdamW", "params": {"lr": 0.002, "weight_decay": 0.1}},
        "model": model_block(moe),
        "data": {"train": os.path.join(data, "kjv_train_*.bin")},
        "train": {"steps": steps, "log_interval": 1, "eval_interval": 0, "sample_tokens": 0},
        "device": {"type": "cpu"},
        "seed": 1234,
        "output_dir": out_dir,
    }
    if ep > 1:
        c["expert_parallel"] = {"enabled": True, "autoep_size": ep}
    return c


def run(build, data, ranks, steps, moe, ep, scratch, tag):
    out_dir = os.path.join(scratch, tag)
    path = os.path.join(scratch, tag + ".json")
    with open(path, "w") as f:
        json.dump(config(out_dir, data, ranks, steps, moe, ep), f)
    env = dict(os.environ, ZRT_BUILD_DIR=build)
    zrt_run = os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "zrt-run")
    subprocess.run([zrt_run, "-n", str(ranks), path], check=True, env=env,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    rows = []
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        for line in f:
            row = json.loads(line)
            if "tokens_per_s" in row:
                rows.append(row)
    rows = rows[1:]  # the first step pays for the start-up
    tokens = statistics.median(r["tokens_per_s"] for r in rows)
    sent = statistics.median(r.get("comm_expert_parallel_sent_bytes", 0) for r in rows)
    return tokens, sent


def formula_sent_bytes(ep):
    """docs/multi-node.md: per MoE layer and micro-batch, 4 T k C b (ep-1)/ep for the rows (fp32
    here, b = 4) and 8 E (ep-1)/ep for the counts, with uniform routing."""
    if ep == 1:
        return 0.0
    T = MICRO_BATCH * SEQ
    share = (ep - 1) / ep
    return LAYERS * (4 * T * TOP_K * C * 4 * share + 8 * EXPERTS * share)


def main():
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--build", default="build")
    p.add_argument("--data", required=True)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--steps", type=int, default=8)
    a = p.parse_args()
    variants = [("dense (llama, MLP 2x128)", False, 1)] + [
        (f"mixtral 8x128 top-2, autoep_size {ep}", True, ep)
        for ep in (1, 2, 4) if ep <= a.ranks and a.ranks % ep == 0]
    results = {name: ([], []) for name, _, _ in variants}
    with tempfile.TemporaryDirectory() as scratch:
        for r in range(a.repeats):
            for i, (name, moe, ep) in enumerate(variants):
                tokens, sent = run(os.path.abspath(a.build), a.data, a.ranks, a.steps, moe, ep,
                                   scratch, f"r{r}v{i}")
                results[name][0].append(tokens)
                results[name][1].append(sent)
    print(f"# {a.ranks} ranks, stage 2, fp32, micro-batch {MICRO_BATCH} x {SEQ} tokens a rank, "
          f"median of {a.repeats} runs of each run's median step")
    print(f"{'model':40s} {'tokens/s':>10s} {'a2a sent B/step':>16s} {'formula':>12s} "
          f"{'ratio':>6s}")
    for name, moe, ep in variants:
        tokens = statistics.median(results[name][0])
        sent = statistics.median(results[name][1])
        formula = formula_sent_bytes(ep) if moe else 0.0
        ratio = f"{sent / formula:6.3f}" if formula > 0 else "     -"
        print(f"{name:40s} {tokens:10.0f} {sent:16.0f} {formula:12.0f} {ratio}")


if __name__ == "__main__":
    sys.exit(main())
