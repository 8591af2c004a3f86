"""Writes the launch-bound profiles of docs/benchmarks.md's planner table: OUT/lb100.json and
OUT/lb1000.json, a GPU-like model whose host launches each layer in a fixed 0.03-0.08 ms (a
backward 2.2 times that, plus one 0.08 ms autograd call per backward) while its kernels take
lognormal times proportional to the micro-batch (0.02 ms per sample at the median): below about
16 samples the host sets the pace. Batch 256, micro-batch sizes 1 to 256, seeded.

Usage: python3 bench/launch_bound_profiles.py OUT_DIR
then:  pipetune plan --profile OUT_DIR/lb1000.json --devices 16 --bandwidth 20GB --latency-ms 0.01 \
           --schedule gpipe,1f1b
"""

import json
import os
import random
import sys


def profile(count):
    random.seed(5)
    sizes = [1, 2, 4, 8, 16, 32, 64, 128, 256]
    layers = []
    for i in range(count):
        forward = random.lognormvariate(0, 0.5) * 0.02
        launch = random.uniform(0.03, 0.08)
        layers.append({
            "name": f"l{i}",
            "param_bytes": 1 << 20,
            "forward_ms": [forward * s for s in sizes],
            "backward_ms": [2 * forward * s for s in sizes],
            "forward_launch_ms": [launch] * len(sizes),
            "backward_launch_ms": [2.2 * launch] * len(sizes),
            "output_bytes": [s * 65536 for s in sizes],
            "saved_bytes": [s * 65536 for s in sizes],
            "workspace_bytes": [0] * len(sizes),
        })
    return {
        "format": "pipetune.profile/1",
        "model": f"launch-bound-{count}",
        "device": {"type": "cuda", "name": "synthetic", "library_bytes": 0, "memory_bytes": 0,
                   "backward_call_ms": 0.08},
        "dtype": "float32",
        "batch_size": 256,
        "micro_batch_sizes": sizes,
        "input_bytes": [s * 65536 for s in sizes],
        "layers": layers,
    }


def main():
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    for count in (100, 1000):
        with open(os.path.join(out, f"lb{count}.json"), "w") as f:
            json.dump(profile(count), f)


if __name__ == "__main__":
    main()
