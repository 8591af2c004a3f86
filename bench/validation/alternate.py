"""A prediction's bias told apart from the machine's drift: profile and run, alternated many times.

One `validate` compares one profile with one run, each a few seconds long. On a shared VM the
cores' pace moves by a fifth between such windows (a fixed matrix product's half-second medians
on this project's 2-vCPU VMs: 1.62 to 2.07 ms within ten seconds), so one comparison cannot tell
a model that is 10 % short from a machine that was 10 % faster while it profiled. This alternates
the two, CYCLES times: a fresh profile (`pipetune profile`, only the micro-batch sizes the plans
use), then each plan predicted (`pipetune simulate`) and run (`pipetune run`), the plans' order
turned by one each cycle. Each comparison's error is predicted over measured median step, minus
one; the drift is as likely to flatter as to hurt, so the errors' median estimates the model's
own bias, and a bootstrap of it (the cycles resampled) says how sure that is. Per plan and over
all of them: the median error, its 95 % interval, and the errors' spread (p10-p90); and per task
kind, measured over predicted duration (from the two traces, task by task).

    python3 bench/validation/alternate.py --model mlp --batch 256 --devices 2 --cycles 15 \
        "[9] x4 never gpipe" "[5,4] x4 never 1f1b" "[2,3,2,2] x4 never interleaved-1f1b"

A plan is written as the reports write it: "[BALANCE] xCHUNKS CHECKPOINT SCHEDULE" (two stages a
device for the looped and V schedules). Nothing is written outside a temporary folder unless
--json names a file (one object: every cycle's numbers and the summary).
"""
import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TWO_STAGES = {"interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv", "dualpipev"}


def plan_of(text):
    try:
        balance, chunks, checkpoint, schedule = text.split()
        plan = {"format": "pipetune.plan/1", "balance": json.loads(balance),
                "chunks": int(chunks.lstrip("x")), "checkpoint": checkpoint, "schedule": schedule}
    except ValueError:
        sys.exit(f"alternate.py: plan {text!r}: expected \"[BALANCE] xCHUNKS CHECKPOINT SCHEDULE\"")
    if schedule in TWO_STAGES:
        plan["stages_per_device"] = 2
    return plan


def micro_batch_sizes(batch, chunks):
    """The sizes `chunks` micro-batches of `batch` samples have (as tensor.chunk splits)."""
    each = -(-batch // chunks)
    sizes, left = [], batch
    while left > 0:
        sizes.append(min(each, left))
        left -= each
    return sizes


def call(what):
    try:
        done = subprocess.run(what, capture_output=True, text=True)
    except OSError as e:
        sys.exit(f"alternate.py: {what[0]}: {e.strerror} (build pipetune first, or pass --pipetune)")
    if done.returncode:
        sys.exit(f"alternate.py: {' '.join(what[:2])}: {done.stderr.strip() or done.stdout.strip()}")
    return done.stdout


def task_durations(path):
    with open(path) as f:
        trace = json.load(f)
    tasks = {e["name"]: (e.get("cat", ""), e["dur"], e["pid"], e["ts"]) for e in trace["traceEvents"]
             if e.get("ph") == "X" and e.get("cat") != "copy"}
    return tasks


def quantile(values, q):
    ordered = sorted(values)
    at = q * (len(ordered) - 1)
    low = int(at)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (at - low)


def median_interval(values, rounds=2000, seed=1):
    """The median and a 95 % bootstrap interval of it."""
    rng = random.Random(seed)
    medians = sorted(statistics.median(rng.choices(values, k=len(values))) for _ in range(rounds))
    return statistics.median(values), quantile(medians, 0.025), quantile(medians, 0.975)


def summary(errors):
    mid, low, high = median_interval(errors)
    return {"cycles": len(errors), "median_error": mid, "median_low": low, "median_high": high,
            "p10": quantile(errors, 0.1), "p90": quantile(errors, 0.9)}


def percent(x):
    return f"{100 * x:+.1f} %"


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("plans", nargs="+", help='e.g. "[5,4] x4 never 1f1b"')
    parser.add_argument("--pipetune", default=os.path.join(ROOT, "build", "cli", "pipetune"))
    parser.add_argument("--model", required=True, help="the model spec, as `pipetune run` takes it")
    parser.add_argument("--batch", type=int, required=True)
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--cycles", type=int, default=15)
    parser.add_argument("--steps", type=int, default=10, help="measured steps per run")
    parser.add_argument("--repeats", type=int, default=5, help="the profile's timed runs per layer")
    parser.add_argument("--threads", type=int,
                        help="intra-op threads a device, profiled and run alike (default: cores / devices)")
    parser.add_argument("--json", help="write every cycle and the summary here")
    args = parser.parse_args()
    if args.cycles < 2:
        sys.exit("alternate.py: --cycles: at least 2 (a median of one comparison is that comparison)")
    if args.threads is None:
        args.threads = max(1, (os.cpu_count() or 1) // args.devices)
    plans = [(text, plan_of(text)) for text in args.plans]
    sizes = sorted({s for _, p in plans for s in micro_batch_sizes(args.batch, p["chunks"])})
    cycles = []
    with tempfile.TemporaryDirectory() as tmp:
        profile = os.path.join(tmp, "profile.json")
        for cycle in range(args.cycles):
            call([args.pipetune, "profile", "--model", args.model, "--batch", str(args.batch),
                        "--devices", str(args.devices), "--threads", str(args.threads),
                        "--repeats", str(args.repeats),
                        "--micro-batch-sizes", ",".join(map(str, sizes)), "-o", profile,
                        "--progress", "none"])
            turned = plans[cycle % len(plans):] + plans[:cycle % len(plans)]
            for text, plan in turned:
                plan_path = os.path.join(tmp, "plan.json")
                with open(plan_path, "w") as f:
                    json.dump(plan, f)
                predicted_trace = os.path.join(tmp, "predicted.json")
                measured_trace = os.path.join(tmp, "measured.json")
                predicted = json.loads(call([
                    args.pipetune, "simulate", "--profile", profile, "--devices", str(args.devices),
                    "--plan", plan_path, "--trace", predicted_trace, "--json"]))["iteration_ms"]
                measured = json.loads(call([
                    args.pipetune, "run", "--model", args.model, "--batch", str(args.batch),
                    "--plan", plan_path, "--threads", str(args.threads), "--steps", str(args.steps),
                    "--trace", measured_trace,
                    "--json", "--progress", "none"]))
                measured_ms = statistics.median(measured["pipeline_ms"])
                want, got = task_durations(predicted_trace), task_durations(measured_trace)
                # Each device's first task of the step apart: it follows the optimizer's sweep.
                first = {}
                for name, (_, _, device, start) in got.items():
                    if device not in first or start < got[first[device]][3]:
                        first[device] = name
                firsts = set(first.values())
                ratios = {}
                for name, (kind, ms, _, _) in want.items():
                    if name in got and ms > 0:
                        ratios.setdefault("first" if name in firsts else kind, []).append(got[name][1] / ms)
                row = {"cycle": cycle, "plan": text, "predicted_ms": predicted,
                       "measured_ms": measured_ms, "error": predicted / measured_ms - 1,
                       "task_ratio": {k: statistics.median(v) for k, v in ratios.items()}}
                cycles.append(row)
                print(f"cycle {cycle + 1}/{args.cycles}  {text:40s} predicted {predicted:8.2f} ms  "
                      f"measured {measured_ms:8.2f} ms  {percent(row['error'])}", flush=True)

    out = {"model": args.model, "batch": args.batch, "devices": args.devices, "plans": {}}
    print("\n| plan | cycles | median error (95 % interval) | p10 to p90 | measured / predicted, per task kind |")
    print("|---|---|---|---|---|")
    for text, _ in plans + [("all plans", None)]:
        rows = [r for r in cycles if text == "all plans" or r["plan"] == text]
        s = summary([r["error"] for r in rows])
        kinds = sorted({k for r in rows for k in r["task_ratio"]})
        s["task_ratio"] = {k: statistics.median(r["task_ratio"][k] for r in rows if k in r["task_ratio"])
                           for k in kinds}
        out["plans"][text] = s
        ratio_text = ", ".join(f"{k} {v:.3f}" for k, v in s["task_ratio"].items())
        print(f"| {text} | {s['cycles']} | {percent(s['median_error'])} ({percent(s['median_low'])} to "
              f"{percent(s['median_high'])}) | {percent(s['p10'])} to {percent(s['p90'])} | {ratio_text} |")
    if args.json:
        out["cycles"] = cycles
        with open(args.json, "w") as f:
            json.dump(out, f, indent=1)


if __name__ == "__main__":
    main()
