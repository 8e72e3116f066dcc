#!/usr/bin/env python3
"""Tokenizes text with a model's own tokenizer.json into llm.c token shards for zrt-train.

    tools/data/tokenize_hf.py --tokenizer models/llama-3.2-1b --input a.txt [b.txt ...] \\
        --out data/corpus [--val-fraction 0.05] [--shard-tokens 100000000]

Each input file is one document, preceded by a separator token (config.json's bos_token_id
beside tokenizer.json, or --separator-id; none with --separator-id -1), as llm.c's scripts do.
The first --val-fraction of the tokens (whole documents, at least one when there are two) go
to PREFIX_val_000000.bin ..., the rest to PREFIX_train_000000.bin ..., at most --shard-tokens
per shard, as zrt-data names them. The width follows the vocabulary (the larger of the
tokenizer's and config.json's vocab_size, or --vocab-size): up to 65536 ids, GPT-2 style shards
(magic 20240520, version 1, uint16 tokens); above, Llama-3 style (magic 20240801, version 7,
uint32 tokens). Every shard is written to a temporary file and fsynced, and only when all are
written are they renamed into place (a failed write, a full disk say, leaves the shards at
PREFIX as they were); shards with the same prefix and a higher number, left by an earlier run,
are removed. An id at or above the
vocabulary size is an error. Needs the `tokenizers` package from PyPI (pip install tokenizers).
"""
import argparse
import glob
import json
import os
import re
import signal
import struct
import sys

GPT2_MAGIC, GPT2_VERSION = 20240520, 1
LLAMA3_MAGIC, LLAMA3_VERSION = 20240801, 7


def fail(message):
    sys.exit("tokenize_hf: error: " + message)


def write_shard(tmp, tokens, width):
    """One shard into the temporary file `tmp`, on disk before it is renamed into place."""
    header = [0] * 256
    header[0], header[1] = (GPT2_MAGIC, GPT2_VERSION) if width == 2 else (LLAMA3_MAGIC,
                                                                          LLAMA3_VERSION)
    header[2] = len(tokens)
    with open(tmp, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%d%s" % (len(tokens), "H" if width == 2 else "I"), *tokens))
        f.flush()
        os.fsync(f.fileno())


def stage_split(prefix, split, tokens, width, shard_tokens, staged):
    """Writes a split's shards as temporary files, appending (tmp, path) pairs to `staged`;
    returns how many."""
    starts = range(0, max(len(tokens), 1), shard_tokens)
    for i, start in enumerate(starts):
        path = "%s_%s_%06d.bin" % (prefix, split, i)
        staged.append(("%s.tmp.%d" % (path, os.getpid()), path))
        write_shard(staged[-1][0], tokens[start:start + shard_tokens], width)
    return len(starts)


def stale_shards(prefix, split, count):
    """Shards of the split numbered `count` and above, left by an earlier, longer run."""
    pattern = re.compile(re.escape(os.path.basename(prefix)) + "_" + split + r"_(\d{6})\.bin$")
    stale = []
    for old in glob.glob("%s_%s_*.bin" % (prefix, split)):
        m = pattern.search(os.path.basename(old))
        if m and int(m.group(1)) >= count:
            stale.append(old)
    return stale


def write_shards(prefix, splits, width, shard_tokens):
    """Every split's shards, all written (and fsynced) before any is renamed into place, so a
    write that fails (a full disk) leaves the shards at PREFIX as they were: never a new val
    split beside an old train split. Returns the paths."""
    staged, counts = [], {}
    try:
        for split, tokens in splits:
            counts[split] = stage_split(prefix, split, tokens, width, shard_tokens, staged)
    except BaseException:
        for tmp, _ in staged:
            if os.path.lexists(tmp):
                os.remove(tmp)
        raise
    # The renames and the stale shards' removal with SIGINT and SIGTERM held back (delivered
    # after): an interrupt never leaves old and new shards mixed.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT, signal.SIGTERM})
    try:
        for tmp, path in staged:
            os.replace(tmp, path)
        for split, count in counts.items():
            for old in stale_shards(prefix, split, count):
                os.remove(old)
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
    directory = os.path.dirname(prefix) or "."
    fd = os.open(directory, os.O_RDONLY)
    try:
        os.fsync(fd)  # the renames on disk
    finally:
        os.close(fd)
    return [path for _, path in staged]


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--tokenizer", required=True, help="tokenizer.json or the directory holding it")
    p.add_argument("--input", required=True, nargs="+", help="text files, one document each")
    p.add_argument("--out", required=True, help="DIR/PREFIX of the shards")
    p.add_argument("--val-fraction", type=float, default=0.05)
    p.add_argument("--shard-tokens", type=int, default=100000000)
    p.add_argument("--vocab-size", type=int, default=0, help="default: tokenizer/config.json")
    p.add_argument("--separator-id", type=int, default=None,
                   help="token before each document (default: config.json's bos_token_id; -1: none)")
    args = p.parse_args()
    try:
        from tokenizers import Tokenizer
    except ImportError:
        fail("needs the tokenizers package (pip install tokenizers)")
    if not 0 <= args.val_fraction < 1:
        fail("--val-fraction %r: must be in [0, 1)" % args.val_fraction)
    if not 0 < args.shard_tokens <= 2147483647:
        fail("--shard-tokens %r: must be in [1, 2^31)" % args.shard_tokens)
    path = args.tokenizer
    if os.path.isdir(path):
        path = os.path.join(path, "tokenizer.json")
    if not os.path.isfile(path):
        fail("%s: no such file (a model directory holds tokenizer.json)" % path)
    tokenizer = Tokenizer.from_file(path)
    config = {}
    config_path = os.path.join(os.path.dirname(path), "config.json")
    if os.path.isfile(config_path):
        with open(config_path) as f:
            config = json.load(f)
    vocab = args.vocab_size or max(tokenizer.get_vocab_size(with_added_tokens=True),
                                   int(config.get("vocab_size") or 0))
    separator = args.separator_id
    if separator is None:
        bos = config.get("bos_token_id")
        separator = bos[0] if isinstance(bos, list) else (bos if bos is not None else -1)
    if separator >= vocab:
        fail("separator id %d is not below the vocabulary size %d" % (separator, vocab))
    width = 2 if vocab <= 65536 else 4
    documents = []
    for name in args.input:
        try:
            with open(name, "rb") as f:
                raw = f.read()
        except OSError as e:
            fail("%s: %s" % (name, e.strerror))
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            fail("%s: not UTF-8 text: byte 0x%02x at byte offset %d (convert the file, e.g. with "
                 "iconv -f latin1 -t utf-8)" % (name, raw[e.start], e.start))
        ids = tokenizer.encode(text, add_special_tokens=False).ids
        bad = [i for i in ids if i >= vocab]
        if bad:
            fail("%s: token id %d is not below the vocabulary size %d" % (name, bad[0], vocab))
        documents.append(([separator] if separator >= 0 else []) + ids)
    total = sum(len(d) for d in documents)
    val, train, seen = [], [], 0
    for i, doc in enumerate(documents):
        # Whole documents to val until the fraction is reached; the last always trains.
        to_val = seen < args.val_fraction * total and i < len(documents) - 1
        (val if to_val else train).extend(doc)
        seen += len(doc)
    splits = ([("val", val)] if args.val_fraction > 0 else []) + [("train", train)]
    try:
        out_dir = os.path.dirname(args.out)
        if out_dir:
            os.makedirs(out_dir, exist_ok=True)
        written = write_shards(args.out, splits, width, args.shard_tokens)
    except OSError as e:
        fail("writing %s: %s (nothing written; the shards at %s are as they were)"
             % (e.filename or args.out + "_*.bin", e.strerror or e, args.out))
    print("tokenize_hf: %d document(s), %d tokens (%d val, %d train), vocabulary %d: %s shards %s"
          % (len(documents), total, len(val), len(train), vocab,
             "uint16 (GPT-2 style)" if width == 2 else "uint32 (Llama-3 style)",
             " ".join(written)))


def interrupted(signum, frame):
    """SIGTERM (a job's time limit, kill) ends the run as Ctrl-C does: through the cleanup that
    removes what was half-written."""
    raise KeyboardInterrupt


if __name__ == "__main__":
    signal.signal(signal.SIGTERM, interrupted)
    try:
        main()
    except KeyboardInterrupt:
        sys.stderr.write("tokenize_hf: interrupted (the shards at the prefix are whole, old or new)\n")
        sys.exit(130)
