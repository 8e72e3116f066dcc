#!/usr/bin/env python3
"""Checks a run's metrics.jsonl: the training loss of its last row is below its first row's.

usage: check_loss_falls.py OUTPUT_DIR/metrics.jsonl [--min-drop FRACTION]

Rows without a "loss" (evaluation rows) are skipped. Exit status 0 when the loss fell by at
least FRACTION of the first loss (default 0.1), 1 when not, 2 when the file is unusable.
"""
import argparse
import json
import sys


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("metrics")
    parser.add_argument("--min-drop", type=float, default=0.1)
    args = parser.parse_args()
    try:
        with open(args.metrics) as f:
            rows = [json.loads(line) for line in f if line.strip()]
    except (OSError, ValueError) as e:
        print(f"{args.metrics}: cannot read the metrics: {e}", file=sys.stderr)
        return 2
    losses = [(row["step"], row["loss"]) for row in rows if "loss" in row]
    if len(losses) < 2:
        print(f"{args.metrics}: {len(losses)} training row(s); need two", file=sys.stderr)
        return 2
    (first_step, first), (last_step, last) = losses[0], losses[-1]
    fell = last <= first * (1.0 - args.min_drop)
    print(f"{args.metrics}: loss {first:.4f} at step {first_step} -> {last:.4f} at step "
          f"{last_step}: {'falls' if fell else 'DOES NOT FALL'} (by at least "
          f"{100 * args.min_drop:.0f}% required)")
    return 0 if fell else 1


if __name__ == "__main__":
    sys.exit(main())
