"""A plan on torch.distributed.pipelining against pipetune's predictions of it, for torch's
runtime and for pipetune's executor: iteration time (torch's median step) and every rank's peak
memory, as one Markdown row a plan.

    python3 bench/validation/torch_record.py --builder scripts/examples/hf_gpt2.py:build \
        --profile gpt2.profile.json --hardware torch.hardware.json "[3,3] x4 never 1f1b" ...

A plan is written short, as the reports write it: "[BALANCE] xCHUNKS CHECKPOINT SCHEDULE" (two
stages a device for the looped and V schedules). The profile is pipetune's (`pipetune profile`, one
intra-op thread a device as torch's ranks run); the hardware file torch_pipeline.py --probe's.
With --eager-profile (scripts/eager_profile.py's retiming of that profile on the model's Python
modules), a column more: the prediction for torch's runtime from the eager times.
"""
import argparse
import json
import os
import subprocess
import sys
import tempfile

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.join(HERE, "..", "..")
TWO_STAGES_A_DEVICE = {"interleaved-1f1b", "interleaved-zb", "looped-bfs", "zbv", "dualpipev"}


def plan_of(text):
    balance, chunks, checkpoint, schedule = text.split()
    plan = {"format": "pipetune.plan/1", "balance": json.loads(balance), "chunks": int(chunks.lstrip("x")),
            "checkpoint": checkpoint, "schedule": schedule}
    if schedule in TWO_STAGES_A_DEVICE:
        plan["stages_per_device"] = 2
    return plan


def predicted(args, plan_path, hardware, profile=None):
    done = subprocess.run([args.pipetune, "simulate", "--profile", profile or args.profile, "--plan", plan_path,
                           "--json", *hardware], capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"torch_record.py: simulate: {done.stderr.strip()}")
    report = json.loads(done.stdout)
    return report["iteration_ms"], [d["peak_memory_bytes"] for d in report["devices"]]


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--builder", required=True)
    parser.add_argument("--profile", required=True)
    parser.add_argument("--hardware", required=True, help="torch_pipeline.py --probe's hardware file")
    parser.add_argument("--eager-profile", help="scripts/eager_profile.py's retiming of --profile")
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--python", default=os.path.expanduser("~/.cache/pipetune/venv/bin/python"))
    parser.add_argument("--pipetune", default=os.path.join(ROOT, "build", "cli", "pipetune"))
    parser.add_argument("plans", nargs="+")
    args = parser.parse_args()
    eager = "| predicted for torch, eager profile " if args.eager_profile else ""
    print(f"| plan | torch ms {eager}| predicted for torch | for pipetune's executor | peaks measured (MB) "
          "| memory error for torch | for pipetune's executor |")
    print("|---|---|---|---|---|---|---|" + ("---|" if eager else ""))
    with tempfile.TemporaryDirectory() as folder:
        for text in args.plans:
            plan = plan_of(text)
            plan_path, trace_path = os.path.join(folder, "plan.json"), os.path.join(folder, "trace.json")
            with open(plan_path, "w") as f:
                json.dump(plan, f)
            done = subprocess.run([args.python, os.path.join(ROOT, "scripts", "torch_pipeline.py"), args.builder,
                                   "--plan", plan_path, "--steps", str(args.steps), "--json", "--trace", trace_path],
                                  capture_output=True, text=True)
            if done.returncode:
                print(f"| `{text}` | {done.stderr.strip().splitlines()[-1]} |||||")
                continue
            measured_ms = json.loads(done.stdout.strip().splitlines()[-1])["median_ms"]
            with open(trace_path) as f:
                peaks = [d["peak_memory_bytes"] for d in json.load(f)["pipetune"]["summary"]["devices"]]
            torch_ms, torch_peaks = predicted(args, plan_path, ["--hardware", args.hardware])
            own_ms, own_peaks = predicted(args, plan_path, ["--devices", str(len(peaks))])

            def error(ms):
                return f"{ms:.2f} ({(ms / measured_ms - 1) * 100:+.1f} %)"

            eager_column = ""
            if args.eager_profile:
                eager_ms, _ = predicted(args, plan_path, ["--hardware", args.hardware], args.eager_profile)
                eager_column = f"| {error(eager_ms)} "

            def errors(values):
                return ", ".join(f"{(p / m - 1) * 100:+.1f} %" for p, m in zip(values, peaks))

            print(f"| `{text}` | {measured_ms:.2f} {eager_column}| {error(torch_ms)} | {error(own_ms)} "
                  f"| {', '.join(f'{p / 1e6:.2f}' for p in peaks)} | {errors(torch_peaks)} | {errors(own_peaks)} |",
                  flush=True)


if __name__ == "__main__":
    main()
