#!/usr/bin/env python3
"""Checks GPU profiles against whole-model runs (scripts/gpu-check.sh, phase `profile`).

    python3 bench/gpu/profile_check.py DIR

DIR holds, per model NAME: NAME.cupti.profile.json and NAME.events.profile.json (the same model
profiled with `--timer cupti` and `--timer events`) and NAME.whole.run.json (`pipetune run --json`
of the whole model as one stage and one micro-batch, timed by the executor's CUDA events).

Per model: the per-layer forward and backward times at the full batch summed, for each timer,
and, where the profile has the host's launch times, each pass taken as the larger of the
device's sum and the launches' sum (as the simulator takes a stage's task), against the median
measured step (the run's pipeline time: the same forwards and backwards plus the loss); and how
far the two timers disagree layer by layer. Exits 1 when a prediction is more than 10 % off the
whole-model time.
"""
import json
import os
import statistics
import sys


def layer_sums(profile):
    """(device forward, device backward, launch forward, launch backward) at the full batch;
    the launch sums are None without launch times."""
    k = profile["micro_batch_sizes"].index(profile["batch_size"])
    layers = profile["layers"]
    device = (sum(l["forward_ms"][k] for l in layers), sum(l["backward_ms"][k] for l in layers))
    if "forward_launch_ms" not in layers[0]:
        return device + (None, None), k
    # One backward call for the whole model: its own time once.
    call = profile["device"].get("backward_call_ms", 0.0)
    launch = (sum(l["forward_launch_ms"][k] for l in layers),
              sum(l["backward_launch_ms"][k] for l in layers) + call)
    return device + launch, k


def paced(sums):
    device_f, device_b, launch_f, launch_b = sums
    if launch_f is None:
        return device_f + device_b
    return max(device_f, launch_f) + max(device_b, launch_b)


def main(folder):
    names = sorted({f.split(".")[0] for f in os.listdir(folder) if f.endswith(".whole.run.json")})
    print("| model | device | timer | layers | Σ device ms | Σ launch ms | predicted ms | whole model ms | "
          "difference |")
    print("|---|---|---|---|---|---|---|---|---|")
    worst = 0.0
    disagreements = []
    for name in names:
        with open(os.path.join(folder, f"{name}.whole.run.json")) as f:
            whole = statistics.median(json.load(f)["pipeline_ms"])
        profiles = {}
        for timer in ("cupti", "events"):
            path = os.path.join(folder, f"{name}.{timer}.profile.json")
            if not os.path.exists(path):
                continue
            with open(path) as f:
                profiles[timer] = json.load(f)
            p = profiles[timer]
            sums, _ = layer_sums(p)
            total = paced(sums)
            diff = (total - whole) / whole
            worst = max(worst, abs(diff))
            launch = "–" if sums[2] is None else f"{sums[2]:.3f} + {sums[3]:.3f}"
            print(f"| {p['model']} | {p['device']['name']} | {p.get('timer', '?')} | {len(p['layers'])} | "
                  f"{sums[0]:.3f} + {sums[1]:.3f} | {launch} | {total:.3f} | {whole:.3f} | {diff * 100:+.1f} % |")
        if len(profiles) == 2:
            (_, k) = layer_sums(profiles["cupti"])
            for a, b in zip(profiles["cupti"]["layers"], profiles["events"]["layers"]):
                for key in ("forward_ms", "backward_ms"):
                    if b[key][k] > 0.05:
                        disagreements.append(abs(a[key][k] - b[key][k]) / b[key][k])
    if disagreements:
        print()
        print(f"- CUPTI against CUDA events, per layer and pass (at the full batch, passes over 0.05 ms): "
              f"median |difference| {statistics.median(disagreements) * 100:.1f} %, "
              f"worst {max(disagreements) * 100:.1f} %, over {len(disagreements)} passes")
    print(f"- worst |predicted − whole model|: {worst * 100:.1f} %")
    return 1 if worst > 0.10 else 0


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    sys.exit(main(sys.argv[1]))
