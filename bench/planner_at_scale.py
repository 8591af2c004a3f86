"""Random planning problems at scale, each timed through `pipetune plan` with its defaults.

Draws COUNT instances from one seeded generator: 40 to 3,000 layers with lognormal forward
times (sigma 0.2 to 1.5), backwards 2 or 1-10 times their forward, random activation, saved
and parameter sizes; batch 16 to 1,024; 2 to 32 devices, some of unequal speeds, some capped
at 1.5 to 4 times their share of the parameters; links of 1 to 100 GB/s. Writes each profile
and hardware file to OUT_DIR, runs `plan --top 1 --json` on each (every schedule, or SCHEDULE's
as `plan --schedule` takes them; the default budget), and prints one row per instance: its
shape, wall time, answer, proven or the gap. What docs/benchmarks.md's "Random instances at
scale" table reports.

Usage: python3 bench/planner_at_scale.py PIPETUNE OUT_DIR [COUNT] [SEED] [SCHEDULE]
"""

import json
import os
import random
import subprocess
import sys
import time


def instance(rng, k):
    layers = rng.choice([40, 120, 400, 1000, 2000, 3000])
    batch = rng.choice([16, 64, 128, 256, 512, 1024])
    sizes = []
    s = 1
    while s < batch:
        sizes.append(s)
        s *= 2
    sizes.append(batch)
    sigma = rng.choice([0.2, 0.6, 1.0, 1.5])
    exponent = rng.uniform(0.6, 1.0)
    rows = []
    for i in range(layers):
        forward = rng.lognormvariate(0, sigma)
        ratio = rng.choice([2.0, 2.0, rng.uniform(1.0, 10.0)])
        output, saved = rng.uniform(0.1, 3.0), rng.uniform(0.0, 4.0)
        per = [forward * (0.02 + 0.01 * x ** exponent) for x in sizes]
        rows.append({
            "name": f"l{i}",
            "param_bytes": int(rng.uniform(0.1, 8) * (1 << 20)),
            "forward_ms": per,
            "backward_ms": [ratio * t for t in per],
            "output_bytes": [int(output * 16384 * x) for x in sizes],
            "saved_bytes": [int(saved * 32768 * x) for x in sizes],
            "workspace_bytes": [int(8192 * x) for x in sizes],
        })
    profile = {
        "format": "pipetune.profile/1", "model": f"random-{k}",
        "device": {"type": "cpu", "name": "synthetic", "memory_bytes": 0},
        "dtype": "float32", "batch_size": batch, "micro_batch_sizes": sizes,
        "input_bytes": [4096 * x for x in sizes], "layers": rows,
    }
    devices = min(rng.choice([2, 4, 8, 16, 32]), layers)
    params = sum(r["param_bytes"] for r in rows)
    cap = rng.choice([0, 0, 1.5, 2.5, 4.0])
    unequal = rng.random() < 0.4
    entries = []
    for d in range(devices):
        entry = {"name": f"cpu:{d}", "memory_bytes": int(cap * params / devices) if cap else 0}
        if unequal:
            entry["speed"] = rng.choice([0.5, 0.75, 1.0, 1.5, 2.0])
        entries.append(entry)
    hardware = {
        "format": "pipetune.hardware/1", "devices": entries,
        "link": {"bandwidth_bytes_per_s": rng.choice([1e9, 1e10, 1e11]),
                 "latency_ms": rng.choice([0.0, 0.01, 0.1])},
    }
    shape = f"{layers} x {devices}, batch {batch}, sigma {sigma}"
    shape += f", cap {cap} x" if cap else ", no cap"
    shape += ", unequal" if unequal else ""
    return profile, hardware, shape


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    pipetune, out = sys.argv[1], sys.argv[2]
    count = int(sys.argv[3]) if len(sys.argv) > 3 else 12
    rng = random.Random(int(sys.argv[4]) if len(sys.argv) > 4 else 1)
    schedule = sys.argv[5] if len(sys.argv) > 5 else "all"
    os.makedirs(out, exist_ok=True)
    print("| # | instance | time | answer | proven / gap |")
    print("| --- | --- | --- | --- | --- |")
    for k in range(count):
        profile, hardware, shape = instance(rng, k)
        p, h = os.path.join(out, f"p{k}.json"), os.path.join(out, f"h{k}.json")
        with open(p, "w") as f:
            json.dump(profile, f)
        with open(h, "w") as f:
            json.dump(hardware, f)
        start = time.monotonic()
        run = subprocess.run([pipetune, "plan", "--profile", p, "--hardware", h, "--top", "1",
                              "--schedule", schedule, "--json"], capture_output=True, text=True)
        seconds = time.monotonic() - start
        try:
            result = json.loads(run.stdout)
        except json.JSONDecodeError:
            print(f"| {k} | {shape} | {seconds:.2f} s | exit {run.returncode}: "
                  f"{run.stderr.strip()[:80]} | |")
            continue
        if result["plans"]:
            best = result["plans"][0]["iteration_ms"]
            answer = f"{best:.3f} ms"
            bound = result.get("lower_bound_ms") or 0.0
            verdict = "proven" if result["proven_optimal"] else \
                f"{100 * (best - bound) / best:.1f} % gap"
        else:
            leanest = result.get("leanest")
            peak = max(leanest["peak_memory_bytes"]) / 2**20 if leanest else None
            answer = f"nothing fits; leanest {peak:.0f} MiB" if peak else "nothing fits; no plan"
            verdict = ""
        print(f"| {k} | {shape} | {seconds:.2f} s | {answer} | {verdict} |")


if __name__ == "__main__":
    main()
