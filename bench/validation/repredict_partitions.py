#!/usr/bin/env python3
"""Predicts again what `scripts/gpu-check.sh partitions` measured, with this build's simulator,
and tables it (partitions_table.py), so that a change to the time model is set against runs
already made, without a GPU.

    python3 bench/validation/repredict_partitions.py --pipetune build/cli/pipetune \
        PARTITIONS_DIR OUT_DIR

PARTITIONS_DIR is the phase's folder (one folder per model). OUT_DIR gets a copy of it with
each STEM.predicted.json made again. A profile taken on a share by a profiler older than the
`device.sm_shares` field gets the field from its device name ("1 of K shares"), which is what
that profiler wrote instead, so the simulator's default hardware is K shares of one GPU.
"""
import argparse
import glob
import json
import os
import re
import shutil
import subprocess
import sys

HERE = os.path.dirname(os.path.abspath(__file__))


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--pipetune", required=True, help="the pipetune CLI to predict with")
    parser.add_argument("partitions", help="the partitions phase's folder")
    parser.add_argument("out", help="where the copy with the new predictions goes")
    args = parser.parse_args()
    if os.path.exists(args.out):
        sys.exit(f"{args.out}: exists; name a new folder")
    shutil.copytree(args.partitions, args.out)
    for profile_path in sorted(glob.glob(os.path.join(args.out, "*", "profile.json"))):
        with open(profile_path) as f:
            profile = json.load(f)
        shares = re.search(r"1 of (\d+) shares", profile["device"]["name"])
        if shares and "sm_shares" not in profile["device"]:
            profile["device"]["sm_shares"] = int(shares.group(1))
            with open(profile_path, "w") as f:
                json.dump(profile, f, indent=1)
        folder = os.path.dirname(profile_path)
        for plan in sorted(glob.glob(os.path.join(folder, "*.plan.json"))):
            stem = plan[: -len(".plan.json")]
            if stem.endswith(".turns"):
                continue
            predicted = subprocess.run(
                [args.pipetune, "simulate", "--profile", profile_path, "--plan", plan, "--json"],
                check=True, capture_output=True, text=True).stdout
            with open(stem + ".predicted.json", "w") as f:
                f.write(predicted)
    subprocess.run([sys.executable, os.path.join(HERE, "partitions_table.py"), args.out],
                   check=True)


if __name__ == "__main__":
    main()
