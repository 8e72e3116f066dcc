#!/usr/bin/env python3
"""tools/data/tokenize_hf.py against the tokenizers package and zrt-data --inspect.

A BPE tokenizer trained here (vocabulary 300) gives GPT-2 style shards (uint16); a word-level
tokenizer of 70000 words gives Llama-3 style shards (uint32, ids above 65535). For each, the
shard bytes (header and tokens) must be the tokenizer's own ids with the separator before each
document, split into val and train, and zrt-data --inspect must accept them with the width named.
An id at or above --vocab-size is refused; a failed write leaves the shards as they were; an
input that is missing or not UTF-8 is named. Exits 77 (skipped, with the reason) without tokenizers.
"""
import argparse
import os
import shutil
import struct
import subprocess
import sys

SKIP = 77


def check(condition, message):
    if not condition:
        sys.exit("FAILED: " + message)


def read_shard(path):
    with open(path, "rb") as f:
        data = f.read()
    magic, version, count = struct.unpack("<3i", data[:12])
    width = {20240520: 2, 20240801: 4}[magic]
    check(len(data) == 1024 + width * count, "%s: %d bytes for %d tokens" % (path, len(data), count))
    return magic, version, list(struct.unpack("<%d%s" % (count, "H" if width == 2 else "I"),
                                              data[1024:]))


def run(cmd, expect_ok=True):
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    if expect_ok and done.returncode != 0:
        sys.exit("%s failed (%d):\n%s" % (" ".join(cmd), done.returncode, done.stdout))
    return done


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--script", required=True)
    p.add_argument("--zrt-data", required=True)
    p.add_argument("--work", required=True)
    args = p.parse_args()
    try:
        from tokenizers import Tokenizer, models, pre_tokenizers, trainers
    except ImportError as e:
        print("skipped: %s lacks the tokenizers package (%s): pip install tokenizers"
              % (sys.executable, e))
        return SKIP
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    docs = ["In the beginning God created the heaven and the earth. " * 20,
            "And the earth was without form, and void; and darkness was upon the deep. " * 20,
            "And God said, Let there be light: and there was light. " * 20]
    inputs = []
    for i, text in enumerate(docs):
        inputs.append(os.path.join(args.work, "doc%d.txt" % i))
        with open(inputs[-1], "w") as f:
            f.write(text)

    # BPE, vocabulary 300: uint16 shards; separator 0 from config.json's bos_token_id.
    bpe = Tokenizer(models.BPE(unk_token="[UNK]"))
    bpe.pre_tokenizer = pre_tokenizers.Whitespace()
    bpe.train_from_iterator(docs, trainers.BpeTrainer(vocab_size=300, special_tokens=["<s>", "[UNK]"]))
    small = os.path.join(args.work, "small")
    os.makedirs(small)
    bpe.save(os.path.join(small, "tokenizer.json"))
    with open(os.path.join(small, "config.json"), "w") as f:
        f.write('{"vocab_size": 300, "bos_token_id": 0}')
    out = run([sys.executable, args.script, "--tokenizer", small, "--input"] + inputs +
              ["--out", os.path.join(args.work, "s/corpus"), "--val-fraction", "0.2"]).stdout
    check("uint16 (GPT-2 style)" in out, out)
    ids = [[0] + bpe.encode(t, add_special_tokens=False).ids for t in docs]
    magic, version, val = read_shard(os.path.join(args.work, "s/corpus_val_000000.bin"))
    check((magic, version) == (20240520, 1), "uint16 header %d %d" % (magic, version))
    check(val == ids[0], "val shard is not document 0's ids")
    _, _, train = read_shard(os.path.join(args.work, "s/corpus_train_000000.bin"))
    check(train == ids[1] + ids[2], "train shard is not documents 1-2's ids")
    inspect = run([args.zrt_data, "--inspect", os.path.join(args.work, "s/corpus_*.bin"),
                   "--seq-len", "8"]).stdout
    check("uint16, GPT-2 style" in inspect and "%d tokens" % (len(val) + len(train)) in inspect,
          inspect)

    # Word level, 70000 words: uint32 shards with ids above 65535, no separator.
    vocab = {"[UNK]": 0}
    for i in range(1, 70000):
        vocab["w%d" % i] = i
    words = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    words.pre_tokenizer = pre_tokenizers.Whitespace()
    big = os.path.join(args.work, "big")
    os.makedirs(big)
    words.save(os.path.join(big, "tokenizer.json"))
    text = " ".join("w%d" % (69999 - 37 * i) for i in range(500))
    with open(os.path.join(args.work, "words.txt"), "w") as f:
        f.write(text)
    out = run([sys.executable, args.script, "--tokenizer", os.path.join(big, "tokenizer.json"),
               "--input", os.path.join(args.work, "words.txt"), "--out",
               os.path.join(args.work, "b/words"), "--val-fraction", "0", "--shard-tokens",
               "200"]).stdout
    check("uint32 (Llama-3 style)" in out, out)
    got = []
    for i in range(3):
        magic, version, part = read_shard(os.path.join(args.work, "b/words_train_%06d.bin" % i))
        check((magic, version) == (20240801, 7), "uint32 header %d %d" % (magic, version))
        got += part
    check(got == [69999 - 37 * i for i in range(500)], "uint32 tokens differ")
    check(max(got) > 65535, "no id above uint16")
    inspect = run([args.zrt_data, "--inspect", os.path.join(args.work, "b/words_train_*.bin")]).stdout
    check("uint32, Llama-3 style" in inspect and "3 shard(s), 500 tokens" in inspect, inspect)

    # A vocabulary smaller than the tokenizer's ids is refused, naming the id.
    bad = run([sys.executable, args.script, "--tokenizer", big, "--input",
               os.path.join(args.work, "words.txt"), "--out", os.path.join(args.work, "c/x"),
               "--vocab-size", "60000"], expect_ok=False)
    check(bad.returncode != 0 and "token id 69999 is not below the vocabulary size 60000"
          in bad.stdout, bad.stdout)
    # A write that fails (the file-size limit here, EFBIG, as a full disk would) over existing
    # shards: one plain error, no temporary file left, the old shards as they were (never a new
    # val split beside an old train split).
    before = {}
    for name in sorted(os.listdir(os.path.join(args.work, "s"))):
        with open(os.path.join(args.work, "s", name), "rb") as f:
            before[name] = f.read()

    def limited():
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (1500, 1500))  # the val shard fits, train not

    longer = os.path.join(args.work, "longer.txt")
    with open(longer, "w") as f:
        f.write(docs[2] * 10)
    done = subprocess.run([sys.executable, args.script, "--tokenizer", small, "--input", inputs[0],
                           longer, "--out", os.path.join(args.work, "s/corpus"),
                           "--val-fraction", "0.2"], stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, preexec_fn=limited)
    check(done.returncode == 1 and "tokenize_hf: error: writing " in done.stdout
          and "File too large (nothing written; the shards at" in done.stdout
          and "Traceback" not in done.stdout, "a failed write: %s" % done.stdout)
    after = {}
    for name in sorted(os.listdir(os.path.join(args.work, "s"))):
        with open(os.path.join(args.work, "s", name), "rb") as f:
            after[name] = f.read()
    check(after == before, "a failed write changed the shards: %s" % sorted(after))

    # Inputs that cannot be read: named, without a traceback.
    latin = os.path.join(args.work, "latin1.txt")
    with open(latin, "wb") as f:
        f.write(b"caf\xe9")
    for name, expected in ((latin, "latin1.txt: not UTF-8 text: byte 0xe9 at byte offset 3"),
                           (os.path.join(args.work, "missing.txt"),
                            "missing.txt: No such file or directory")):
        bad = run([sys.executable, args.script, "--tokenizer", small, "--input", name, "--out",
                   os.path.join(args.work, "d/x")], expect_ok=False)
        check(bad.returncode == 1 and expected in bad.stdout and "Traceback" not in bad.stdout,
              bad.stdout)
    print("ok: uint16 and uint32 shards equal the tokenizers package's ids; a failed write leaves "
          "the shards as they were; unreadable inputs are named")
    return 0


if __name__ == "__main__":
    sys.exit(main())
