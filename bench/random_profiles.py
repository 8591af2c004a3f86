"""Writes the random profiles docs/planner.md's multi-stage table plans: OUT/r16.json, r48.json
and r200.json, drawn in that order from one seeded generator. Layer forward times are lognormal
(sigma 0.5), backward twice the forward, split between input and weight gradients by a uniform
share of 30-70 % (the first layer's all weight), parameters 1-8 MiB, activations 64 KiB per
sample; batch 32 at micro-batch sizes 1 to 32.

Usage: python3 bench/random_profiles.py OUT_DIR
"""

import json
import os
import random
import sys


def main():
    out = sys.argv[1]
    os.makedirs(out, exist_ok=True)
    random.seed(3)
    sizes = [1, 2, 4, 8, 16, 32]
    for count in (16, 48, 200):
        layers = []
        for i in range(count):
            forward = random.lognormvariate(0, 0.5)
            weight_share = random.uniform(0.3, 0.7)
            layers.append({
                "name": f"l{i}",
                "param_bytes": random.randint(1, 8) * 1 << 20,
                "forward_ms": [forward * s / 8 for s in sizes],
                "backward_ms": [2 * forward * s / 8 for s in sizes],
                "backward_input_ms": [2 * forward * s / 8 * (1 - weight_share) for s in sizes],
                "backward_weight_ms": [2 * forward * s / 8 * weight_share for s in sizes],
                "output_bytes": [s * 65536 for s in sizes],
                "saved_bytes": [s * 65536 for s in sizes],
                "workspace_bytes": [0] * len(sizes),
            })
        layers[0]["backward_input_ms"] = [0] * len(sizes)
        layers[0]["backward_weight_ms"] = layers[0]["backward_ms"]
        profile = {
            "format": "pipetune.profile/1",
            "model": f"rand-{count}",
            "device": {"type": "cpu", "name": "synthetic", "memory_bytes": 0},
            "dtype": "float32",
            "batch_size": 32,
            "micro_batch_sizes": sizes,
            "input_bytes": [s * 65536 for s in sizes],
            "layers": layers,
        }
        with open(os.path.join(out, f"r{count}.json"), "w") as f:
            json.dump(profile, f)


if __name__ == "__main__":
    main()
