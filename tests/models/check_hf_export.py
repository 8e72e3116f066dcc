#!/usr/bin/env python3
"""zrt-ckpt export --hf, read by Hugging Face's own Python packages.

--part safetensors (the python3 on PATH; needs safetensors and numpy): a tiny GPT-2 trained 2
steps, exported in fp32, bf16 and fp16, sharded with an index (--max-shard-size 40KB) and as one
file; safetensors.numpy reads every file, the index maps every tensor to the shard holding it,
metadata.total_size is the tensors' bytes, and the bf16/fp16 values are numpy's own rounding of
the fp32 export (round to nearest even).

--part transformers (/usr/bin/python3; needs torch, transformers, safetensors): a GPT-2 made and
saved by transformers (save_pretrained, sharded with an index) is zrt-train's model.init_from (a directory: the
architecture comes from its config.json), trained 3 steps on 2 ranks at ZeRO stage 3, exported
with --hf; from_pretrained loads it with no missing or unexpected keys, the weights moved away
from the start, the tokenizer files were copied, and transformers' logits equal zrt's
(zrt-ckpt logits) within fp32 rounding.

--part transformers-moe (/usr/bin/python3) and transformers-moe-v5 (the virtual environment of
tools/install-python-deps --hf-venv: PyPI's torch and the newest transformers, which must have
Qwen3-MoE; each needs torch, transformers, safetensors): for every mixture of experts the running
transformers has (Mixtral and Qwen2-MoE since 4.36; Qwen3-MoE since 4.51), a tiny model made and
saved by transformers (its per-expert tensors, the Hub's form; a shared expert and a dense layer
for Qwen2-MoE) is zrt-train's init_from, trained 3 steps on 2 ranks at ZeRO stage 3 and exported
with --hf; from_pretrained loads it with no missing or unexpected keys and its logits equal zrt's.

--part transformers-qwen3-v5 (the same virtual environment; Qwen3 came in transformers 4.51): a
dense Qwen3 (q_norm / k_norm, head_dim wider than hidden_size / heads, a tied head) the same
round trip, and again with YaRN rotary scaling, as is a Qwen3-MoE. --part transformers-window-v5: sliding windows (Mistral, Qwen2, Qwen3, Mixtral,
Qwen3-MoE) through it, each export keeping its window.

Exits 77 (ctest: skipped, with the reason printed) when a package is missing.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

SKIP = 77
V5_HINT = ("; tools/install-python-deps --hf-venv makes the virtual environment this part runs in, "
           "then configure the build again")


def check(condition, message):
    if not condition:
        sys.exit("FAILED: " + message)


def write_corpus(path, vocab):
    tokens = [(i * 7 + i // 13) % vocab for i in range(20000)]
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(tokens)
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(tokens), *tokens))


def run(cmd, timeout=300):
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), done.returncode, done.stdout))
    return done.stdout


def train(args, work, model, steps, ranks, stage):
    write_corpus(os.path.join(work, "c_train_000000.bin"), 256)
    config = {
        "train_batch_size": 4, "train_micro_batch_size_per_gpu": 4 // ranks,
        "zero_optimization": {"stage": stage},
        "model": model,
        "data": {"train": os.path.join(work, "c_train_*.bin")},
        "train": {"steps": steps, "log_interval": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 1e-2}},
        "device": {"type": "cpu"},
        "checkpoint": {"save_interval": steps},
        "output_dir": os.path.join(work, "out"),
    }
    path = os.path.join(work, "run.json")
    with open(path, "w") as f:
        json.dump(config, f)
    run([args.mpiexec, "-n", str(ranks), "--oversubscribe", "--bind-to", "none",
         args.zrt_train, "--config", path])
    return os.path.join(work, "out", "checkpoints")


def export(args, ckpt, out, *extra):
    return run([args.zrt_ckpt, "export", ckpt, "--hf", out] + list(extra))


def part_safetensors(args):
    try:
        import numpy as np
        from safetensors import deserialize
    except ImportError as e:
        print("skipped: %s lacks safetensors/numpy (%s); tools/install-python-deps installs it"
              % (sys.executable, e))
        return SKIP
    # safetensors' own parser (numpy has no bfloat16: bf16 comes back as its 16-bit words).
    words = {"F32": np.float32, "F16": np.float16, "BF16": np.uint16}

    def load_file(path):
        with open(path, "rb") as f:
            return {name: np.frombuffer(bytes(t["data"]), dtype=words[t["dtype"].upper()])
                    .reshape(t["shape"]) for name, t in deserialize(f.read())}

    ckpt = train(args, args.work, {"n_layer": 2, "n_head": 4, "n_embd": 64, "vocab_size": 256,
                                   "seq_len": 32}, 2, 1, 1)
    exported = {}
    for dtype in ("fp32", "bf16", "fp16"):
        out = os.path.join(args.work, "hf_" + dtype)
        export(args, ckpt, out, "--dtype", dtype, "--max-shard-size", "40KB")
        with open(os.path.join(out, "model.safetensors.index.json")) as f:
            index = json.load(f)
        shards = sorted(set(index["weight_map"].values()))
        check(len(shards) > 1, "%s: one shard at 40KB" % dtype)
        tensors, total = {}, 0
        for shard in shards:
            data = load_file(os.path.join(out, shard))
            for name, value in data.items():
                check(index["weight_map"].get(name) == shard,
                      "%s: %s in %s, index says %s" % (dtype, name, shard,
                                                       index["weight_map"].get(name)))
                check(os.path.getsize(os.path.join(out, shard)) <= 40000 or len(data) == 1,
                      "%s: %s above 40KB with %d tensors" % (dtype, shard, len(data)))
                tensors[name] = value
                total += value.nbytes
        check(sorted(tensors) == sorted(index["weight_map"]), "%s: index and shards differ" % dtype)
        check(index["metadata"]["total_size"] == total,
              "%s: total_size %s, tensors hold %d" % (dtype, index["metadata"]["total_size"], total))
        exported[dtype] = tensors
        single = os.path.join(args.work, "hf1_" + dtype)
        export(args, ckpt, single, "--dtype", dtype)
        one = load_file(os.path.join(single, "model.safetensors"))
        check(sorted(one) == sorted(tensors), "%s: single file holds other tensors" % dtype)
        for name in one:
            check(np.array_equal(one[name].view(np.uint8), tensors[name].view(np.uint8)),
                  "%s: %s differs between the single file and the shards" % (dtype, name))
    f32 = exported["fp32"]
    check(all(v.dtype == np.float32 for v in f32.values()), "fp32 export holds other dtypes")
    for name, value in f32.items():
        half = exported["fp16"][name]
        check(half.dtype == np.float16 and np.array_equal(half, value.astype(np.float16)),
              "fp16 %s is not numpy's rounding of the fp32 values" % name)
        bits = value.view(np.uint32).astype(np.uint64)
        rounded = ((bits + 0x7FFF + ((bits >> 16) & 1)) >> 16).astype(np.uint16)  # nearest even
        got = exported["bf16"][name]
        check(got.dtype == np.uint16 and np.array_equal(got, rounded),
              "bf16 %s is not the round-to-nearest-even of the fp32 values" % name)
    print("ok: %d tensors in fp32/bf16/fp16, sharded and single, read by safetensors" % len(f32))
    return 0


def compare_logits(args, ckpt, model, label):
    """zrt-ckpt logits of `ckpt` against transformers' `model` on 32 fixed tokens."""
    import torch
    import transformers
    tokens = [(i * 37 + 11) % 256 for i in range(32)]
    # stdout alone is the JSON (warnings go to stderr): a pipe into a JSON reader must work.
    cmd = [args.zrt_ckpt, "logits", ckpt, "--tokens", ",".join(str(t) for t in tokens)]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          timeout=300)
    if done.returncode != 0:
        sys.exit("%s failed (%d):\n%s%s" % (" ".join(cmd), done.returncode, done.stdout,
                                            done.stderr))
    zrt = json.loads(done.stdout)
    ours = torch.tensor(zrt["logits"], dtype=torch.float64)
    with torch.no_grad():
        theirs = model(torch.tensor([tokens])).logits[0].double()
    err = (ours - theirs).abs().max().item()
    scale = theirs.abs().max().item()
    # fp32 forward of a 2-layer, 64-wide model, summed in other orders: each logit is a few
    # hundred fp32 products deep; 1e-5 of the largest logit is ~100x fp32's epsilon.
    print("%s, transformers %s: max |logit| %.4f, max |zrt - transformers| %.3g" %
          (label, transformers.__version__, scale, err))
    check(err <= 1e-5 * max(1.0, scale), "%s: logits differ by %g" % (label, err))


def part_transformers(args, arch):
    try:
        import torch
        import transformers
        from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print("skipped: %s lacks torch/transformers (%s): /usr/bin/python3 -m pip install "
              "--break-system-packages transformers safetensors" % (sys.executable, e))
        return SKIP
    torch.manual_seed(0)
    src = os.path.join(args.work, "hf_src")
    if arch == "llama":
        # Grouped-query attention, an untied head, Llama 3.1's rotary scaling.
        cfg = LlamaConfig(hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                          num_attention_heads=4, num_key_value_heads=2, vocab_size=256,
                          max_position_embeddings=32, tie_word_embeddings=False,
                          rope_theta=500000.0,
                          rope_scaling={"rope_type": "llama3", "factor": 8.0,
                                        "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                        "original_max_position_embeddings": 16},
                          bos_token_id=255, eos_token_id=255)
        model_class = LlamaForCausalLM
    else:
        cfg = GPT2Config(n_layer=2, n_head=4, n_embd=64, vocab_size=256, n_positions=32,
                         bos_token_id=255, eos_token_id=255)
        model_class = GPT2LMHeadModel
    start = model_class(cfg).eval()
    # transformers' own sharded layout (index + shards) is what zrt imports.
    start.save_pretrained(src, safe_serialization=True, max_shard_size="60KB")
    check(os.path.exists(os.path.join(src, "model.safetensors.index.json")),
          "transformers wrote no sharded source")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        with open(os.path.join(src, name), "w") as f:
            f.write('{"made_for": "%s"}' % name)
    ckpt = train(args, args.work, {"init_from": src}, 3, 2, 3)
    out = os.path.join(args.work, "hf_out")
    print(export(args, ckpt, out, "--max-shard-size", "100KB"))
    check(os.path.exists(os.path.join(out, "model.safetensors.index.json")), "not sharded")
    for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json"):
        with open(os.path.join(out, name)) as f:
            check(name in f.read(), "%s not copied" % name)
    model, info = model_class.from_pretrained(out, output_loading_info=True)
    model.eval()
    for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
        check(not info.get(key), "from_pretrained %s: %s" % (key, info.get(key)))
    moved = max((a - b).abs().max().item() for a, b in
                zip(model.state_dict().values(), start.state_dict().values()))
    check(moved > 1e-3, "the weights did not change in training (max change %g)" % moved)
    compare_logits(args, ckpt, model, arch)
    print("ok")
    return 0


def round_trip(args, cases, expect_config=None):
    """Each (arch, config, model class): transformers' model saved, trained by zrt-train from it
    (3 steps, 2 ranks, stage 3), exported, loaded back by transformers, its logits against
    zrt-ckpt logits'. expect_config(arch, config.json) checks the exported config.json."""
    import torch
    import transformers
    for arch, cfg, model_class in cases:
        torch.manual_seed(0)
        work = os.path.join(args.work, arch)
        os.makedirs(work)
        src = os.path.join(work, "hf_src")
        start = model_class(cfg).eval()
        start.save_pretrained(src, safe_serialization=True)
        ckpt = train(args, work, {"init_from": src}, 3, 2, 3)
        out = os.path.join(work, "hf_out")
        export(args, ckpt, out)
        if expect_config is not None:
            with open(os.path.join(out, "config.json")) as f:
                expect_config(arch, json.load(f))
        with open(os.path.join(out, "model.safetensors"), "rb") as f:
            header = json.loads(f.read(struct.unpack("<Q", f.read(8))[0]))
        check(not any("gate_up_proj" in name for name in header),
              "%s: the export holds fused experts" % arch)
        model, info = model_class.from_pretrained(out, output_loading_info=True)
        model.eval()
        for key in ("missing_keys", "unexpected_keys", "mismatched_keys", "error_msgs"):
            check(not info.get(key), "%s: from_pretrained %s: %s" % (arch, key, info.get(key)))
        moved = max((a - b).abs().max().item() for a, b in
                    zip(model.state_dict().values(), start.state_dict().values()))
        check(moved > 1e-3, "%s: the weights did not change in training (max change %g)"
              % (arch, moved))
        # (The mixtures of experts: the routing takes the same experts, the router's top-k gaps
        # being far above fp32 rounding at this init.)
        compare_logits(args, ckpt, model, arch)
    return 0


def part_transformers_moe(args):
    try:
        import torch
        import transformers
    except ImportError as e:
        print("skipped: %s lacks torch/transformers (%s)%s" % (sys.executable, e, V5_HINT
              if args.part == "transformers-moe-v5" else ""))
        return SKIP
    if args.part == "transformers-moe-v5":
        # The part exists for Qwen3-MoE (and transformers v5's handling of the experts): a
        # transformers without it, or one that finds this torch too old and leaves its models
        # out, is a missing install, not a pass on the older models alone.
        if not transformers.is_torch_available():
            print("skipped: transformers %s in %s does not use its torch %s%s" %
                  (transformers.__version__, sys.executable, torch.__version__, V5_HINT))
            return SKIP
        if not hasattr(transformers, "Qwen3MoeConfig"):
            print("skipped: transformers %s in %s has no Qwen3-MoE (4.51 on)%s" %
                  (transformers.__version__, sys.executable, V5_HINT))
            return SKIP
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=32,
                  tie_word_embeddings=False, rope_theta=10000.0, bos_token_id=255,
                  eos_token_id=255, router_aux_loss_coef=0.02)
    cases = []
    if hasattr(transformers, "MixtralConfig"):
        cases.append(("mixtral", transformers.MixtralConfig(
            intermediate_size=48, num_local_experts=4, num_experts_per_tok=2, **common),
            transformers.MixtralForCausalLM))
    if hasattr(transformers, "Qwen2MoeConfig"):
        cases.append(("qwen2_moe", transformers.Qwen2MoeConfig(
            intermediate_size=96, moe_intermediate_size=32, shared_expert_intermediate_size=48,
            num_experts=4, num_experts_per_tok=2, norm_topk_prob=False, mlp_only_layers=[1],
            **common), transformers.Qwen2MoeForCausalLM))
    if hasattr(transformers, "Qwen3MoeConfig"):
        cases.append(("qwen3_moe", transformers.Qwen3MoeConfig(
            intermediate_size=96, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
            norm_topk_prob=True, head_dim=16, **common), transformers.Qwen3MoeForCausalLM))
    if not cases:
        print("skipped: transformers %s has none of the MoE models" % transformers.__version__)
        return SKIP
    round_trip(args, cases)
    print("ok: %s" % ", ".join(c[0] for c in cases))
    return 0


WINDOW = 8  # tokens: the round trip's 32-token logits see a quarter of their causal context


def part_transformers_qwen3(args):
    """A dense Qwen3 through the round trip (the hf-venv's transformers v5): its per-head q_norm
    and k_norm come back under transformers' names, head_dim 32 (hidden_size / heads is 16),
    grouped-query attention, the head tied to the embedding."""
    try:
        import transformers
    except ImportError as e:
        print("skipped: %s lacks torch/transformers (%s)%s" % (sys.executable, e, V5_HINT))
        return SKIP
    if not transformers.is_torch_available() or not hasattr(transformers, "Qwen3Config"):
        print("skipped: transformers %s in %s has no Qwen3 (4.51 on) or no torch%s" %
              (transformers.__version__, sys.executable, V5_HINT))
        return SKIP
    cfg = transformers.Qwen3Config(
        hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, head_dim=32, vocab_size=256, max_position_embeddings=32,
        tie_word_embeddings=True, rope_theta=10000.0, bos_token_id=255, eos_token_id=255)

    def expect_config(arch, exported):
        check(exported.get("model_type") == "qwen3" and
              exported.get("architectures") == ["Qwen3ForCausalLM"],
              "qwen3: exported as %s %s" % (exported.get("model_type"),
                                           exported.get("architectures")))
        check(exported.get("head_dim") == 32 and exported.get("tie_word_embeddings") is True,
              "qwen3: exported head_dim %s, tie_word_embeddings %s" %
              (exported.get("head_dim"), exported.get("tie_word_embeddings")))
        check(exported.get("use_sliding_window") is False,
              "qwen3: exported use_sliding_window %s" % exported.get("use_sliding_window"))

    # YaRN over the same model (Qwen3's long-context setting, config.json's rope_parameters):
    # factor 2 over an original context of 16, so the ramp interpolates most of the head's
    # frequencies and the attention factor (1.069) scales every rotation.
    yarn = transformers.Qwen3Config(**dict(
        cfg.to_dict(), rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                                        "original_max_position_embeddings": 16}))

    def expect_yarn(arch, exported):
        rope = exported.get("rope_scaling") or {}
        check(rope.get("rope_type") == "yarn" and rope.get("factor") == 2.0 and
              rope.get("original_max_position_embeddings") == 16,
              "%s: exported rope_scaling %s" % (arch, rope))

    # And a Qwen3-MoE with the same YaRN (its rotary table is the dense model's).
    moe_yarn = transformers.Qwen3MoeConfig(
        hidden_size=64, intermediate_size=96, moe_intermediate_size=16, num_experts=8,
        num_experts_per_tok=3, norm_topk_prob=True, head_dim=16, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, vocab_size=256, max_position_embeddings=32,
        tie_word_embeddings=False, bos_token_id=255, eos_token_id=255, router_aux_loss_coef=0.02,
        rope_parameters={"rope_type": "yarn", "rope_theta": 10000.0, "factor": 2.0,
                         "original_max_position_embeddings": 16})
    round_trip(args, [("qwen3", cfg, transformers.Qwen3ForCausalLM),
                      ("qwen3-yarn", yarn, transformers.Qwen3ForCausalLM),
                      ("qwen3_moe-yarn", moe_yarn, transformers.Qwen3MoeForCausalLM)],
               lambda arch, exported: (expect_config if arch == "qwen3" else expect_yarn)(
                   arch, exported))
    print("ok: qwen3, qwen3-yarn, qwen3_moe-yarn")
    return 0


def part_transformers_window(args):
    """Sliding windows through the round trip (transformers v5's semantics: the hf-venv): Mistral
    and Mixtral on every layer, Qwen2 and Qwen3 from max_window_layers 1 on, Qwen3-MoE with
    use_sliding_window; the export keeps the window (config.json), transformers' logits of the
    exported model equal zrt's, and differ from the same weights without the window."""
    try:
        import torch
        import transformers
    except ImportError as e:
        print("skipped: %s lacks torch/transformers (%s)%s" % (sys.executable, e, V5_HINT))
        return SKIP
    if not transformers.is_torch_available() or not hasattr(transformers, "Qwen3MoeConfig"):
        print("skipped: transformers %s in %s has no Qwen3-MoE or no torch%s" %
              (transformers.__version__, sys.executable, V5_HINT))
        return SKIP
    common = dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=256, max_position_embeddings=32,
                  tie_word_embeddings=False, rope_theta=10000.0, bos_token_id=255,
                  eos_token_id=255, sliding_window=WINDOW)
    moe = dict(common, router_aux_loss_coef=0.02)
    cases = [
        ("mistral", transformers.MistralConfig(intermediate_size=96, **common),
         transformers.MistralForCausalLM),
        ("qwen2", transformers.Qwen2Config(intermediate_size=96, use_sliding_window=True,
                                           max_window_layers=1, **common),
         transformers.Qwen2ForCausalLM),
        ("qwen3", transformers.Qwen3Config(intermediate_size=96, use_sliding_window=True,
                                           max_window_layers=1, head_dim=16, **common),
         transformers.Qwen3ForCausalLM),
        ("mixtral", transformers.MixtralConfig(intermediate_size=48, num_local_experts=4,
                                               num_experts_per_tok=2, **moe),
         transformers.MixtralForCausalLM),
        ("qwen3_moe", transformers.Qwen3MoeConfig(
            intermediate_size=96, moe_intermediate_size=16, num_experts=8, num_experts_per_tok=3,
            norm_topk_prob=True, head_dim=16, use_sliding_window=True, **moe),
         transformers.Qwen3MoeForCausalLM),
    ]
    for arch, cfg, _ in cases:
        check(cfg.sliding_window == WINDOW, "%s: transformers dropped the window" % arch)

    def expect_config(arch, exported):
        check(exported.get("sliding_window") == WINDOW,
              "%s: exported sliding_window %s" % (arch, exported.get("sliding_window")))
        if arch in ("qwen2", "qwen3", "qwen3_moe"):
            check(exported.get("use_sliding_window") is True,
                  "%s: exported use_sliding_window %s" % (arch, exported.get("use_sliding_window")))
        if arch in ("qwen2", "qwen3"):
            check(exported.get("max_window_layers") == 1,
                  "%s: exported max_window_layers %s" % (arch, exported.get("max_window_layers")))

    round_trip(args, cases, expect_config)
    # The window matters at these lengths: the same weights without it give other logits.
    tokens = torch.tensor([[(i * 37 + 11) % 256 for i in range(32)]])
    for arch, cfg, model_class in cases:
        windowed = model_class.from_pretrained(os.path.join(args.work, arch, "hf_out")).eval()
        fields = {k: v for k, v in windowed.config.to_dict().items() if k != "layer_types"}
        fields.update(sliding_window=None, use_sliding_window=False)
        whole_cfg = windowed.config.__class__(**fields)
        whole = model_class(whole_cfg).eval()
        whole.load_state_dict(windowed.state_dict())
        with torch.no_grad():
            apart = (windowed(tokens, use_cache=False).logits -
                     whole(tokens, use_cache=False).logits).abs().max().item()
        print("%s: max |logit with window - without| %.4g" % (arch, apart))
        check(apart > 1e-3, "%s: the window changes no logit (%g)" % (arch, apart))
    print("ok: %s" % ", ".join(c[0] for c in cases))
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--part", choices=["safetensors", "transformers", "transformers-llama",
                                      "transformers-moe", "transformers-moe-v5",
                                      "transformers-qwen3-v5", "transformers-window-v5"],
                   required=True)
    p.add_argument("--zrt-train", required=True)
    p.add_argument("--zrt-ckpt", required=True)
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    if args.part == "safetensors":
        return part_safetensors(args)
    if args.part == "transformers-window-v5":
        return part_transformers_window(args)
    if args.part == "transformers-qwen3-v5":
        return part_transformers_qwen3(args)
    if args.part.startswith("transformers-moe"):
        return part_transformers_moe(args)
    return part_transformers(args, "llama" if args.part == "transformers-llama" else "gpt2")


if __name__ == "__main__":
    sys.exit(main())
