#!/usr/bin/env python3
"""Turns `pipetune validate` reports (report.json) into the markdown table of docs/validation.md.

    python3 bench/validation/record_table.py OUT/*/*/report.json

One row per plan validated: predicted time without and with the calibration, the median measured
time and its spread (median absolute deviation over steps), both errors, and the peak memory of
the device whose prediction is furthest off. Then a summary of the absolute errors, and how many
device peaks came out more than 0.5 % above their prediction and within the worst arrival order's peak,
and every device's peak in its traced step's own order of tasks (the memory model's bytes without
the arrival order, where the reports have it).
"""
import json
import os
import statistics
import sys


def device_of(report):
    """The device's model from the profile the report used, else the device kind."""
    path = report.get("profile", "")
    if path and os.path.exists(path):
        with open(path) as f:
            return json.load(f)["device"]["name"] or report["device"]
    return report["device"]


def mib(b):
    return f"{b / 2**20:.1f} MiB"


def pct(x):
    return f"{x * 100:+.1f} %"


def main(paths):
    rows, time_raw, time_cal, memory = [], [], [], []
    above = covered = devices = 0  # measured peaks above their prediction; of them, within the worst order
    interval = []  # per plan, the device furthest outside [predicted, worst order]
    own_order = []  # per device, the memory model at its traced step's task times against that step
    for path in paths:
        with open(path) as f:
            r = json.load(f)
        calibrated = r["calibration"] != "none"
        for p in r["plans"]:
            u, c = p["uncalibrated"], p["calibrated"]
            worst = max(range(len(c["memory_error"])), key=lambda d: abs(c["memory_error"][d]))
            time_raw.append(abs(u["time_error"]))
            if calibrated:
                time_cal.append(abs(c["time_error"]))
            memory.append(abs(c["memory_error"][worst]))
            if "worst_order_peak_bytes" in c:
                outside = [0.0]
                for d, measured in enumerate(c["measured_peak_bytes"]):
                    low, high = c["predicted_peak_bytes"][d], c["worst_order_peak_bytes"][d]
                    outside.append((low - measured) / measured if measured < low else
                                   (measured - high) / measured if measured > high else 0.0)
                interval.append(max(abs(x) for x in outside))
            for predicted, measured in zip(p.get("measured_order_peak_bytes", []),
                                           p.get("traced_step_peak_bytes", [])):
                if measured > 0:
                    own_order.append(abs(predicted / measured - 1))
            for d, measured in enumerate(c["measured_peak_bytes"]):
                devices += 1
                if measured > 1.005 * c["predicted_peak_bytes"][d]:
                    above += 1
                    covered += "worst_order_peak_bytes" in c and measured <= 1.005 * c["worst_order_peak_bytes"][d]
            rows.append("| {} | {} | {} | {} | {:.2f} | {} | {:.2f} ± {:.2f} | {} | {} | {} | {} | {} |".format(
                device_of(r), r["model"], r["batch_size"], p["plan"], u["predicted_ms"],
                f"{c['predicted_ms']:.2f}" if calibrated else "-", p["measured_median_ms"], p["measured_spread_ms"],
                pct(u["time_error"]), pct(c["time_error"]) if calibrated else "-",
                mib(c["predicted_peak_bytes"][worst]), mib(c["measured_peak_bytes"][worst]),
                pct(c["memory_error"][worst])))
    print("| device | model | batch | plan | predicted ms | calibrated ms | measured ms | error | error calibrated | "
          "peak predicted | peak measured | memory error |")
    print("|---|---|---|---|---|---|---|---|---|---|---|---|")
    print("\n".join(rows))
    print()

    def summary(name, values):
        if not values:
            return
        within5 = sum(v <= 0.05 for v in values)
        within10 = sum(v <= 0.10 for v in values)
        print(f"- {name}: median |error| {statistics.median(values) * 100:.1f} %, worst {max(values) * 100:.1f} %, "
              f"{within5}/{len(values)} within 5 %, {within10}/{len(values)} within 10 %")

    summary("iteration time, uncalibrated", time_raw)
    summary("iteration time, calibrated", time_cal)
    summary("peak memory (worst device of each plan)", memory)
    summary("peak memory outside [predicted, worst arrival order] (worst device of each plan)", interval)
    summary("peak memory in each traced step's own order of tasks (every device)", own_order)
    print(f"- device peaks measured more than 0.5 % above their prediction: {above} of {devices}, "
          f"{covered} of them within 0.5 % of the worst arrival order's peak or under it")


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit(__doc__)
    main(sys.argv[1:])
