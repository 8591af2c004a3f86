"""The pace of each CPU core, chunk by chunk: is this machine steady enough to validate on?

A fixed piece of work (50 matrix products of 64 x 64 and their tanh, about 1 ms, one intra-op
thread) runs back to back on one core for a few seconds, on each core alone, then on all of
them at once (as a pipeline's devices run). Each chunk is classed fast (within 20 % of the
core's 5th percentile) or slow. On a virtual machine whose cores are hyper-threads of the
host's, a slow chunk is one the host ran beside another tenant's thread on the same physical
core: the chunks then fall into two clusters, about 1.4 apart, and the share of slow ones moves
from minute to minute with the host's load. A prediction taken in one share and a run measured
in another differ by that much, whatever the model.

    ~/.cache/pipetune/venv/bin/python bench/validation/vcpu_pace.py [--seconds 5] [--cores 0,1]
"""
import argparse
import multiprocessing
import os
import statistics
import time

import torch

SLOW = 1.2  # a chunk this much over the core's fast pace is slow


def chunks(core, seconds, queue):
    """Runs on `core` for `seconds`; puts each chunk's duration (ms) on the queue."""
    os.sched_setaffinity(0, {core})
    torch.set_num_threads(1)
    a, b = torch.randn(64, 64), torch.randn(64, 64)

    def work():
        x = a
        for _ in range(50):
            x = torch.tanh(x @ b)

    for _ in range(200):  # warm the caches and the allocator
        work()
    durations = []
    end = time.perf_counter() + seconds
    while (start := time.perf_counter()) < end:
        work()
        durations.append((time.perf_counter() - start) * 1e3)
    queue.put((core, durations))


def spells(slow):
    """Lengths of the runs of consecutive slow chunks."""
    runs, length = [], 0
    for s in slow:
        if s:
            length += 1
        elif length:
            runs.append(length)
            length = 0
    return runs + ([length] if length else [])


def describe(core, durations):
    fast = sorted(durations)[len(durations) // 20]
    slow = [d > SLOW * fast for d in durations]
    slow_ones = [d for d in durations if d > SLOW * fast]
    ratio = statistics.median(slow_ones) / fast if slow_ones else float("nan")
    runs = spells(slow)
    longest = max(runs) if runs else 0
    return (f"core {core}: {len(durations)} chunks, fast {fast:.3f} ms, median {statistics.median(durations):.3f} ms, "
            f"slow {100 * len(slow_ones) / len(durations):.0f} % (at {ratio:.2f} x the fast pace), "
            f"longest slow spell {longest} chunks")


def run(cores, seconds):
    queue = multiprocessing.get_context("fork").Queue()
    workers = [multiprocessing.get_context("fork").Process(target=chunks, args=(c, seconds, queue)) for c in cores]
    for w in workers:
        w.start()
    results = dict(queue.get() for _ in workers)
    for w in workers:
        w.join()
    return [describe(c, results[c]) for c in cores]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=5.0, help="per measurement (default 5)")
    parser.add_argument("--cores", default=None, help="comma-separated cores (default: all this process may use)")
    args = parser.parse_args()
    cores = [int(c) for c in args.cores.split(",")] if args.cores else sorted(os.sched_getaffinity(0))
    for core in cores:
        print("alone    ", run([core], args.seconds)[0])
    if len(cores) > 1:
        for line in run(cores, args.seconds):
            print("together ", line)


if __name__ == "__main__":
    main()
