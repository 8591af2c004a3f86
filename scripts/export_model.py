"""Exports a PyTorch model for pipetune: a scripted nn.Sequential and a batch of real data.

    python scripts/export_model.py MODULE:FUNCTION [--out PREFIX] [--loss cross_entropy|mse]

MODULE is a module importable from the current folder (`my_models`) or a Python file
(`path/to/my_models.py`). FUNCTION() returns `(model, (inputs, targets))`: the model as an
nn.Sequential or a list of modules (its children are the layers pipetune balances over stages),
and a batch whose dimension 0 is samples, of any dtypes and shapes (int64 token ids, images, ...).
Each child takes one tensor and returns one (wrap a library's block that takes a mask or returns
a tuple). Children may hold the very same parameter (tied weights, e.g. an embedding and the
output projection that reuses it): pipetune trains it as one, summing its gradients over the
stages that hold it. A buffer two children share (one rotary embedding module in every block's
wrapper) is copied, each child keeping its own, where a training-mode forward of the example does
not change it; one a forward changes (batch norm's running statistics), or a view of another
child's tensor, is refused. So is a child holding a parameter that other children train and its
own forward never reaches on the example (a wrapper keeping the whole model to call one part of
it: every stage holding it would keep the whole model); a parameter only one child holds and
its forward does not reach is exported with an `unused:` line (it gets no gradient, but takes
memory, and pipetune's memory model counts a gradient for it).

Each child is compiled on its own, its input being the previous child's output on the example:

- Scripted (torch.jit.script) where TorchScript compiles it and can save what it compiled (a
  method marked torch.jit.ignore compiles to a call back into Python, which cannot be saved);
  the scripted child must compute what the Python one does on the example, in evaluation mode.
- Traced (torch.jit.trace) where it does not (keyword-only arguments with defaults, *args, and
  much else that libraries such as Hugging Face transformers write). A trace records the
  operations one input ran, so it is accepted only after proof. A tracer warning (a Python
  branch or a size taken from a tensor, baked into the trace; the refusal names the model's line
  that called into torch where torch warns inside itself) refuses it, except on a check whose
  only effect is to raise (an `assert`, an `if` whose body only raises: nn.Embedding's check of
  its padding index, batch norm's of more than one value per channel), which cannot bake an
  output, and on torch.tensor() of Python values, kept as a constant (see bakes()). A trace
  that calls a Python autograd function (torch.autograd.Function) is refused by its name:
  TorchScript cannot hold it. Then the trace and
  the Python child run at every micro-batch size the plan can use (a batch of B is split as
  tensor.chunk does, so any size from 1 to B; all of 1 to N for an example of N <= 64 samples,
  else 1, 2, 3, odd and even sizes around powers of two, N/2, N - 1 and N), and must agree on
  the output, the gradients with respect to the input (where floating) and to every parameter
  (under a fixed random output gradient), and the buffers a forward updates. Both run in the
  mode the model was given in (a trace keeps the mode it was traced in; training mode is the
  default and what pipetune runs), with torch.manual_seed set before each run so that dropout
  draws the same masks in both.
  The trace runs as its graph is written (torch.jit.optimized_execution(False)): the optimised
  path rewrites dropout as native_dropout, which draws a mask even at p = 0, where pipetune's
  executor replaces every dropout with its own seeded one that draws nothing at p = 0.
  Tolerance: |trace - Python| <= atol * max(1, largest |Python|) + rtol * |Python| per element,
  with rtol 1e-4, atol 1e-5 for float32; 1e-7, 1e-9 for float64; 1e-2, 1e-3 for float16; 5e-2,
  1e-2 for bfloat16; integer and boolean results must be equal. Both run the same kernels, but
  pipetune's executor runs the optimised graph, which may fuse or reorder floating-point
  arithmetic; the bounds allow some hundreds of units in the last place, scaled
  by the largest magnitude because a parameter's gradient sums over the samples and an element
  that cancels to near zero keeps the rounding of its large terms. A real bug (a baked size or
  branch) differs by the size of the values themselves.

The last output must fit the loss: cross_entropy takes class indices of the output's shape
without its last dimension (one per sample or one per token) or class probabilities of the
output's shape; mse targets of the output's shape. Then PREFIX.pt (torch.jit.script of an
nn.Sequential of the scripted and traced children) and PREFIX.batch.pt (torch.save((inputs,
targets))) are written; which children were scripted and which traced is printed, then the
--model spec, last, on its own line.

Bad input (an import that fails, a shared buffer or view, a child holding parameters other
children train and it never uses, a child that takes two inputs or returns a tuple, one that neither scripts nor traces, a trace torch warns about or that does not match
Python at some micro-batch size, a batch that does not fit): one line on stderr, exit status 2,
nothing written. Needs only torch.
"""

import argparse
import ast
import collections
import contextlib
import copy
import functools
import importlib
import importlib.util
import inspect
import io
import linecache
import os
import re
import sys
import traceback
import warnings

import torch


class BadInput(Exception):
    pass


def describe(t):
    return f"{str(t.dtype).replace('torch.', '')} {list(t.shape)}"


def first_line(error):
    """Torch's reason in one line: its first non-empty line, and where in the source."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    if not lines:
        return type(error).__name__
    if lines[0].startswith("The following operation failed in the TorchScript interpreter"):
        return lines[-1]  # the error itself comes last, after the interpreter's traceback
    where = next((line for line in lines[1:] if line.startswith("File ")), None)
    return lines[0] + (f" ({where})" if where else "")


def load_function(target):
    module_name, colon, function_name = target.rpartition(":")
    if not colon or not module_name or not function_name:
        raise BadInput(f"{target}: expected MODULE:FUNCTION, e.g. my_models.py:build")
    try:
        if module_name.endswith(".py") or os.sep in module_name:
            if not os.path.isfile(module_name):
                raise BadInput(f"{module_name}: no such file")
            spec = importlib.util.spec_from_file_location(os.path.splitext(os.path.basename(module_name))[0], module_name)
            module = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = module  # TorchScript finds the classes' source through it
            spec.loader.exec_module(module)
        else:
            sys.path.insert(0, os.getcwd())
            module = importlib.import_module(module_name)
    except BadInput:
        raise
    except Exception as e:
        raise BadInput(f"{module_name}: cannot import: {first_line(e)}")
    function = getattr(module, function_name, None)
    if not callable(function):
        raise BadInput(f"{module_name}: no function {function_name}")
    return function


def as_sequential(model):
    if isinstance(model, torch.nn.Sequential):
        return model
    if isinstance(model, (list, tuple)) and model and all(isinstance(m, torch.nn.Module) for m in model):
        return torch.nn.Sequential(collections.OrderedDict((str(i), m) for i, m in enumerate(model)))
    raise BadInput(f"the model: expected an nn.Sequential or a list of modules, got {type(model).__name__}")


def children(model):
    """(name, module) at every position of the Sequential, a module used at two positions (one
    activation instance reused) at both: named_children() and children() give each module once,
    which dropped its second use from the model."""
    return list(model._modules.items())


def as_batch(batch):
    if not (isinstance(batch, (list, tuple)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
        raise BadInput("the batch: expected a pair of tensors (inputs, targets)")
    # Copies, so that a view of a larger tensor saves its own samples only.
    inputs, targets = (t.detach().cpu().clone(memory_format=torch.contiguous_format) for t in batch)
    if inputs.dim() == 0 or targets.dim() == 0 or inputs.shape[0] != targets.shape[0] or inputs.shape[0] == 0:
        raise BadInput(f"the batch: inputs {describe(inputs)} and targets {describe(targets)} must have the same "
                       "number of samples, at least one, in dimension 0")
    return inputs, targets


def base_loss(name):
    """The loss a pipeline trains with, as torch_pipeline.py runs it and eager_profile.py times
    the last child: cross entropy over the last dimension (a token model's every position), or
    mean squared error."""
    if name == "mse":
        return torch.nn.functional.mse_loss

    def cross_entropy(output, target):
        if target.is_floating_point():
            return torch.nn.functional.cross_entropy(output.flatten(0, -2), target.flatten(0, -2))
        return torch.nn.functional.cross_entropy(output.flatten(0, -2), target.flatten())

    return cross_entropy


def check_loss(loss, output, targets):
    if not isinstance(output, torch.Tensor):
        raise BadInput(f"the last child returns {type(output).__name__}, expected a tensor")
    if loss == "mse":
        if targets.shape != output.shape or not targets.is_floating_point():
            raise BadInput(f"targets {describe(targets)} cannot match the output {describe(output)}: "
                           "mse takes floating targets of the output's shape")
        return
    if output.dim() < 2:
        raise BadInput(f"the model's output {describe(output)} has no last dimension to classify over "
                       "(cross entropy needs [samples, ..., classes]; for regression use --loss mse)")
    if targets.is_floating_point() and targets.shape == output.shape:
        return
    if targets.is_floating_point() or targets.shape != output.shape[:-1]:
        raise BadInput(f"targets {describe(targets)} cannot match the output {describe(output)}: cross entropy takes "
                       f"class indices of shape {list(output.shape[:-1])} (the output's without its last dimension) "
                       "or class probabilities of the output's shape")
    if targets.numel() and (targets.min() < 0 or targets.max() >= output.shape[-1]):
        raise BadInput(f"targets hold classes {int(targets.min())} to {int(targets.max())}, "
                       f"but the output has {output.shape[-1]}")


def label(name, child):
    return f"'{name}' ({type(child).__name__})"


def copy_shared_constant_buffers(model, inputs):
    """Gives each child its own copy of a buffer it shares with others where no forward changes
    it (a rotary embedding's frequencies, a position table: a model's one module reused in every
    block's wrapper), so that each stage keeps its own. A buffer a training-mode forward changes
    (batch norm's running statistics) stays shared, and tied_parameters refuses it: copies would
    drift apart. Parameters stay the very objects they were (tied weights kept). Returns report
    lines."""
    holders = collections.OrderedDict()
    for name, child in children(model):
        for buffer_name, buffer in child.named_buffers(remove_duplicate=False):
            if buffer is not None:
                entry = holders.setdefault(id(buffer), (buffer, []))
                if name not in [n for n, _ in entry[1]]:
                    entry[1].append((name, buffer_name))
    shared = [(buffer, names) for buffer, names in holders.values() if len(names) > 1]
    if not shared:
        return []
    # Values as well as versions: batch norm's kernel updates its running statistics in place
    # without a version bump.
    before = [(buffer._version, buffer.detach().clone()) for buffer, _ in shared]
    with preserving(model), torch.no_grad():
        try:
            model(inputs)  # in the mode pipetune runs it: training, as given
        except Exception:
            return []  # compile_children names the child that fails
        changed = [buffer._version != version or not torch.equal(buffer, value)
                   for (buffer, _), (version, value) in zip(shared, before)]
    report, copied_children = [], set()
    for (buffer, names), was_changed in zip(shared, changed):
        if was_changed:
            continue
        for name, _ in names[1:]:
            copied_children.add(name)
        report.append("copied: " + ", ".join(f"{child}.{n}" for child, n in names) +
                      " (one buffer no forward changes: each child now keeps its own copy)")
    for name in copied_children:
        child = model._modules[name]
        memo = {id(p): p for _, p in child.named_parameters(remove_duplicate=False)}
        model._modules[name] = copy.deepcopy(child, memo)
    return report


def tied_parameters(model):
    """The parameters two or more children hold as the same object (tied weights), as
    [(tensor, [(child name, parameter name), ...])], in order of first holder. pipetune keeps each
    as one: every stage holding it gets a copy, and their gradients are summed before each step.

    Refuses what cannot be kept as one: a buffer two children hold, and a tensor that shares
    another's storage without being it (a view), which would be trained or kept as two copies."""
    seen, tied = {}, collections.OrderedDict()
    for name, child in children(model):
        tensors = [("parameter", n, t) for n, t in child.named_parameters(remove_duplicate=False)]
        tensors += [("buffer", n, t) for n, t in child.named_buffers(remove_duplicate=False) if t is not None]
        for kind, tensor_name, tensor in tensors:
            keys = [("object", id(tensor))]
            if tensor.numel() and tensor.device.type != "meta":
                keys.append(("storage", tensor.untyped_storage().data_ptr()))
            for key in keys:
                first = seen.setdefault(key, (name, child, kind, tensor_name, tensor))
                if first[0] == name:
                    continue
                if first[4] is tensor and kind == first[2] == "parameter":
                    holders = tied.setdefault(id(tensor), (tensor, [(first[0], first[3])]))[1]
                    if (name, tensor_name) not in holders:
                        holders.append((name, tensor_name))
                    break
                shared, copies = ("parameter", "train") if "parameter" in (kind, first[2]) else ("buffer", "keep")
                what = "a view of another child's tensor" if first[4] is not tensor else f"a {shared}"
                if first[4] is tensor and shared == "buffer":
                    raise BadInput(f"children {label(first[0], first[1])} and {label(name, child)} share a buffer "
                                   f"that a forward changes ({first[0]}.{first[3]} is {name}.{tensor_name}, as batch "
                                   "norm's running statistics): pipetune would keep two copies, which would drift "
                                   "apart; give each child its own module")
                raise BadInput(f"children {label(first[0], first[1])} and {label(name, child)} share {what} "
                               f"({first[0]}.{first[3]} is {name}.{tensor_name}): pipetune would {copies} two copies; "
                               "untie them (e.g. `head.weight = nn.Parameter(embedding.weight.detach().clone())`), "
                               "hold the very same parameter in both, or make both uses one child")
    return list(tied.values())


def unreached_parameters(model, inputs_of):
    """[(child name, child, [(parameter name, tensor), ...])]: the trainable parameters each child
    holds that a training-mode forward and backward of its input on the example (`inputs_of`, as
    compile_children made them) does not reach (no gradient at all, not a zero one). Buffers and
    torch's random state are put back."""
    out = []
    for (name, child), x in zip(children(model), inputs_of):
        trainable = [(n, p) for n, p in child.named_parameters() if p.requires_grad]
        if trainable:
            with preserving(model), torch.enable_grad():
                torch.manual_seed(0)
                # Not a leaf: a child may change its input in place (an in-place activation).
                given = x.detach().requires_grad_().clone() if x.is_floating_point() else x
                y = child(given)
                grads = (torch.autograd.grad(y, [p for _, p in trainable], grad_outputs=torch.ones_like(y),
                                             allow_unused=True)
                         if y.requires_grad else [None] * len(trainable))
            missed = [(n, p) for (n, p), g in zip(trainable, grads) if g is None]
            if missed:
                out.append((name, child, missed))
    return out


def megabytes(n):
    return f"{n / 1e6:.1f} MB" if n >= 100_000 else f"{n / 1e3:.1f} kB"


def check_reached(model, inputs_of, tied):
    """Refuses a child holding a tied parameter its own forward never uses (a wrapper that keeps
    the whole model to call one part of it): every stage holding that child would keep a copy of
    the parameter and its gradient for nothing, which defeats splitting the model. Returns report
    lines for untied parameters a child holds and does not use (no gradient, memory all the same)."""
    holders_of = {id(tensor): holders for tensor, holders in tied}
    refusals, report = [], []
    for name, child, missed in unreached_parameters(model, inputs_of):
        shared = [(n, p) for n, p in missed if id(p) in holders_of]
        alone = [(n, p) for n, p in missed if id(p) not in holders_of]
        if shared:
            n, p = shared[0]
            other = next((f"{c}.{m}" for c, m in holders_of[id(p)] if c != name), None)
            more = f", and {len(shared) - 1} more" if len(shared) > 1 else ""
            size = megabytes(sum(p.numel() * p.element_size() for _, p in shared))
            refusals.append(f"child {label(name, child)} holds {len(shared)} parameter{'s' if len(shared) > 1 else ''} "
                            f"({size}) that other children train and its forward never uses ({name}.{n} is {other}"
                            f"{more}): every stage holding '{name}' would keep a copy of them and their gradients; "
                            f"give '{name}' only the modules its forward uses (e.g. `self.patch_embed = "
                            "model.patch_embed`, not `self.model = model`)")
        if alone:
            names = ", ".join(f"{name}.{n}" for n, _ in alone[:3]) + (f", and {len(alone) - 3} more"
                                                                      if len(alone) > 3 else "")
            size = megabytes(sum(p.numel() * p.element_size() for _, p in alone))
            report.append(f"unused: {label(name, child)} holds {len(alone)} trainable parameter"
                          f"{'s' if len(alone) > 1 else ''} ({size}) its forward does not reach on the example "
                          f"({names}): they get no gradient there, yet take memory on its stage, and pipetune's "
                          "memory model counts a gradient for them")
    if refusals:
        raise BadInput("; ".join(refusals))
    return report


def tie_lines(tied):
    """One `tied:` line per tensor; where more than 3 share their holders (a layer repeated at
    every depth), one line for them all."""
    groups = collections.OrderedDict()
    for tensor, holders in tied:
        groups.setdefault((tuple(child for child, _ in holders), tensor.requires_grad), []).append(holders)
    lines = []
    for (children_, trained), members in groups.items():
        kept = ("one tensor: pipetune sums its gradients over the stages holding it" if trained
                else "one tensor, frozen: each stage holding it keeps a copy that does not train")
        if len(members) <= 3:
            lines += ["tied: " + " is ".join(f"{c}.{n}" for c, n in holders) + f" ({kept})" for holders in members]
            continue
        who = ", ".join(f"'{c}'" for c in children_)
        first = " is ".join(f"{c}.{n}" for c, n in members[0])
        kept = kept.replace("one tensor:", "each one tensor:").replace("one tensor,", "each one tensor,")
        lines.append(f"tied: {len(members)} parameters, each held by children {who} ({first}, and "
                     f"{len(members) - 1} more; {kept})")
    return lines


def check_ties_kept(scripted, tied):
    """The compiled Sequential must still hold each tied parameter as one object in every holder
    (a compiled child with a copy of its own would train it apart)."""
    for _, holders in tied:
        found = [dict(getattr(scripted, child).named_parameters(remove_duplicate=False))[name]
                 for child, name in holders]
        if any(t is not found[0] for t in found[1:]):
            names = " and ".join(f"{child}.{name}" for child, name in holders)
            raise BadInput(f"the compiled children hold {names} as separate tensors: the tie was lost "
                           "in compiling them; untie them in the model")


def check_takes_one_input(name, child):
    try:
        signature = inspect.signature(child.forward)
    except (TypeError, ValueError):
        return  # nothing to read; running it will tell
    kinds = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    required = [p.name for p in signature.parameters.values() if p.kind in kinds and p.default is p.empty]
    if len(required) > 1:
        raise BadInput(f"child {label(name, child)} takes {len(required)} inputs ({', '.join(required)}); each child "
                       "must take one tensor: wrap it in a module whose forward(x) supplies the others")


def check_returns_one_tensor(name, child, output):
    if isinstance(output, torch.Tensor):
        return
    what = type(output).__name__
    if isinstance(output, dict):
        key = repr(next(iter(output), "last_hidden_state"))
        raise BadInput(f"child {label(name, child)} returns a {what} (keys {', '.join(map(str, output))}); each child "
                       f"must return one tensor: wrap it so that it does, e.g. `hidden_states = block(x)[{key}]`")
    if isinstance(output, (tuple, list)):
        raise BadInput(f"child {label(name, child)} returns a {what} of {len(output)}; each child must return one "
                       "tensor: wrap it so that it does, e.g. `hidden_states = block(x)[0]` where the rest are "
                       "extras (attention weights, a cache), or pack what the next child needs into one tensor "
                       "(torch.cat) and split it there")
    raise BadInput(f"child {label(name, child)} returns {what}; each child must take one tensor and return one")


@contextlib.contextmanager
def evaluating(*modules):
    """Evaluation mode for a while: dropout off, batch-norm statistics untouched."""
    modes = [(m, m.training) for module in modules for m in module.modules()]
    for module in modules:
        module.eval()
    try:
        yield
    finally:
        for m, mode in modes:
            m.training = mode


@contextlib.contextmanager
def preserving(module):
    """Puts back the buffers (running statistics) and torch's random state that runs change."""
    buffers = [(b, b.detach().clone()) for b in module.buffers()]
    rng = torch.get_rng_state()
    try:
        yield lambda: restore(buffers)
    finally:
        restore(buffers)
        torch.set_rng_state(rng)


def restore(buffers):
    with torch.no_grad():
        for buffer, value in buffers:
            buffer.copy_(value)


# (rtol, atol) by dtype; atol is scaled by the largest magnitude, at least 1 (see the docstring).
TOLERANCES = {torch.float64: (1e-7, 1e-9), torch.float32: (1e-4, 1e-5),
              torch.float16: (1e-2, 1e-3), torch.bfloat16: (5e-2, 1e-2)}


def difference(got, expected):
    """None where a compiled child's tensor matches Python's, else how it differs (a phrase)."""
    if got.shape != expected.shape:
        return f"has shape {list(got.shape)}, Python's {list(expected.shape)}"
    if got.dtype != expected.dtype:
        return f"is {describe(got)}, Python's {describe(expected)}"
    got, expected = got.detach(), expected.detach()
    if expected.is_complex():
        got, expected = torch.view_as_real(got), torch.view_as_real(expected)
    if not expected.is_floating_point():
        if torch.equal(got, expected):
            return None
        return f"differs from Python's in {int((got != expected).sum())} of {expected.numel()} elements"
    rtol, atol = TOLERANCES.get(expected.dtype, TOLERANCES[torch.float32])
    got, expected = got.double(), expected.double()
    finite = expected[expected.isfinite()]
    scale = max(1.0, finite.abs().max().item()) if finite.numel() else 1.0
    if torch.allclose(got, expected, rtol=rtol, atol=atol * scale, equal_nan=True):
        return None
    error = (got - expected).abs().nan_to_num(nan=float("inf")).max().item()
    return f"differs from Python's by up to {error:.3g} (allowed: rtol {rtol:g}, atol {atol:g} x {scale:.3g})"


def micro_batch_sizes(n):
    """Every size a plan can give a micro-batch of an example of n samples, or a spread of them."""
    if n <= 64:
        return list(range(1, n + 1))
    spread = {1, 2, 3, 5, 7, 8, 9, 15, 16, 17, 31, 32, 33, 63, 64, 65, n // 3, n // 2, n // 2 + 1, n - 1, n}
    return sorted(s for s in spread if 1 <= s <= n)


def run_once(module, x, restore, cotangent=None):
    """One forward and backward from the saved buffers and a fixed seed: (output, gradients, buffers)."""
    restore()
    torch.manual_seed(0)
    x = x.detach().clone()
    floating = x.is_floating_point() or x.is_complex()
    if floating:
        x.requires_grad_()
    output = module(x)
    if not isinstance(output, torch.Tensor):
        raise RuntimeError(f"returns {type(output).__name__}, not a tensor")
    buffers = {n: b.detach().clone() for n, b in module.named_buffers()}
    gradients = {}
    if output.requires_grad:
        if cotangent is None:
            generator = torch.Generator().manual_seed(0)
            cotangent = torch.randn(output.shape, generator=generator, dtype=torch.float64).to(output.dtype)
        wrt = dict(module.named_parameters())
        wrt = {f"'{n}'": p for n, p in wrt.items() if p.requires_grad}
        if floating:
            wrt["its input"] = x
        if output.shape == cotangent.shape:
            values = torch.autograd.grad(output, list(wrt.values()), cotangent, allow_unused=True)
            gradients = {n: torch.zeros_like(p) if g is None else g for (n, p), g in zip(wrt.items(), values)}
    return output.detach(), gradients, buffers, cotangent


def prove(child, traced, x):
    """(None, sizes Python itself fails at) where the trace matches the Python child at every other
    micro-batch size, else (what does not, None)."""
    compared = []
    python_failure = None
    skipped = []
    with preserving(child) as restore, torch.enable_grad():
        for size in micro_batch_sizes(x.shape[0]):
            xs = x[:size]
            try:
                expected, expected_gradients, expected_buffers, cotangent = run_once(child, xs, restore)
            except Exception as e:
                python_failure = python_failure or first_line(e)
                skipped.append(size)
                continue  # the Python child cannot run this size either (batch norm at 1): nothing to prove
            samples = f"a micro-batch of {size} sample{'s' if size != 1 else ''}"
            try:
                got, gradients, buffers, _ = run_once(traced, xs, restore, cotangent)
            except Exception as e:
                return f"its trace does not generalise: at {samples} it fails: {first_line(e)}", None
            problems = [("its output", difference(got, expected))]
            for n, g in expected_gradients.items():
                problems.append((f"its gradient w.r.t. {n}",
                                 difference(gradients[n], g) if n in gradients else "is missing"))
            for n, b in expected_buffers.items():
                problems.append((f"its buffer '{n}' after a forward",
                                 difference(buffers[n], b) if n in buffers else "is missing"))
            for what, problem in problems:
                if problem:
                    return f"its trace does not generalise: at {samples}, {what} {problem}", None
            compared.append(size)
    if not compared:
        return (f"its trace could not be compared with Python at any micro-batch size (Python fails: "
                f"{python_failure})", None)
    return None, (skipped, python_failure)


def warning_line(caught):
    """The first tracer warning in one line: torch's first sentence, then where it was raised:
    the line of the model's code that called into torch where torch raised it (GPT-J's
    `torch.split(sincos, sincos.shape[-1] // 2)` warns inside torch's own `Tensor.split`)."""
    first = caught[0]
    message = str(first.message).strip().splitlines()[0]
    sentence = message.split(". ")[0].rstrip(".")
    filename, lineno = getattr(first, "origin", None) or (first.filename, first.lineno)
    source = linecache.getline(filename, lineno).strip()
    inside = f" (torch raised it at {first.filename}:{first.lineno})" if filename != first.filename else ""
    more = f" (and {len(caught) - 1} more)" if len(caught) > 1 else ""
    return f'"{sentence}" at {filename}:{lineno}' + (f": `{source}`" if source else "") + inside + more


def recording_origins(caught):
    """A warnings.showwarning that appends each warning to `caught` (as catch_warnings(record=True)
    does) with `origin`: the innermost frame of the stack outside torch's sources and this file,
    taken while the warning is raised, or None where the warning's own line is outside torch."""
    def record(message, category, filename, lineno, file=None, line=None):
        warning = warnings.WarningMessage(message, category, filename, lineno, file, line)
        warning.origin = None
        if filename.startswith(TORCH_SOURCES):
            for frame in reversed(traceback.extract_stack()[:-1]):
                if not (frame.filename.startswith(TORCH_SOURCES) or frame.filename == __file__
                        or frame.filename == warnings.__file__):
                    warning.origin = (frame.filename, frame.lineno)
                    break
        caught.append(warning)
    return record


@functools.lru_cache(maxsize=None)
def raise_only_lines(filename):
    """The lines of a source file that hold a check whose only effect is to raise: an `assert`,
    or an `if` (no else) whose body is nothing but `raise`."""
    try:
        with open(filename) as source:
            tree = ast.parse(source.read())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Assert):
            lines.add(node.lineno)
        elif (isinstance(node, ast.If) and not node.orelse
              and all(isinstance(statement, ast.Raise) for statement in node.body)):
            lines.add(node.test.lineno)
    return frozenset(lines)


def bakes(warning):
    """Whether a tracer warning may have baked an input's value or size into the trace. Two
    cannot:
    - a tensor turned into a Python boolean for a check that can only raise (nn.Embedding's
      padding index against its table, a user's length check): where the check passes, the
      trace records what Python ran;
    - torch.tensor() of Python values, kept as a constant (transformers' GPT-Neo builds its mask
      value from torch.finfo so): a value read from an input's data would have warned on its own
      as it became a Python number, boolean or list, and one counted from the batch size differs
      at the sizes the proof below runs (every size a plan can give; the other dimensions of a
      micro-batch are the example's)."""
    message = str(warning.message)
    if message.startswith("torch.tensor results are registered as constants in the trace"):
        return False
    boolean = "Converting a tensor to a Python boolean" in message
    return not (boolean and warning.lineno in raise_only_lines(warning.filename))


TORCH_SOURCES = os.path.dirname(torch.__file__) + os.sep


def python_functions(traced):
    """The Python autograd functions (torch.autograd.Function subclasses) a trace calls, as
    "NAME (at FILE:LINE)", the line being the first outside torch's own sources. A trace holds
    each as a Python call that TorchScript cannot save, nor pipetune's executor run."""
    found = []
    for node in traced.inlined_graph.nodes():
        if node.kind() != "prim::PythonOp":
            continue
        where = ""
        for frame in (node.sourceRange() or "").splitlines():
            match = re.match(r"(.+)\((\d+)\): \S+$", frame.strip())
            if match and not match.group(1).startswith(TORCH_SOURCES):
                where = f" (at {match.group(1)}:{match.group(2)})"
                break
        name = f"{node.pyname()}{where}"
        if name not in found:
            found.append(name)
    return found


def save_problem(compiled):
    """Why TorchScript cannot save this compiled child, or None. A script compiles a call to a
    method marked torch.jit.ignore as a call back into Python (timm's MobileViT-v2 attention has
    one on a branch it never takes), which only saving refuses."""
    try:
        torch.jit.save(compiled, io.BytesIO())
    except Exception as e:
        return first_line(e)
    return None


def trace(name, child, x, script_reason):
    """The traced child, proven; raises BadInput naming what went wrong."""
    prefix = f"child {label(name, child)} cannot be scripted: {script_reason}; "
    with preserving(child), warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warnings.showwarning = recording_origins(caught)
        try:
            # torch's own check_trace reruns once at the same size and calls dropout nondeterministic;
            # prove() below is the check, at every size and with the random state fixed.
            traced = torch.jit.trace(child, (x,), check_trace=False)
        except Exception as e:
            raise BadInput(prefix + f"nor traced: {first_line(e)}")
    tracer = [w for w in caught if issubclass(w.category, torch.jit.TracerWarning) and bakes(w)]
    if tracer:
        raise BadInput(prefix + f"its trace would be wrong for other inputs: torch warns: {warning_line(tracer)}")
    functions = python_functions(traced)
    if functions:
        raise BadInput(prefix + f"its trace calls the Python autograd function{'s' if len(functions) > 1 else ''} "
                       f"{', '.join(functions)}, which TorchScript cannot hold: replace the module that calls "
                       f"it with one of torch's operations")
    unsaved = save_problem(traced)
    if unsaved:
        raise BadInput(prefix + f"nor can its trace be saved: {unsaved}")
    # As the graph is written: the graph executor's optimised path rewrites dropout as
    # native_dropout, which draws a mask even at p = 0 (transformers' OPT has such a dropout
    # before one of p > 0), so Python's masks would be compared with others. pipetune's executor
    # replaces every dropout with its own, which draws nothing at p = 0, before it runs a child.
    with warnings.catch_warnings(), torch.jit.optimized_execution(False):
        warnings.simplefilter("ignore")  # the graph executor's notes while it runs the proof
        problem, skipped = prove(child, traced, x)
    if problem:
        raise BadInput(prefix + problem)
    return traced, skipped


def compile_children(model, inputs):
    """Scripts each child, or traces and proves it; returns (compiled children, report, each
    child's input on the example in order, last output)."""
    failures = []
    compiled = collections.OrderedDict()
    scripted_names, traced_names, not_compared = [], [], []
    x, inputs_of = inputs, []
    # The first reason each class of child did not script: TorchScript keeps a class it failed to
    # compile half-registered, so the next child of that class fails with "Can't redefine method",
    # which is not why.
    script_reasons = {}
    for name, child in children(model):
        inputs_of.append(x)
        check_takes_one_input(name, child)
        try:
            with evaluating(child), torch.no_grad():  # deterministic: the example for the next child
                expected = child(x)
        except Exception as e:
            raise BadInput(f"child {label(name, child)} fails on its input {describe(x)}: {first_line(e)}")
        check_returns_one_tensor(name, child, expected)
        try:
            scripted = torch.jit.script(child)
            unsaved = save_problem(scripted)
            if unsaved:
                raise RuntimeError(f"its script cannot be saved: {unsaved}")
        except Exception as e:
            reason = first_line(e)
            if "Can't redefine method" in reason and type(child) in script_reasons:
                reason = script_reasons[type(child)]
            script_reasons.setdefault(type(child), reason)
            try:
                compiled[name], (skipped, why) = trace(name, child, x, reason)
                traced_names.append(label(name, child) + ("" if child.training else " in evaluation mode"))
                if skipped:
                    sizes = ", ".join(map(str, skipped))
                    not_compared.append(f"{label(name, child)} at {sizes} sample{'s' if skipped != [1] else ''} "
                                        f"(Python itself fails: {why})")
            except BadInput as refusal:
                failures.append(str(refusal))
        else:
            try:
                with evaluating(child, scripted), torch.no_grad():
                    got = scripted(x)
            except Exception as e:
                raise BadInput(f"child {label(name, child)} scripted fails on its input {describe(x)}: {first_line(e)}")
            problem = difference(got, expected) if isinstance(got, torch.Tensor) else f"is {type(got).__name__}"
            if problem:
                raise BadInput(f"child {label(name, child)} scripted does not compute what it computes in Python: "
                               f"its output {problem}")
            compiled[name] = scripted
            scripted_names.append(label(name, child))
        x = expected
    if failures:
        raise BadInput("; ".join(failures))
    report = [f"scripted: {', '.join(scripted_names) or 'none'}"]
    if traced_names:
        sizes = micro_batch_sizes(inputs.shape[0])
        sizes = f"1 to {sizes[-1]}" if len(sizes) == sizes[-1] else ", ".join(map(str, sizes))
        report.append(f"traced: {', '.join(traced_names)}; each trace matched Python's output and gradients "
                      f"at micro-batches of {sizes} samples" + (f", but for {'; '.join(not_compared)}: a plan "
                                                                 f"must not give it such a micro-batch"
                                                                 if not_compared else ""))
    return compiled, report, inputs_of, x


def export(target, prefix, loss):
    function = load_function(target)
    try:
        result = function()
    except Exception as e:
        raise BadInput(f"{target}: failed: {first_line(e)}")
    if not (isinstance(result, (list, tuple)) and len(result) == 2):
        raise BadInput(f"{target}: expected it to return (model, (inputs, targets))")
    model = as_sequential(result[0]).cpu()
    inputs, targets = as_batch(result[1])
    copied = copy_shared_constant_buffers(model, inputs)
    tied = tied_parameters(model)
    compiled, report, inputs_of, output = compile_children(model, inputs)
    report += check_reached(model, inputs_of, tied)
    report += copied
    check_loss(loss, output, targets)
    try:
        # A Sequential of script modules, traced ones included, scripts as one container.
        scripted = torch.jit.script(torch.nn.Sequential(compiled))
    except Exception as e:
        raise BadInput(f"the Sequential cannot be scripted: {first_line(e)}")
    check_ties_kept(scripted, tied)
    report += tie_lines(tied)

    model_path, batch_path = prefix + ".pt", prefix + ".batch.pt"
    # Written under temporary names and renamed, so a failure leaves nothing behind.
    temporary = [model_path + ".tmp", batch_path + ".tmp"]
    try:
        scripted.save(temporary[0])
        torch.save((inputs, targets), temporary[1])
        os.replace(temporary[0], model_path)
        os.replace(temporary[1], batch_path)
    except (OSError, RuntimeError) as e:
        for path in temporary:
            if os.path.exists(path):
                os.remove(path)
        raise BadInput(f"{prefix}: cannot write: {first_line(e)}")
    for line in report:
        print(line)
    names = list(compiled)
    print(f"wrote {model_path} ({len(names)} layers: {', '.join(names)}) and {batch_path} "
          f"({inputs.shape[0]} samples: inputs {describe(inputs)}, targets {describe(targets)})")
    spec = f"torchscript:path={model_path},batch={batch_path}" + (",loss=mse" if loss == "mse" else "")
    print(spec)


def main():
    parser = argparse.ArgumentParser(description="Export a model and a batch for pipetune's --model.")
    parser.add_argument("target", metavar="MODULE:FUNCTION",
                        help="FUNCTION() returns (model, (inputs, targets)); MODULE a module name or a .py file")
    parser.add_argument("--out", default="model", metavar="PREFIX", help="writes PREFIX.pt and PREFIX.batch.pt")
    parser.add_argument("--loss", default="cross_entropy", choices=["cross_entropy", "mse"])
    args = parser.parse_args()
    try:
        export(args.target, args.out, args.loss)
    except BadInput as e:
        print(f"export_model: error: {e}", file=sys.stderr)
        sys.exit(2)


if __name__ == "__main__":
    main()
