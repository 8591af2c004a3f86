"""Each stage's actions, by kind, in pipetune traces (predicted or measured): the median duration
in ms, one Markdown row per stage and kind, one column per trace.

    python3 bench/validation/action_medians.py measured.trace.json predicted.trace.json

Names are the IR's ("2I0": stage 2's input gradient of micro-batch 0); copies are left out.
Used to read where a prediction's time goes action by action, where a step's total hides it.
"""
import re
import statistics
import sys

from alternate import task_durations

ACTION = re.compile(r"(\d+)([FBIWR])(\d+)")


def medians(path):
    durations = {}
    for name, (_, duration_us, _, _) in task_durations(path).items():
        match = ACTION.fullmatch(name)
        if match:
            key = (int(match.group(1)), match.group(2))
            durations.setdefault(key, []).append(duration_us / 1000.0)
    return {key: statistics.median(values) for key, values in durations.items()}


def main():
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    traces = [medians(path) for path in sys.argv[1:]]
    print("| stage, kind | " + " | ".join(sys.argv[1:]) + " |")
    print("|---|" + "---|" * len(traces))
    for key in sorted(set().union(*traces)):
        cells = [f"{t[key]:.3f}" if key in t else "-" for t in traces]
        print(f"| {key[0]}{key[1]} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
