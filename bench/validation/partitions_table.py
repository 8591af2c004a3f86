#!/usr/bin/env python3
"""Tables what `scripts/gpu-check.sh partitions` measured: plans run with their stages on equal
shares of one GPU's SMs (`pipetune run --sm-partitions K`) against the simulator's prediction
from a profile taken on one such share.

    python3 bench/validation/partitions_table.py PARTITIONS_DIR

PARTITIONS_DIR holds one folder per model with, per plan STEM: STEM.plan.json,
STEM.predicted.json (`pipetune simulate --json`), STEM.run.json (`pipetune run --json`) and
STEM.measured.trace.json; and STEM.turns.run.json where the same plan also ran with its stages
taking turns on the whole GPU. The shares split the SMs, not the memory: every device's
measured peak is the GPU's, set here beside the sum of the predicted devices' peaks.
"""
import glob
import json
import os
import statistics
import sys


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    rows, errors = [], []
    for folder in sorted(glob.glob(os.path.join(root, "*"))):
        if not os.path.isdir(folder):
            continue
        model = os.path.basename(folder)
        for plan_path in sorted(glob.glob(os.path.join(folder, "*.plan.json"))):
            stem = plan_path[: -len(".plan.json")]
            if stem.endswith(".turns") or not os.path.exists(stem + ".run.json"):
                continue
            with open(plan_path) as f:
                plan = json.load(f)
            with open(stem + ".predicted.json") as f:
                predicted = json.load(f)
            with open(stem + ".run.json") as f:
                run = json.load(f)
            with open(stem + ".measured.trace.json") as f:
                summary = json.load(f)["pipetune"]["summary"]
            measured = statistics.median(run["pipeline_ms"])
            error = predicted["iteration_ms"] / measured - 1
            errors.append(abs(error))
            turns = ""
            if os.path.exists(stem + ".turns.run.json"):
                with open(stem + ".turns.run.json") as f:
                    turns = f"{statistics.median(json.load(f)['pipeline_ms']):.2f}"
            predicted_peaks = sum(d["peak_memory_bytes"] for d in predicted["devices"])
            rows.append(
                f"| {model} | {plan['balance']} x{plan['chunks']} {plan['schedule']} "
                f"| {predicted['iteration_ms']:.2f} | {measured:.2f} | {100 * error:+.1f} % "
                f"| {100 * predicted['bubble_fraction']:.1f} % "
                f"| {100 * summary['bubble_fraction']:.1f} % | {turns or '-'} "
                f"| {predicted_peaks / 2**20:.0f} | {max(run['peak_memory_bytes']) / 2**20:.0f} |")
    if not rows:
        sys.exit(f"{root}: no plan with a run")
    print("| model | plan | predicted ms | measured ms | error | bubble predicted "
          "| bubble measured | whole GPU, stages in turn, ms | predicted peaks summed MiB "
          "| GPU peak measured MiB |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(f"\n- iteration time: median |error| {100 * statistics.median(errors):.1f} %, "
          f"worst {100 * max(errors):.1f} %, {sum(e <= 0.05 for e in errors)}/{len(errors)} "
          f"within 5 %, {sum(e <= 0.10 for e in errors)}/{len(errors)} within 10 %")


if __name__ == "__main__":
    main()
