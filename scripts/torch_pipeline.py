"""Runs a pipetune plan on torch.distributed.pipelining, the runtime users train with, and
measures it as pipetune measures its own runs.

    python scripts/torch_pipeline.py MODULE:FUNCTION --plan plan.json [--steps 10] [--warmup 1]
        [--lr 0.01] [--loss cross_entropy|mse] [--trace measured.trace.json] [--json]

MODULE:FUNCTION is the builder scripts/export_model.py takes: FUNCTION() returns
`(model, (inputs, targets))`, the model an nn.Sequential or a list of modules. The plan's balance
splits its children into stages, placed as pipetune places them (stage s on device s for gpipe
and 1f1b; on device s mod D for interleaved-1f1b, interleaved-zb and looped-bfs; in a V for zbv
and dualpipev: stage s on device s, stage 2D - 1 - s on device s), and torch's schedule class of
the plan's schedule runs them (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B,
ScheduleLoopedBFS, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV)
with the plan's micro-batches, SGD on every device.

One process per device, with Gloo over loopback (NCCL with --device cuda): started here, or by
torchrun (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, one rank per device). Each rank
builds the model from the same seed and keeps its stages.

Same training as one device: each micro-batch's loss is weighted by its share of the batch and
torch's own division of the gradients by the micro-batch count is off, so the gradient is the
whole batch's mean loss's, as pipetune's executor computes it; the printed loss is that mean.
torch's stages check every micro-batch against one shape, so a chunk count that does not divide
the batch (8 in 3: micro-batches of 3, 3 and 2) is refused, as is what torch cannot express:
checkpoint except_last (a stage runs one module for every micro-batch; always wraps each stage
in torch.utils.checkpoint).

Every forward, backward, input-gradient and weight-gradient action of every rank is timed (the
stage's own methods, wrapped), the ranks' clocks set to a common origin by a barrier before each
step; --trace writes the median step in pipetune's measured-trace format, which the GUI lays over
pipetune's prediction of the same plan. Copies are torch's asynchronous sends and receives and
are not in it; peak memory is written on CUDA (the caching allocator's) and as 0 on CPU.

Tied weights (children holding one parameter, as GPT-2's embedding and head) are trained as one
device trains them: torch would have each rank step its own copy with its part of the gradient,
so after each step's backwards the ranks holding a tie sum its gradient (an all-reduce) before
the optimizer, and a rank's stages holding the same tensor list it once in the optimizer. A
buffer or a view two children share is refused.

Bad input (a builder that fails, a plan that does not fit the model, a schedule or mode torch
cannot run): one line on stderr, exit status 2. Needs only torch.
"""

import argparse
import json
import os
import socket
import statistics
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_model import BadInput, as_batch, as_sequential, first_line, load_function, tied_parameters  # noqa: E402

LOOPED = {"interleaved-1f1b", "interleaved-zb", "looped-bfs"}
V_SHAPED = {"zbv", "dualpipev"}
SCHEDULES = {
    "gpipe": "ScheduleGPipe",
    "1f1b": "Schedule1F1B",
    "interleaved-1f1b": "ScheduleInterleaved1F1B",
    "looped-bfs": "ScheduleLoopedBFS",
    "interleaved-zb": "ScheduleInterleavedZeroBubble",
    "zbv": "ScheduleZBVZeroBubble",
    "dualpipev": "ScheduleDualPipeV",
}


def load_plan(path):
    try:
        with open(path) as f:
            plan = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: {first_line(e)}")
    for field in ("balance", "chunks", "schedule"):
        if field not in plan:
            raise BadInput(f"{path}: missing field \"{field}\"")
    if plan["schedule"] not in SCHEDULES:
        raise BadInput(f"{path}: schedule: expected one of {', '.join(SCHEDULES)}, got \"{plan['schedule']}\"")
    balance = plan["balance"]
    if not balance or any(not isinstance(b, int) or b < 1 for b in balance):
        raise BadInput(f"{path}: balance: expected layer counts of at least 1, got {balance}")
    checkpoint = plan.get("checkpoint", "never")
    if checkpoint == "except_last":
        raise BadInput(f"{path}: checkpoint except_last: torch's PipelineStage runs one module for every "
                       "micro-batch, so recomputing all but the last cannot be expressed; use never or always")
    if checkpoint not in ("never", "always"):
        raise BadInput(f"{path}: checkpoint: expected never, except_last or always, got \"{checkpoint}\"")
    return plan


def devices_of(plan):
    """How many devices the plan uses, and each stage's."""
    stages, kind = len(plan["balance"]), plan["schedule"]
    per_device = 2 if kind in V_SHAPED else plan.get("stages_per_device", 1) if kind in LOOPED else 1
    if stages % per_device:
        raise BadInput(f"the plan's {stages} stages do not make {per_device} per device")
    devices = stages // per_device
    if kind in V_SHAPED:
        return devices, [s if s < devices else 2 * devices - 1 - s for s in range(stages)]
    return devices, [s % devices for s in range(stages)]


def micro_batch_sizes(batch, chunks):
    """pipetune's split (tensor.chunk), where torch's is the same and one size throughout."""
    ours = [len(c) for c in torch.arange(batch).chunk(chunks)]
    if len(set(ours)) != 1:
        raise BadInput(f"a batch of {batch} in {chunks} chunks makes micro-batches of {ours}: torch's stages "
                       "check every micro-batch against one shape, so they must be of one size; use a chunk count "
                       "that divides the batch")
    return ours


class Checkpointed(torch.nn.Module):
    """A stage recomputed in its backward (the plan's checkpoint always)."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(self.module, x, use_reentrant=False)


def base_loss(name):
    if name == "mse":
        return torch.nn.functional.mse_loss

    def cross_entropy(output, target):
        if target.is_floating_point():
            return torch.nn.functional.cross_entropy(output.flatten(0, -2), target.flatten(0, -2))
        return torch.nn.functional.cross_entropy(output.flatten(0, -2), target.flatten())

    return cross_entropy


def time_actions(stage, records):
    """Wraps the stage's actions so that each records (stage, micro-batch, kind, start, end)."""

    def wrap(name, kind_of):
        original = getattr(stage, name)

        def timed(chunk, *args, **kwargs):
            start = time.perf_counter()
            result = original(chunk, *args, **kwargs)
            records.append((stage.stage_index, chunk, kind_of(args, kwargs), start, time.perf_counter()))
            return result

        setattr(stage, name, timed)

    def backward_kind(args, kwargs):
        full = kwargs.get("full_backward", args[1] if len(args) > 1 else True)
        return "backward" if full else "backward_input"

    wrap("forward_one_chunk", lambda a, k: "forward")
    wrap("backward_one_chunk", backward_kind)
    wrap("backward_weight_one_chunk", lambda a, k: "backward_weight")


def tied_across_stages(model, balance):
    """The parameters children hold as one tensor (tied weights) that the balance puts on more
    than one stage, each with the stages holding it. torch's stages would each train the copy of
    the process they run in: sum_tied_gradients makes every holder's update the one-device one.
    A buffer or a view two children share is refused (export_model.tied_parameters)."""
    stage_of, first = {}, 0
    for s, count in enumerate(balance):
        for name, _ in list(model.named_children())[first:first + count]:
            stage_of[name] = s
        first += count
    split = []
    for tensor, holders in tied_parameters(model):
        stages = sorted({stage_of[child] for child, _ in holders})
        if len(stages) > 1:
            split.append((tensor, stages))
    return split


def sum_tied_gradients(split_ties, device_of, rank, device):
    """After a step's backwards, before the optimizer: each split tie's gradient becomes its sum
    over the ranks holding it (a rank's stages share the one object, whose .grad already sums
    theirs). Every rank takes part, in the same order, those holding none with zeros."""
    for tensor, stages in split_ties:
        holds = any(device_of[s] == rank for s in stages)
        grad = tensor.grad if holds and tensor.grad is not None else torch.zeros_like(tensor, device=device)
        dist.all_reduce(grad, op=dist.ReduceOp.SUM)
        if holds:
            tensor.grad = grad


def rank_main(rank, world, args, plan, results=None):
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if args.device == "cuda" else torch.device("cpu")
        from torch.distributed import pipelining

        torch.manual_seed(args.seed)
        model, batch = load_function(args.builder)()
        model = as_sequential(model)
        inputs, targets = as_batch(batch)
        children = list(model.children())
        if sum(plan["balance"]) != len(children):
            raise BadInput(f"the plan's balance {plan['balance']} holds {sum(plan['balance'])} layers, "
                           f"the model has {len(children)}")
        devices, device_of = devices_of(plan)
        if devices != world:
            raise BadInput(f"the plan runs on {devices} devices, the run has {world} ranks")
        batch_size = inputs.shape[0]
        micro_batch_sizes(batch_size, plan["chunks"])
        loss_of = base_loss(args.loss)

        def loss_fn(output, target):  # weighted by the micro-batch's share of the batch
            return loss_of(output, target) * (output.shape[0] / batch_size)

        # Each stage's input and output on a micro-batch, given to torch up front: its shape
        # inference at the first step asks the stages' neighbours in its default placement
        # (s mod D), which is not the V's.
        examples, current, first = [], inputs[:micro_batch_sizes(batch_size, plan["chunks"])[0]], 0
        with torch.no_grad():
            for count in plan["balance"]:
                before = current
                for child in children[first:first + count]:
                    current = child(current)
                examples.append((before, current))
                first += count
        stages, records, first = [], [], 0
        for s, count in enumerate(plan["balance"]):
            if device_of[s] == rank:
                module = torch.nn.Sequential(*children[first:first + count]).to(device)
                if plan.get("checkpoint", "never") == "always":
                    module = Checkpointed(module)
                stage = pipelining.PipelineStage(module, s, len(plan["balance"]), device,
                                                 input_args=examples[s][0].to(device),
                                                 output_args=examples[s][1].to(device))
                time_actions(stage, records)
                stages.append(stage)
            first += count
        schedule_class = getattr(pipelining, SCHEDULES[plan["schedule"]])
        n = len(micro_batch_sizes(batch_size, plan["chunks"]))
        if plan["schedule"] in ("gpipe", "1f1b"):
            schedule = schedule_class(stages[0], n_microbatches=n, loss_fn=loss_fn, scale_grads=False)
        else:
            schedule = schedule_class(stages, n_microbatches=n, loss_fn=loss_fn, scale_grads=False)
        # A parameter two stages of this rank hold is one object: listed once, stepped once.
        parameters = list({id(p): p for stage in stages for p in stage.submod.parameters()}.values())
        optimizer = torch.optim.SGD(parameters, lr=args.lr) if parameters else None
        split_ties = tied_across_stages(model, plan["balance"])
        holds_first = device_of[0] == rank
        holds_last = device_of[-1] == rank
        x, y = inputs.to(device), targets.to(device)
        steps = []
        for step in range(args.warmup + args.steps):
            if optimizer:
                optimizer.zero_grad(set_to_none=True)
            records.clear()
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            dist.barrier()
            origin = time.perf_counter()
            losses = [] if holds_last else None
            schedule.step(*((x,) if holds_first else ()), target=y if holds_last else None, losses=losses)
            sum_tied_gradients(split_ties, device_of, rank, device)
            if optimizer:
                optimizer.step()
            if args.device == "cuda":
                torch.cuda.synchronize(device)
            peak = torch.cuda.max_memory_allocated(device) if args.device == "cuda" else 0
            if step >= args.warmup:
                steps.append({
                    "loss": float(sum(l.item() for l in losses)) if holds_last else None,
                    "tasks": [(s, i, k, (a - origin) * 1e3, (b - origin) * 1e3) for s, i, k, a, b in records],
                    "peak": peak,
                })
        gathered = [None] * world
        dist.gather_object(steps, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            report = summarize(gathered, plan, device_of, batch_size, args)
            if results is not None:
                results.put(report)
            else:
                emit(report, args)
    finally:
        dist.destroy_process_group()


def summarize(per_rank, plan, device_of, batch_size, args):
    """Each step's loss and pipeline time over the ranks; the median step's tasks."""
    steps = []
    for k in range(len(per_rank[0])):
        tasks = [t for rank in per_rank for t in rank[k]["tasks"]]
        start, end = min(t[3] for t in tasks), max(t[4] for t in tasks)
        loss = next(rank[k]["loss"] for rank in per_rank if rank[k]["loss"] is not None)
        steps.append({"loss": loss, "pipeline_ms": end - start, "start": start, "tasks": tasks,
                      "peaks": [rank[k]["peak"] for rank in per_rank]})
    order = sorted(range(len(steps)), key=lambda k: steps[k]["pipeline_ms"])
    median = steps[order[(len(order) - 1) // 2]]
    return {"plan": plan, "device_of": device_of, "batch_size": batch_size,
            "losses": [s["loss"] for s in steps], "pipeline_ms": [s["pipeline_ms"] for s in steps],
            "median_ms": statistics.median(s["pipeline_ms"] for s in steps), "median_step": median,
            "device": args.device, "model": args.builder.rpartition(":")[0].rpartition("/")[2]}


def measured_trace(report):
    """The median step in pipetune's measured-trace format (pipetune.trace/1)."""
    step, device_of = report["median_step"], report["device_of"]
    devices = max(device_of) + 1
    prefix = "cuda" if report["device"] == "cuda" else "cpu"
    events, busy = [], [0.0] * devices
    for d in range(devices):
        events.append({"ph": "M", "pid": d, "name": "process_name", "args": {"name": f"{prefix}:{d}"}})
        events.append({"ph": "M", "pid": d, "tid": 0, "name": "thread_name", "args": {"name": "compute"}})
    letter = {"forward": "F", "backward": "B", "backward_input": "I", "backward_weight": "W"}
    for s, i, kind, start, end in sorted(step["tasks"], key=lambda t: t[3]):
        d = device_of[s]
        busy[d] += end - start
        events.append({"ph": "X", "pid": d, "tid": 0, "name": f"{s}{letter[kind]}{i}", "cat": kind,
                       "ts": round((start - step["start"]) * 1e3, 3), "dur": round((end - start) * 1e3, 3),
                       "args": {"stage": s, "micro_batch": i}})
    iteration = step["pipeline_ms"]
    summary = {
        "iteration_ms": iteration,
        "throughput_samples_per_s": report["batch_size"] / (iteration / 1e3) if iteration > 0 else 0.0,
        "bubble_fraction": 1.0 - sum(busy) / (devices * iteration) if iteration > 0 else 0.0,
        "devices": [{"name": f"{prefix}:{d}", "stages": [s for s, r in enumerate(device_of) if r == d],
                     "busy_ms": busy[d], "peak_memory_bytes": step["peaks"][d], "memory_capacity_bytes": 0}
                    for d in range(devices)],
    }
    plan = {"format": "pipetune.plan/1", **{k: v for k, v in report["plan"].items() if k != "format"}}
    sizes = [len(c) for c in torch.arange(report["batch_size"]).chunk(report["plan"]["chunks"])]
    return {"displayTimeUnit": "ms",
            "pipetune": {"format": "pipetune.trace/1", "kind": "measured", "runtime": "torch.distributed.pipelining",
                         "model": report["model"], "plan": plan, "micro_batch_sizes": sizes, "summary": summary},
            "traceEvents": events}


def emit(report, args):
    if args.trace:
        temporary = args.trace + ".partial"
        with open(temporary, "w") as f:
            json.dump(measured_trace(report), f)
        os.replace(temporary, args.trace)
    if args.json:
        print(json.dumps({"losses": report["losses"], "pipeline_ms": report["pipeline_ms"],
                          "median_ms": report["median_ms"], "trace": args.trace or None}))
        return
    for k, (loss, ms) in enumerate(zip(report["losses"], report["pipeline_ms"])):
        print(f"step {k + 1:<4} loss {loss:.6f}  pipeline {ms:.3f} ms")
    print(f"median    pipeline {report['median_ms']:.3f} ms on torch.distributed.pipelining "
          f"({SCHEDULES[report['plan']['schedule']]})")
    if args.trace:
        print(f"trace     {args.trace} (the median step)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawned(rank, world, args, plan, results, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    try:
        rank_main(rank, world, args, plan, results)
    except BadInput as e:
        results.put({"error": str(e), "rank": rank})
    except Exception as e:  # torch's own refusals: one line (the whole of it with PIPETUNE_DEBUG)
        if os.environ.get("PIPETUNE_DEBUG"):
            import traceback
            traceback.print_exc()
        results.put({"error": f"torch: {first_line(e)}", "rank": rank})
        raise SystemExit(1)


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builder", metavar="MODULE:FUNCTION")
    parser.add_argument("--plan", required=True)
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--loss", choices=("cross_entropy", "mse"), default="cross_entropy")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--trace", metavar="OUT.json")
    parser.add_argument("--json", action="store_true")
    args = parser.parse_args()
    try:
        if args.steps < 1 or args.warmup < 0:
            raise BadInput("--steps: expected at least 1 (and --warmup 0 or more)")
        plan = load_plan(args.plan)
        devices, _ = devices_of(plan)
        if plan["schedule"] in V_SHAPED and args.device == "cpu":
            raise BadInput(f"{plan['schedule']} on CPU: torch's V schedules pass tensors between the two stages a "
                           "rank holds as messages to itself, which Gloo cannot send; run it with --device cuda "
                           "(NCCL), or pick another schedule")
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
            rank_main(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args, plan)
            return 0
        context = mp.get_context("spawn")
        results = context.Queue()
        port = free_port()
        processes = [context.Process(target=spawned, args=(r, devices, args, plan, results, port))
                     for r in range(devices)]
        for p in processes:
            p.start()
        report, errors = None, []
        while report is None and any(p.is_alive() for p in processes):
            try:
                message = results.get(timeout=0.5)
                if "error" in message:
                    errors.append(message)
                else:
                    report = message
            except Exception:
                # A rank that died leaves the others waiting for it in a collective.
                if any(p.exitcode not in (None, 0) for p in processes):
                    break
        time.sleep(0.5)  # the other ranks' errors, if they are on their way
        while not results.empty():
            message = results.get()
            errors.append(message) if "error" in message else None
        for p in processes:
            p.join(timeout=5 if errors else 30)
            if p.is_alive():
                p.kill()
        if errors:
            # The cause, not the peers that lost their connection to the rank that failed.
            errors.sort(key=lambda e: ("Connection" in e["error"] or "Read error" in e["error"], e["rank"]))
            raise BadInput(errors[0]["error"])
        if report is None:
            raise BadInput("a rank failed before reporting (see above)")
        emit(report, args)
        return 0
    except BadInput as e:
        print(f"torch_pipeline.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
