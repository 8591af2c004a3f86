"""Side by side on CPU: pipetune's executor against torch.distributed.pipelining's ScheduleGPipe.

Same model (pipetune's zoo MLP: Linear+ReLU blocks and a Linear head), same split into two
stages, same micro-batches, same torch build (the wheel pipetune links). torch's pipeline runs
one process per stage on gloo over loopback, as that library requires; pipetune runs both stages
in one process with a worker thread each. Both use one intra-op thread per stage and SGD.
Prints each side's median step time and the ratio (target: pipetune at least as fast).

    ~/.cache/pipetune/venv/bin/python bench/compare_torch_pipelining.py --pipetune build/cli/pipetune
"""
import argparse
import json
import os
import socket
import statistics
import subprocess
import tempfile
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def mlp_stage(layers, width, classes, first, last):
    """Blocks [first, last) of the zoo MLP; index `layers` is the head."""
    modules = []
    for k in range(first, last):
        if k < layers:
            modules += [torch.nn.Linear(width, width), torch.nn.ReLU()]
        else:
            modules.append(torch.nn.Linear(width, classes))
    return torch.nn.Sequential(*modules)


def torch_rank(rank, args, port, results):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=2)
    from torch.distributed.pipelining import PipelineStage, ScheduleGPipe

    split = args.split
    bounds = [(0, split), (split, args.layers + 1)][rank]
    torch.manual_seed(0)
    module = mlp_stage(args.layers, args.width, 10, *bounds)
    stage = PipelineStage(module, rank, 2, torch.device("cpu"))
    loss = torch.nn.CrossEntropyLoss()
    schedule = ScheduleGPipe(stage, n_microbatches=args.chunks, loss_fn=lambda out, y: loss(out, y))
    optimizer = torch.optim.SGD(module.parameters(), lr=0.01)
    generator = torch.Generator().manual_seed(1)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randn(args.batch, args.width, generator=generator)
        y = torch.randint(10, (args.batch,), generator=generator)
        dist.barrier()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        if rank == 0:
            schedule.step(x)
        else:
            schedule.step(target=y, losses=[])
        optimizer.step()
        dist.barrier()
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    if rank == 0:
        results.put(statistics.median(times))
    dist.destroy_process_group()


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--pipetune", required=True, help="the pipetune binary")
    parser.add_argument("--layers", type=int, default=8)
    parser.add_argument("--width", type=int, default=1024)
    parser.add_argument("--batch", type=int, default=64)
    parser.add_argument("--chunks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--warmup", type=int, default=3)
    args = parser.parse_args()
    args.split = (args.layers + 1) // 2

    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=torch_rank, args=(r, args, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    torch_ms = results.get(timeout=600)
    for p in procs:
        p.join()

    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "plan.json")
        with open(plan, "w") as f:
            json.dump({"format": "pipetune.plan/1", "balance": [args.split, args.layers + 1 - args.split],
                       "chunks": args.chunks, "checkpoint": "never", "schedule": "gpipe"}, f)
        out = subprocess.run(
            [args.pipetune, "run", "--model", f"mlp:layers={args.layers},width={args.width}", "--plan", plan,
             "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup),
             "--threads", "1", "--json"], check=True, capture_output=True, text=True).stdout
        pipetune_ms = statistics.median(json.loads(out)["step_ms"])

    print(f"model mlp:layers={args.layers},width={args.width}, batch {args.batch}, {args.chunks} micro-batches, "
          f"2 stages, GPipe, no checkpointing, torch {torch.__version__}")
    print(f"torch.distributed.pipelining ScheduleGPipe  {torch_ms:9.3f} ms/step (median of {args.steps})")
    print(f"pipetune run                                {pipetune_ms:9.3f} ms/step (median of {args.steps})")
    print(f"ratio torch / pipetune                      {torch_ms / pipetune_ms:9.3f}")


if __name__ == "__main__":
    main()
