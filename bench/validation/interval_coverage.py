"""Where measured steps fall against pipetune's 80 % intervals, for the validation record.

    python3 bench/validation/interval_coverage.py --report DIR/report.json [...]
    python3 bench/validation/interval_coverage.py --pipetune build/cli/pipetune --pack traces/h200-gpt [...]

--report: a `pipetune validate` report (this build's), whose plans carry their interval and the
measured steps: the share of steps inside is counted.

--pack PREFIX: a validation pack kept in traces/ (PREFIX.profile.json, PREFIX.hardware.json,
PREFIX.report.md and a PREFIX.*.plan.json for the devices): every plan of the report is
re-predicted offline with this build (`simulate --json`), and as the pack keeps each plan's
median step and median absolute deviation, not the steps, the share of steps inside is
estimated as a normal's mass between the interval's ends (sigma = 1.4826 x MAD).

Prints one row per plan and, per source, the share of steps inside (70-90 % is right for an
80 % interval) and the median width.
"""
import argparse
import glob
import json
import math
import re
import statistics
import subprocess
import tempfile


def normal_cdf(x):
    return 0.5 * (1.0 + math.erf(x / math.sqrt(2.0)))


def from_report(path):
    with open(path) as f:
        report = json.load(f)
    rows = []
    for plan in report["plans"]:
        interval = plan.get("interval")
        if not interval:
            continue
        steps = plan["measured_pipeline_ms"]
        rows.append({"plan": plan["plan"], "low": interval["low_ms"], "high": interval["high_ms"],
                     "predicted": (plan["calibrated"] if report.get("calibration") != "none" else plan["uncalibrated"])["predicted_ms"],
                     "median": plan["measured_median_ms"], "spread": plan["measured_spread_ms"],
                     "inside": interval["steps_inside"] / len(steps), "steps": len(steps)})
    return report["model"], rows


ROW = re.compile(r"^\| \d+ \| (?P<plan>[^|]+?) \| (?P<predicted>[\d.]+) \|(?: [\d.]+ \|)? (?P<median>[\d.]+) ± (?P<spread>[\d.]+) \|")


def plan_json(text, devices):
    """'[4,4] x2 except_last gpipe (2 stages/device)' as a plan file's object."""
    m = re.match(r"\[([\d,]+)\] x(\d+) (\S+) (\S+)(?: \((\d+) stages/device\))?", text)
    plan = {"format": "pipetune.plan/1", "balance": [int(b) for b in m.group(1).split(",")],
            "chunks": int(m.group(2)), "checkpoint": m.group(3), "schedule": m.group(4)}
    if m.group(5):
        plan["stages_per_device"] = int(m.group(5))
    if devices and len(devices) == len(plan["balance"]):
        plan["devices"] = devices
    return plan


def from_pack(prefix, pipetune):
    devices = None
    for path in sorted(glob.glob(prefix + ".*.plan.json")):
        with open(path) as f:
            devices = json.load(f).get("devices")
        break
    rows = []
    with open(prefix + ".report.md") as f:
        lines = f.read().splitlines()
    model = lines[0].split(": ", 1)[1] if lines else prefix
    for line in lines:
        m = ROW.match(line)
        if not m:
            continue
        with tempfile.NamedTemporaryFile("w", suffix=".json", delete=False) as f:
            json.dump(plan_json(m.group("plan"), devices), f)
        out = subprocess.run([pipetune, "simulate", "--profile", prefix + ".profile.json", "--hardware",
                              prefix + ".hardware.json", "--plan", f.name, "--json"],
                             capture_output=True, text=True, check=True)
        result = json.loads(out.stdout)
        if "iteration_low_ms" not in result:
            continue
        median, spread = float(m.group("median")), float(m.group("spread"))
        low, high = result["iteration_low_ms"], result["iteration_high_ms"]
        sigma = 1.4826 * spread
        inside = (normal_cdf((high - median) / sigma) - normal_cdf((low - median) / sigma)) if sigma > 0 \
            else float(low <= median <= high)
        rows.append({"plan": m.group("plan"), "low": low, "high": high, "predicted": result["iteration_ms"],
                     "median": median, "spread": spread, "inside": inside, "steps": None})
    return model, rows


def show(source, rows):
    print(f"## {source}\n")
    print("| plan | predicted ms | 80 % interval | width | measured ms | median inside | steps inside |")
    print("|---|---|---|---|---|---|---|")
    for r in rows:
        width = (r["high"] - r["low"]) / r["predicted"] if r["predicted"] else 0.0
        share = f"{100 * r['inside']:.0f} %" + ("" if r["steps"] else " (est.)")
        print(f"| {r['plan']} | {r['predicted']:.2f} | {r['low']:.2f} - {r['high']:.2f} | {100 * width:.1f} % | "
              f"{r['median']:.2f} ± {r['spread']:.2f} | {'yes' if r['low'] <= r['median'] <= r['high'] else 'no'} | "
              f"{share} |")
    if rows:
        widths = [(r["high"] - r["low"]) / r["predicted"] for r in rows if r["predicted"]]
        print(f"\n{source}: {100 * statistics.mean(r['inside'] for r in rows):.0f} % of steps inside on "
              f"average over {len(rows)} plans, medians inside on {sum(r['low'] <= r['median'] <= r['high'] for r in rows)}, "
              f"median width {100 * statistics.median(widths):.1f} %\n")


def main():
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--report", action="append", default=[])
    parser.add_argument("--pack", action="append", default=[])
    parser.add_argument("--pipetune", default="build/cli/pipetune")
    args = parser.parse_args()
    for path in args.report:
        show(*from_report(path))
    for prefix in args.pack:
        show(*from_pack(prefix, args.pipetune))


if __name__ == "__main__":
    main()
