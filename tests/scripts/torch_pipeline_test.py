"""scripts/torch_pipeline.py against one device: the same losses step after step for every
schedule torch runs on CPU (the training loop below is the independent truth), a measured trace
with every action of the median step, and one line, exit status 2, for what torch cannot run."""
import copy
import json
import os
import statistics
import subprocess
import sys
import tempfile
import unittest

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
RUNNER = os.path.join(HERE, "..", "..", "scripts", "torch_pipeline.py")
CASES = os.path.join(HERE, "torch_pipeline_cases.py")
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
sys.path.insert(0, os.path.join(HERE, "..", "..", "scripts"))
import torch_pipeline  # noqa: E402
import torch_pipeline_cases  # noqa: E402

STEPS, WARMUP, LR = 3, 1, 0.05


def one_device_losses(builder=torch_pipeline_cases.build):
    """The losses of steps WARMUP + 1 .. WARMUP + STEPS of plain SGD on the whole batch."""
    torch.manual_seed(0)
    layers, (x, y) = builder()
    model = torch.nn.Sequential(*layers)
    optimizer = torch.optim.SGD(model.parameters(), lr=LR)
    losses = []
    for _ in range(WARMUP + STEPS):
        optimizer.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return losses[WARMUP:]


class TorchPipelineTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.addCleanup(self.folder.cleanup)

    def run_plan(self, plan, *extra, builder="build", env=None):
        path = os.path.join(self.folder.name, "plan.json")
        with open(path, "w") as f:
            json.dump({"format": "pipetune.plan/1", **plan}, f)
        environment = dict(env or os.environ, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run([sys.executable, RUNNER, f"{CASES}:{builder}", "--plan", path, "--steps", str(STEPS),
                               "--warmup", str(WARMUP), "--lr", str(LR), *extra],
                              cwd=self.folder.name, env=environment, capture_output=True, text=True, timeout=240)

    def test_same_losses_as_one_device(self):
        expected = one_device_losses()
        plans = [
            {"balance": [4, 3], "chunks": 4, "checkpoint": "never", "schedule": "gpipe"},
            {"balance": [4, 3], "chunks": 2, "checkpoint": "always", "schedule": "1f1b"},
            {"balance": [2, 2, 2, 1], "chunks": 4, "checkpoint": "never", "schedule": "interleaved-1f1b",
             "stages_per_device": 2},
            {"balance": [2, 2, 2, 1], "chunks": 2, "checkpoint": "never", "schedule": "looped-bfs",
             "stages_per_device": 2},
            {"balance": [1, 3, 2, 1], "chunks": 4, "checkpoint": "never", "schedule": "interleaved-zb",
             "stages_per_device": 2},
            # In a V: stages 1 and 2 on rank 1, handed over without a message (Gloo has no link from a
            # rank to itself).
            {"balance": [2, 2, 2, 1], "chunks": 2, "checkpoint": "never", "schedule": "zbv"},
            {"balance": [1, 2, 3, 1], "chunks": 4, "checkpoint": "never", "schedule": "dualpipev"},
        ]
        for plan in plans:
            with self.subTest(plan=plan["schedule"]):
                done = self.run_plan(plan, "--json")
                self.assertEqual(done.returncode, 0, done.stderr)
                losses = json.loads(done.stdout.strip().splitlines()[-1])["losses"]
                # float64 throughout; the micro-batches' losses and gradients add in another order.
                for got, want in zip(losses, expected):
                    self.assertAlmostEqual(got, want, delta=1e-12 * abs(want))
                self.assertEqual(len(losses), STEPS)

    def test_a_checkpointed_stage_counts_each_micro_batch_once_in_batch_norm(self):
        # torch.utils.checkpoint runs the forward again in the backward, which in training mode
        # updated the running statistics twice (num_batches_tracked 2 after one micro-batch).
        torch.manual_seed(0)
        stage = torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.BatchNorm1d(8), torch.nn.Tanh()).double()
        plain = copy.deepcopy(stage)
        checkpointed = torch_pipeline.Checkpointed(stage)
        g = torch.Generator().manual_seed(1)
        for _ in range(2):  # two micro-batches
            x = torch.randn(4, 6, generator=g, dtype=torch.float64)
            checkpointed(x).square().sum().backward()
            plain(x).square().sum().backward()
        for (name, got), want in zip(stage.named_buffers(), plain.buffers()):
            torch.testing.assert_close(got, want, rtol=1e-12, atol=1e-14, msg=name)
        for got, want in zip(stage.parameters(), plain.parameters()):
            torch.testing.assert_close(got.grad, want.grad, rtol=1e-12, atol=1e-14)
        self.assertEqual(int(stage[1].num_batches_tracked), 2)

    def run_order_as_one_device(self, rows):
        """Runs the compute-only order `rows` on the seven-child MLP in four stages, holds its
        losses to one device's, and returns its measured trace."""
        order = os.path.join(self.folder.name, "order.csv")
        with open(order, "w") as f:
            f.write(rows)
        plan = {"balance": [2, 2, 2, 1], "chunks": 2, "checkpoint": "never", "schedule": "1f1b"}
        trace = os.path.join(self.folder.name, "measured.trace.json")
        done = self.run_plan(plan, "--json", "--schedule-csv", order, "--trace", trace)
        self.assertEqual(done.returncode, 0, done.stderr)
        losses = json.loads(done.stdout.strip().splitlines()[-1])["losses"]
        self.assertEqual(len(losses), STEPS)
        for got, want in zip(losses, one_device_losses()):
            self.assertAlmostEqual(got, want, delta=1e-12 * abs(want))
        with open(trace) as f:
            return json.load(f)

    def test_a_custom_order_runs_through_torchs_csv_runtime_and_trains_as_one_device(self):
        # Four stages looped over two ranks, an order no schedule class makes: stage 2 splits its
        # backward in I and W right after its forwards, stage 1 runs both I before either W.
        t = self.run_order_as_one_device("0F0,0F1,2F0,2F1,2I0,2W0,2I1,2W1,0B0,0B1\n"
                                         "1F0,1F1,3F0,3B0,3F1,3B1,1I0,1I1,1W0,1W1\n")
        self.assertEqual([d["stages"] for d in t["pipetune"]["summary"]["devices"]], [[0, 2], [1, 3]])
        kinds = {(e["args"]["stage"], e["cat"]) for e in t["traceEvents"] if e["ph"] == "X"}
        self.assertIn((2, "backward_weight"), kinds)
        self.assertIn((0, "backward"), kinds)

    def test_a_custom_order_with_neighbouring_stages_on_one_rank_trains_as_one_device(self):
        # Stages 1 and 2 on rank 1, as a V places them: the activation and the gradient between
        # them never leave the rank.
        t = self.run_order_as_one_device("0F0,0F1,3F0,3B0,3F1,3B1,0B0,0B1\n"
                                         "1F0,1F1,2F0,2F1,2B0,2B1,1B0,1B1\n")
        self.assertEqual([d["stages"] for d in t["pipetune"]["summary"]["devices"]], [[0, 3], [1, 2]])

    def test_a_custom_order_that_does_not_fit_the_plan_is_one_line(self):
        plan = {"balance": [2, 2, 2, 1], "chunks": 2, "checkpoint": "never", "schedule": "1f1b"}
        cases = [
            ("0F0,0F1,2F0,2F1,2B0,2B1,0B0,0B1\n1F0,1F1,1B0,1B1\n", "stage 3 of the plan's 4 runs in no row"),
            ("0F0,0F1,4F0\n1F0\n", "stage 4, the plan's balance has 4 stages"),
            ("0F0,0F1,2F0,2F1\n1F0,1F1,3F0,2F0\n", "stage 2 is in rows 1 and 2"),
            ("0F0,SEND_F\n", "expected a compute action such as 0F1"),
            ("0F0,0F1,2F0,2F1,2I0,2W0,2I1,2W1,0B0,0B1\n1F0,1F1,3F0,3B0,3F1,3B1,1B0,1B1\n",
             "row 1, cell 5: checkpoint always with a split backward (2I0): torch recomputes"),
        ]
        for text, message in cases:
            with self.subTest(message=message):
                order = os.path.join(self.folder.name, "order.csv")
                with open(order, "w") as f:
                    f.write(text)
                checkpointed = dict(plan, checkpoint="always") if "split backward" in message else plan
                done = self.run_plan(checkpointed, "--json", "--schedule-csv", order)
                self.assertEqual(done.returncode, 2, done.stderr)
                self.assertIn(message, done.stderr)
                self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
        # Micro-batches the plan does not have: found once the builder's batch is known.
        order = os.path.join(self.folder.name, "order.csv")
        with open(order, "w") as f:
            f.write("0F0,0F1,0F2,2F0,2F1,2F2,2B0,2B1,2B2,0B0,0B1,0B2\n1F0,1F1,1F2,3F0,3B0,3F1,3B1,3F2,3B2,1B0,1B1,1B2\n")
        done = self.run_plan(plan, "--json", "--schedule-csv", order)
        self.assertEqual(done.returncode, 2, done.stderr)
        self.assertIn("micro-batches 0 to 2, the plan has 2", done.stderr)

    def test_tied_weights_split_over_ranks_train_as_one_device(self):
        # The first and fifth children hold one weight: on two ranks (gpipe, 1f1b over three,
        # interleaved), and on two stages of one rank (interleaved-zb's stages 0 and 2, the V's
        # first and last).
        expected = one_device_losses(torch_pipeline_cases.build_tied)
        plans = [
            {"balance": [4, 3], "chunks": 4, "checkpoint": "never", "schedule": "gpipe"},
            {"balance": [2, 3, 2], "chunks": 4, "checkpoint": "never", "schedule": "1f1b"},
            {"balance": [2, 3, 1, 1], "chunks": 2, "checkpoint": "never", "schedule": "interleaved-1f1b",
             "stages_per_device": 2},
            {"balance": [1, 3, 2, 1], "chunks": 4, "checkpoint": "never", "schedule": "interleaved-zb",
             "stages_per_device": 2},
            {"balance": [1, 2, 1, 3], "chunks": 2, "checkpoint": "never", "schedule": "zbv"},
            {"balance": [1, 2, 1, 3], "chunks": 4, "checkpoint": "never", "schedule": "dualpipev"},
        ]
        for plan in plans:
            with self.subTest(plan=plan["schedule"]):
                done = self.run_plan(plan, "--json", builder="build_tied")
                self.assertEqual(done.returncode, 0, done.stderr)
                losses = json.loads(done.stdout.strip().splitlines()[-1])["losses"]
                self.assertEqual(len(losses), STEPS)
                for got, want in zip(losses, expected):
                    self.assertAlmostEqual(got, want, delta=1e-12 * abs(want))

    def test_a_rank_holding_none_of_a_tie_keeps_none_of_it(self):
        import gc
        import weakref
        layers, _ = torch_pipeline_cases.build_tied()
        model = torch.nn.Sequential(*layers)
        ties = torch_pipeline.tied_across_stages(model, [2, 3, 2])
        self.assertEqual([stages for _, stages in ties], [[0, 1]])
        parameter = weakref.ref(ties[0][0])
        stand_ins = [torch_pipeline.stand_in(tensor) for tensor, _ in ties]
        del layers, model, ties
        gc.collect()
        self.assertIsNone(parameter())  # a rank of stage 2 lets the tied weight go
        self.assertEqual((stand_ins[0].shape, stand_ins[0].device.type), (torch.Size([32, 16]), "meta"))

    def test_trace_holds_every_action_of_the_median_step(self):
        trace = os.path.join(self.folder.name, "measured.trace.json")
        plan = {"balance": [2, 2, 2, 1], "chunks": 2, "checkpoint": "never", "schedule": "interleaved-zb",
                "stages_per_device": 2}
        done = self.run_plan(plan, "--json", "--trace", trace)
        self.assertEqual(done.returncode, 0, done.stderr)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        with open(trace) as f:
            t = json.load(f)
        meta = t["pipetune"]
        self.assertEqual((meta["format"], meta["kind"]), ("pipetune.trace/1", "measured"))
        self.assertEqual(meta["micro_batch_sizes"], [4, 4])
        self.assertIn(meta["summary"]["iteration_ms"], report["pipeline_ms"])
        self.assertEqual([d["stages"] for d in meta["summary"]["devices"]], [[0, 2], [1, 3]])
        tasks = {(e["args"]["stage"], e["args"]["micro_batch"], e["cat"]) for e in t["traceEvents"] if e["ph"] == "X"}
        for stage in range(4):
            for micro_batch in range(2):
                self.assertIn((stage, micro_batch, "forward"), tasks)
                # Zero bubble splits the backward: I then W (the first stage has no input gradient).
                self.assertIn((stage, micro_batch, "backward_weight"), tasks)
        for e in t["traceEvents"]:
            if e["ph"] == "X":
                self.assertEqual(e["pid"], [0, 1, 0, 1][e["args"]["stage"]])
                self.assertGreaterEqual(e["ts"], 0)
        # Every boundary crosses the ranks: each activation and each gradient once, 4 samples of
        # float64 by the boundary's width (32 after the first two children, then 32, then 32).
        copies = sorted((e["args"]["stage"], e["args"]["micro_batch"], e["args"]["direction"], e["args"]["to"],
                         e["args"]["bytes"]) for e in t["traceEvents"] if e["ph"] == "X" and e["cat"] == "copy")
        expected = sorted([(s, i, "activation", [1, 0, 1][s], 4 * 32 * 8) for s in range(3) for i in range(2)]
                          + [(s, i, "gradient", [0, 1, 0][s - 1], 4 * 32 * 8) for s in range(1, 4) for i in range(2)])
        self.assertEqual(copies, expected)

    def test_spans_are_the_actions_known_sleeps(self):
        # Two children a stage, each sleeping 20 ms forward and 40 ms backward: a forward span
        # of at least 40 ms, a backward of at least 80, and not much more (Python and a tiny
        # linear layer on top; the tolerance absorbs a busy 2-core machine).
        trace = os.path.join(self.folder.name, "sleepy.trace.json")
        plan = {"balance": [2, 2], "chunks": 2, "checkpoint": "never", "schedule": "1f1b"}
        done = self.run_plan(plan, "--json", "--trace", trace, builder="build_sleepy")
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(trace) as f:
            events = [e for e in json.load(f)["traceEvents"] if e["ph"] == "X"]
        spans = [e for e in events if e["cat"] != "copy"]
        self.assertEqual(sorted((e["args"]["stage"], e["args"]["micro_batch"], e["cat"]) for e in spans),
                         sorted((s, i, k) for s in range(2) for i in range(2) for k in ("forward", "backward")))
        for e in spans:
            sleep_ms = 2 * (20 if e["cat"] == "forward" else 40)
            self.assertGreaterEqual(e["dur"] / 1e3, sleep_ms, e)
            self.assertLess(e["dur"] / 1e3, sleep_ms + 25, e)
        self.assert_copies_between_their_tasks(events, slack_ms=0.0)
        # The ranks' time in waits for messages, from the clock-cycle table of 1F1B with stages
        # of 40 ms forward and 80 ms backward: rank 1 waits for stage 0's first forward (40 ms);
        # rank 0, its two forwards done at 80, waits for stage 1's first forward and backward to
        # end at 160 (80 ms), then, its first backward done at 240, for stage 1's second forward
        # and backward to end at 280 (40 ms). 160 ms, and a little Python. Every step waits at
        # least that; the median step no more than 30 ms over it (one step of a loaded 2-core
        # machine's, its peer's sleeps each late, once waited 190.9 ms).
        blocked = json.loads(done.stdout.strip().splitlines()[-1])["blocked_ms"]
        self.assertEqual(len(blocked), STEPS)
        for ms in blocked:
            self.assertGreater(ms, 160 - 5)
        self.assertLess(statistics.median(blocked), 160 + 30, blocked)

    def test_copies_across_machines_keep_their_order_on_rank_0s_clock(self):
        # As if the ranks were on two machines: each measures its clock's offset to rank 0's.
        # Half the shortest round trip bounds the error; a loaded 2-core machine's is under 5 ms.
        trace = os.path.join(self.folder.name, "sleepy.trace.json")
        plan = {"balance": [2, 2], "chunks": 2, "checkpoint": "never", "schedule": "1f1b"}
        environment = dict(os.environ, PIPETUNE_CLOCK_EXCHANGE="1")
        done = self.run_plan(plan, "--json", "--trace", trace, builder="build_sleepy", env=environment)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(trace) as f:
            self.assert_copies_between_their_tasks([e for e in json.load(f)["traceEvents"] if e["ph"] == "X"],
                                                   slack_ms=5.0)

    def assert_copies_between_their_tasks(self, events, slack_ms):
        """One copy per message of a two-stage 1F1B step of two micro-batches of 2 samples by 8
        float32 features, each after the task making its tensor ended and before the task using
        it started (the receiver's wait for it returns before that task is timed)."""
        span = {(e["args"]["stage"], e["args"]["micro_batch"], e["cat"]): (e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3)
                for e in events if e["cat"] != "copy"}
        copies = [e for e in events if e["cat"] == "copy"]
        self.assertEqual(sorted((e["args"]["stage"], e["args"]["micro_batch"], e["args"]["direction"], e["pid"],
                                 e["tid"], e["args"]["to"], e["args"]["bytes"], e["name"]) for e in copies),
                         sorted([(0, i, "activation", 0, 2, 1, 64, f"0>1 act {i}") for i in range(2)]
                                + [(1, i, "gradient", 1, 1, 0, 64, f"1>0 grad {i}") for i in range(2)]))
        for e in copies:
            i = e["args"]["micro_batch"]
            made, used = ((0, i, "forward"), (1, i, "forward")) if e["args"]["direction"] == "activation" \
                else ((1, i, "backward"), (0, i, "backward"))
            start, end = e["ts"] / 1e3, (e["ts"] + e["dur"]) / 1e3
            self.assertGreaterEqual(start, span[made][1] - slack_ms, e)
            self.assertLessEqual(end, span[used][0] + slack_ms, e)

    def test_cpu_peak_is_the_highest_running_total_inside_the_window(self):
        # Exact bytes. Inside the window a 1 MiB block made before it is freed, a 4 MiB one made
        # and freed, a 2 MiB one made and kept: the running total goes -1, +3, -1, +1 MiB from
        # the window's start, so the peak is 3 MiB over it and the window ends 1 MiB over it.
        peak = torch_pipeline.CpuPeak()
        before = torch.empty(1 << 18)  # counted: made while recording
        peak.open_window()
        start = peak.total
        del before
        block = torch.empty(1 << 20)
        del block
        kept = torch.empty(1 << 19)
        self.assertEqual(peak.close_window() - start, 3 << 20)
        self.assertEqual(peak.total - start, 1 << 20)
        del kept

    def test_the_link_fit_is_the_line_through_exact_points(self):
        sizes = torch_pipeline.PROBE_SIZES
        latency, bandwidth = torch_pipeline.one_way_fit(sizes, [0.25 + b / 2e9 * 1e3 for b in sizes])
        self.assertAlmostEqual(latency, 0.25, places=9)
        self.assertAlmostEqual(bandwidth / 2e9, 1.0, places=9)

    def test_probe_writes_a_hardware_file_for_torchs_runtime(self):
        out = os.path.join(self.folder.name, "torch.hardware.json")
        environment = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        done = subprocess.run([sys.executable, RUNNER, "--probe", out, "--probe-steps", "3", "--json"],
                              cwd=self.folder.name, env=environment, capture_output=True, text=True, timeout=240)
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(out) as f:
            hardware = json.load(f)
        self.assertEqual(hardware["format"], "pipetune.hardware/1")
        self.assertEqual(hardware["runtime"], "torch.distributed.pipelining")
        self.assertEqual([d["name"] for d in hardware["devices"]], ["cpu:0", "cpu:1"])
        self.assertGreater(hardware["launch_overhead_ms"], 0)
        self.assertGreater(hardware["link"]["bandwidth_bytes_per_s"], 0)
        self.assertGreaterEqual(hardware["link"]["latency_ms"], 0)
        report = json.loads(done.stdout.strip().splitlines()[-1])
        self.assertEqual(len(report["per_action_by_rank_ms"]), 2)

    def test_probe_refuses_bad_input_in_one_line(self):
        one_device = os.path.join(self.folder.name, "one.json")
        with open(one_device, "w") as f:
            json.dump({"format": "pipetune.hardware/1", "devices": [{"name": "cpu:0", "memory_bytes": 0}]}, f)
        cases = {
            "missing base": (["--hardware", os.path.join(self.folder.name, "none.json")], "No such file"),
            "one device": (["--hardware", one_device], "expected at least 2"),
            "a model too": ([f"{CASES}:build"], "takes no MODULE:FUNCTION"),
        }
        for name, (extra, words) in cases.items():
            with self.subTest(case=name):
                out = os.path.join(self.folder.name, "probe.json")
                done = subprocess.run([sys.executable, RUNNER, "--probe", out, *extra], cwd=self.folder.name,
                                      capture_output=True, text=True, timeout=120)
                self.assert_one_line(done, words)
                self.assertFalse(os.path.exists(out))

    def test_what_torch_cannot_run_is_one_line(self):
        refusals = {
            "except_last": ({"balance": [4, 3], "chunks": 2, "checkpoint": "except_last", "schedule": "1f1b"},
                            "checkpoint except_last"),
            "uneven micro-batches": ({"balance": [4, 3], "chunks": 3, "checkpoint": "never", "schedule": "gpipe"},
                                     "micro-batches of [3, 3, 2]"),
            "balance": ({"balance": [4, 4], "chunks": 2, "checkpoint": "never", "schedule": "gpipe"},
                        "holds 8 layers, the model has 7"),
            # torch.utils.checkpoint would recompute the stage at I and for each of W's groups.
            "checkpointed split backward": ({"balance": [2, 2, 2, 1], "chunks": 2, "checkpoint": "always",
                                             "schedule": "zbv"},
                                            "checkpoint always under zbv: torch recomputes a checkpointed stage at "
                                            "its I and again for each of its W's parameter groups"),
        }
        for name, (plan, words) in refusals.items():
            with self.subTest(case=name):
                self.assert_one_line(self.run_plan(plan), words)
        # What torch itself refuses while it runs: its own error, with its cause, in one line (torch
        # logs the whole schedule first unless told not to).
        with self.subTest(case="in-place first child"):
            plan = {"balance": [1, 2], "chunks": 2, "checkpoint": "never", "schedule": "gpipe"}
            self.assert_one_line(self.run_plan(plan, builder="build_inplace"),
                                 "failed to run forward: a leaf Variable that requires grad is being used in an "
                                 "in-place operation. The stage's first child works in place on its input")
        # Under torchrun, a world that is not the plan's devices: refused before any rank waits.
        with self.subTest(case="world size"):
            plan = {"balance": [4, 3], "chunks": 2, "checkpoint": "never", "schedule": "gpipe"}
            os.environ.update(RANK="0", WORLD_SIZE="3", MASTER_ADDR="127.0.0.1", MASTER_PORT="1")
            try:
                done = self.run_plan(plan)
            finally:
                for name in ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
                    del os.environ[name]
            self.assert_one_line(done, "the plan runs on 2 devices, torchrun started 3 ranks")

    def assert_one_line(self, done, words):
        self.assertEqual(done.returncode, 2, done.stderr)
        lines = done.stderr.strip().splitlines()
        self.assertEqual(len(lines), 1, done.stderr)
        self.assertIn(words, lines[0])

if __name__ == "__main__":
    unittest.main()
