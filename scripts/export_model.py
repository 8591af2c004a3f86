"""Exports a PyTorch model for pipetune: a scripted nn.Sequential and a batch of real data.

    python scripts/export_model.py MODULE:FUNCTION [--out PREFIX] [--loss cross_entropy|mse]

MODULE is a module importable from the current folder (`my_models`) or a Python file
(`path/to/my_models.py`). FUNCTION() returns `(model, (inputs, targets))`: the model as an
nn.Sequential or a list of modules (its children are the layers pipetune balances over stages),
and a batch whose dimension 0 is samples, of any dtypes and shapes (int64 token ids, images, ...).

Each child is scripted and run on the example (its input being the previous child's output);
the scripted child must give what the Python one gives. The last output must fit the loss:
cross_entropy takes class indices of the output's shape without its last dimension (one per
sample or one per token) or class probabilities of the output's shape; mse targets of the
output's shape. Then PREFIX.pt (torch.jit.script of the Sequential) and PREFIX.batch.pt
(torch.save((inputs, targets))) are written and the --model spec is printed, last, on its own.

Bad input (an import that fails, a child that cannot be scripted, a batch that does not fit):
one line on stderr, exit status 2, nothing written. Needs only torch.
"""

import argparse
import collections
import importlib
import importlib.util
import os
import sys

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


def as_batch(batch):
    if not (isinstance(batch, (list, tuple)) and len(batch) == 2 and all(isinstance(t, torch.Tensor) for t in batch)):
        raise BadInput("the batch: expected a pair of tensors (inputs, targets)")
    # Copies, so that a view of a larger tensor saves its own samples only.
    inputs, targets = (t.detach().cpu().clone(memory_format=torch.contiguous_format) for t in batch)
    if inputs.dim() == 0 or targets.dim() == 0 or inputs.shape[0] != targets.shape[0] or inputs.shape[0] == 0:
        raise BadInput(f"the batch: inputs {describe(inputs)} and targets {describe(targets)} must have the same "
                       "number of samples, at least one, in dimension 0")
    return inputs, targets


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


def check_children(model, inputs):
    """Scripts every child and runs it on the example; returns the last output."""
    failures = []
    x = inputs
    with torch.no_grad():
        for name, child in model.named_children():
            kind = type(child).__name__
            try:
                expected = child(x)
            except Exception as e:
                raise BadInput(f"child '{name}' ({kind}) fails on its input {describe(x)}: {first_line(e)}")
            if not isinstance(expected, torch.Tensor):
                raise BadInput(f"child '{name}' ({kind}) returns {type(expected).__name__}; "
                               "each child must take one tensor and return one")
            try:
                scripted = torch.jit.script(child)
            except Exception as e:
                failures.append(f"child '{name}' ({kind}) cannot be scripted: {first_line(e)}")
            else:
                try:
                    got = scripted(x)
                except Exception as e:
                    raise BadInput(f"child '{name}' ({kind}) scripted fails on its input {describe(x)}: {first_line(e)}")
                if not (isinstance(got, torch.Tensor) and got.shape == expected.shape and got.dtype == expected.dtype
                        and torch.allclose(got, expected, rtol=1e-4, atol=1e-5, equal_nan=True)):
                    raise BadInput(f"child '{name}' ({kind}) scripted does not compute what it computes in Python")
            x = expected
    if failures:
        raise BadInput("; ".join(failures))
    return x


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
    was_training = model.training
    model.eval()  # dropout off, batch-norm statistics untouched: the check must be deterministic
    output = check_children(model, inputs)
    check_loss(loss, output, targets)
    model.train(was_training)
    try:
        scripted = torch.jit.script(model)
    except Exception as e:
        raise BadInput(f"the Sequential cannot be scripted: {first_line(e)}")

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
    names = [name for name, _ in model.named_children()]
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
