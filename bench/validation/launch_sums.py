#!/usr/bin/env python3
"""Prints a profile's host launch sums per micro-batch size, beside the device's sums.

    python3 bench/validation/launch_sums.py PROFILE [PROFILE...]

A layer's calls do not grow with the batch, so launch sums that move from size to size met a
host whose pace moved (or calls that do depend on the size: a library choosing another kernel
plan). The profile's `meta.host_pace_us` is the host's pace it was taken at.
"""
import json
import sys


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    for path in sys.argv[1:]:
        with open(path) as f:
            profile = json.load(f)
        pace = profile.get("meta", {}).get("host_pace_us")
        print(f"{path}: {profile['model']}, host pace "
              f"{'%.2f us per call' % pace if pace else 'not recorded'}")
        print("| size | forward: device, launch | backward: device, launch | nograd launch |")
        print("| --- | --- | --- | --- |")
        layers = profile["layers"]
        for k, size in enumerate(profile["micro_batch_sizes"]):
            def total(key):
                return sum(layer[key][k] for layer in layers if key in layer)
            print(f"| {size} | {total('forward_ms'):.3f}, {total('forward_launch_ms'):.3f} "
                  f"| {total('backward_ms'):.3f}, {total('backward_launch_ms'):.3f} "
                  f"| {total('forward_nograd_launch_ms'):.3f} |")


if __name__ == "__main__":
    main()
