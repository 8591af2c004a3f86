"""How much slower a layer runs when its weights come from memory rather than the last-level cache.

pipetune's profile times each layer hot and cold, cold after writing a buffer four times the
core's private cache (L2). A pipeline whose stages touch more than the last-level cache (L3)
between two uses of a layer runs it colder than that: its weights come from DRAM. This times one
Linear+ReLU layer's forward and backward hot, after an L2-sized flush (the profiler's cold) and
after an LLC-sized flush, interleaved so that the machine's drift hits all three alike.

    python bench/validation/llc_cold.py [--width 1024] [--batch 64] [--llc-mib 32] [--repeats 300]
"""

import argparse
import statistics
import time

import torch


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--l2-mib", type=int, default=1, help="the core's private cache (MiB)")
    parser.add_argument("--llc-mib", type=int, default=32, help="the last-level cache (MiB)")
    parser.add_argument("--repeats", type=int, default=300)
    args = parser.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    layer = torch.nn.Sequential(torch.nn.Linear(args.width, args.width), torch.nn.ReLU())
    x = torch.randn(args.batch, args.width, requires_grad=True)
    floats = 1024 * 1024 // 4  # a MiB of float32
    flushes = {"hot": None,
               "L2-cold": torch.empty(4 * args.l2_mib * floats),
               "LLC-cold": torch.empty(4 * args.llc_mib * floats)}
    times = {name: ([], []) for name in flushes}
    for _ in range(10):
        layer(x).sum().backward()
    for _ in range(args.repeats):
        for name, flush in flushes.items():
            if flush is not None:
                flush.fill_(1.0)
            start = time.perf_counter()
            y = layer(x)
            forward = time.perf_counter() - start
            if flush is not None:
                flush.fill_(1.0)
            start = time.perf_counter()
            y.sum().backward()
            backward = time.perf_counter() - start
            times[name][0].append(forward)
            times[name][1].append(backward)
    hot_forward, hot_backward = (statistics.median(t) for t in times["hot"])
    for name, (forward, backward) in times.items():
        f, b = statistics.median(forward), statistics.median(backward)
        print(f"{name:9} forward {f * 1e3:.3f} ms ({f / hot_forward - 1:+.1%})  "
              f"backward {b * 1e3:.3f} ms ({b / hot_backward - 1:+.1%})")


if __name__ == "__main__":
    main()
