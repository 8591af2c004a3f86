"""Each task's measured over predicted duration, grouped by how long its device waited before it
(in the measured trace): a step's first task, back to back (under 0.1 ms), 0.1-1, 1-5 and over
5 ms. Reads `validate` output folders (their plan-N.measured and plan-N.predicted traces).

    python3 bench/validation/ratio_by_wait.py OUT_DIR [OUT_DIR ...]

The profile times a layer's repetitions back to back, so a model error shows at every wait.
What a wait costs the task after it is in the prediction where the profile has its curve
(`device.after_idle`, docs/architecture.md "After a wait"); without it, or where the curve
misses, it shows as a ratio that grows with the wait.
"""
import glob
import re
import statistics
import sys

from alternate import task_durations

ACTION = re.compile(r"\d+[FBIWR]\d+")
GROUPS = ("the step's first", "under 0.1 ms", "0.1-1 ms", "1-5 ms", "over 5 ms")


def tasks(path):
    """Compute actions by name: (device, start ms, duration ms)."""
    return {name: (device, start_us / 1000.0, duration_us / 1000.0)
            for name, (_, duration_us, device, start_us) in task_durations(path).items() if ACTION.fullmatch(name)}


def group(wait):
    if wait is None:
        return GROUPS[0]
    return GROUPS[1] if wait < 0.1 else GROUPS[2] if wait < 1 else GROUPS[3] if wait < 5 else GROUPS[4]


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    ratios = {g: [] for g in GROUPS}
    for folder in sys.argv[1:]:
        for measured_path in sorted(glob.glob(f"{folder}/plan-*.measured.trace.json")):
            measured = tasks(measured_path)
            predicted = tasks(measured_path.replace(".measured.", ".predicted."))
            by_device = {}
            for name, (device, start, duration) in measured.items():
                by_device.setdefault(device, []).append((start, duration, name))
            for runs in by_device.values():
                previous_end = None
                for start, duration, name in sorted(runs):
                    wait = None if previous_end is None else start - previous_end
                    previous_end = start + duration
                    if name in predicted and predicted[name][2] > 0:
                        ratios[group(wait)].append(duration / predicted[name][2])
    print("| wait before the task | tasks | measured / predicted, median | p25-p75 |")
    print("|---|---|---|---|")
    for g in GROUPS:
        values = ratios[g]
        if len(values) >= 2:
            q = statistics.quantiles(values, n=4)
            print(f"| {g} | {len(values)} | {statistics.median(values):.2f} | {q[0]:.2f}-{q[2]:.2f} |")


if __name__ == "__main__":
    main()
