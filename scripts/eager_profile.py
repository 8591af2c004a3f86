"""Retimes a pipetune profile on the model's own Python modules, as torch.distributed.pipelining
runs them, so that pipetune predicts a plan's time on torch's runtime rather than on its own
executor's TorchScript.

    python scripts/eager_profile.py MODULE:FUNCTION --profile profile.json -o eager.profile.json
        [--loss cross_entropy|mse] [--threads N] [--warmup N] [--repeats N] [--co-runners K]

MODULE:FUNCTION is the builder scripts/export_model.py and scripts/torch_pipeline.py take;
profile.json is `pipetune profile`'s of its export (same children, same example batch size).
pipetune's profiler times the exported TorchScript children, which run faster than the Python
modules torch's stages call (on a CPU, a quarter slower eager on GPT-2's blocks at small
micro-batches: Python's dispatch of every op). This script times each child the way the profiler
does, in one process with the profile's intra-op threads: per micro-batch size of the profile,
each repetition runs the forward without autograd through every child, then the forward and the
backward through every child, each child timed alone and joined to the next by a detached
tensor, then the backward split as zero-bubble schedules run it (the input's gradient, the graph
kept, then the weights'); the medians and median absolute deviations of the timed repetitions
replace the profile's times.

The times change, and what autograd saves of each child (`saved_bytes`), counted by the
saved-tensor hooks: the same bytes as the export's but for dropout on a CPU, whose eager mask is
float32 where the export's is one byte (docs/torch.md); and what torch's zero-bubble I keeps of
each child for its W (`torch_weight_gradient_bytes`, `torch_keeps_output_gradient`: a gradient
per operation with weights) and what dies when that I ends (`torch_freed_by_input_bytes`),
counted on torch's own `stage_backward_input`, and the peaks of torch's W of each child alone
(`torch_weight_peak_bytes`, `torch_weight_accumulate_peak_bytes`), counted by torch's profiler
on `stage_backward_weight`, and what that W frees as it goes inside a stage
(`torch_weight_freed_bytes`, `torch_weight_frees_input`). The rest of the memory stays the
profile's. Times measured with the cache emptied (`*_cold_ms`, and `forward_step_start_ms`
after the optimizer-like sweep) keep the profile's extra time over its hot time (the cache's
cost does not depend on who dispatched the op). With
co-runners (the profile's `co_runners`, or --co-runners K), each child is timed again beside K
processes, each running its own copy of the same child in a loop as torch's other ranks do, and
`*_corun_ms` is the eager time times that slowdown, as pipetune's profiler writes it. CPU
profiles only: on a GPU a child's device time does not depend on who launched it.

Bad input (a builder that fails, a profile that does not load or does not fit the model, a GPU
profile): one line on stderr, exit status 2, nothing written. Needs only torch.
"""

import argparse
import json
import multiprocessing
import os
import statistics
import sys
import tempfile
import time
import warnings

import torch
from torch.multiprocessing.reductions import StorageWeakRef

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the profiler counting W's memory: no GPU notes

try:  # torch's own I and W, so that what they keep is counted as torch keeps it (torch >= 2.4)
    from torch.distributed.pipelining._backward import stage_backward_input, stage_backward_weight
except ImportError:
    stage_backward_input = None

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from export_model import BadInput, as_batch, as_sequential, base_loss, children, first_line, load_function  # noqa: E402


def median_and_spread(values):
    """The median and the median absolute deviation, as pipetune's profiler computes them."""
    if not values:
        return 0.0, 0.0
    middle = statistics.median(values)
    return middle, statistics.median([abs(v - middle) for v in values])


def samples(tensor, size):
    """The first `size` samples of the example batch, repeated when it holds fewer."""
    if size <= tensor.shape[0]:
        return tensor[:size].clone()
    repeats = -(-size // tensor.shape[0])
    return torch.cat([tensor] * repeats)[:size].clone()


def layer_input(previous, wants_gradient):
    """A child's input as a stage's intermediate: (leaf receiving the gradient or None, x).

    As pipetune's profiler and executor: in a model with frozen parameters, only where some child
    before it trains (a frozen stem works on data, as one device's autograd sees it); in one
    without, every child's but the first."""
    if not wants_gradient or not previous.is_floating_point():
        return None, previous.detach().clone()
    leaf = previous.detach().requires_grad_(True)
    return leaf, leaf.clone()


class Runner:
    """The children and what running one means: its forward, plus the loss for the last."""

    def __init__(self, children, loss, target):
        self.children, self.loss, self.target = children, loss, target
        frozen = any(not p.requires_grad for child in children for p in child.parameters())
        trained_before, self.wants_gradient = False, []
        for layer, child in enumerate(children):
            self.wants_gradient.append(layer > 0 and (not frozen or trained_before))
            trained_before = trained_before or any(p.requires_grad for p in child.parameters())

    def forward(self, layer, x):
        """What backward starts from (the loss, or the output) and the output."""
        y = self.children[layer](x)
        if layer + 1 < len(self.children):
            return y, y
        return self.loss(y, self.target), y

    def parameters(self, layer):
        return [p for p in self.children[layer].parameters() if p.requires_grad]


class Clock:
    """Wall-clock regions, milliseconds."""

    def __init__(self):
        self.times = {}

    def region(self, timed, key, work):
        if not timed:
            return work()
        began = time.perf_counter()
        result = work()
        self.times.setdefault(key, []).append((time.perf_counter() - began) * 1e3)
        return result


def repetition(run, x0, clock, timed):
    """One repetition of the profiler's passes through every child, each child's timed alone."""
    count = len(run.children)
    with torch.no_grad():
        current = x0
        for layer in range(count):
            current = clock.region(timed, ("nograd", layer), lambda: run.forward(layer, current)[1])

    # The forward and the backward through every child.
    inputs, roots, current = [], [], x0
    for layer in range(count):
        leaf, x = layer_input(current, run.wants_gradient[layer])
        root, current = clock.region(timed, ("forward", layer), lambda: run.forward(layer, x))
        inputs.append(leaf)
        roots.append(root)
    gradient = None
    for layer in reversed(range(count)):
        if not roots[layer].requires_grad:
            break  # nothing before can need a gradient either
        seed = None if layer + 1 == count else gradient
        clock.region(timed, ("backward", layer), lambda: torch.autograd.backward(roots[layer], seed))
        roots[layer] = None
        gradient = inputs[layer].grad if inputs[layer] is not None else None
        if gradient is None:
            break

    # The backward split: I (the input's gradient, the graph kept), then W (the weights').
    inputs, roots, current = [], [], x0
    for layer in range(count):
        leaf, x = layer_input(current, run.wants_gradient[layer])
        root, current = run.forward(layer, x)
        inputs.append(leaf)
        roots.append(root)
    gradient = None
    for layer in reversed(range(count)):
        if not roots[layer].requires_grad:
            break
        seed = None if layer + 1 == count else gradient
        parameters = run.parameters(layer)
        input_gradient = None
        if inputs[layer] is not None:
            input_gradient = clock.region(timed, ("input", layer), lambda: torch.autograd.grad(
                roots[layer], inputs[layer], seed, retain_graph=bool(parameters), allow_unused=True)[0])
        if parameters:
            clock.region(timed, ("weight", layer),
                         lambda: torch.autograd.backward(roots[layer], seed, inputs=parameters))
        roots[layer] = None
        gradient = input_gradient
        if gradient is None:
            break


def forward_backward(run, layer, inputs_by_layer, clock, timed):
    """One forward and backward of one child on its own copy of its input."""
    leaf, x = layer_input(inputs_by_layer[layer], run.wants_gradient[layer])
    root, _ = clock.region(timed, ("forward", layer), lambda: run.forward(layer, x))
    if not root.requires_grad:
        return
    seed = None if layer + 1 == len(run.children) else torch.ones_like(root)
    clock.region(timed, ("backward", layer), lambda: torch.autograd.backward(root, seed))


def inputs_of_every_layer(run, x0):
    """Each child's input at one size, without autograd."""
    with torch.no_grad():
        out, current = [], x0
        for layer in range(len(run.children)):
            out.append(current)
            current = run.forward(layer, current)[1]
    return out


def tensors_held_outside(children):
    """The storages the children hold before any forward (parameters, buffers, and tensors kept
    as plain attributes, such as a rotary embedding's tables): not what a forward saves."""
    held = set()
    for child in children:
        for module in child.modules():
            tensors = list(module.parameters(recurse=False)) + list(module.buffers(recurse=False))
            tensors += [v for v in vars(module).values() if isinstance(v, torch.Tensor)]
            held.update(t.untyped_storage().data_ptr() for t in tensors)
    return held


def saved_bytes(run, layer, previous, held):
    """What autograd saves of the child's forward besides its input and output (and the loss,
    the target, the children's own tensors), by storage, as pipetune's profiler counts
    `saved_bytes`: the saved-tensor hooks see every tensor a node keeps."""
    _, x = layer_input(previous, run.wants_gradient[layer])
    root, y, packed = forward_saving(run, layer, x)
    storages = {pointer: nbytes for _, pointer, nbytes in packed}
    skip = held | {t.untyped_storage().data_ptr() for t in (x, y, root, run.target)}
    return sum(nbytes for pointer, nbytes in storages.items() if pointer not in skip)


def forward_saving(run, layer, x):
    """The child's forward, (root, output) as Runner.forward's, and every tensor autograd saved
    of it: [(weak reference to its storage, storage, bytes)], one per save. The hook saves an
    alias without the graph: a node that saves its own output (log_softmax, a ReLU) would
    otherwise hold itself through the hook's tensor, a cycle through C++ that Python's
    collector never frees, and what I or W frees would seem to stay."""
    packed = []

    def pack(tensor):
        storage = tensor.untyped_storage()
        packed.append((StorageWeakRef(storage), storage.data_ptr(), storage.nbytes()))
        return tensor.detach()

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        root, y = run.forward(layer, x)
    return root, y, packed


def build(builder, loss_name, seed):
    torch.manual_seed(seed)
    model, batch = load_function(builder)()
    layers = [module for _, module in children(as_sequential(model))]
    inputs, targets = as_batch(batch)
    return layers, inputs, targets, base_loss(loss_name)


def co_runner(builder, loss_name, seed, threads, commands, replies, stop):
    """Another rank's process: its own copy of the model, running the child it is told to in a
    loop until `stop` is set."""
    try:
        torch.set_num_threads(threads)
        children, inputs, targets, loss = build(builder, loss_name, seed)
        by_size = {}
        replies.put(("ready", None))
        while True:
            command = commands.get()
            if command is None:
                return
            layer, size = command
            if size not in by_size:
                run = Runner(children, loss, samples(targets, size))
                by_size[size] = (run, inputs_of_every_layer(run, samples(inputs, size)))
            run, inputs_by_layer = by_size[size]
            clock, started = Clock(), False
            while not stop.is_set():
                forward_backward(run, layer, inputs_by_layer, clock, False)
                if not started:
                    started = True
                    replies.put(("running", None))
            replies.put(("stopped", None))
    except Exception as e:  # noqa: BLE001 - the parent reports it in one line
        replies.put(("error", first_line(e)))


class CoRunners:
    """K processes that run a child beside the timed one, started once for the whole profile."""

    def __init__(self, count, builder, loss_name, seed, threads):
        context = multiprocessing.get_context("spawn")
        self.stop = context.Event()
        self.replies = context.Queue()
        self.commands = [context.Queue() for _ in range(count)]
        self.processes = [context.Process(target=co_runner, daemon=True,
                                          args=(builder, loss_name, seed, threads, q, self.replies, self.stop))
                          for q in self.commands]
        for p in self.processes:
            p.start()
        self.wait_for("ready")

    def wait_for(self, state):
        for _ in self.processes:
            while True:
                try:
                    kind, detail = self.replies.get(timeout=1.0)
                    break
                except Exception:  # queue.Empty: is anyone still alive?
                    if any(p.exitcode not in (None, 0) for p in self.processes):
                        raise BadInput("a co-runner process died (see above)")
            if kind == "error":
                raise BadInput(f"a co-runner: {detail}")
            if kind != state:
                raise BadInput(f"a co-runner said {kind}, expected {state}")

    def beside(self, layer, size, work):
        """`work()` while every co-runner runs `layer` at `size`."""
        self.stop.clear()
        for q in self.commands:
            q.put((layer, size))
        self.wait_for("running")
        try:
            return work()
        finally:
            self.stop.set()
            self.wait_for("stopped")

    def close(self):
        for q in self.commands:
            q.put(None)
        for p in self.processes:
            p.join(timeout=10)
            if p.is_alive():
                p.kill()


def read_profile(path, children):
    try:
        with open(path) as f:
            profile = json.load(f)
    except (OSError, ValueError) as e:
        raise BadInput(f"{path}: {first_line(e)}")
    if not isinstance(profile, dict) or not isinstance(profile.get("layers"), list):
        raise BadInput(f"{path}: expected a pipetune profile (an object with \"layers\")")
    sizes = profile.get("micro_batch_sizes")
    if not isinstance(sizes, list) or not sizes or any(not isinstance(s, int) or s < 1 for s in sizes):
        raise BadInput(f"{path}: micro_batch_sizes: expected positive integers, got {sizes}")
    if len(profile["layers"]) != len(children):
        raise BadInput(f"{path}: layers: the profile has {len(profile['layers'])} layers, the model has "
                       f"{len(children)} children (profile the export of this builder)")
    dtypes = {str(p.dtype).replace("torch.", "") for c in children for p in c.parameters() if p.is_floating_point()}
    if "dtype" in profile and dtypes and dtypes != {profile["dtype"]}:
        raise BadInput(f"{path}: dtype: the profile is of {profile['dtype']}, the model's parameters are "
                       f"{', '.join(sorted(dtypes))} (profile the export with --dtype {sorted(dtypes)[0]})")
    if profile["layers"] and "forward_launch_ms" in profile["layers"][0] or profile.get("timer", "clock") != "clock":
        raise BadInput(f"{path}: a GPU profile (timer {profile.get('timer')}): retime CPU profiles only; on a GPU "
                       "a child's device time does not depend on who launched it")
    return profile


def torch_input(run, layer, leaf, root):
    """torch's I of the child from its forward's `root` (the loss for the last child, else its
    output, given a gradient of ones): the param groups it keeps for W, and that gradient (None
    for the last child)."""
    seed = None if layer + 1 == len(run.children) else torch.ones_like(root)
    _, groups = stage_backward_input([root], None if seed is None else [seed], [leaf],
                                     iter(run.parameters(layer)))
    return groups, seed


def zero_bubble_input(run, layer, previous, held):
    """What torch's zero-bubble I does to the child as a stage's last, counted on torch's own I
    (`stage_backward_input`): (1) the bytes of the gradients flowing into its operations with
    weights (torch's param groups), which it keeps for W, by storage, besides the gradient of
    the child's output (for the last child, whose output's gradient the loss makes, that one too
    where kept); (2) whether it keeps the gradient of the output too; (3) the bytes autograd
    saved of the child that die when I ends, as torch then detaches the stage's output: what
    was saved above its last operation with weights (the loss's log-probabilities), and all a
    child without weights saved. (0, False, 0) where the child's input needs no gradient."""
    leaf, x = layer_input(previous, run.wants_gradient[layer])
    if leaf is None or stage_backward_input is None:
        return 0, False, 0
    root, y, packed = forward_saving(run, layer, x)
    kept, seed = {}, None
    if run.parameters(layer):
        groups, seed = torch_input(run, layer, leaf, root)
        for group in groups:
            for gradients in group.get("grads") or ():
                for gradient in gradients or ():
                    if gradient is not None:
                        storage = gradient.untyped_storage()
                        kept[storage.data_ptr()] = storage.nbytes()
        del groups
    else:  # no I: torch's stage drops the graph with the output's
        root = root.detach()
        y = y.detach()
    # The input, the output (torch holds it until W) and the children's own tensors stay.
    stay = held | {t.untyped_storage().data_ptr() for t in (leaf, x, y, run.target)}
    stay |= {pointer for ref, pointer, _ in packed if not ref.expired()}
    dead = {pointer: nbytes for _, pointer, nbytes in packed if pointer not in stay}
    incoming = None if seed is None else seed.untyped_storage().data_ptr()
    return (sum(n for pointer, n in kept.items() if pointer != incoming), incoming in kept,
            sum(dead.values()))


def weight_frees(run, layer, previous, held):
    """What torch's W (`stage_backward_weight`) of the child frees as it goes inside a stage. W
    asks autograd for the weights' gradients without keeping the graph, so what only the
    child's operations with weights saved goes as each is done; what other operations saved
    goes when the graph dies at W's end (the next child's operations hold the child's graph
    until then). Counted with the child's top operation held, as the next child holds it:
    (bytes of what it saved, besides its input and output, that W frees; whether W frees its
    input, which only its operations with weights saved). (0, False) without I or weights."""
    leaf, x = layer_input(previous, run.wants_gradient[layer])
    weights = run.parameters(layer)
    if leaf is None or not weights or stage_backward_input is None:
        return 0, False
    grads = [w.grad for w in weights]
    root, y, packed = forward_saving(run, layer, x)
    top = y.grad_fn  # I detaches the output in place; the next child's operations hold this
    groups, _ = torch_input(run, layer, leaf, root)
    input_ref = StorageWeakRef(x.untyped_storage())
    ends = held | {t.untyped_storage().data_ptr() for t in (x, y, run.target)}
    alive = [(ref, nbytes) for ref, pointer, nbytes in packed if not ref.expired() and pointer not in ends]
    del root, y, x, leaf
    input_saved = not input_ref.expired()  # by an operation still there: W's or the graph's
    stage_backward_weight(iter(weights), groups)
    del groups
    freed = sum(nbytes for ref, nbytes in alive if ref.expired())
    frees_input = input_saved and input_ref.expired()
    del top
    for w, grad in zip(weights, grads):
        w.grad = grad
    return freed, frees_input


def zero_bubble_weight(run, layer, previous):
    """torch's W (`stage_backward_weight`) of the child alone, after its forward and torch's I:
    (peak above W's start the first time, its weights' gradients made; the same a later time,
    added into them), bytes, from torch's profiler's memory events (the CPU allocator's, as
    pipetune's counting allocator counts). (0, 0) without I or weights."""
    leaf, _ = layer_input(previous, run.wants_gradient[layer])
    weights = run.parameters(layer)
    if leaf is None or not weights or stage_backward_input is None:
        return 0, 0
    saved = [w.grad for w in weights]
    for w in weights:
        w.grad = None
    first = weight_pass(run, layer, previous)
    later = weight_pass(run, layer, previous)
    for w, grad in zip(weights, saved):
        w.grad = grad
    return first, later


def weight_pass(run, layer, previous):
    """One forward, I and W of the child, recorded: W's peak above its start."""
    from torch.profiler import ProfilerActivity, profile, record_function
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as recording:
            leaf, x = layer_input(previous, True)
            root, _ = run.forward(layer, x)
            groups, _ = torch_input(run, layer, leaf, root)
            with record_function("pipetune_weight"):
                stage_backward_weight(iter(run.parameters(layer)), groups)
            del groups, root, leaf, x
    events = recording.profiler.kineto_results.events()
    weight = next(e for e in events if e.name() == "pipetune_weight")
    total, start, peak = 0, None, 0
    for e in sorted((e for e in events if e.name() == "[memory]"), key=lambda e: e.start_ns()):
        if e.start_ns() > weight.end_ns():
            break
        if start is None and e.start_ns() >= weight.start_ns():
            start = peak = total
        total += e.nbytes()
        if start is not None:
            peak = max(peak, total)
    return 0 if start is None else peak - start


def retime(profile, times, slowdown, saved, zero_bubble):
    """The profile with its times replaced by `times[(kind, layer)][size index]` = (median, MAD),
    its saved bytes by `saved[layer][size index]`, and what torch's zero-bubble I and W keep by
    `zero_bubble[layer][size index]` = (zero_bubble_input(), zero_bubble_weight(), weight_frees())."""
    out = json.loads(json.dumps(profile))
    sizes = len(profile["micro_batch_sizes"])
    for index, layer in enumerate(out["layers"]):
        def column(kind, part=0):
            return [times[(kind, index)][s][part] for s in range(sizes)]

        layer["saved_bytes"] = saved[index]
        counts, weights, frees = zip(*zero_bubble[index])
        layer["torch_weight_gradient_bytes"] = [b for b, _, _ in counts]
        layer["torch_freed_by_input_bytes"] = [d for _, _, d in counts]
        layer.pop("torch_keeps_output_gradient", None)
        if any(k for _, k, _ in counts):
            layer["torch_keeps_output_gradient"] = True
        for field, part in (("torch_weight_peak_bytes", 0), ("torch_weight_accumulate_peak_bytes", 1)):
            layer[field] = [w[part] for w in weights]
        layer["torch_weight_freed_bytes"] = [f for f, _ in frees]
        layer.pop("torch_weight_frees_input", None)
        if any(i for _, i in frees):
            layer["torch_weight_frees_input"] = True
        old_forward, old_backward = list(layer["forward_ms"]), list(layer["backward_ms"])
        layer["forward_ms"], layer["backward_ms"] = column("forward"), column("backward")
        if "forward_nograd_ms" in layer:
            layer["forward_nograd_ms"] = column("nograd")
        if "backward_input_ms" in layer:
            layer["backward_input_ms"], layer["backward_weight_ms"] = column("input"), column("weight")
        layer["forward_ms_spread"], layer["backward_ms_spread"] = column("forward", 1), column("backward", 1)
        for cold, hot, old in (("forward_cold_ms", "forward_ms", old_forward),
                               ("backward_cold_ms", "backward_ms", old_backward),
                               ("forward_step_start_ms", "forward_ms", old_forward)):
            if cold in layer:
                layer[cold] = [new + max(0.0, c - o) for new, c, o in zip(layer[hot], layer[cold], old)]
        for corun, hot, kind in (("forward_corun_ms", "forward_ms", "forward"),
                                 ("backward_corun_ms", "backward_ms", "backward")):
            if slowdown is None:
                layer.pop(corun, None)
            else:
                layer[corun] = [t * slowdown[(kind, index)][s] for s, t in enumerate(layer[hot])]
    if slowdown is None:
        out.pop("co_runners", None)
    return out


def measure(args, profile, children, inputs, targets, loss, progress):
    """Every child's eager times and saved bytes per size, and its slowdown beside the
    co-runners (None without them)."""
    count = len(children)
    # Per size: the runner and each child's input, made once for every pass below.
    by_size = []
    for size in profile["micro_batch_sizes"]:
        run = Runner(children, loss, samples(targets, size))
        by_size.append((size, run, inputs_of_every_layer(run, samples(inputs, size))))
    times = {(kind, layer): [] for kind in ("nograd", "forward", "backward", "input", "weight")
             for layer in range(count)}
    held = tensors_held_outside(children)
    saved = [[] for _ in range(count)]
    zero_bubble = [[] for _ in range(count)]
    for size, run, inputs_by_layer in by_size:
        clock = Clock()
        for r in range(args.warmup + args.repeats):
            repetition(run, inputs_by_layer[0], clock, r >= args.warmup)
        for key in times:
            times[key].append(median_and_spread(clock.times.get(key, [])))
        for layer in range(count):
            saved[layer].append(saved_bytes(run, layer, inputs_by_layer[layer], held))
            zero_bubble[layer].append((zero_bubble_input(run, layer, inputs_by_layer[layer], held),
                                       zero_bubble_weight(run, layer, inputs_by_layer[layer]),
                                       weight_frees(run, layer, inputs_by_layer[layer], held)))
        progress(f"size {size}: timed")
    slowdown = measure_slowdown(args, by_size, count, progress) if args.co_runners > 0 else None
    return times, slowdown, saved, zero_bubble


def measure_slowdown(args, by_size, count, progress):
    """Each child's forward and backward beside args.co_runners processes running their own
    copy of it, over its time alone: {(kind, layer): [per size]}."""
    slowdown = {(kind, layer): [] for kind in ("forward", "backward") for layer in range(count)}
    runners = CoRunners(args.co_runners, args.builder, args.loss, args.seed, args.threads)
    try:
        for size, run, inputs_by_layer in by_size:
            for layer in range(count):
                def timed_rounds():
                    clock = Clock()
                    for r in range(args.warmup + args.repeats):
                        forward_backward(run, layer, inputs_by_layer, clock, r >= args.warmup)
                    return clock.times

                alone = timed_rounds()
                together = runners.beside(layer, size, timed_rounds)
                for kind in ("forward", "backward"):
                    solo = median_and_spread(alone.get((kind, layer), []))[0]
                    next_to = median_and_spread(together.get((kind, layer), []))[0]
                    # Below the solo time is noise, as the profiler reads it.
                    slowdown[(kind, layer)].append(max(1.0, next_to / solo) if solo > 0 else 1.0)
            progress(f"size {size}: beside {args.co_runners} co-runner(s)")
    finally:
        runners.close()
    return slowdown


def write_atomically(path, document):
    folder = os.path.dirname(os.path.abspath(path))
    handle, temporary = tempfile.mkstemp(dir=folder, prefix=".eager_profile.")
    try:
        with os.fdopen(handle, "w") as f:
            json.dump(document, f, indent=1)
            f.write("\n")
        os.replace(temporary, path)
    except BaseException:
        os.unlink(temporary)
        raise


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("builder", metavar="MODULE:FUNCTION")
    parser.add_argument("--profile", required=True, help="pipetune profile of the builder's export")
    parser.add_argument("-o", "--out", required=True, help="the retimed profile")
    parser.add_argument("--loss", choices=("cross_entropy", "mse"), default="cross_entropy")
    parser.add_argument("--threads", type=int, help="intra-op threads (default: the profile's)")
    parser.add_argument("--warmup", type=int, help="untimed repetitions (default: the profile's)")
    parser.add_argument("--repeats", type=int, help="timed repetitions (default: the profile's)")
    parser.add_argument("--co-runners", type=int, help="processes running beside (default: the profile's)")
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--quiet", action="store_true", help="no progress lines")
    args = parser.parse_args()
    try:
        children, inputs, targets, loss = build(args.builder, args.loss, args.seed)
        profile = read_profile(args.profile, children)
        meta = profile.get("meta", {}) if isinstance(profile.get("meta"), dict) else {}
        for name, default in (("threads", 1), ("warmup", 2), ("repeats", 5)):
            if getattr(args, name) is None:
                setattr(args, name, int(meta.get(name, default)))
        if args.co_runners is None:
            args.co_runners = int(profile.get("co_runners", 0))
        if args.threads < 1 or args.warmup < 0 or args.repeats < 1 or args.co_runners < 0:
            raise BadInput("--threads and --repeats: expected at least 1; --warmup and --co-runners at least 0")
        torch.set_num_threads(args.threads)

        def progress(line):
            if not args.quiet:
                print(f"eager_profile.py: {line}", file=sys.stderr, flush=True)

        times, slowdown, saved, zero_bubble = measure(args, profile, children, inputs, targets, loss, progress)
        out = retime(profile, times, slowdown, saved, zero_bubble)
        changed = [str(i) for i, layer in enumerate(profile["layers"]) if layer.get("saved_bytes") != saved[i]]
        if changed:
            progress(f"saved bytes differ from the profile's on layer(s) {', '.join(changed)} "
                     "(on a CPU, eager dropout keeps a float32 mask where the export keeps one byte)")
        if slowdown is not None:
            out["co_runners"] = args.co_runners
        out.setdefault("meta", {})
        if isinstance(out["meta"], dict):
            out["meta"]["eager"] = {"builder": args.builder, "threads": args.threads, "warmup": args.warmup,
                                    "repeats": args.repeats, "co_runners": args.co_runners,
                                    "torch": torch.__version__}
        write_atomically(args.out, out)
        return 0
    except BadInput as e:
        print(f"eager_profile.py: {e}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
