#!/usr/bin/env python3
"""zrt-train's TensorBoard event files, read by the tensorboard package's own reader.

Runs zrt-train (2 ranks under mpirun) with "tensorboard": {"enabled": true} for 6 steps with a
checkpoint at step 3, then replays a crash after step 6 by pointing `latest` back at step 3 and
running again (it resumes at step 3 and redoes steps 4-6). After each run, EventAccumulator
must show, per tag, exactly one point per step, at DeepSpeed's x axis (samples = step x
train_batch_size), with the values and times metrics.jsonl holds: the resumed run's file starts
with a SessionLog START that makes the reader drop the first run's points after step 3.

Exits 77 (ctest: skipped, with the reason printed) when python has no tensorboard package;
tools/install-python-deps installs it.
"""
import argparse
import json
import os
import shutil
import struct
import subprocess
import sys

SKIP = 77
BATCH = 4  # train_batch_size: the x axis is samples
TAGS = ["Train/Samples/train_loss", "Train/Samples/lr", "Train/Samples/grad_norm"]


def write_corpus(path):
    text = ("In the beginning was the Word, and the Word was God. " * 400).encode()
    header = [0] * 256
    header[0], header[1], header[2] = 20240520, 1, len(text)  # llm.c: magic, version, tokens
    with open(path, "wb") as f:
        f.write(struct.pack("<256i", *header))
        f.write(struct.pack("<%dH" % len(text), *text))


def run(args, config_path):
    cmd = [args.mpiexec, "-n", "2", "--oversubscribe", "--bind-to", "none", args.zrt_train,
           "--config", config_path]
    done = subprocess.run(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                          timeout=240)
    if done.returncode != 0:
        sys.exit("zrt-train failed (%d):\n%s" % (done.returncode, done.stdout))
    return done.stdout


def metrics_rows(out_dir):
    with open(os.path.join(out_dir, "metrics.jsonl")) as f:
        return [json.loads(line) for line in f if line.strip()]


def check(condition, message):
    if not condition:
        sys.exit("FAILED: " + message)


def check_events(event_accumulator, log_dir, rows, label):
    acc = event_accumulator.EventAccumulator(log_dir, size_guidance={"scalars": 0})
    acc.Reload()
    scalars = acc.Tags()["scalars"]
    for tag in TAGS:
        check(tag in scalars, "%s: tag %s missing (tags: %s)" % (label, tag, scalars))
    check("Train/Samples/loss_scale" not in scalars, "%s: loss_scale written for fp32" % label)
    by_step = {row["step"]: row for row in rows if "loss" in row}
    check(sorted(by_step) == [1, 2, 3, 4, 5, 6], "%s: metrics.jsonl steps %s" % (label, sorted(by_step)))
    for tag, key in zip(TAGS, ["loss", "lr", "grad_norm"]):
        points = acc.Scalars(tag)
        steps = [p.step for p in points]
        check(steps == [BATCH * s for s in range(1, 7)],
              "%s: %s steps %s, expected one per step at samples %s" %
              (label, tag, steps, [BATCH * s for s in range(1, 7)]))
        for p in points:
            row = by_step[p.step // BATCH]
            want = row[key]
            check(abs(p.value - want) <= 1e-6 * max(1.0, abs(want)),
                  "%s: %s at %d is %r, metrics.jsonl has %r" % (label, tag, p.step, p.value, want))
            check(abs(p.wall_time - row["time"]) < 1.0,
                  "%s: %s at %d timed %r, metrics.jsonl %r" % (label, tag, p.step, p.wall_time,
                                                              row["time"]))
    return acc


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--zrt-train", required=True)
    parser.add_argument("--mpiexec", required=True)
    parser.add_argument("--work", required=True)
    args = parser.parse_args()
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ImportError as e:
        print("SKIP: %s has no tensorboard package (%s); tools/install-python-deps installs it"
              % (sys.executable, e))
        return SKIP

    shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work)
    write_corpus(os.path.join(args.work, "t_train_000000.bin"))
    out_dir = os.path.join(args.work, "out")
    config = {
        "train_batch_size": BATCH, "train_micro_batch_size_per_gpu": 2,
        "model": {"preset": "gpt2-tiny", "seq_len": 32},
        "data": {"train": os.path.join(args.work, "t_train_*.bin")},
        "train": {"steps": 6, "log_interval": 1},
        "device": {"type": "cpu"},
        "checkpoint": {"save_interval": 3},
        "tensorboard": {"enabled": True, "job_name": "tb_job"},
        "output_dir": out_dir,
    }
    config_path = os.path.join(args.work, "run.json")
    with open(config_path, "w") as f:
        json.dump(config, f)
    log_dir = os.path.join(out_dir, "tb_job")

    run(args, config_path)
    files = [f for f in os.listdir(log_dir) if f.startswith("events.out.tfevents.")]
    check(len(files) == 1, "one event file expected, found %s" % files)
    check_events(event_accumulator, log_dir, metrics_rows(out_dir), "first run")

    # A crash after step 6 whose last checkpoint was step 3: the restart redoes steps 4-6.
    with open(os.path.join(out_dir, "checkpoints", "latest"), "w") as f:
        f.write("global_step3\n")
    output = run(args, config_path)
    check("resumed from" in output and "global_step3" in output, "no resume:\n" + output)
    files = [f for f in os.listdir(log_dir) if f.startswith("events.out.tfevents.")]
    check(len(files) == 2, "a new event file per run expected, found %s" % files)
    rows = metrics_rows(out_dir)
    check_events(event_accumulator, log_dir, rows, "resumed run")
    first_run_time = max(r["time"] for r in rows if r["step"] <= 3)
    check(all(r["time"] > first_run_time for r in rows if r["step"] > 3),
          "metrics.jsonl rows 4-6 should be the resumed run's")
    print("OK: %s read %d-step timelines of %s from %s" %
          (event_accumulator.__name__, 6, ", ".join(TAGS), log_dir))
    return 0


if __name__ == "__main__":
    sys.exit(main())
