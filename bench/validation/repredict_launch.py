#!/usr/bin/env python3
"""Re-predicts a GPU record's plans with the profile's host launch times estimated other ways.

    python3 bench/validation/repredict_launch.py --pipetune build/cli/pipetune RECORD [RECORD...]

RECORD is what `scripts/gpu-check.sh record` leaves (its `record/` folder): one folder per model
with `profile.json` and `validate/` (report.json, the plans, hardware.json). For each way of
estimating a layer's launch times it rewrites the profile, runs `pipetune simulate` on every
plan the report validated, and compares the prediction with the report's measured median:

  as profiled         the profile unchanged (each micro-batch size's median over repetitions)
  median over sizes   each layer's launch time, per kind, the median over the sizes
  least over sizes    ... the least over the sizes (a call's host work does not grow with the
                      batch, so a size that took longer met a slower host)
  none                no launch times: the device's times alone
  at the run's pace   as profiled, times the host's pace the plan's run met over the pace the
                      profile was taken at (report `host_pace_us`, profile `meta.host_pace_us`:
                      profiler/host_pace.hpp), plan by plan

A question about the host's pace, asked of measurements already made: nothing is run on a GPU.
"""
import argparse
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile

LAUNCH_KEYS = ("forward_launch_ms", "backward_launch_ms", "forward_nograd_launch_ms")


def estimated(profile, how, plan=None):
    out = copy.deepcopy(profile)
    if how == "at the run's pace":
        profiled = profile.get("meta", {}).get("host_pace_us")
        met = plan.get("host_pace_us") if plan else None
        if not profiled or not met:
            return None
        scale = statistics.median(met) / profiled
        if "backward_call_ms" in out["device"]:
            out["device"]["backward_call_ms"] *= scale
        for layer in out["layers"]:
            for key in LAUNCH_KEYS:
                if key in layer:
                    layer[key] = [v * scale for v in layer[key]]
        return out
    if how == "none":
        out["device"].pop("backward_call_ms", None)
        for layer in out["layers"]:
            for key in LAUNCH_KEYS:
                layer.pop(key, None)
        return out
    pick = {"median over sizes": statistics.median, "least over sizes": min}.get(how)
    if pick:
        for layer in out["layers"]:
            for key in LAUNCH_KEYS:
                if key in layer:
                    layer[key] = [pick(layer[key])] * len(layer[key])
    return out


def errors(pipetune, record, how, scratch):
    found = []
    for model in sorted(os.listdir(record)):
        folder = os.path.join(record, model)
        report_path = os.path.join(folder, "validate", "report.json")
        if not os.path.isfile(report_path):
            continue
        with open(os.path.join(folder, "profile.json")) as f:
            profile = json.load(f)
        profile_path = os.path.join(scratch, f"{model}.profile.json")
        with open(report_path) as f:
            report = json.load(f)
        for plan in report["plans"]:
            rewritten = estimated(profile, how, plan)
            if rewritten is None:
                sys.exit(f"{report_path}: no host pace in the report or the profile")
            with open(profile_path, "w") as f:
                json.dump(rewritten, f)
            plan_path = os.path.join(folder, "validate", os.path.basename(plan["plan_file"]))
            run = subprocess.run(
                [pipetune, "simulate", "--profile", profile_path, "--hardware",
                 os.path.join(folder, "validate", "hardware.json"), "--plan", plan_path, "--json"],
                capture_output=True, text=True)
            if run.returncode != 0:
                sys.exit(f"simulate {plan_path}: {run.stderr.strip()}")
            predicted = json.loads(run.stdout)["iteration_ms"]
            found.append((model, plan["plan"], predicted / plan["measured_median_ms"] - 1))
    return found


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipetune", default="build/cli/pipetune")
    parser.add_argument("records", nargs="+")
    args = parser.parse_args()
    print("| record | launch times | median | worst | within 5 % | within 10 % |")
    print("| --- | --- | --- | --- | --- | --- |")
    with tempfile.TemporaryDirectory() as scratch:
        for record in args.records:
            for how in ("as profiled", "median over sizes", "least over sizes", "none",
                        "at the run's pace"):
                found = errors(args.pipetune, record, how, scratch)
                if not found:
                    sys.exit(f"{record}: no model folder with validate/report.json")
                size = [abs(e) for _, _, e in found]
                model, plan, worst = max(found, key=lambda x: abs(x[2]))
                print(f"| {record} | {how} | {100 * statistics.median(size):.1f} % "
                      f"| {100 * worst:+.1f} % ({model} {plan}) "
                      f"| {sum(e <= 0.05 for e in size)} / {len(size)} "
                      f"| {sum(e <= 0.10 for e in size)} / {len(size)} |")


if __name__ == "__main__":
    main()
