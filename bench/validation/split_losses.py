"""Does a split train what one device trains? Runs a model on one stage and on random splits
under every schedule, and compares each run's losses with the one stage's.

    python3 bench/validation/split_losses.py --model SPEC --layers L [--batch 8] [--chunks 4]
        [--steps 3] [--optimizer adam] [--seed 0] [--pipetune build/cli/pipetune] [-- RUN FLAGS]

One stage (GPipe), then GPipe and 1F1B on 2 stages, interleaved 1F1B, interleaved zero bubble,
ZBV, DualPipeV and looped BFS on 4 stages over 2 devices, and 1F1B checkpointed, each at a
random balance, all with the same seed, batch and micro-batches (`pipetune run --json`). Prints
each plan's largest relative loss difference from the one stage's. GPipe and looped BFS run the
micro-batches' backwards in the one stage's order and should match it exactly; the others add
the micro-batches' gradients in another order, which rounds differently (1e-8 to 1e-5 after
a few Adam steps; more on a model whose batch norm sees micro-batches of 2). Pass
`-- --threads 1` to keep every run's intra-op threads equal (one stage otherwise gets both
cores, whose reductions round differently again). Exit status 1 when a run fails.
"""
import argparse
import json
import os
import random
import subprocess
import sys
import tempfile


def split(layers, stages, rng):
    cuts = sorted(rng.sample(range(1, layers), stages - 1))
    return [end - start for start, end in zip([0] + cuts, cuts + [layers])]


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True)
    parser.add_argument("--layers", type=int, required=True)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--chunks", type=int, default=4)
    parser.add_argument("--steps", type=int, default=3)
    parser.add_argument("--optimizer", default="adam")
    parser.add_argument("--seed", type=int, default=0, help="for the balances")
    parser.add_argument("--pipetune", default="build/cli/pipetune")
    parser.add_argument("run_flags", nargs="*", help="after --: more flags for pipetune run")
    args = parser.parse_args()
    rng = random.Random(args.seed)
    plans = [("one stage", {"balance": [args.layers], "schedule": "gpipe"})]
    for schedule, stages in [("gpipe", 2), ("1f1b", 2), ("interleaved-1f1b", 4), ("interleaved-zb", 4),
                             ("zbv", 4), ("dualpipev", 4), ("looped-bfs", 4)]:
        if args.layers >= stages:
            plan = {"balance": split(args.layers, stages, rng), "schedule": schedule}
            if stages == 4:
                plan["stages_per_device"] = 2
            plans.append((schedule, plan))
    if args.layers >= 2:
        plans.append(("1f1b checkpointed", {"balance": split(args.layers, 2, rng), "schedule": "1f1b",
                                            "checkpoint": "always"}))
    reference, failed = None, False
    with tempfile.TemporaryDirectory() as folder:
        for label, plan in plans:
            plan = {"format": "pipetune.plan/1", "chunks": args.chunks, "checkpoint": "never", **plan}
            path = os.path.join(folder, "plan.json")
            with open(path, "w") as out:
                json.dump(plan, out)
            run = subprocess.run([args.pipetune, "run", "--model", args.model, "--plan", path, "--batch",
                                  str(args.batch), "--steps", str(args.steps), "--optimizer", args.optimizer,
                                  "--lr", "0.001", "--json", "--progress", "none"] + args.run_flags,
                                 capture_output=True, text=True)
            if run.returncode != 0:
                print(f"{label:18s} {str(plan['balance']):16s} failed: {run.stderr.strip()}")
                failed = True
                continue
            losses = json.loads(run.stdout)["losses"]
            reference = reference or losses
            difference = max(abs(a - b) / abs(b) for a, b in zip(losses, reference))
            print(f"{label:18s} {str(plan['balance']):16s} {difference:.1e}  "
                  + " ".join(f"{loss:.6f}" for loss in losses))
    sys.exit(1 if failed else 0)


if __name__ == "__main__":
    main()
