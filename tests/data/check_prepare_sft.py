#!/usr/bin/env python3
"""tools/data/prepare-sft against transformers' goldens, the shard format and its error cases.

    check_prepare_sft.py --script tools/data/prepare-sft --work DIR

With the fixture tokenizers of tests/data/sft (Llama-3 and Qwen2.5 templates, a template with
{% generation %} blocks, SmolLM3's) and conversations in all four input forms (TRL's
language-modeling text records mixed with a chat record, Llama 3.1's ipython role, and
chat_template_kwargs, per record and from --chat-template-kwargs, too):
  * every conversation's ids and loss mask equal goldens.json (transformers' apply_chat_template
    ids and masks, tests/data/make_sft_goldens.py), unpacked and packed, for --train-on
    assistant and last-assistant; with transformers installed, goldens.json is recomputed and
    must agree; --train-on all marks every token;
  * every shard parses with the reader below (written from docs/fine-tuning.md, not from the
    script): header, exact file size, document pointers and ends, padding = pad id with mask 0;
    packed documents are whole conversations, each exactly once, none split;
  * overlong conversations are dropped, truncated or split (pieces overlapping by one token, every
    target kept) and counted; the val split (fraction or
    file) is whole conversations; --shard-sequences splits shards; runs are deterministic;
  * each error (malformed JSON, unknown role, missing content, a template that raises, a
    tokenizer without a template, an id >= --vocab-size, an existing output) exits 1 with
    prepare-sft: error: FILE:LINE: ... and leaves nothing behind; so do a failed write (an old
    OUT kept) and SIGTERM while reading or writing (exit 130);
  * a realistic length mix (lognormal, median ~300 tokens) packs into 4096 at >= 95%; long text
    records (median ~3000 tokens) in 2048 keep every target with --overlong split (as many as
    the records whole), more than truncate, more than drop, and pack at >= 95%.
Needs tokenizers and jinja2 (tools/install-python-deps installs them, and transformers).
"""
import argparse
import json
import math
import os
import random
import re
import shutil
import signal
import struct
import subprocess
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
SFT = os.path.join(HERE, "sft")
MAGIC, VERSION = 20251201, 1


def check(condition, message):
    if not condition:
        sys.exit("FAILED: " + message)


def run(args, cmd, expect_ok=True):
    done = subprocess.run([sys.executable, args.script] + cmd, stdout=subprocess.PIPE,
                          stderr=subprocess.PIPE, text=True)
    if expect_ok and done.returncode != 0:
        sys.exit("FAILED: prepare-sft %s exited %d:\n%s%s"
                 % (" ".join(cmd), done.returncode, done.stdout, done.stderr))
    return done


# --- An independent reader of the packed SFT shard format (docs/fine-tuning.md) -------------

def read_shard(path):
    """The shard's header and sequences: [(tokens, mask, [(start, end) of each document])]."""
    with open(path, "rb") as f:
        data = f.read()
    check(len(data) >= 1024, "%s: %d bytes, shorter than the header" % (path, len(data)))
    header = struct.unpack("<256i", data[:1024])
    magic, version, S, T, D, token_bytes, vocab, pad = header[:8]
    check((magic, version, token_bytes) == (MAGIC, VERSION, 4),
          "%s: magic %d version %d token_bytes %d" % (path, magic, version, token_bytes))
    check(all(h == 0 for h in header[8:]), "%s: header words 8.. are not 0" % path)
    check(S >= 1 and T >= 1 and D >= S, "%s: S %d T %d D %d" % (path, S, T, D))
    check(len(data) == 1024 + S * T * 5 + (S + 1) * 8 + D * 4,
          "%s: %d bytes, the format says %d" % (path, len(data), 1024 + S * T * 5 + (S + 1) * 8 + D * 4))
    at = 1024
    tokens = struct.unpack("<%dI" % (S * T), data[at:at + 4 * S * T])
    at += 4 * S * T
    mask = data[at:at + S * T]
    at += S * T
    doc_ptr = struct.unpack("<%dq" % (S + 1), data[at:at + 8 * (S + 1)])
    at += 8 * (S + 1)
    doc_end = struct.unpack("<%di" % D, data[at:at + 4 * D])
    check(doc_ptr[0] == 0 and doc_ptr[S] == D, "%s: doc_ptr %d .. %d, D %d" % (path, doc_ptr[0], doc_ptr[S], D))
    check(set(mask) <= {0, 1}, "%s: a mask byte other than 0 or 1" % path)
    check(max(tokens) < vocab and 0 <= pad < vocab, "%s: an id or the pad id not below %d" % (path, vocab))
    sequences = []
    for s in range(S):
        check(doc_ptr[s + 1] - doc_ptr[s] >= 1, "%s: sequence %d has no document" % (path, s))
        toks, m = tokens[s * T:(s + 1) * T], mask[s * T:(s + 1) * T]
        docs, start = [], 0
        for end in doc_end[doc_ptr[s]:doc_ptr[s + 1]]:
            check(start < end <= T, "%s: sequence %d: document ends %d after %d (T %d)" % (path, s, end, start, T))
            docs.append((start, end))
            start = end
        check(all(t == pad for t in toks[start:]), "%s: sequence %d: padding is not the pad id" % (path, s))
        check(not any(m[start:]), "%s: sequence %d: a loss target in the padding" % (path, s))
        sequences.append((toks, m, docs))
    return {"S": S, "T": T, "D": D, "vocab": vocab, "pad": pad}, sequences


def read_output(out, split="train"):
    """summary.json and every document of a split, as (ids, mask string), in file order."""
    with open(os.path.join(out, "summary.json")) as f:
        summary = json.load(f)
    docs, sequences = [], 0
    check(summary[split]["shards"], "%s: no %s shards" % (out, split))
    for shard in summary[split]["shards"]:
        header, seqs = read_shard(os.path.join(out, shard))
        check(header["T"] == summary["seq_len"] and header["pad"] == summary["pad_id"]
              and header["vocab"] == summary["vocab_size"], "%s: header disagrees with summary" % shard)
        sequences += len(seqs)
        for toks, m, spans in seqs:
            for a, b in spans:
                docs.append((list(toks[a:b]), "".join(str(x) for x in m[a:b])))
    real = sum(len(d[0]) for d in docs)
    s = summary[split]
    check((s["sequences"], s["documents"], s["tokens"]) == (sequences, len(docs), real),
          "%s: summary says %d sequences, %d documents, %d tokens; the shards hold %d, %d, %d"
          % (out, s["sequences"], s["documents"], s["tokens"], sequences, len(docs), real))
    check(abs(s["packing_efficiency"] - real / float(sequences * summary["seq_len"])) < 1e-9,
          "%s: packing efficiency" % out)
    check(s["loss_tokens"] == sum(m[1:].count("1") for _, m in docs), "%s: loss_tokens" % out)
    return summary, docs


def match_goldens(docs, expected, what):
    """Every document is exactly one expected conversation (ids and mask), each exactly once."""
    remaining = {}
    for ids, mask in expected:
        remaining.setdefault(tuple(ids), []).append(mask)
    for ids, mask in docs:
        masks = remaining.get(tuple(ids))
        check(masks, "%s: a document (%d tokens) is no whole conversation of the goldens: a split "
              "or wrong ids? %s" % (what, len(ids), ids[:20]))
        check(mask in masks, "%s: loss mask of a %d-token conversation differs from the golden:\n"
              "  got    %s\n  golden %s" % (what, len(ids), mask, masks[0]))
        masks.remove(mask)
    left = sum(len(m) for m in remaining.values())
    check(left == 0, "%s: %d golden conversation(s) missing from the output" % (what, left))


def golden_case(goldens, tokenizer, data, train_on):
    for case in goldens["cases"]:
        if (case["tokenizer"], case["input"], case["train_on"]) == (tokenizer, data, train_on) \
                and "chat_template" not in case:
            return case["conversations"]
    sys.exit("FAILED: goldens.json has no case %s %s %s" % (tokenizer, data, train_on))


def kept(entries):
    return [(e["ids"], e["mask"]) for e in entries if "ids" in e]


# --- The checks --------------------------------------------------------------------------------

def check_goldens(args, goldens):
    for case in goldens["cases"]:
        name, data, train_on = case["tokenizer"], case["input"], case["train_on"]
        expected = kept(case["conversations"])
        check(any("0" in m for _, m in expected) and any("1" in m for _, m in expected),
              "goldens %s/%s: masks are all zeros or all ones" % (name, data))
        # A case with its own template: --chat-template FILE over the tokenizer's.
        template = case.get("chat_template")
        template_args = ["--chat-template", os.path.join(SFT, template)] if template else []
        for packed in (False, True):
            out = os.path.join(args.work, "golden-%s-%s-%s-%d%s" % (
                name, data, train_on, packed, "-template" if template else ""))
            run(args, ["--tokenizer", os.path.join(SFT, name), "--input", os.path.join(SFT, data),
                       "--output", out, "--seq-len", "256", "--train-on", train_on]
                + ([] if packed else ["--no-pack"]) + template_args)
            summary, docs = read_output(out)
            what = "%s %s --train-on %s%s%s" % (name, data, train_on, "" if packed else " --no-pack",
                                               " --chat-template " + template if template else "")
            if template:
                check(summary["chat_template"] == os.path.join(SFT, template),
                      "%s: summary's chat_template %s" % (what, summary["chat_template"]))
            match_goldens(docs, expected, what)
            dropped = [e["dropped"] for e in case["conversations"] if "dropped" in e]
            check((summary["dropped_empty"], summary["dropped_no_loss_token"], summary["kept"],
                   summary["conversations_read"])
                  == (dropped.count("empty"), dropped.count("no_loss_token"), len(expected),
                      len(case["conversations"])), "%s: drop counts %s" % (what, summary))
            if name == "qwen2.5" and data == "chat.jsonl" and not template:
                # Line 3's answer starts with a newline, which Qwen's tokenizer merges with the
                # generation prompt's: the prefix rule falls back to character offsets.
                check(summary["prefix_rule_offset_fallbacks"] == 1, "%s: fallbacks %d, expected 1"
                      % (what, summary["prefix_rule_offset_fallbacks"]))
            shards = sorted(os.path.join("train", n) for n in os.listdir(os.path.join(out, "train")))
            check(shards == sorted(summary["train"]["shards"]), "%s: summary lists %s, the directory "
                  "holds %s" % (what, summary["train"]["shards"], shards))
            if not packed:
                check(summary["train"]["sequences"] == len(expected), "%s: not one per sequence" % what)
            else:
                check(summary["train"]["sequences"] < len(expected), "%s: nothing was packed" % what)
        print("ok: %s %s --train-on %s%s: %d conversations equal transformers' ids and masks, "
              "packed and not" % (name, data, train_on,
                                  " --chat-template " + template if template else "", len(expected)))


def check_train_on_all(args, goldens):
    entries = golden_case(goldens, "qwen2.5", "chat.jsonl", "assistant")
    expected = kept(entries)
    out = os.path.join(args.work, "all")
    run(args, ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--input", os.path.join(SFT, "chat.jsonl"),
               "--output", out, "--seq-len", "256", "--train-on", "all"])
    summary, docs = read_output(out)
    check(all(set(m) == {"1"} for _, m in docs), "--train-on all: a token is not a target")
    # With every token a target, a conversation without an assistant answer is kept too.
    known = set(tuple(ids) for ids, _ in expected)
    extra = [d for d in docs if tuple(d[0]) not in known]
    check(len(extra) == sum(1 for e in entries if e.get("dropped") == "no_loss_token"),
          "--train-on all: %d documents beyond the goldens" % len(extra))
    match_goldens([d for d in docs if tuple(d[0]) in known],
                  [(ids, "1" * len(ids)) for ids, _ in expected], "--train-on all")
    print("ok: --train-on all marks every token of every conversation")


def check_overlong(args, goldens):
    entries = golden_case(goldens, "llama3", "chat.jsonl", "assistant")
    expected = kept(entries)
    lengths = sorted(len(ids) for ids, _ in expected)
    seq_len = lengths[len(lengths) // 2]  # about half are longer
    longer = [(ids, m) for ids, m in expected if len(ids) > seq_len]
    check(longer, "overlong: no conversation is longer than %d" % seq_len)
    base = ["--tokenizer", os.path.join(SFT, "llama3"), "--input", os.path.join(SFT, "chat.jsonl"),
            "--seq-len", str(seq_len)]
    out = os.path.join(args.work, "overlong-drop")
    run(args, base + ["--output", out])
    summary, docs = read_output(out)
    check(summary["dropped_overlong"] == len(longer) and summary["truncated"] == 0,
          "--overlong drop: %d dropped, expected %d" % (summary["dropped_overlong"], len(longer)))
    match_goldens(docs, [(ids, m) for ids, m in expected if len(ids) <= seq_len], "--overlong drop")
    out = os.path.join(args.work, "overlong-truncate")
    run(args, base + ["--output", out, "--overlong", "truncate"])
    summary, docs = read_output(out)
    cut = [(ids[:seq_len], m[:seq_len]) for ids, m in expected]
    keep = [(ids, m) for ids, m in cut if "1" in m[1:]]
    # truncated counts the kept ones only: a conversation cut before its first trained token is
    # dropped, counted once, as without a loss token.
    kept_cut = [1 for ids, m in longer if "1" in m[:seq_len][1:]]
    check(summary["truncated"] == len(kept_cut) and summary["dropped_overlong"] == 0
          and summary["dropped_no_loss_token"] == len(cut) - len(keep)
          + sum(1 for e in entries if e.get("dropped") == "no_loss_token"),
          "--overlong truncate: counts %s" % summary)
    match_goldens(docs, keep, "--overlong truncate")
    check(any(len(ids) == seq_len for ids, _ in docs), "--overlong truncate: nothing truncated to T")
    # Cut shorter, to the median position of the first trained token: some conversations lose
    # every trained token (dropped, counted once as without a loss token, not as truncated).
    firsts = sorted(m.index("1", 1) for ids, m in expected if "1" in m[1:])
    short = firsts[len(firsts) // 2]
    out = os.path.join(args.work, "overlong-truncate-short")
    run(args, ["--tokenizer", os.path.join(SFT, "llama3"), "--input",
               os.path.join(SFT, "chat.jsonl"), "--seq-len", str(short), "--output", out,
               "--overlong", "truncate"])
    summary, _ = read_output(out)
    longer_short = [m for ids, m in expected if len(ids) > short]
    kept_short = [m for m in longer_short if "1" in m[:short][1:]]
    check(len(kept_short) < len(longer_short), "--seq-len %d: none cut to no loss token" % short)
    check(summary["truncated"] == len(kept_short)
          and summary["dropped_no_loss_token"] == len(longer_short) - len(kept_short)
          + sum(1 for e in entries if e.get("dropped") == "no_loss_token"),
          "--overlong truncate at %d: counts %s" % (short, summary))
    print("ok: --seq-len %d: %d overlong conversation(s) dropped, or truncated to %d tokens "
          "(%d kept); at %d, %d cut to no loss token counted once, as dropped"
          % (seq_len, len(longer), seq_len, len(kept_cut), short,
             len(longer_short) - len(kept_short)))


def expected_pieces(ids, mask, seq_len):
    """--overlong split as docs/fine-tuning.md states it: piece k is tokens [k(T-1), k(T-1) + T),
    the last one ending with the conversation; pieces without a target after their first token
    are dropped."""
    if len(ids) <= seq_len:
        return [(ids, mask)]
    pieces = []
    for start in range(0, len(ids) - 1, seq_len - 1):
        piece = (ids[start:start + seq_len], mask[start:start + seq_len])
        if "1" in piece[1][1:]:
            pieces.append(piece)
        if start + seq_len >= len(ids):
            break
    return pieces


def check_overlong_split(args, goldens):
    """--overlong split keeps every target: the documents are the pieces of the rule, and the
    loss tokens are the unsplit conversations' loss tokens, to the token."""
    expected = (kept(golden_case(goldens, "llama3", "chat.jsonl", "assistant"))
                + kept(golden_case(goldens, "llama3", "text.jsonl", "assistant")))
    for seq_len in (2, 17, 40):
        out = os.path.join(args.work, "overlong-split-%d" % seq_len)
        done = run(args, ["--tokenizer", os.path.join(SFT, "llama3"), "--input",
                          os.path.join(SFT, "chat.jsonl"), os.path.join(SFT, "text.jsonl"),
                          "--seq-len", str(seq_len), "--overlong", "split", "--output", out,
                          "--val-fraction", "0.3"])
        summary, train = read_output(out, "train")
        _, val = read_output(out, "val")
        docs = train + val
        check(all(len(ids) <= seq_len for ids, _ in docs), "--overlong split: a document over T")
        pieces = [p for ids, m in expected for p in expected_pieces(ids, m, seq_len)]
        match_goldens(docs, pieces, "--overlong split at %d" % seq_len)
        targets = sum(m[1:].count("1") for _, m in expected)
        got = summary["train"]["loss_tokens"] + summary["val"]["loss_tokens"]
        check(got == targets, "--overlong split at %d: %d loss tokens, the unsplit conversations "
              "have %d" % (seq_len, got, targets))
        longer = [ids for ids, _ in expected if len(ids) > seq_len]
        all_pieces = sum(len(range(0, len(ids) - 1, seq_len - 1)) for ids in longer)
        dropped = all_pieces - sum(len(expected_pieces(ids, m, seq_len))
                                   for ids, m in expected if len(ids) > seq_len)
        check(summary["split"] == len(longer) and summary["truncated"] == 0
              and summary["dropped_overlong"] == 0 and summary["kept"] == len(expected)
              and summary["split_pieces_dropped_no_loss_token"] == dropped,
              "--overlong split at %d: counts %s" % (seq_len, summary))
        # The val split takes whole conversations: no conversation has pieces on both sides.
        conversations = summary["train"]["conversations"] + summary["val"]["conversations"]
        check(conversations == len(expected), "--overlong split: %d conversations in the splits, "
              "%d kept" % (conversations, len(expected)))
        owner = {}
        for ids, m in expected:
            for p in expected_pieces(ids, m, seq_len):
                owner.setdefault(tuple(p[0]), set()).add(tuple(ids))
        # Pieces of one conversation only say whose they are (at T = 2, [BOS, <|start...|>] is
        # everyone's).
        def owners(docs):
            return set(o for ids, _ in docs for o in owner[tuple(ids)] if len(owner[tuple(ids)]) == 1)
        train_owners, val_owners = owners(train), owners(val)
        check(not train_owners & val_owners, "--overlong split: a conversation in both splits")
        check("%d split" % len(longer) in done.stdout, "--overlong split: the count is not printed")
    done = run(args, ["--tokenizer", os.path.join(SFT, "llama3"), "--input",
                      os.path.join(SFT, "text.jsonl"), "--seq-len", "1", "--overlong", "split",
                      "--output", os.path.join(args.work, "overlong-split-1")], expect_ok=False)
    check(done.returncode == 1 and "--overlong split needs --seq-len of at least 2" in done.stderr
          and not os.path.exists(os.path.join(args.work, "overlong-split-1")),
          "--overlong split at --seq-len 1: %d %s" % (done.returncode, done.stderr))
    print("ok: --overlong split at T = 2, 17, 40: the documents are the pieces of the rule, every "
          "target of %d conversations kept, none across the val split" % len(expected))


def check_val_and_shards(args, goldens):
    chat = kept(golden_case(goldens, "qwen2.5", "chat.jsonl", "assistant"))
    share = kept(golden_case(goldens, "qwen2.5", "sharegpt.jsonl", "assistant"))
    base = ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--seq-len", "256"]
    out = os.path.join(args.work, "val-fraction")
    run(args, base + ["--input", os.path.join(SFT, "chat.jsonl"), "--output", out,
                      "--val-fraction", "0.4", "--shard-sequences", "1", "--no-pack"])
    _, train = read_output(out, "train")
    summary, val = read_output(out, "val")
    check(len(val) == round(0.4 * (len(train) + len(val))), "--val-fraction 0.4: %d val of %d"
          % (len(val), len(train) + len(val)))
    check(len(summary["train"]["shards"]) == len(train) and summary["train"]["shards"][0]
          == "train/sft_000000.bin", "--shard-sequences 1: shards %s" % summary["train"]["shards"])
    match_goldens(train + val, chat, "--val-fraction")
    out = os.path.join(args.work, "val-file")
    run(args, base + ["--input", os.path.join(SFT, "chat.jsonl"), "--output", out,
                      "--val", os.path.join(SFT, "sharegpt.jsonl")])
    _, val = read_output(out, "val")
    match_goldens(val, share, "--val FILE")
    print("ok: val splits are whole conversations; --shard-sequences 1 gives one shard per sequence")


def check_templates(args, goldens):
    """chat_template.jinja wins over tokenizer_config.json's; a list of named templates gives
    "default"; the same tokenizer.json gives the same ids either way."""
    with open(os.path.join(SFT, "qwen2.5", "tokenizer_config.json")) as f:
        config = json.load(f)
    qwen_template = config["chat_template"]
    with open(os.path.join(SFT, "chatml-generation", "chat_template.jinja")) as f:
        generation_template = f.read()
    named = os.path.join(args.work, "tok-named")
    shutil.copytree(os.path.join(SFT, "qwen2.5"), named)
    with open(os.path.join(named, "tokenizer_config.json"), "w") as f:
        json.dump(dict(config, chat_template=[{"name": "rag", "template": "{{ raise_exception('not me') }}"},
                                              {"name": "default", "template": qwen_template},
                                              {"name": "gen", "template": generation_template}]), f)
    jinja = os.path.join(args.work, "tok-jinja")
    shutil.copytree(os.path.join(SFT, "qwen2.5"), jinja)
    with open(os.path.join(jinja, "chat_template.jinja"), "w") as f:
        f.write(generation_template)
    for directory, golden in ((named, "qwen2.5"), (jinja, "chatml-generation")):
        out = os.path.join(args.work, "out-" + os.path.basename(directory))
        run(args, ["--tokenizer", directory, "--input", os.path.join(SFT, "chat.jsonl"),
                   "--output", out, "--seq-len", "256"])
        match_goldens(read_output(out)[1], kept(golden_case(goldens, golden, "chat.jsonl", "assistant")),
                      os.path.basename(directory))
    # --chat-template NAME picks a named one (apply_chat_template(chat_template=NAME)).
    out = os.path.join(args.work, "out-named-gen")
    run(args, ["--tokenizer", named, "--input", os.path.join(SFT, "chat.jsonl"), "--output", out,
               "--seq-len", "256", "--chat-template", "gen"])
    match_goldens(read_output(out)[1],
                  kept(golden_case(goldens, "chatml-generation", "chat.jsonl", "assistant")),
                  "--chat-template gen")
    done = run(args, ["--tokenizer", named, "--input", os.path.join(SFT, "chat.jsonl"), "--output",
                      os.path.join(args.work, "out-named-rag"), "--seq-len", "256",
                      "--chat-template", "rag"], expect_ok=False)
    check(done.returncode == 1 and "not me" in done.stderr, "--chat-template rag: %s" % done.stderr)
    print("ok: chat_template.jinja wins over tokenizer_config.json; named templates give default; "
          "--chat-template NAME picks one")


def check_template_kwargs(args, goldens):
    """--chat-template-kwargs reaches every render of every record, and a record's own
    chat_template_kwargs win over it: SmolLM3's enable_thinking false (empty think blocks in
    every answer) given on the command line gives smollm3_kwargs.jsonl's goldens (transformers'
    apply_chat_template(..., enable_thinking=False)) for smollm3.jsonl's conversations, and that
    file's last record, which sets it true, keeps its own."""
    smollm3 = os.path.join(SFT, "smollm3")
    flag = ["--chat-template-kwargs", '{"enable_thinking": false}']
    for train_on in ("assistant", "last-assistant"):
        with_kwargs = kept(golden_case(goldens, "smollm3", "smollm3_kwargs.jsonl", train_on))
        plain = kept(golden_case(goldens, "smollm3", "smollm3.jsonl", train_on))
        check(with_kwargs[:len(plain)] != plain, "enable_thinking false changes nothing in the goldens")
        out = os.path.join(args.work, "kwargs-flag-%s" % train_on)
        run(args, ["--tokenizer", smollm3, "--input", os.path.join(SFT, "smollm3.jsonl"),
                   "--output", out, "--seq-len", "256", "--train-on", train_on] + flag)
        summary, docs = read_output(out)
        check(summary["chat_template_kwargs"] == {"enable_thinking": False},
              "summary.json's chat_template_kwargs: %s" % summary["chat_template_kwargs"])
        match_goldens(docs, with_kwargs[:len(plain)], "--chat-template-kwargs, %s" % train_on)
        out = os.path.join(args.work, "kwargs-record-%s" % train_on)
        run(args, ["--tokenizer", smollm3, "--input", os.path.join(SFT, "smollm3_kwargs.jsonl"),
                   "--output", out, "--seq-len", "256", "--train-on", train_on] + flag)
        match_goldens(read_output(out)[1], with_kwargs, "a record's kwargs over the flag's, %s" % train_on)
    print("ok: --chat-template-kwargs reaches every render; a record's chat_template_kwargs win")


def check_determinism(args):
    base = ["--tokenizer", os.path.join(SFT, "llama3"), "--input", os.path.join(SFT, "chat.jsonl"),
            os.path.join(SFT, "sharegpt.jsonl"), os.path.join(SFT, "prompt_completion.jsonl"),
            "--seq-len", "512"]
    shards = []
    for name, seed in (("seed-a", "1"), ("seed-b", "1")):
        out = os.path.join(args.work, name)
        run(args, base + ["--output", out, "--seed", seed])
        with open(os.path.join(out, "train", "sft_000000.bin"), "rb") as f:
            shards.append(f.read())
    check(shards[0] == shards[1], "two runs with --seed 1 differ")
    # --overwrite replaces an output; without it an existing one is an error.
    out = os.path.join(args.work, "seed-a")
    done = run(args, base + ["--output", out], expect_ok=False)
    check(done.returncode == 1 and "exists" in done.stderr, "an existing --output was not refused")
    run(args, base + ["--output", out, "--overwrite", "--seed", "2"])
    read_output(out)
    print("ok: the same seed gives the same bytes; an existing output needs --overwrite")


def check_errors(args):
    qwen, gen = os.path.join(SFT, "qwen2.5"), os.path.join(SFT, "chatml-generation")
    bare = os.path.join(args.work, "tok-bare")
    shutil.copytree(qwen, bare)
    with open(os.path.join(bare, "tokenizer_config.json")) as f:
        config = json.load(f)
    del config["chat_template"]
    with open(os.path.join(bare, "tokenizer_config.json"), "w") as f:
        json.dump(config, f)
    # A template that renders the last message differently, so a conversation's beginning does
    # not render as the beginning of its render: the prefix rule cannot place the answers.
    unstable = os.path.join(args.work, "tok-unstable")
    shutil.copytree(qwen, unstable)
    with open(os.path.join(unstable, "chat_template.jinja"), "w") as f:
        f.write("{% for m in messages %}{% if loop.last %}LAST {% endif %}{{ m.content }}\n{% endfor %}")
    good = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
    cases = [
        ("malformed JSON", qwen, [good, '{"messages": [', good], [], 2, r"malformed JSON"),
        ("unknown role", qwen, [good, good, '{"messages": [{"role": "robot", "content": "beep"}]}'],
         [], 3, r"messages\[0\]: unknown role \"robot\""),
        ("unknown ShareGPT role", qwen, ['{"conversations": [{"from": "bot", "value": "x"}]}'], [], 1,
         r"conversations\[0\]: unknown role \"bot\""),
        ("missing content", qwen, [good, '{"messages": [{"role": "user"}]}'], [], 2,
         r"messages\[0\]: missing content"),
        ("missing ShareGPT value", qwen, ['{"conversations": [{"from": "human"}]}'], [], 1,
         r"missing content"),
        ("a template that raises", gen, [good, '{"messages": [{"role": "assistant", "content": "first"}]}'],
         [], 2, r"the chat template refused the conversation: Conversations must start with a "
                r"system or user message, not assistant"),
        ("a tokenizer without a chat template", bare, [good], [], 1, r"has no chat template"),
        ("a template whose prefixes are not prefixes", unstable, [good], [], 1,
         r"does not render the conversation's first 1 message\(s\) as a prefix"),
        ("an id >= the vocabulary", qwen, [good], ["--vocab-size", "501"], 1,
         r"token id \d+ is not below the vocabulary size 501"),
        ("no known form", qwen, [good, '{"content": "hi"}'], [], 2,
         r"a record needs messages, prompt and completion, conversations, or text"),
        ("a preference record", qwen,
         [good, '{"prompt": "2+2?", "chosen": "4", "rejected": "5"}'], [], 2,
         r"a preference record \(prompt, chosen, rejected: TRL's form for DPO\) is not SFT data"),
        ("a language-modeling text that is not a string", qwen, ['{"text": ["a", "b"]}'], [], 1,
         r"text must be a string, not list"),
        ("chat_template_kwargs that are not an object", qwen,
         [good, '{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": [1]}'],
         [], 2, r"chat_template_kwargs must be an object of keyword arguments for the chat "
                r"template, not list"),
        ("chat_template_kwargs naming the conversation's own variable", qwen,
         ['{"messages": [{"role": "user", "content": "hi"}], "chat_template_kwargs": '
          '{"add_generation_prompt": true}}'], [], 1,
         r"chat_template_kwargs: \"add_generation_prompt\" is the conversation's own"),
        ("an unknown role next to ipython", qwen,
         ['{"messages": [{"role": "ipython", "content": "1"}, {"role": "function", "content": "2"}]}'],
         [], 1, r"messages\[1\]: unknown role \"function\" \(expected system, user, assistant, "
                r"tool, ipython\)"),
        ("a prompt string with a completion list", qwen,
         ['{"prompt": "a", "completion": [{"role": "assistant", "content": "b"}]}'], [], 1,
         r"two strings or two message lists"),
        ("bytes that are not UTF-8", qwen,
         [good, b'{"messages": [{"role": "user", "content": "caf\xe9"}]}'], [], 2,
         r"not UTF-8 text: byte 0xe9 at byte 47 of the line"),
        ("a byte-order mark, then bytes that are not UTF-8 (counted from the mark)", qwen,
         [b'\xef\xbb\xbf{"messages": [{"role": "user", "content": "caf\xe9"}]}'], [], 1,
         r"not UTF-8 text: byte 0xe9 at byte 50 of the line"),
        ("lines ended by a bare CR (old Mac files): the second is line 2", qwen,
         [good + "\r" + '{"messages": [' + "\r" + good], [], 2, r"malformed JSON"),
        ("a lone surrogate escape", qwen,
         [good, '{"messages": [{"role": "user", "content": "half \\ud800 a pair"}]}'], [], 2,
         r"a lone surrogate escape \(\\ud800\) after \"half \": not a Unicode character"),
    ]
    for what, tokenizer, lines, extra, line, pattern in cases:
        path = os.path.join(args.work, "bad.jsonl")
        with open(path, "wb") as f:
            f.write(b"\n".join(x if isinstance(x, bytes) else x.encode() for x in lines) + b"\n")
        out = os.path.join(args.work, "errors", "out")
        done = run(args, ["--tokenizer", tokenizer, "--input", path, "--output", out,
                          "--seq-len", "64"] + extra, expect_ok=False)
        check(done.returncode == 1, "%s: exit status %d, expected 1\n%s" % (what, done.returncode, done.stderr))
        want = r"^prepare-sft: error: %s:%d: .*%s" % (re.escape(path), line, pattern)
        check(re.search(want, done.stderr, re.M), "%s: stderr does not match %r:\n%s"
              % (what, want, done.stderr))
        leftovers = os.listdir(os.path.dirname(out)) if os.path.isdir(os.path.dirname(out)) else []
        check(not leftovers, "%s: left %s behind" % (what, leftovers))
        print("ok: %s: %s" % (what, done.stderr.strip()))


def check_chat_template_errors(args):
    """--chat-template that is neither a file nor a template of the tokenizer's: exit 1, naming
    the templates there are, nothing written."""
    out = os.path.join(args.work, "template-errors", "out")
    done = run(args, ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--input",
                      os.path.join(SFT, "chat.jsonl"), "--output", out, "--seq-len", "64",
                      "--chat-template", "tool_use"], expect_ok=False)
    check(done.returncode == 1 and re.search(
        r"^prepare-sft: error: --chat-template tool_use: neither a file nor one of the "
        r"tokenizer's templates \(default\)", done.stderr, re.M), done.stderr)
    check(not os.path.exists(os.path.dirname(out)) or not os.listdir(os.path.dirname(out)),
          "--chat-template error: left output behind")
    print("ok: an unknown --chat-template: %s" % done.stderr.strip())
    # A file that is no chat template (tokenizer_config.json given by mistake): named as such
    # rather than rendered the same for every record, leaving nothing to train on.
    not_template = os.path.join(args.work, "special_tokens_map.json")
    with open(not_template, "w") as f:
        f.write('{"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"}\n')
    done = run(args, ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--input",
                      os.path.join(SFT, "chat.jsonl"), "--output", out, "--seq-len", "64",
                      "--chat-template", not_template], expect_ok=False)
    check(done.returncode == 1 and re.search(
        r"^prepare-sft: error: --chat-template \S+: not a chat template: it never reads "
        r"`messages`", done.stderr, re.M), done.stderr)
    print("ok: a --chat-template file that is no template: %s" % done.stderr.strip())
    # A template that does not compile, with workers: found before any record, never a worker
    # that exits and leaves the run waiting.
    broken = os.path.join(args.work, "broken.jinja")
    with open(broken, "w") as f:
        f.write("{% for m in messages %}{{ m.content }}{% endfor")
    try:
        done = subprocess.run([sys.executable, args.script, "--tokenizer", os.path.join(SFT, "qwen2.5"),
                               "--input", os.path.join(SFT, "chat.jsonl"), "--output", out,
                               "--seq-len", "64", "--chat-template", broken, "--workers", "2"],
                              stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, timeout=120)
    except subprocess.TimeoutExpired:
        sys.exit("FAILED: a chat template that does not compile left prepare-sft waiting")
    check(done.returncode == 1 and re.search(r"^prepare-sft: error: %s: chat template 'default' "
                                             r"does not compile: " % re.escape(broken),
                                             done.stderr, re.M), done.stderr)
    print("ok: a --chat-template that does not compile: %s" % done.stderr.strip())


def check_write_failure(args):
    """A write that fails (a full disk; here the file-size limit, EFBIG, as no mount is needed)
    is one plain error, leaves nothing behind, and an OUT being replaced stays as it was."""
    out = os.path.join(args.work, "write-failure")
    base = ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--input", os.path.join(SFT, "chat.jsonl"),
            "--output", out]
    run(args, base + ["--seq-len", "256"])
    with open(os.path.join(out, "summary.json")) as f:
        before = f.read()

    def limited():
        import resource
        import signal
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails, not kills
        resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))

    # --seq-len 4096: the shard is over 4 KiB, the limit.
    done = subprocess.run([sys.executable, args.script] + base + ["--seq-len", "4096", "--overwrite"],
                          stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                          preexec_fn=limited)
    check(done.returncode == 1 and "prepare-sft: error: writing " in done.stderr
          and "File too large (nothing written; %s is as it was)" % out in done.stderr
          and "Traceback" not in done.stderr,
          "a failed write: exit %d, %s" % (done.returncode, done.stderr))
    with open(os.path.join(out, "summary.json")) as f:
        check(f.read() == before, "a failed write changed the OUT it was replacing")
    read_output(out)
    left = [n for n in os.listdir(args.work) if n.startswith(".write-failure.")]
    check(not left, "a failed write left %s behind" % left)
    print("ok: a failed write: %s" % done.stderr.strip())


def check_input_edges(args):
    """A byte-order mark before the first record is read past (Windows editors write one); a
    --val file left empty is an error, not a run without evaluation data; a --val-fraction that
    leaves no val conversation says so."""
    qwen = os.path.join(SFT, "qwen2.5")
    good = '{"messages": [{"role": "user", "content": "hi"}, {"role": "assistant", "content": "hello"}]}'
    plain, bom = os.path.join(args.work, "plain.jsonl"), os.path.join(args.work, "bom.jsonl")
    with open(plain, "w") as f:
        f.write(good + "\n")
    with open(bom, "wb") as f:
        f.write(b"\xef\xbb\xbf" + good.encode() + b"\n")
    docs = []
    for path in (plain, bom):
        out = os.path.join(args.work, "edges", os.path.basename(path))
        run(args, ["--tokenizer", qwen, "--input", path, "--output", out, "--seq-len", "256"])
        docs.append(read_output(out)[1])
    check(docs[0] == docs[1] and len(docs[0]) == 1, "a byte-order mark changed the output")
    no_loss = os.path.join(args.work, "no-loss.jsonl")
    with open(no_loss, "w") as f:
        f.write('{"messages": [{"role": "user", "content": "only a question"}]}\n')
    out = os.path.join(args.work, "edges", "empty-val")
    done = run(args, ["--tokenizer", qwen, "--input", plain, "--val", no_loss, "--output", out,
                      "--seq-len", "256"], expect_ok=False)
    check(done.returncode == 1 and re.search(
        r"^prepare-sft: error: --val: no conversation is left in the val split \(1 read: 0 "
        r"overlong, 0 empty, 1 without a loss token\)", done.stderr, re.M),
        "an empty --val split: exit %d\n%s" % (done.returncode, done.stderr))
    check(not os.path.exists(out), "an empty --val split left %s behind" % out)
    out = os.path.join(args.work, "edges", "fraction")
    done = run(args, ["--tokenizer", qwen, "--input", plain, "--val-fraction", "0.5", "--output",
                      out, "--seq-len", "256"])
    check("warning: --val-fraction 0.5: 1 conversation(s) kept, so no val split" in done.stderr
          and not os.path.exists(os.path.join(out, "val")),
          "--val-fraction with one conversation:\n%s" % done.stderr)
    print("ok: a byte-order mark is read past; an empty --val split fails; an empty fraction warns")


# Words that are one token each (with their leading space) in the fixture tokenizer, so a text
# of n words is about n tokens.
MIX_WORDS = ("the model is an optimizer step per rank and every stage of zrt offload as it runs "
             "on one rank with a step that is true for its stage").split()


def mix_lengths(seed, count, median, sigma, least):
    """(the seeded generator, a length) `count` times: lognormal around `median`, at least
    `least`; each drawn when the caller has drawn the record before it from the same generator."""
    rng = random.Random(seed)
    for _ in range(count):
        yield rng, max(least, int(rng.lognormvariate(math.log(median), sigma)))


def mix_text(rng, n):
    return " ".join(rng.choice(MIX_WORDS) for _ in range(n))


def check_efficiency(args):
    """A realistic length mix: lognormal conversation lengths, median ~300 tokens, in 4096."""
    path = os.path.join(args.work, "mix.jsonl")
    with open(path, "w") as f:
        for rng, n in mix_lengths(7, 3000, 220, 0.9, 8):
            q = max(2, n // 5)
            text = lambda k: mix_text(rng, k)
            f.write(json.dumps({"messages": [{"role": "user", "content": text(q)},
                                             {"role": "assistant", "content": text(n - q)}]}) + "\n")
    out = os.path.join(args.work, "mix")
    done = run(args, ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--input", path, "--output", out,
                      "--seq-len", "4096"])
    summary, docs = read_output(out)
    lengths = sorted(len(ids) for ids, _ in docs)
    median = lengths[len(lengths) // 2]
    efficiency = summary["train"]["packing_efficiency"]
    check(150 <= median <= 600, "the mix's median is %d tokens, not ~300" % median)
    check(efficiency >= 0.95, "packing efficiency %.4f < 0.95 on the realistic mix" % efficiency)
    print("ok: %d conversations (median %d tokens, %d dropped as overlong) pack into %d sequences "
          "of 4096 at %.2f%% efficiency" % (len(docs), median, summary["dropped_overlong"],
                                           summary["train"]["sequences"], 100 * efficiency))
    sys.stdout.write(done.stdout)


def check_long_text_mix(args):
    """Long {"text"} records (lognormal, median ~3000 tokens) in T = 2048: --overlong drop and
    truncate lose targets, split keeps every one and still packs at >= 95%."""
    path = os.path.join(args.work, "long_text.jsonl")
    with open(path, "w") as f:
        for rng, n in mix_lengths(11, 200, 3000, 0.8, 16):
            f.write(json.dumps({"text": mix_text(rng, n)}) + "\n")
    figures = {}
    # "whole": every record in one sequence (T above the longest), nothing cut: the targets
    # split must keep, counted without splitting.
    for mode, seq_len in (("drop", 2048), ("truncate", 2048), ("split", 2048), ("whole", 65536)):
        out = os.path.join(args.work, "long-text-" + mode)
        run(args, ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--input", path, "--output", out,
                   "--seq-len", str(seq_len), "--no-pack", "--overlong", "drop"]
            if mode == "whole" else
            ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--input", path, "--output", out,
             "--seq-len", str(seq_len), "--overlong", mode])
        figures[mode] = read_output(out)[0]
    check(figures["whole"]["dropped_overlong"] == 0, "long text: a record over 65536 tokens")
    targets = {m: figures[m]["train"]["loss_tokens"] for m in figures}
    check(targets["drop"] < targets["truncate"] < targets["split"] == targets["whole"],
          "long text: loss tokens drop %(drop)d, truncate %(truncate)d, split %(split)d, "
          "the records whole %(whole)d" % targets)
    efficiency = figures["split"]["train"]["packing_efficiency"]
    check(efficiency >= 0.95, "long text, split: packing efficiency %.4f < 0.95" % efficiency)
    print("ok: 200 long text records (median ~3000 tokens) in T = 2048: loss tokens %d of %d "
          "with drop (%d records kept), %d with truncate, %d with split (%.2f%% packed, %d "
          "documents in %d sequences)"
          % (targets["drop"], targets["whole"], figures["drop"]["kept"], targets["truncate"],
             targets["split"], 100 * efficiency, figures["split"]["train"]["documents"],
             figures["split"]["train"]["sequences"]))


def check_workers(args):
    """--workers: the same bytes for 1, 2 and 3 processes on the realistic mix (the val split too),
    and with several bad lines the error reported is the first in file order, whichever worker
    got there first."""
    path = os.path.join(args.work, "mix.jsonl")
    outputs = []
    for workers in ("1", "2", "3"):
        out = os.path.join(args.work, "workers-%s" % workers)
        run(args, ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--input", path, "--output", out,
                   "--seq-len", "4096", "--val-fraction", "0.05", "--workers", workers])
        files = {}
        for directory, _, names in os.walk(out):
            for name in names:
                with open(os.path.join(directory, name), "rb") as f:
                    files[os.path.relpath(os.path.join(directory, name), out)] = f.read()
        outputs.append(files)
    check(outputs[0] == outputs[1] == outputs[2], "--workers 1, 2 and 3 give different outputs")
    with open(path) as f:
        lines = f.readlines()
    bad = os.path.join(args.work, "workers-bad.jsonl")
    lines[1500] = '{"messages": [{"role": "narrator", "content": "x"}]}\n'
    lines[2900] = '{"messages": [\n'
    with open(bad, "w") as f:
        f.writelines(lines)
    done = run(args, ["--tokenizer", os.path.join(SFT, "qwen2.5"), "--input", bad, "--output",
                      os.path.join(args.work, "workers-bad"), "--seq-len", "4096", "--workers", "2"],
               expect_ok=False)
    check(done.returncode == 1 and re.search(r"^prepare-sft: error: %s:1501: .*unknown role"
                                             % re.escape(bad), done.stderr, re.M)
          and "Traceback" not in done.stderr, "--workers 2, two bad lines: %s" % done.stderr)
    check(not os.path.exists(os.path.join(args.work, "workers-bad")), "--workers: left output")
    print("ok: --workers 1, 2, 3 write the same bytes; the first bad line in file order is named")


def children(pid):
    """The process ids of pid's children (Linux /proc)."""
    try:
        with open("/proc/%d/task/%d/children" % (pid, pid)) as f:
            return [int(x) for x in f.read().split()]
    except OSError:
        return []


def check_worker_death(args):
    """A worker killed mid-run (the OOM killer, say) ends prepare-sft with that said, exit 1,
    nothing left: never the wait forever a plain multiprocessing pool would do."""
    parent = os.path.join(args.work, "worker-death")
    os.makedirs(parent)
    p = subprocess.Popen([sys.executable, args.script, "--tokenizer", os.path.join(SFT, "qwen2.5"),
                          "--input", os.path.join(args.work, "long_text_x8.jsonl"), "--output",
                          os.path.join(parent, "out"), "--seq-len", "2048", "--overlong", "split",
                          "--workers", "2"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 60
    while p.poll() is None and len(children(p.pid)) < 2 and time.time() < deadline:
        time.sleep(0.01)
    time.sleep(0.5)  # the workers at work
    workers = children(p.pid)
    check(p.poll() is None and workers, "worker death: no workers to kill")
    os.kill(workers[0], signal.SIGKILL)
    try:
        _, err = p.communicate(timeout=120)
    except subprocess.TimeoutExpired:
        p.kill()
        sys.exit("FAILED: a killed worker left prepare-sft waiting")
    check(p.returncode == 1 and "prepare-sft: error: a worker process ended abruptly" in err
          and "Traceback" not in err, "worker death: exit %d, %s" % (p.returncode, err))
    check(not os.listdir(parent), "worker death: left %s" % os.listdir(parent))
    print("ok: a worker killed mid-run: %s" % err.strip())


def check_interrupt(args):
    """SIGTERM (a job's limit) ends prepare-sft through its cleanup: exit 130, one line, nothing
    left beside OUT, whether it comes while reading or while the shards are being written."""
    with open(os.path.join(args.work, "long_text.jsonl")) as f:
        records = f.read()
    path = os.path.join(args.work, "long_text_x8.jsonl")
    with open(path, "w") as f:
        f.write(records * 8)
    parent = os.path.join(args.work, "interrupt")
    os.makedirs(parent)
    out = os.path.join(parent, "out")
    cmd = [sys.executable, args.script, "--tokenizer", os.path.join(SFT, "qwen2.5"), "--input",
           path, "--output", out, "--seq-len", "2048", "--overlong", "split"]
    for when in ("reading", "writing"):
        p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        if when == "reading":
            time.sleep(0.5)
        else:
            # The staging directory beside OUT appears when the writing starts.
            while p.poll() is None and not any(n.startswith(".out.tmp-") for n in os.listdir(parent)):
                time.sleep(0.002)
        check(p.poll() is None, "interrupt while %s: prepare-sft ended before the signal" % when)
        p.send_signal(signal.SIGTERM)
        _, err = p.communicate()
        check(p.returncode == 130 and "prepare-sft: interrupted" in err and "Traceback" not in err,
              "interrupt while %s: exit %d, %s" % (when, p.returncode, err))
        check(not os.listdir(parent), "interrupt while %s: left %s" % (when, os.listdir(parent)))
    print("ok: SIGTERM while reading and while writing: exit 130, nothing left beside OUT")


def check_live_transformers(goldens):
    try:
        import transformers
    except ImportError as e:
        print("note: transformers is not installed (%s), so goldens.json is not recomputed "
              "(tools/install-python-deps installs it)" % e)
        return
    # goldens.json follows one transformers' rules (and its chat_template.jinja); an older major
    # version (4.45, the last for Debian 12's torch, which the export test needs) reads templates
    # and marks assistant tokens by older rules, so only a version as new recomputes them.
    have = int(transformers.__version__.split(".")[0])
    made = int(str(goldens["transformers"]).split(".")[0])
    if have < made:
        print("note: transformers %s is older than goldens.json's %s, so goldens.json is not "
              "recomputed (the goldens themselves were checked above)"
              % (transformers.__version__, goldens["transformers"]))
        return
    sys.path.insert(0, HERE)
    sys.dont_write_bytecode = True  # no __pycache__ in the source tree
    import make_sft_goldens
    live = make_sft_goldens.compute()
    check(live["cases"] == goldens["cases"],
          "transformers %s's apply_chat_template disagrees with goldens.json (made with %s): "
          "rerun tests/data/make_sft_goldens.py --check for details"
          % (live["transformers"], goldens["transformers"]))
    print("ok: transformers %s's apply_chat_template gives goldens.json's ids and masks"
          % live["transformers"])


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--script", required=True, help="tools/data/prepare-sft")
    p.add_argument("--work", required=True, help="a scratch directory (emptied)")
    args = p.parse_args()
    for package in ("tokenizers", "jinja2"):
        try:
            __import__(package)
        except ImportError as e:
            sys.exit("FAILED: %s lacks the %s package (%s): run tools/install-python-deps"
                     % (sys.executable, package, e))
    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    with open(os.path.join(SFT, "goldens.json")) as f:
        goldens = json.load(f)
    check_live_transformers(goldens)
    check_goldens(args, goldens)
    check_train_on_all(args, goldens)
    check_overlong(args, goldens)
    check_overlong_split(args, goldens)
    check_val_and_shards(args, goldens)
    check_templates(args, goldens)
    check_template_kwargs(args, goldens)
    check_determinism(args)
    check_errors(args)
    check_chat_template_errors(args)
    check_input_edges(args)
    check_write_failure(args)
    check_efficiency(args)
    check_long_text_mix(args)
    check_workers(args)
    check_interrupt(args)
    check_worker_death(args)
    print("check_prepare_sft: all checks passed")


if __name__ == "__main__":
    main()
