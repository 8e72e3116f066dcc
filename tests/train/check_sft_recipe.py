#!/usr/bin/env python3
"""The fine-tuning recipe end to end, as docs/fine-tuning.md writes it: a Hugging Face model
directory (a tiny Llama that transformers itself makes and saves, with the verse example's
byte-level ChatML tokenizer and template) -> tools/data/prepare-sft with that directory as the
tokenizer -> zrt-train from it (`model.init_from`, 2 ranks, ZeRO-3) on the packed shards ->
zrt-ckpt export --hf -> transformers loads the export with no missing or unexpected key, its
tokenizer files and chat template came through unchanged, its chat template renders the prompt
to the ids prepare-sft trained on, the weights moved, and it chats (generates a reply).

    /usr/bin/python3 tests/train/check_sft_recipe.py --zrt-train Z --zrt-ckpt C --mpiexec M \\
        --work DIR

Needs torch and transformers (Debian's python3-torch and the transformers tools/test installs for
it); exits 77 (ctest: skipped, with the reason) without them.
"""
import argparse
import json
import os
import shutil
import subprocess
import sys

SKIP = 77
HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.abspath(os.path.join(HERE, "..", ".."))


def check(condition, message):
    if not condition:
        sys.exit("FAILED: " + message)


def run(cmd, timeout=600):
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=timeout)
    if done.returncode != 0:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), done.returncode, done.stdout[-4000:]))
    return done.stdout


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--zrt-train", required=True)
    p.add_argument("--zrt-ckpt", required=True)
    p.add_argument("--mpiexec", required=True)
    p.add_argument("--work", required=True)
    a = p.parse_args()
    try:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer, LlamaConfig, LlamaForCausalLM
    except ImportError as e:
        print("skipped: %s lacks torch/transformers (%s); tools/test installs them" %
              (sys.executable, e))
        return SKIP

    shutil.rmtree(a.work, ignore_errors=True)
    os.makedirs(a.work)
    work = lambda *parts: os.path.join(a.work, *parts)  # noqa: E731

    # 1. Verse conversations and the byte-level ChatML tokenizer (the bundled example's tool, on a
    #    small corpus of its verse-line format written here).
    with open(work("corpus.txt"), "w") as f:
        for c in range(1, 9):
            for v in range(1, 31):
                f.write("Ge%d:%d And God said unto the %dth, Let there be light: and there was "
                        "light.\n" % (c, v, c * v))
    run([sys.executable, os.path.join(ROOT, "tools/data/make-verse-sft"), "--corpus",
         work("corpus.txt"), "--out", work("verses"), "--conversations", "400"])

    # 2. The Hugging Face model directory: transformers' own tiny Llama, saved, beside the
    #    tokenizer files.
    torch.manual_seed(0)
    config = LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2,
                         num_attention_heads=4, num_key_value_heads=2, vocab_size=259,
                         max_position_embeddings=256, tie_word_embeddings=False,
                         eos_token_id=257, pad_token_id=258, bos_token_id=None)
    model_dir = work("model")
    LlamaForCausalLM(config).save_pretrained(model_dir)
    for name in os.listdir(work("verses", "tokenizer")):
        shutil.copy(work("verses", "tokenizer", name), model_dir)

    # 3. prepare-sft with the model directory as the tokenizer.
    run([sys.executable, os.path.join(ROOT, "tools/data/prepare-sft"), "--tokenizer", model_dir,
         "--input", work("verses", "verses.jsonl"), "--seq-len", "128", "--output",
         work("sft")])
    summary = json.load(open(work("sft", "summary.json")))
    check(summary["train"]["loss_tokens"] > 0, "prepare-sft trained on no token: %s" % summary)

    # 4. zrt-train from the directory on the packed shards: 2 ranks, ZeRO-3, 12 steps.
    run_config = {
        "train_batch_size": 4, "train_micro_batch_size_per_gpu": 2,
        "zero_optimization": {"stage": 3},
        "model": {"type": "llama", "init_from": model_dir, "seq_len": 128},
        "data": {"train": work("sft", "train")},
        "train": {"steps": 12, "log_interval": 1},
        "optimizer": {"type": "AdamW", "params": {"lr": 3e-3}},
        "device": {"type": "cpu"},
        "checkpoint": {"save_interval": 12},
        "output_dir": work("out"),
    }
    with open(work("sft.json"), "w") as f:
        json.dump(run_config, f)
    run([a.mpiexec, "-n", "2", "--oversubscribe", "--bind-to", "none", a.zrt_train, "--config",
         work("sft.json")])
    rows = [json.loads(l) for l in open(work("out", "metrics.jsonl")) if l.strip()]
    losses = [r["loss"] for r in rows if "loss" in r]
    check(len(losses) == 12 and all(r.get("loss_tokens", 0) > 0 for r in rows if "loss" in r),
          "12 steps with loss tokens expected, got %s" % rows)
    check(losses[-1] < losses[0], "the loss did not fall: %s" % losses)

    # 5. Export as a Hugging Face directory.
    run([a.zrt_ckpt, "export", work("out", "checkpoints"), "--hf", work("hf")])
    for name in ("tokenizer.json", "tokenizer_config.json", "chat_template.jinja"):
        check(os.path.exists(work("hf", name)), "export --hf did not copy %s" % name)
        check(open(work("hf", name), "rb").read() == open(os.path.join(model_dir, name),
                                                           "rb").read(),
              "%s changed on its way through the export" % name)

    # 6. transformers loads it and chats with its template.
    model, info = AutoModelForCausalLM.from_pretrained(work("hf"), output_loading_info=True)
    check(not info["missing_keys"] and not info["unexpected_keys"],
          "from_pretrained: missing %s, unexpected %s" % (info["missing_keys"],
                                                         info["unexpected_keys"]))
    start = LlamaForCausalLM.from_pretrained(model_dir)
    moved = max((p - q).abs().max().item()
                for p, q in zip(model.parameters(), start.parameters()))
    check(moved > 1e-4, "the exported weights equal the initial ones")
    tok = AutoTokenizer.from_pretrained(work("hf"))
    messages = [{"role": "user", "content": "Ge1:3"}]
    ids = tok.apply_chat_template(messages, add_generation_prompt=True)
    text = tok.decode(ids)
    check(text == "<|im_start|>user\nGe1:3<|im_end|>\n<|im_start|>assistant\n",
          "the exported template renders %r" % text)
    # The specials are single ids after the 256 bytes; the rest are the bytes themselves.
    check(ids[0] == 256 and ids[1:5] == list(b"user"), "the exported tokenizer's ids: %s" % ids)
    with torch.no_grad():
        out = model.generate(torch.tensor([ids]), max_new_tokens=12, do_sample=False,
                             pad_token_id=258)
    reply = out[0][len(ids):]
    check(len(reply) > 0, "no reply generated")
    print("ok: loss %.4f -> %.4f over 12 steps; export loads (%d tensors moved up to %.3g); "
          "reply to Ge1:3: %r" % (losses[0], losses[-1], sum(1 for _ in model.parameters()),
                                   moved, tok.decode(reply)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
