"""How much slower a layer runs after its core did something else: one child of an exported
model (`scripts/export_model.py`), forward without autograd on one thread, timed back to back,
after writing a buffer four times a core's private cache (the profile's cold times), after
sleeping 1, 5 and 20 ms, and after spinning 5 ms in Python. Medians of N runs, ms, three rounds.

    python bench/validation/after_idle.py MODEL.pt MODEL.batch.pt [--child 1] [--runs 200]

The profile times a layer's repetitions back to back; in a pipeline a device's task often starts
after a wait for another device's work. On this project's 2-vCPU VM (AMD EPYC, KVM) a Llama
decoder layer of `scripts/examples/hf_llama.py` (0.6 ms back to back) ran 1.1-1.3 x that after
1 ms asleep, 1.4-1.9 x after 5 ms and 2.1-3.1 x after 20 ms, and 1.4-2.1 x after spinning 5 ms,
where the 4 MB write changed nothing: not the data cache, which the profile's cold times flush.
torchvision's ResNet `layer2` (6-7 ms) ran 0.5-1.3 ms longer after 20 ms: more a cost per task
than a factor.
"""
import argparse
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model")
    parser.add_argument("batch")
    parser.add_argument("--child", type=int, default=1, help="the child timed; those before make its input")
    parser.add_argument("--runs", type=int, default=200)
    args = parser.parse_args()
    torch.set_num_threads(1)
    children = list(torch.jit.load(args.model).children())
    batch = torch.load(args.batch)
    x = batch[0] if isinstance(batch, (tuple, list)) else batch["inputs"]
    flush = torch.empty(4 * 1024 * 1024 // 4)
    with torch.no_grad():
        for child in children[: args.child]:
            x = child(x)
        layer = children[args.child]

        def before(mode):
            if mode == "flush 4 MB":
                flush.add_(1.0)
            elif mode.startswith("sleep"):
                time.sleep(float(mode.split()[1]) / 1e3)
            elif mode == "spin 5":
                start = time.perf_counter()
                while time.perf_counter() - start < 0.005:
                    pass

        modes = ["back to back", "flush 4 MB", "sleep 1", "sleep 5", "sleep 20", "spin 5"]
        for _ in range(20):
            layer(x)
        for _ in range(3):
            row = {}
            for mode in modes:
                times = []
                for _ in range(args.runs):
                    before(mode)
                    start = time.perf_counter()
                    layer(x)
                    times.append(time.perf_counter() - start)
                row[mode] = statistics.median(times) * 1e3
            print("  ".join(f"{mode}: {ms:.3f}" for mode, ms in row.items()))


if __name__ == "__main__":
    main()
