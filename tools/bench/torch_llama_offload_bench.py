#!/usr/bin/env python3
"""The peers of zrt's offloaded Llama run on one GPU: DeepSpeed ZeRO-3 with `offload_optimizer`
and PyTorch FSDP2 with `CPUOffloadPolicy`, on transformers' own LlamaForCausalLM (flash SDPA,
bf16 compute), with the same shapes, micro-batch, accumulation and sequence as zrt's config.

    python3 tools/bench/torch_llama_offload_bench.py --engine deepspeed --layers 32 --ratio 0.7
    python3 tools/bench/torch_llama_offload_bench.py --engine fsdp2 --layers 16

The model is Llama-3.1-8B's shape (4096 wide, 14336 MLP, 32 heads, 8 key/value heads, 128256
vocabulary, untied head); --layers keeps that many of its 32 blocks. Weights are random (the
throughput does not depend on them), token ids random below 256 (zrt trains on the KJV bytes).

DeepSpeed: the model is built inside zero.Init (sharded as it is created), AdamW is its
DeepSpeedCPUAdam for the offloaded part (--ratio: the fraction of the optimizer state on the
host, DeepSpeed's `offload_optimizer.ratio`, as zrt's key of the same name), gradients
accumulated in bf16 as zrt's config does. FSDP2: each decoder layer and the root sharded with
CPUOffloadPolicy (parameters, gradients and optimizer state on the host; torch's fused CPU AdamW
steps them), bf16 parameters in compute, fp32 gradient reduction; gradient sync only on the last
micro-batch. FSDP2 has no partial offload: --ratio must be 1 for it.

Prints one line per timed step and a RESULT line: median tokens/s over the steps after
--warmup, MFU by zrt's formula (6 x non-embedding parameters + attention, per token, against
989 TFLOP/s dense bf16), the GPU's peak allocated memory and the host's peak RSS.
"""
import argparse
import os
import resource
import statistics
import sys
import time

import torch

p = argparse.ArgumentParser()
p.add_argument("--engine", choices=["deepspeed", "fsdp2"], required=True)
p.add_argument("--layers", type=int, default=32)
p.add_argument("--seq", type=int, default=2048)
p.add_argument("--micro", type=int, default=1)
p.add_argument("--gas", type=int, default=8)
p.add_argument("--steps", type=int, default=4)
p.add_argument("--warmup", type=int, default=1, help="steps left out of the median")
p.add_argument("--ratio", type=float, default=1.0)
p.add_argument("--peak-tflops", type=float, default=989.0)
a = p.parse_args()
if a.engine == "fsdp2" and a.ratio != 1.0:
    sys.exit("torch_llama_offload_bench: FSDP2's CPUOffloadPolicy offloads everything: --ratio 1")

from transformers import LlamaConfig, LlamaForCausalLM  # noqa: E402

cfg = LlamaConfig(hidden_size=4096, intermediate_size=14336, num_hidden_layers=a.layers,
                  num_attention_heads=32, num_key_value_heads=8, vocab_size=128256,
                  max_position_embeddings=131072, rope_theta=500000.0, rms_norm_eps=1e-5, tie_word_embeddings=False, use_cache=False)
cfg._attn_implementation = "sdpa"
head_dim = cfg.hidden_size // cfg.num_attention_heads

os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
os.environ.setdefault("MASTER_PORT", "29533")
os.environ.setdefault("RANK", "0")
os.environ.setdefault("LOCAL_RANK", "0")
os.environ.setdefault("WORLD_SIZE", "1")
torch.cuda.set_device(0)
torch.manual_seed(0)
t_build = time.perf_counter()

if a.engine == "deepspeed":
    import deepspeed
    ds_config = {
        "train_micro_batch_size_per_gpu": a.micro,
        "gradient_accumulation_steps": a.gas,
        "gradient_clipping": 1.0,
        "bf16": {"enabled": True},
        "data_types": {"grad_accum_dtype": "bf16"},
        "zero_optimization": {
            "stage": 3, "overlap_comm": True, "contiguous_gradients": True,
            "offload_optimizer": {"device": "cpu", "pin_memory": True, "ratio": a.ratio},
        },
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-5, "betas": [0.9, 0.95], "eps": 1e-8,
                                                   "weight_decay": 0.1}},
        "steps_per_print": 1000000,
        "wall_clock_breakdown": False,
    }
    deepspeed.init_distributed(dist_backend="nccl", verbose=False)
    with deepspeed.zero.Init(config_dict_or_path=ds_config, dtype=torch.bfloat16):
        model = LlamaForCausalLM(cfg)
    n_params = sum(p.ds_numel for p in model.parameters())
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=ds_config)

    def train_step(batches):
        for ids in batches:
            loss = engine(input_ids=ids, labels=ids).loss
            engine.backward(loss)
            engine.step()  # DeepSpeed steps the optimizer on the last micro-batch only
        return loss
else:
    import torch.distributed as dist
    from torch.distributed.fsdp import CPUOffloadPolicy, MixedPrecisionPolicy, fully_shard
    dist.init_process_group("nccl", device_id=torch.device("cuda", 0))
    with torch.device("meta"):
        model = LlamaForCausalLM(cfg)
    policy = dict(offload_policy=CPUOffloadPolicy(pin_memory=True),
                  mp_policy=MixedPrecisionPolicy(param_dtype=torch.bfloat16,
                                                 reduce_dtype=torch.float32))
    for layer in model.model.layers:
        fully_shard(layer, **policy)
    fully_shard(model, **policy)
    model.to_empty(device="cpu")  # CPUOffloadPolicy keeps the sharded fp32 parameters on the host
    with torch.no_grad():
        for name, p in model.named_parameters():
            if p.dim() == 1:
                p.fill_(1.0)  # the RMSNorm weights
            else:
                p.normal_(0.0, cfg.initializer_range)
    n_params = sum(p.numel() for p in model.parameters())
    opt = torch.optim.AdamW(model.parameters(), lr=3e-5, betas=(0.9, 0.95), eps=1e-8,
                            weight_decay=0.1, fused=True)
    # The rotary table is a buffer that to_empty left uninitialised: make it again on the GPU.
    model.model.rotary_emb = type(model.model.rotary_emb)(config=cfg, device="cuda")

    def train_step(batches):
        for i, ids in enumerate(batches):
            model.set_requires_gradient_sync(i == len(batches) - 1)
            loss = model(input_ids=ids, labels=ids).loss / len(batches)
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        return loss

print(f"{a.engine}: {a.layers} layers, {n_params / 1e9:.2f} B parameters, built in "
      f"{time.perf_counter() - t_build:.0f} s", flush=True)
tokens = a.micro * a.seq * a.gas
looked_up = cfg.vocab_size * cfg.hidden_size
flops_per_token = 6.0 * (n_params - looked_up) + 12.0 * a.layers * cfg.num_attention_heads * \
    head_dim * a.seq
g = torch.Generator(device="cuda").manual_seed(1)
times = []
for step in range(a.steps):
    batches = [torch.randint(256, (a.micro, a.seq), device="cuda", generator=g)
               for _ in range(a.gas)]
    torch.cuda.synchronize()
    t = time.perf_counter()
    loss = train_step(batches)
    torch.cuda.synchronize()
    dt = time.perf_counter() - t
    times.append(dt)
    print(f"step {step + 1}: loss {loss.item():.4f}, {dt * 1e3:.0f} ms, {tokens / dt:.0f} tok/s",
          flush=True)
med = statistics.median(times[a.warmup:] if len(times) > a.warmup else times)
tok_s = tokens / med
rss = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20
print(f"RESULT engine={a.engine} torch={torch.__version__} layers={a.layers} "
      f"params={n_params / 1e9:.2f}B seq={a.seq} micro={a.micro} gas={a.gas} ratio={a.ratio} "
      f"tok_s={tok_s:.0f} step_ms={med * 1e3:.0f} mfu={100 * tok_s * flops_per_token / (a.peak_tflops * 1e12):.1f}% "
      f"gpu_peak_GiB={torch.cuda.max_memory_allocated() / 2**30:.1f} host_peak_rss_GiB={rss:.1f}",
      flush=True)
os._exit(0)  # skip the engines' teardown: nothing is saved, and it can take a minute
