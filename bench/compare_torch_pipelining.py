"""Side by side: pipetune's executor against torch.distributed.pipelining.

Same model (pipetune's zoo MLP: Linear+ReLU blocks and a Linear head), same split into two
stages, same micro-batches, same torch build (the wheel pipetune links), SGD on both sides.

--device cpu (default): torch's ScheduleGPipe runs one process per stage on gloo over loopback,
as that library requires; pipetune runs both stages in one process with a worker thread each.
Both use one intra-op thread per stage.

--device cuda: both stages on the one GPU. torch runs them in one process (world size 1, both
stages on rank 0) under ScheduleLoopedBFS, which is GPipe's order for several stages on a rank
(all forwards of stage 0, of stage 1, then the backwards); pipetune runs a plan whose two
stages name the same device, so one stream runs both, in GPipe's order.

Prints each side's median step time and the ratio (target: pipetune at least as fast).

    ~/.cache/pipetune/venv/bin/python bench/compare_torch_pipelining.py --pipetune build/cli/pipetune
    python3 bench/compare_torch_pipelining.py --pipetune build-gpu/cli/pipetune --device cuda --width 4096
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


def torch_one_gpu(args):
    """Both stages on cuda:0 in this process: the schedule passes activations between them locally."""
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(free_port())
    dist.init_process_group("gloo", rank=0, world_size=1)
    from torch.distributed.pipelining import PipelineStage, ScheduleLoopedBFS
    from torch.distributed.pipelining import stage as stage_module

    # The schedule's first step opens its links with a send to each neighbouring rank, even when
    # the neighbour is this rank, which a one-rank group cannot do; there is nothing to open.
    stage_module._PipelineStageBase._get_init_p2p_neighbors_ops = lambda self: []
    device = torch.device("cuda:0")
    torch.manual_seed(0)
    bounds = [(0, args.split), (args.split, args.layers + 1)]
    modules = [mlp_stage(args.layers, args.width, 10, *b).to(device) for b in bounds]
    micro = -(-args.batch // args.chunks)
    # Shapes given, so no shape inference over the (one-rank) group either.
    hidden = torch.empty(micro, args.width, device=device)
    outputs = [hidden, torch.empty(micro, 10, device=device)]
    stages = [PipelineStage(m, k, 2, device, input_args=(hidden,), output_args=(outputs[k],))
              for k, m in enumerate(modules)]
    loss = torch.nn.CrossEntropyLoss()
    schedule = ScheduleLoopedBFS(stages, n_microbatches=args.chunks, loss_fn=lambda out, y: loss(out, y))
    optimizer = torch.optim.SGD([p for m in modules for p in m.parameters()], lr=0.01)
    generator = torch.Generator(device=device).manual_seed(1)
    times = []
    for step in range(args.warmup + args.steps):
        x = torch.randn(args.batch, args.width, generator=generator, device=device)
        y = torch.randint(10, (args.batch,), generator=generator, device=device)
        torch.cuda.synchronize()
        start = time.perf_counter()
        optimizer.zero_grad(set_to_none=True)
        schedule.step(x, target=y, losses=[])
        optimizer.step()
        torch.cuda.synchronize()
        if step >= args.warmup:
            times.append((time.perf_counter() - start) * 1e3)
    dist.destroy_process_group()
    return statistics.median(times), "ScheduleLoopedBFS (both stages on cuda:0)"


def torch_two_processes(args):
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=torch_rank, args=(r, args, port, results)) for r in range(2)]
    for p in procs:
        p.start()
    torch_ms = results.get(timeout=600)
    for p in procs:
        p.join()
    return torch_ms, "ScheduleGPipe (one process per stage, gloo)"


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
    parser.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    args = parser.parse_args()
    args.split = (args.layers + 1) // 2
    if args.device == "cuda" and not torch.cuda.is_available():
        parser.error("--device cuda: torch sees no CUDA device")

    torch_ms, torch_name = torch_one_gpu(args) if args.device == "cuda" else torch_two_processes(args)

    with tempfile.TemporaryDirectory() as tmp:
        plan = os.path.join(tmp, "plan.json")
        spec = {"format": "pipetune.plan/1", "balance": [args.split, args.layers + 1 - args.split],
                "chunks": args.chunks, "checkpoint": "never", "schedule": "gpipe"}
        command = [args.pipetune, "run", "--model", f"mlp:layers={args.layers},width={args.width}", "--plan", plan,
                   "--batch", str(args.batch), "--steps", str(args.steps), "--warmup", str(args.warmup), "--json"]
        if args.device == "cuda":
            spec["devices"] = ["cuda:0", "cuda:0"]
            command += ["--device", "cuda"]
        else:
            command += ["--threads", "1"]
        with open(plan, "w") as f:
            json.dump(spec, f)
        out = subprocess.run(command, check=True, capture_output=True, text=True).stdout
        pipetune_ms = statistics.median(json.loads(out)["step_ms"])

    print(f"model mlp:layers={args.layers},width={args.width}, batch {args.batch}, {args.chunks} micro-batches, "
          f"2 stages, GPipe, no checkpointing, torch {torch.__version__}, {args.device}")
    print(f"torch.distributed.pipelining {torch_name}: {torch_ms:9.3f} ms/step (median of {args.steps})")
    print(f"pipetune run: {pipetune_ms:9.3f} ms/step (median of {args.steps})")
    print(f"ratio torch / pipetune: {torch_ms / pipetune_ms:9.3f}")


if __name__ == "__main__":
    main()
