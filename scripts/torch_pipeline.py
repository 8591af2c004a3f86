"""Runs a pipetune plan on torch.distributed.pipelining, the runtime users train with, and
measures it as pipetune measures its own runs.

    python scripts/torch_pipeline.py MODULE:FUNCTION --plan plan.json [--steps 10] [--warmup 1]
        [--lr 0.01] [--loss cross_entropy|mse] [--trace measured.trace.json] [--json]
    python scripts/torch_pipeline.py MODULE:FUNCTION --plan plan.json --schedule-csv order.csv ...
    python scripts/torch_pipeline.py --probe torch.hardware.json [--devices 2] [--hardware BASE.json]

MODULE:FUNCTION is the builder scripts/export_model.py takes: FUNCTION() returns
`(model, (inputs, targets))`, the model an nn.Sequential or a list of modules. The plan's balance
splits its children into stages, placed as pipetune places them (stage s on device s for gpipe
and 1f1b; on device s mod D for interleaved-1f1b, interleaved-zb and looped-bfs; in a V for zbv
and dualpipev: stage s on device s, stage 2D - 1 - s on device s), and torch's schedule class of
the plan's schedule runs them (ScheduleGPipe, Schedule1F1B, ScheduleInterleaved1F1B,
ScheduleLoopedBFS, ScheduleInterleavedZeroBubble, ScheduleZBVZeroBubble, ScheduleDualPipeV)
with the plan's micro-batches, SGD on every device. --schedule-csv runs a custom order instead
(pipetune's `plan`/`simulate --write-schedule-csv` writes one): torch's _PipelineScheduleRuntime
loads it and adds the sends and receives; stage s runs on the rank of the row its actions are in.

One process per device, with Gloo over loopback (NCCL with --device cuda): started here, or by
torchrun (RANK, WORLD_SIZE, MASTER_ADDR and MASTER_PORT set, one rank per device). Each rank
builds the model from the same seed and keeps its stages.

Same training as one device: each micro-batch's loss is weighted by its share of the batch and
torch's own division of the gradients by the micro-batch count is off, so the gradient is the
whole batch's mean loss's, as pipetune's executor computes it; the printed loss is that mean.
torch's stages check every micro-batch against one shape, so a chunk count that does not divide
the batch (8 in 3: micro-batches of 3, 3 and 2) is refused, as is what torch cannot express:
checkpoint except_last (a stage runs one module for every micro-batch; always wraps each stage
in torch.utils.checkpoint), and checkpoint always under a split backward (interleaved-zb, zbv,
dualpipev, a CSV's I and W), where torch recomputes a stage once for every autograd call its
backward makes.

Every forward, backward, input-gradient and weight-gradient action of every rank is timed (the
stage's own methods, wrapped), and every message between ranks (the schedules' own helpers that
post and wait for them, wrapped): a copy runs from both ends having posted it to its receiver's
wait for it ending, at or after its arrival (torch waits just before the action that needs it).
The times are on one clock: ranks on one machine share it, and across machines each rank's
offset to rank 0's is measured first (Cristian's exchange). --trace writes the median step in
pipetune's measured-trace format, which the GUI lays over pipetune's prediction of the same
plan. Peak memory per rank: the caching allocator's on CUDA; on CPU the rank's CPU tensors over
the last unmeasured step, counted by torch's profiler (CpuPeak).

--probe OUT.json measures torch's own costs (per action, and its point-to-point copies) and
writes a hardware file for its runtime ("runtime": "torch.distributed.pipelining"), with which
pipetune's simulate and plan predict a plan on torch rather than on pipetune's executor.

Tied weights (children holding one parameter, as GPT-2's embedding and head) are trained as one
device trains them: torch would have each rank step its own copy with its part of the gradient,
so after each step's backwards the ranks holding a tie sum its gradient (an all-reduce in a group
of those ranks alone) before the optimizer, and a rank's stages holding the same tensor list it once in the optimizer. A
buffer two children share is copied into each where no forward changes it (as export_model.py
does); one a forward changes, or a view two children share, is refused.

Bad input (a builder that fails, a plan that does not fit the model, a schedule or mode torch
cannot run): one line on stderr, exit status 2. Needs only torch.
"""

import argparse
import contextlib
import gc
import json
import logging
import os
import socket
import statistics
import sys
import time

# c10's warnings from the memory window (frees of blocks made before it, the profiler's own
# callbacks) say nothing about the user's run.
os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
import torch  # noqa: E402
import torch.distributed as dist  # noqa: E402
import torch.multiprocessing as mp  # noqa: E402

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_model import (BadInput, as_batch, as_sequential, base_loss, children,  # noqa: E402
                          copy_shared_constant_buffers, first_line, load_function, tied_parameters)

LOOPED = {"interleaved-1f1b", "interleaved-zb", "looped-bfs"}
V_SHAPED = {"zbv", "dualpipev"}
SPLIT_BACKWARD = {"interleaved-zb", "zbv", "dualpipev"}
# torch.utils.checkpoint recomputes once per autograd call that reaches the stage's saved tensors,
# and torch's split backward makes one for I and one for each of W's parameter groups.
RECOMPUTES_PER_AUTOGRAD_CALL = ("torch recomputes a checkpointed stage at its I and again for each of its W's "
                                "parameter groups (a stage of L layers with weights runs its forward L + 1 times "
                                "more); use never, or a schedule that does not split the backward")
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
    if checkpoint == "always" and plan["schedule"] in SPLIT_BACKWARD:
        raise BadInput(f"{path}: checkpoint always under {plan['schedule']}: {RECOMPUTES_PER_AUTOGRAD_CALL}")
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


def csv_placement(path, plan, batch_size=None):
    """The ranks and each stage's rank of a compute-only schedule CSV (row r: rank r's actions,
    as pipetune's --write-schedule-csv and torch's _dump_csv write it), checked against the plan:
    the stages of its balance, each in one row, and, once the batch size is known, its
    micro-batches. The order itself torch's _load_csv checks."""
    import csv
    import re
    try:
        with open(path, newline="") as f:
            rows = list(csv.reader(f))
    except OSError as e:
        raise BadInput(f"{path}: {first_line(e)}")
    stages = len(plan["balance"])
    device_of, seen = [None] * stages, set()
    for r, row in enumerate(rows):
        for c, cell in enumerate(row):
            # An OVERLAP_F_B pair, (0F3;5B1)OVERLAP_F_B, is its two actions.
            for action in filter(None, cell.strip().removesuffix("OVERLAP_F_B").strip("()").split(";")):
                match = re.fullmatch(r"(\d+)([FBIW])(\d+)", action.strip())
                if not match:
                    raise BadInput(f"{path}: row {r + 1}, cell {c + 1}: expected a compute action such as 0F1, "
                                   f"got \"{cell}\"")
                stage, micro_batch = int(match.group(1)), int(match.group(3))
                if match.group(2) in "IW" and plan.get("checkpoint", "never") == "always":
                    raise BadInput(f"{path}: row {r + 1}, cell {c + 1}: checkpoint always with a split backward "
                                   f"({action.strip()}): {RECOMPUTES_PER_AUTOGRAD_CALL}")
                if stage >= stages:
                    raise BadInput(f"{path}: row {r + 1}, cell {c + 1}: stage {stage}, the plan's balance has "
                                   f"{stages} stages")
                if device_of[stage] not in (None, r):
                    raise BadInput(f"{path}: row {r + 1}, cell {c + 1}: stage {stage} is in rows "
                                   f"{device_of[stage] + 1} and {r + 1}")
                device_of[stage] = r
                seen.add(micro_batch)
    if None in device_of:
        raise BadInput(f"{path}: stage {device_of.index(None)} of the plan's {stages} runs in no row")
    if batch_size is not None:
        micro_batches = len(micro_batch_sizes(batch_size, plan["chunks"]))
        if seen != set(range(micro_batches)):
            raise BadInput(f"{path}: micro-batches {min(seen)} to {max(seen)}, the plan has {micro_batches} "
                           f"(chunks {plan['chunks']} of a batch of {batch_size})")
    return len(rows), device_of


def placement(plan, args, batch_size=None):
    """The plan's devices and each stage's: from --schedule-csv's rows, else the schedule's."""
    if getattr(args, "schedule_csv", None):
        return csv_placement(args.schedule_csv, plan, batch_size)
    return devices_of(plan)


def micro_batch_sizes(batch, chunks):
    """pipetune's split (tensor.chunk), where torch's is the same and one size throughout."""
    ours = [len(c) for c in torch.arange(batch).chunk(chunks)]
    if len(set(ours)) != 1:
        raise BadInput(f"a batch of {batch} in {chunks} chunks makes micro-batches of {ours}: torch's stages "
                       "check every micro-batch against one shape, so they must be of one size; use a chunk count "
                       "that divides the batch")
    return ours


class KeptBuffers:
    """Puts a module's buffers back as they were on entry: around a recompute, which in training
    mode would update batch norm's running statistics (and its count of batches) a second time
    for the same micro-batch. Through `.data`, whose version counter is not the buffer's: the
    recompute's graph saved the running statistics, and a version bump would fail its backward
    (in training mode batch norm's backward reads the batch's statistics, not these)."""

    def __init__(self, module):
        self.module = module

    def __enter__(self):
        self.kept = [(b, b.detach().clone()) for b in self.module.buffers()]

    def __exit__(self, *exception):
        for buffer, saved in self.kept:
            buffer.data.copy_(saved)


class Checkpointed(torch.nn.Module):
    """A stage recomputed in its backward (the plan's checkpoint always), the recompute counting
    nothing in the buffers: the micro-batch's forward counted it already, as on one device."""

    def __init__(self, module):
        super().__init__()
        self.module = module

    def forward(self, x):
        return torch.utils.checkpoint.checkpoint(
            self.module, x, use_reentrant=False,
            context_fn=lambda: (contextlib.nullcontext(), KeptBuffers(self.module)))


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


def machine_identity():
    """This machine, as its processes' shared monotonic clock knows it: the host and its boot."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            return socket.gethostname(), f.read().strip()
    except OSError:
        return None  # not Linux: no proof the clock is shared


def clock_offset(rank, world, device):
    """Seconds to add to this rank's time.perf_counter() to read rank 0's. Ranks on one machine
    share it (CLOCK_MONOTONIC): 0, exactly. Across machines, Cristian's exchange with rank 0: of
    eight round trips the shortest, rank 0's reading taken as at its middle (off by at most half
    that trip). A barrier's exit is no common origin: ranks leave it up to a message apart
    (0.4 ms on a 2-vCPU VM, which put a stage's forward before the one feeding it)."""
    identities = [None] * world
    dist.all_gather_object(identities, machine_identity())
    if identities[0] is not None and len(set(identities)) == 1 and not os.environ.get("PIPETUNE_CLOCK_EXCHANGE"):
        return 0.0
    reading = torch.zeros(1, dtype=torch.float64, device=device)
    offset, shortest = 0.0, float("inf")
    for other in range(1, world):
        for _ in range(8):
            if rank == 0:
                dist.recv(reading, src=other)
                reading.fill_(time.perf_counter())
                dist.send(reading, dst=other)
            elif rank == other:
                sent = time.perf_counter()
                dist.send(reading, dst=0)
                dist.recv(reading, src=0)
                back = time.perf_counter()
                if back - sent < shortest:
                    shortest, offset = back - sent, reading.item() - (sent + back) / 2
    return offset


def tag_messages(stage):
    """Marks each point-to-point op the stage's sends and receives make with the message it
    carries: (direction, sending stage, micro-batch, whether this rank sends it)."""

    def wrap(name, direction, sender, sends):
        original = getattr(stage, name)

        def tagged(chunk, *args, **kwargs):
            ops = original(chunk, *args, **kwargs)
            for op in ops:
                op.pipetune_message = (direction, sender(stage.stage_index), chunk, sends)
            return ops

        setattr(stage, name, tagged)

    wrap("get_fwd_send_ops", "activation", lambda s: s, True)
    wrap("get_fwd_recv_ops", "activation", lambda s: s - 1, False)
    wrap("get_bwd_send_ops", "gradient", lambda s: s, True)
    wrap("get_bwd_recv_ops", "gradient", lambda s: s + 1, False)


def no_warm_up_messages_to_itself(stage, rank):
    """Drops the one-element messages a stage's first step sends its neighbours to set up their
    links where the neighbour is on this rank: the V's middle stages, or a custom order's adjacent
    stages on one rank. Gloo has no link from a rank to itself and fails on them ("Pair is not
    connected"); past that first step torch hands tensors between a rank's own stages without
    messages."""
    original = stage._get_init_p2p_neighbors_ops

    def to_other_ranks():
        return [op for op in original() if op.peer != rank]

    stage._get_init_p2p_neighbors_ops = to_other_ranks


def time_messages(messages):
    """Records when this rank posts each tagged op (a send: "sent"; a receive: "posted") and
    when its wait for a receive ends ("received"), through the schedules' own helpers, which
    every schedule and the CSV runtime call to post (batch_isend_irecv) and to wait."""
    from torch.distributed.pipelining import schedules
    # torch's own helpers, also where a process ran a pipeline before (wrapped once, not twice)
    post = getattr(schedules._batch_p2p, "wrapped", schedules._batch_p2p)
    wait = getattr(schedules._wait_batch_p2p, "wrapped", schedules._wait_batch_p2p)
    waiting = {}  # id(work) -> (work, the messages it completes)

    def posted(ops, desc=None):
        now = time.perf_counter()
        works = post(ops, desc)
        tags = [getattr(op, "pipetune_message", None) for op in ops]
        for tag, op in zip(tags, ops):
            if tag is not None:
                messages.append(("sent" if tag[3] else "posted", tag[:3], now, op.tensor.nbytes))
        # Gloo gives a work per op; NCCL one for the whole batch.
        groups = [[tag] for tag in tags] if len(works) == len(ops) else [tags] * len(works)
        for work, group in zip(works, groups):
            waiting[id(work)] = (work, [tag for tag in group if tag is not None and not tag[3]])
        return works

    def waited(works):
        first = time.perf_counter()
        for work in works:
            start = time.perf_counter()
            work.wait()
            now = time.perf_counter()
            for tag in waiting.pop(id(work), (None, []))[1]:
                messages.append(("received", tag[:3], now, now - start))
        if works:  # the whole wait, sends' included: a send's wait may block until it is received
            messages.append(("blocked", None, first, time.perf_counter() - first))

    posted.wrapped, waited.wrapped = post, wait
    schedules._batch_p2p, schedules._wait_batch_p2p = posted, waited
    return waiting


class CpuPeak:
    """The peak bytes of this process's CPU tensors over a window, as pipetune's counting allocator
    counts them. torch's profiler counts the CPU allocator's bytes only while it records memory,
    and a free only of a block it saw allocated; so it records from before the model is built
    (every tensor the rank holds is then counted) up to the window, and the window's peak is the
    highest running total inside it. Recording costs time: the window is the last unmeasured
    step, and the timed steps run without it."""

    def __init__(self):
        os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # no note that there is no GPU
        self.total, self.peak = 0, 0
        self.profiler = self._started()

    @staticmethod
    def _started():
        import warnings
        from torch.profiler import ProfilerActivity, profile
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            profiler = profile(activities=[ProfilerActivity.CPU], profile_memory=True)
            profiler.start()
        return profiler

    def _stopped(self):
        """Stops recording; the running totals of what it recorded, in order."""
        self.profiler.stop()
        events = [e for e in self.profiler.profiler.kineto_results.events() if e.name() == "[memory]"]
        totals = []
        for e in sorted(events, key=lambda e: e.start_ns()):
            self.total += e.nbytes()
            totals.append(self.total)
        return totals

    def open_window(self):
        self._stopped()
        self.peak = self.total
        self.profiler = self._started()

    def close_window(self):
        self.peak = max([self.peak, *self._stopped()])
        return self.peak


def tied_across_stages(model, balance):
    """The parameters children hold as one tensor (tied weights) that the balance puts on more
    than one stage, each with the stages holding it. torch's stages would each train the copy of
    the process they run in: sum_tied_gradients makes every holder's update the one-device one.
    A buffer or a view two children share is refused (export_model.tied_parameters)."""
    stage_of, first = {}, 0
    for s, count in enumerate(balance):
        for name, _ in children(model)[first:first + count]:
            stage_of[name] = s
        first += count
    split = []
    for tensor, holders in tied_parameters(model):
        stages = sorted({stage_of[child] for child, _ in holders})
        if len(stages) > 1:
            split.append((tensor, stages))
    return split


def stand_in(tensor):
    """A meta tensor of a tie's shape, for a rank that holds none of it. Detached: `.to` records
    a graph whose AccumulateGrad node holds the parameter, which kept the whole tensor alive
    (the GPT-2's 512 KB embedding on every middle rank)."""
    return tensor.detach().to("meta")


def tie_groups(split_ties, device_of):
    """Each split tie with the ranks holding it and, where that is more than one rank, a process
    group of those ranks alone (as Megatron's embedding group): the ranks that hold none take
    no part and allocate nothing. Every rank calls this in the same order (new_group's rule)."""
    out = []
    for tensor, stages in split_ties:
        holders = sorted({device_of[s] for s in stages})
        group = dist.new_group(ranks=holders) if len(holders) > 1 else None
        out.append((tensor, holders, group))
    return out


def sum_tied_gradients(ties, rank, device):
    """After a step's backwards, before the optimizer: each split tie's gradient becomes its sum
    over the ranks holding it (a rank's stages share the one object, whose .grad already sums
    theirs)."""
    for tensor, holders, group in ties:
        if group is None or rank not in holders:
            continue
        if tensor.grad is None:  # a holder whose stages gave it no gradient adds zeros
            tensor.grad = torch.zeros_like(tensor, device=device)
        dist.all_reduce(tensor.grad, op=dist.ReduceOp.SUM, group=group)


def stage_examples(children, balance, x):
    """Each stage's input and output on one micro-batch. A function of its own so that no
    local outlives it: a loop variable left holding the model's last child kept its tied
    embedding alive on every rank (512 KB on the GPT-2's middle ranks)."""
    examples, first = [], 0
    with torch.no_grad():
        for count in balance:
            before = x
            for child in children[first:first + count]:
                x = child(x)
            examples.append((before, x))
            first += count
    return examples


def rank_main(rank, world, args, plan, results=None):
    if not os.environ.get("PIPETUNE_DEBUG"):
        # torch logs the whole schedule at error level before it raises; the one line says why.
        logging.getLogger("torch.distributed.pipelining").setLevel(logging.CRITICAL)
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if args.device == "cuda" else torch.device("cpu")
        from torch.distributed import pipelining
        cpu_peak = CpuPeak() if args.device == "cpu" and args.warmup > 0 else None

        torch.manual_seed(args.seed)
        model, batch = load_function(args.builder)()
        model = as_sequential(model)
        inputs, targets = as_batch(batch)
        copy_shared_constant_buffers(model, inputs)  # as the export does: each stage its own copy
        layers = [module for _, module in children(model)]
        if sum(plan["balance"]) != len(layers):
            raise BadInput(f"the plan's balance {plan['balance']} holds {sum(plan['balance'])} layers, "
                           f"the model has {len(layers)}")
        devices, device_of = placement(plan, args, batch_size=inputs.shape[0])
        if devices != world:
            raise BadInput(f"the plan runs on {devices} devices, the run has {world} ranks")
        batch_size = inputs.shape[0]
        micro_batch_sizes(batch_size, plan["chunks"])
        loss_of = base_loss(args.loss)

        def loss_fn(output, target):  # weighted by the micro-batch's share of the batch
            return loss_of(output, target) * (output.shape[0] / batch_size)

        # Each stage's input and output on a micro-batch, given to torch up front: its shape
        # inference at the first step asks the stages' neighbours in its default placement
        # (s mod D), which is not the V's. As meta tensors: torch keeps them for the run.
        examples = stage_examples(layers, plan["balance"], inputs[:micro_batch_sizes(batch_size, plan["chunks"])[0]])
        stages, records, first = [], [], 0
        for s, count in enumerate(plan["balance"]):
            if device_of[s] == rank:
                module = torch.nn.Sequential(*layers[first:first + count]).to(device)
                if plan.get("checkpoint", "never") == "always":
                    module = Checkpointed(module)
                stage = pipelining.PipelineStage(module, s, len(plan["balance"]), device,
                                                 input_args=examples[s][0].to("meta"),
                                                 output_args=examples[s][1].to("meta"))
                time_actions(stage, records)
                tag_messages(stage)
                no_warm_up_messages_to_itself(stage, rank)
                stages.append(stage)
            first += count
        schedule_class = getattr(pipelining, SCHEDULES[plan["schedule"]])
        n = len(micro_batch_sizes(batch_size, plan["chunks"]))
        if args.schedule_csv:
            # torch's own CSV-driven runtime: it adds the sends and receives to the file's order.
            from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime
            schedule = _PipelineScheduleRuntime(stages, n_microbatches=n, loss_fn=loss_fn, scale_grads=False)
            schedule._load_csv(args.schedule_csv, format="compute_only")
        elif plan["schedule"] in ("gpipe", "1f1b"):
            schedule = schedule_class(stages[0], n_microbatches=n, loss_fn=loss_fn, scale_grads=False)
        else:
            schedule = schedule_class(stages, n_microbatches=n, loss_fn=loss_fn, scale_grads=False)
        # A parameter two stages of this rank hold is one object: listed once, stepped once.
        parameters = list({id(p): p for stage in stages for p in stage.submod.parameters()}.values())
        optimizer = torch.optim.SGD(parameters, lr=args.lr) if parameters else None
        held = {id(p) for stage in stages for p in stage.submod.parameters()}
        ties = tie_groups([(tensor if id(tensor) in held else stand_in(tensor), stages)
                           for tensor, stages in tied_across_stages(model, plan["balance"])], device_of)
        holds_first = device_of[0] == rank
        holds_last = device_of[-1] == rank
        # What a rank of a user's run holds: its stages, the inputs on the first, the targets on
        # the last; the rest of the model built here goes.
        x = inputs.to(device) if holds_first else None
        y = targets.to(device) if holds_last else None
        del model, layers, examples, inputs, targets, batch
        gc.collect()  # modules in reference cycles (a builder's whole model) go now, not later
        messages = []
        waiting = time_messages(messages)
        offset = clock_offset(rank, world, device)
        steps, peak = [], 0
        for step in range(args.warmup + args.steps):
            if optimizer:
                optimizer.zero_grad(set_to_none=True)
            records.clear()
            messages.clear()
            waiting.clear()  # every send was waited for by the step's end: nothing left to pair
            if args.device == "cuda":
                torch.cuda.reset_peak_memory_stats(device)
            if cpu_peak and step == args.warmup - 1:
                cpu_peak.open_window()
            dist.barrier()
            losses = [] if holds_last else None
            schedule.step(*((x,) if holds_first else ()), target=y, losses=losses)
            sum_tied_gradients(ties, rank, device)
            if optimizer:
                optimizer.step()
            if args.device == "cuda":
                torch.cuda.synchronize(device)
                peak = torch.cuda.max_memory_allocated(device)
            elif cpu_peak and step == args.warmup - 1:
                peak = cpu_peak.close_window()
            if step >= args.warmup:
                steps.append({
                    "loss": float(sum(l.item() for l in losses)) if holds_last else None,
                    # ms on rank 0's clock
                    "tasks": [(s, i, k, (a + offset) * 1e3, (b + offset) * 1e3) for s, i, k, a, b in records],
                    # the last field: bytes sent, or seconds a receive's (or a whole) wait blocked
                    "messages": [(what, tag, (at + offset) * 1e3, value) for what, tag, at, value in messages],
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
                      "messages": [m for rank in per_rank for m in rank[k]["messages"]],
                      "peaks": [rank[k]["peak"] for rank in per_rank]})
    order = sorted(range(len(steps)), key=lambda k: steps[k]["pipeline_ms"])
    median = steps[order[(len(order) - 1) // 2]]
    # What the ranks lost to messages: their time in waits for sends and receives, summed.
    blocked = [1e3 * sum(m[3] for m in s["messages"] if m[0] == "blocked") for s in steps]
    return {"plan": plan, "device_of": device_of, "batch_size": batch_size,
            "losses": [s["loss"] for s in steps], "pipeline_ms": [s["pipeline_ms"] for s in steps],
            "blocked_ms": blocked,
            "median_ms": statistics.median(s["pipeline_ms"] for s in steps), "median_step": median,
            "device": args.device, "model": args.builder.rpartition(":")[0].rpartition("/")[2]}


def message_copies(step, device_of):
    """Each message between two ranks as a copy (a dict: stage sending, receiver stage, micro-batch,
    direction, device sending, device receiving, bytes, start and end ms, ms its receiver waited
    for it): from when both ends had posted it (Gloo and NCCL move a message once its receive is
    posted too) to the receiver's wait for it ending. torch waits for a receive just before the
    action that needs it, so the end is when the receiver had the tensor in hand: at or after its
    arrival, at or before that action's start. A stream carries one copy at a time, so a copy that
    would start while the one before it on the same stream is still open starts when that one
    ends."""
    sent, posted, received = {}, {}, {}
    for what, tag, at, value in step["messages"]:
        if what != "blocked":
            {"sent": sent, "posted": posted, "received": received}[what][tuple(tag)] = (at, value)
    copies = []
    for tag, (start, nbytes) in sent.items():
        direction, stage, micro_batch = tag
        if tag not in received or tag not in posted:
            continue  # a receive no wrapped wait completed (a backend's batch work we cannot pair): left out
        receiver = stage + 1 if direction == "activation" else stage - 1
        start = max(start, posted[tag][0])
        end, waited_s = received[tag]
        copies.append({"stage": stage, "receiver": receiver, "micro_batch": micro_batch, "direction": direction,
                       "from": device_of[stage], "to": device_of[receiver], "bytes": nbytes,
                       "start": start, "end": max(start, end), "waited_ms": waited_s * 1e3})
    copies.sort(key=lambda c: c["start"])
    stream_end = {}
    for c in copies:
        stream = (c["from"], c["to"])
        c["start"] = max(c["start"], stream_end.get(stream, c["start"]))
        c["end"] = max(c["end"], c["start"])
        stream_end[stream] = c["end"]
    return copies


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
    streams = set()
    for c in message_copies(step, device_of):
        d, to = c["from"], c["to"]
        if (d, to) not in streams:
            streams.add((d, to))
            events.append({"ph": "M", "pid": d, "tid": 1 + to, "name": "thread_name",
                           "args": {"name": f"copy to {prefix}:{to}"}})
        kind = "act" if c["direction"] == "activation" else "grad"
        events.append({"ph": "X", "pid": d, "tid": 1 + to, "cat": "copy",
                       "name": f"{c['stage']}>{c['receiver']} {kind} {c['micro_batch']}",
                       "ts": round((c["start"] - step["start"]) * 1e3, 3),
                       "dur": round((c["end"] - c["start"]) * 1e3, 3),
                       "args": {"stage": c["stage"], "micro_batch": c["micro_batch"], "direction": c["direction"],
                                "to": to, "bytes": c["bytes"], "waited_ms": round(c["waited_ms"], 3)}})
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
                          "blocked_ms": report["blocked_ms"], "median_ms": report["median_ms"],
                          "trace": args.trace or None}))
        return
    for k, (loss, ms, blocked) in enumerate(zip(report["losses"], report["pipeline_ms"], report["blocked_ms"])):
        print(f"step {k + 1:<4} loss {loss:.6f}  pipeline {ms:.3f} ms  blocked for messages {blocked:.3f} ms")
    runtime = (f"_PipelineScheduleRuntime, {os.path.basename(args.schedule_csv)}" if args.schedule_csv
               else SCHEDULES[report['plan']['schedule']])
    print(f"median    pipeline {report['median_ms']:.3f} ms on torch.distributed.pipelining ({runtime})")
    if args.trace:
        print(f"trace     {args.trace} (the median step)")

def one_way_fit(sizes, ms):
    """Latency (ms) and bandwidth (bytes/s) of the line through (bytes, one-way ms) that is off
    least relative to each time (least squares weighted by 1 / ms²): sizes span three orders
    of magnitude, and a plain fit would let the largest decide the latency of the small ones."""
    w = [1.0 / max(y, 1e-9) ** 2 for y in ms]
    sw = sum(w)
    mx = sum(wi * x for wi, x in zip(w, sizes)) / sw
    my = sum(wi * y for wi, y in zip(w, ms)) / sw
    sxx = sum(wi * (x - mx) ** 2 for wi, x in zip(w, sizes))
    slope = max(sum(wi * (x - mx) * (y - my) for wi, x, y in zip(w, sizes, ms)) / sxx, 1e-12)
    return max(my - slope * mx, 0.0), 1e3 / slope


PROBE_SIZES = (4 << 10, 64 << 10, 512 << 10, 2 << 20, 8 << 20)


def probe_main(rank, world, args, plan=None, results=None):
    """torch's own costs on this machine, measured with every rank busy as in a run:
    - per action: each rank runs a one-stage pipeline of one 16-wide linear layer over its own
      group (ScheduleGPipe, 32 micro-batches of one sample), so a step is all torch's own work
      (its schedule, the stage's bookkeeping, the loss) and a layer a profile times at a few
      microseconds; the step's median time over its 64 actions;
    - a copy: ranks 0 and 1 pass tensors of 4 KiB to 8 MiB back and forth with torch's own P2P
      (dist.batch_isend_irecv, as the schedules send), half the round trip's median a one-way
      time, and a line through them gives the link's latency and bandwidth."""
    backend = "nccl" if args.device == "cuda" else "gloo"
    dist.init_process_group(backend, rank=rank, world_size=world)
    try:
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // world))
        device = torch.device(f"cuda:{rank % torch.cuda.device_count()}") if args.device == "cuda" else torch.device("cpu")
        from torch.distributed import pipelining
        own = [dist.new_group([r]) for r in range(world)][rank]
        micro_batches, width = 32, 16
        torch.manual_seed(rank)
        stage = pipelining.PipelineStage(torch.nn.Sequential(torch.nn.Linear(width, width)).to(device), 0, 1, device,
                                         group=own)
        schedule = pipelining.ScheduleGPipe(stage, n_microbatches=micro_batches, loss_fn=torch.nn.functional.mse_loss)
        x = torch.randn(micro_batches, width, device=device)
        y = torch.randn(micro_batches, width, device=device)
        times = []
        for step in range(5 + args.probe_steps):
            dist.barrier()
            start = time.perf_counter()
            schedule.step(x, target=y)
            if args.device == "cuda":
                torch.cuda.synchronize(device)
            if step >= 5:
                times.append((time.perf_counter() - start) * 1e3 / (2 * micro_batches))
        per_action = statistics.median(times)
        one_way = []
        for size in PROBE_SIZES:
            buffer = torch.zeros(size // 4, device=device)
            rounds = []
            for k in range(3 + args.probe_steps):
                dist.barrier()
                start = time.perf_counter()
                if rank == 0:
                    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, buffer, 1)]):
                        work.wait()
                    for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buffer, 1)]):
                        work.wait()
                elif rank == 1:
                    for work in dist.batch_isend_irecv([dist.P2POp(dist.irecv, buffer, 0)]):
                        work.wait()
                    for work in dist.batch_isend_irecv([dist.P2POp(dist.isend, buffer, 0)]):
                        work.wait()
                if k >= 3:
                    rounds.append((time.perf_counter() - start) * 1e3 / 2)
            one_way.append(statistics.median(rounds))
        gathered = [None] * world
        dist.gather_object(per_action, gathered if rank == 0 else None, dst=0)
        if rank == 0:
            latency, bandwidth = one_way_fit(PROBE_SIZES, one_way)
            report = {"per_action_ms": statistics.median(gathered), "per_action_by_rank_ms": gathered,
                      "copy_ms": dict(zip(PROBE_SIZES, one_way)), "latency_ms": latency,
                      "bandwidth_bytes_per_s": bandwidth}
            if results is not None:
                results.put(report)
            else:
                emit_probe(report, args, world)
    finally:
        dist.destroy_process_group()


def read_hardware(path):
    try:
        with open(path) as f:
            hardware = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: {first_line(e)}")
    if not isinstance(hardware, dict) or hardware.get("format") != "pipetune.hardware/1" \
            or not isinstance(hardware.get("devices"), list):
        raise BadInput(f"{path}: expected a pipetune.hardware/1 file with \"devices\"")
    return hardware


def emit_probe(report, args, world):
    """A hardware file for torch's runtime: the base one's devices (else cpu:0.. or cuda:0.., of
    unknown capacity), torch's link and per-action cost, and the runtime named."""
    if args.hardware:
        hardware = read_hardware(args.hardware)
    else:
        hardware = {"format": "pipetune.hardware/1",
                    "devices": [{"name": f"{args.device}:{d}", "memory_bytes": 0} for d in range(world)]}
    hardware.pop("links", None)
    hardware.pop("calibration", None)  # fitted on pipetune's executor, not torch's runtime
    hardware.pop("posted_receives", None)
    hardware["link"] = {"bandwidth_bytes_per_s": report["bandwidth_bytes_per_s"], "latency_ms": report["latency_ms"]}
    hardware["launch_overhead_ms"] = report["per_action_ms"]
    hardware["runtime"] = "torch.distributed.pipelining"
    temporary = args.probe + ".partial"
    with open(temporary, "w") as f:
        json.dump(hardware, f, indent=2)
        f.write("\n")
    os.replace(temporary, args.probe)
    if args.json:
        print(json.dumps(report))
        return
    print(f"per action  {report['per_action_ms']:.4f} ms (torch's schedule and stage around a layer; ranks "
          + ", ".join(f"{t:.4f}" for t in report["per_action_by_rank_ms"]) + ")")
    for size, ms in report["copy_ms"].items():
        print(f"copy {size / 1024:>6.0f} KiB  {ms:.4f} ms one way")
    print(f"link        latency {report['latency_ms']:.4f} ms, {report['bandwidth_bytes_per_s'] / 1e9:.2f} GB/s")
    print(f"hardware    {args.probe} (runtime torch.distributed.pipelining)")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def spawned(rank, world, args, plan, results, port):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    try:
        (probe_main if args.probe else rank_main)(rank, world, args, plan, results)
    except BadInput as e:
        results.put({"error": str(e), "rank": rank})
    except Exception as e:  # torch's own refusals: one line (the whole of it with PIPETUNE_DEBUG)
        if os.environ.get("PIPETUNE_DEBUG"):
            import traceback
            traceback.print_exc()
        results.put({"error": f"torch: {reason(e)}", "rank": rank})
        raise SystemExit(1)


def reason(error):
    """An error's one line, followed down its causes while a line only announces one (torch's
    "[Stage 1] failed to run forward:" wraps the module's own error)."""
    line = first_line(error)
    while line.rstrip().endswith(":") and (error.__cause__ or error.__context__) is not None:
        error = error.__cause__ or error.__context__
        line = f"{line.rstrip()} {first_line(error)}"
    if "leaf Variable that requires grad is being used in an in-place operation" in line:
        line += (" The stage's first child works in place on its input (an nn.ReLU(inplace=True)), which torch "
                 "hands a stage as a leaf: cut the model elsewhere, or make that child out of place")
    return line


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builder", metavar="MODULE:FUNCTION", nargs="?")
    parser.add_argument("--plan")
    parser.add_argument("--steps", type=int, default=10)
    parser.add_argument("--warmup", type=int, default=1)
    parser.add_argument("--lr", type=float, default=0.01)
    parser.add_argument("--loss", choices=("cross_entropy", "mse"), default="cross_entropy")
    parser.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--schedule-csv", metavar="FILE",
                        help="run this compute-only schedule CSV (row r: rank r) through torch's CSV-driven runtime "
                             "instead of the plan's schedule; the plan gives the balance, chunks and checkpoint")
    parser.add_argument("--trace", metavar="OUT.json")
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--probe", metavar="OUT.json",
                        help="measure torch's per-action and copy costs; write a hardware file for its runtime")
    parser.add_argument("--devices", type=int, default=2, help="ranks the probe runs (default 2)")
    parser.add_argument("--hardware", metavar="BASE.json", help="the probe's devices from this hardware file")
    parser.add_argument("--probe-steps", type=int, default=20, help=argparse.SUPPRESS)
    args = parser.parse_args()
    try:
        if args.probe:
            if args.builder or args.plan:
                raise BadInput("--probe measures torch itself: it takes no MODULE:FUNCTION and no --plan")
            if args.devices < 2:
                raise BadInput(f"--devices: expected at least 2 (a copy needs two ranks), got {args.devices}")
            plan, devices = None, args.devices
            if args.hardware:
                devices = len(read_hardware(args.hardware)["devices"])
                if devices < 2:
                    raise BadInput(f"{args.hardware}: devices: expected at least 2 (a copy needs two ranks)")
        else:
            if not args.builder or not args.plan:
                raise BadInput("expected MODULE:FUNCTION and --plan (or --probe OUT.json)")
            if args.steps < 1 or args.warmup < 0:
                raise BadInput("--steps: expected at least 1 (and --warmup 0 or more)")
            plan = load_plan(args.plan)
            devices, _ = placement(plan, args)
        if "RANK" in os.environ and "WORLD_SIZE" in os.environ:  # under torchrun
            if not args.probe and int(os.environ["WORLD_SIZE"]) != devices:
                raise BadInput(f"the plan runs on {devices} devices, torchrun started {os.environ['WORLD_SIZE']} "
                               f"ranks: give torchrun --nproc-per-node {devices}")
            (probe_main if args.probe else rank_main)(int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]), args,
                                                      plan)
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
        emit_probe(report, args, devices) if args.probe else emit(report, args)
        return 0
    except BadInput as e:
        print(f"torch_pipeline.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
