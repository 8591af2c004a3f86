#!/usr/bin/env python3
"""Tables what `scripts/gpu-check.sh partitions` measured: plans run with their stages on equal
shares of one GPU's SMs (`pipetune run --sm-partitions K`) against the simulator's prediction
from a profile taken on one such share.

    python3 bench/validation/partitions_table.py PARTITIONS_DIR

PARTITIONS_DIR holds one folder per model with, per plan STEM: STEM.plan.json,
STEM.predicted.json (`pipetune simulate --json`), STEM.run.json (`pipetune run --json`) and
STEM.measured.trace.json; and STEM.turns.run.json where the same plan also ran with its stages
taking turns on the whole GPU. The shares split the SMs, not the memory: every device's
measured peak is the GPU's, set here beside the predicted GPU's peak (every share's, where the
prediction counts the shares in one memory: its devices name their GPU in `share_of`; else,
from a simulator that counted each share apart, the sum of their peaks, marked "sum"). Each
measured step is checked for causality (out_of_order): a stage that starts on a tensor before
it was made means a stream did not wait, and the run is no validation.
"""
import glob
import json
import os
import statistics
import sys


# A task this long before its dependency's end counts as out of order (stamps on two streams).
SLACK_MS = 0.05


def out_of_order(trace):
    """Hand-overs of a measured GPU trace that a stage did not wait for: the next stage's
    forward starting before the forward that made its input ended (a forward's output is its
    last work, and on a GPU its hand-over and its end are stamped back to back on its stream),
    or a backward starting before the gradient it takes was handed over. Not for CPU traces,
    whose stamps are the host's: a CPU task may end well after it handed its output on."""
    tasks = {}
    copies = []
    for e in trace["traceEvents"]:
        if e.get("ph") != "X":
            continue
        args = e.get("args", {})
        span = (e["ts"] / 1000, (e["ts"] + e["dur"]) / 1000)
        if e["cat"] == "copy":
            copies.append((args["direction"], args["stage"], args["micro_batch"], span))
        else:
            tasks[(e["cat"], args["stage"], args["micro_batch"])] = span
    broken = 0
    for direction, stage, micro_batch, (_, copied) in copies:
        if direction == "activation":
            made = tasks.get(("forward", stage, micro_batch))
            used = tasks.get(("forward", stage + 1, micro_batch))
            ready = made[1] if made else copied
        else:
            used = tasks.get(("backward", stage - 1, micro_batch)) or tasks.get(
                ("backward_input", stage - 1, micro_batch))
            ready = copied
        if used and used[0] < ready - SLACK_MS:
            broken += 1
    return broken, len(copies)


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    root = sys.argv[1]
    rows, errors, disorders, memory_errors = [], [], [], []
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
                trace = json.load(f)
            summary = trace["pipetune"]["summary"]
            broken, handovers = out_of_order(trace)
            disorders.append(broken)
            measured = statistics.median(run["pipeline_ms"])
            error = predicted["iteration_ms"] / measured - 1
            errors.append(abs(error))
            turns = ""
            if os.path.exists(stem + ".turns.run.json"):
                with open(stem + ".turns.run.json") as f:
                    turns = f"{statistics.median(json.load(f)['pipeline_ms']):.2f}"
            devices = predicted["devices"]
            if all(d.get("share_of") for d in devices):
                predicted_peak, joint = max(d["peak_memory_bytes"] for d in devices), True
            else:
                predicted_peak, joint = sum(d["peak_memory_bytes"] for d in devices), False
            measured_peak = max(run["peak_memory_bytes"])
            memory_error = predicted_peak / measured_peak - 1
            if joint:
                memory_errors.append(abs(memory_error))
            rows.append(
                f"| {model} | {plan['balance']} x{plan['chunks']} {plan['schedule']} "
                f"| {predicted['iteration_ms']:.2f} | {measured:.2f} | {100 * error:+.1f} % "
                f"| {100 * predicted['bubble_fraction']:.1f} % "
                f"| {100 * summary['bubble_fraction']:.1f} % | {turns or '-'} "
                f"| {predicted_peak / 2**20:.0f}{'' if joint else ' (sum)'} "
                f"| {measured_peak / 2**20:.0f} | {100 * memory_error:+.1f} % "
                f"| {broken} of {handovers} |")
    if not rows:
        sys.exit(f"{root}: no plan with a run")
    print("| model | plan | predicted ms | measured ms | error | bubble predicted "
          "| bubble measured | whole GPU, stages in turn, ms | GPU peak predicted MiB "
          "| GPU peak measured MiB | memory error | hand-overs out of order |")
    print("| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |")
    print("\n".join(rows))
    print(f"\n- iteration time: median |error| {100 * statistics.median(errors):.1f} %, "
          f"worst {100 * max(errors):.1f} %, {sum(e <= 0.05 for e in errors)}/{len(errors)} "
          f"within 5 %, {sum(e <= 0.10 for e in errors)}/{len(errors)} within 10 %")
    if memory_errors:
        print(f"- GPU peak memory (predictions counting the shares in one memory, "
              f"{len(memory_errors)} plans): median |error| "
              f"{100 * statistics.median(memory_errors):.1f} %, worst "
              f"{100 * max(memory_errors):.1f} %")
    if any(disorders):
        print(f"- NOT A VALIDATION: {sum(d > 0 for d in disorders)} of {len(disorders)} measured "
              "steps have a stage starting on a tensor before it was made")


if __name__ == "__main__":
    main()
