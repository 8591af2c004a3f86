"""scripts/eager_profile.py: a model whose children sleep known times (the truth the retimed
profile must hold), saved bytes counted by hand, a real profile of an exported MLP that pipetune loads again after retiming,
the tied MLP in torch's V predicted against torch's own run, and one line, exit status 2, nothing written, for input that does not fit."""
import json
import os
import subprocess
import sys
import tempfile
import unittest

HERE = os.path.dirname(os.path.abspath(__file__))
SCRIPTS = os.path.join(HERE, "..", "..", "scripts")
RETIMER = os.path.join(SCRIPTS, "eager_profile.py")
CASES = os.path.join(HERE, "torch_pipeline_cases.py")
sys.dont_write_bytecode = True
sys.path.insert(0, HERE)
import torch_pipeline_cases  # noqa: E402

FORWARD_MS = torch_pipeline_cases.Sleepy.FORWARD_S * 1e3
BACKWARD_MS = torch_pipeline_cases.Sleepy.BACKWARD_S * 1e3
# time.sleep oversleeps by the scheduler's slack and the child's linear layer adds its own
# microseconds; a 2-core machine busy with other tests can add a few milliseconds more.
SLACK_MS = 8.0
SIZES = [1, 2, 4]


def fabricated_profile(layers=4):
    """A CPU profile of `layers` children at SIZES, every time field present and wrong (99 ms),
    every memory field a marker the retimed profile must keep."""
    def per_size(value):
        return [value] * len(SIZES)

    return {
        "format": "pipetune.profile/1", "model": "sleepy", "device": "cpu", "dtype": "float32", "timer": "clock",
        "batch_size": 4, "micro_batch_sizes": SIZES, "input_bytes": per_size(128), "co_runners": 1,
        "layers": [{
            "name": str(i), "param_bytes": 288, "output_bytes": per_size(1000 + i), "saved_bytes": per_size(77),
            "forward_ms": per_size(99.0), "backward_ms": per_size(99.0), "forward_nograd_ms": per_size(99.0),
            "backward_input_ms": per_size(99.0), "backward_weight_ms": per_size(99.0),
            "forward_cold_ms": per_size(101.0), "backward_cold_ms": per_size(99.0),
            "forward_step_start_ms": per_size(104.0),
            "forward_corun_ms": per_size(150.0), "backward_corun_ms": per_size(150.0),
        } for i in range(layers)],
        "meta": {"threads": 1, "warmup": 1, "repeats": 3, "kept": "verbatim"},
    }


class EagerProfileTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.addCleanup(self.folder.cleanup)

    def path(self, name):
        return os.path.join(self.folder.name, name)

    def retime(self, builder, profile, *extra):
        with open(self.path("profile.json"), "w") as f:
            json.dump(profile, f)
        environment = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run([sys.executable, RETIMER, builder, "--profile", self.path("profile.json"),
                               "-o", self.path("eager.json"), "--quiet", *extra],
                              cwd=self.folder.name, env=environment, capture_output=True, text=True, timeout=240)

    def assertNear(self, got, expected, what):
        self.assertGreaterEqual(got, expected - 0.5, what)
        self.assertLess(got, expected + SLACK_MS, what)

    def test_times_are_the_sleeps_and_memory_stays(self):
        done = self.retime(f"{CASES}:build_sleepy", fabricated_profile())
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.path("eager.json")) as f:
            out = json.load(f)
        before = fabricated_profile()
        for i, layer in enumerate(out["layers"]):
            for s in range(len(SIZES)):
                where = f"layer {i} size {SIZES[s]}"
                self.assertNear(layer["forward_ms"][s], FORWARD_MS, f"forward, {where}")
                self.assertNear(layer["forward_nograd_ms"][s], FORWARD_MS, f"nograd forward, {where}")
                self.assertNear(layer["backward_ms"][s], BACKWARD_MS, f"backward, {where}")
                # The first child's input needs no gradient: no I, its whole backward is W (as
                # torch runs a first stage). The others' I and W each run the sleeping backward.
                if i == 0:
                    self.assertEqual(layer["backward_input_ms"][s], 0.0, where)
                else:
                    self.assertNear(layer["backward_input_ms"][s], BACKWARD_MS, f"I, {where}")
                self.assertNear(layer["backward_weight_ms"][s], BACKWARD_MS, f"W, {where}")
                # A sleep is not slowed by a co-runner: the co-run times are the solo ones, to
                # the sleeps' own jitter.
                self.assertNear(layer["forward_corun_ms"][s], layer["forward_ms"][s], f"co-run, {where}")
                # The cache's extra time over the hot time is kept (101 - 99 ms).
                self.assertAlmostEqual(layer["forward_cold_ms"][s], layer["forward_ms"][s] + 2.0, 9)
                self.assertEqual(layer["backward_cold_ms"][s], layer["backward_ms"][s])
                # And the step start's (104 - 99 ms).
                self.assertAlmostEqual(layer["forward_step_start_ms"][s], layer["forward_ms"][s] + 5.0, 9)
                self.assertGreaterEqual(layer["forward_ms_spread"][s], 0.0)
            for field in ("name", "param_bytes", "output_bytes"):
                self.assertEqual(layer[field], before["layers"][i][field], field)
            # A linear layer saves its input and its weight, neither counted; the loss saves its
            # log-probabilities (8 classes of float32 a sample) and a float32 weight total.
            expected = [32 * size + 4 for size in SIZES] if i == 3 else [0] * len(SIZES)
            self.assertEqual(layer["saved_bytes"], expected, f"saved bytes, layer {i}")
        self.assertEqual(out["co_runners"], 1)
        self.assertEqual(out["meta"]["kept"], "verbatim")
        self.assertEqual(out["meta"]["eager"]["repeats"], 3)

    def test_saved_bytes_count_eager_dropouts_float32_mask(self):
        done = self.retime(f"{CASES}:build_dropout", fabricated_profile(layers=3), "--co-runners", "0",
                           "--repeats", "1", "--warmup", "0")
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.path("eager.json")) as f:
            out = json.load(f)
        # Linear: its input and weight (neither counted); dropout: a float32 mask the size of its
        # input (8 features a sample); the head's loss: log-probabilities of 4 classes and a
        # float32 weight total.
        self.assertEqual([layer["saved_bytes"] for layer in out["layers"]],
                         [[0] * len(SIZES), [32 * s for s in SIZES], [16 * s + 4 for s in SIZES]])

    def test_what_torchs_zero_bubble_input_keeps_and_frees_is_counted_by_hand(self):
        profile = fabricated_profile(layers=4)
        profile["dtype"] = "float64"
        done = self.retime(f"{CASES}:build_zero_bubble", profile, "--co-runners", "0", "--repeats", "1",
                           "--warmup", "0")
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.path("eager.json")) as f:
            layers = json.load(f)["layers"]
        # The first child's input needs no gradient: no I. The middle child keeps the gradient of
        # its first linear layer's output (16 float64 a sample) and, its last operation having
        # weights, the gradient of its own output; nothing it saved dies. The layer norm without
        # weights has no I, and its mean and reciprocal deviation (8 bytes each a sample) die
        # with the graph. The head keeps the loss's gradient of the logits (4 float64 a sample);
        # the loss's graph dies with its float64 weight total and its log-probabilities (4 float64
        # a sample; a node saving its own output, which the counting must not keep alive).
        self.assertEqual([layer["torch_weight_gradient_bytes"] for layer in layers],
                         [[0] * 3, [128 * s for s in SIZES], [0] * 3, [32 * s for s in SIZES]])
        self.assertEqual([layer.get("torch_keeps_output_gradient", False) for layer in layers],
                         [False, True, False, False])
        self.assertEqual([layer["torch_freed_by_input_bytes"] for layer in layers],
                         [[0] * 3, [0] * 3, [16 * s for s in SIZES], [8 + 32 * s for s in SIZES]])
        # torch's W of the head alone: its weights' gradients (36 float64) while the sum torch
        # takes of the gradient I kept for it (a copy of the logits' gradient) is alive; the
        # same the first time and later. Without I (the first child, the layer norm): none.
        for field in ("torch_weight_peak_bytes", "torch_weight_accumulate_peak_bytes"):
            self.assertEqual(layers[3][field], [288 + 32 * s for s in SIZES], field)
            self.assertEqual(layers[0][field], [0] * 3, field)
            self.assertEqual(layers[2][field], [0] * 3, field)
        # What W frees as it goes: of the middle child, the GELU's output (16 float64 a sample),
        # which only the second linear layer saved (the GELU saved its input, the first linear
        # layer's output, which stays to W's end), and its input, which only the first linear
        # layer saved; of the head, its input. Without I or weights: nothing.
        self.assertEqual([layer["torch_weight_freed_bytes"] for layer in layers],
                         [[0] * 3, [128 * s for s in SIZES], [0] * 3, [0] * 3])
        self.assertEqual([layer.get("torch_weight_frees_input", False) for layer in layers],
                         [False, True, False, True])

    def test_a_frozen_stem_has_no_backward_and_the_first_that_trains_no_input_gradient(self):
        done = self.retime(f"{CASES}:build_sleepy_frozen_stem", fabricated_profile(), "--co-runners", "0",
                           "--repeats", "1", "--warmup", "0")
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.path("eager.json")) as f:
            layers = json.load(f)["layers"]
        for s in range(len(SIZES)):
            for i in (0, 1):  # on data, frozen: autograd records nothing, as one device's
                self.assertEqual(layers[i]["backward_ms"][s], 0.0, f"layer {i}")
                self.assertNear(layers[i]["forward_ms"][s], FORWARD_MS, f"forward, layer {i}")
            # The first that trains: its input needs no gradient, so no I; W is its backward.
            self.assertEqual(layers[2]["backward_input_ms"][s], 0.0)
            self.assertNear(layers[2]["backward_weight_ms"][s], BACKWARD_MS, "W, layer 2")
            self.assertNear(layers[3]["backward_input_ms"][s], BACKWARD_MS, "I, layer 3")

    def test_no_co_runners_drops_the_co_run_times(self):
        done = self.retime(f"{CASES}:build_sleepy", fabricated_profile(), "--co-runners", "0", "--repeats", "1")
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.path("eager.json")) as f:
            out = json.load(f)
        self.assertNotIn("co_runners", out)
        self.assertNotIn("forward_corun_ms", out["layers"][0])

    def test_bad_input_is_one_line_and_nothing_written(self):
        gpu = fabricated_profile()
        gpu["timer"] = "cupti"
        cases = [
            (fabricated_profile(layers=3), "the profile has 3 layers, the model has 4 children"),
            (gpu, "retime CPU profiles only"),
            ({"layers": [], "micro_batch_sizes": [0]}, "micro_batch_sizes: expected positive integers"),
        ]
        for profile, message in cases:
            done = self.retime(f"{CASES}:build_sleepy", profile)
            self.assertEqual(done.returncode, 2, done.stderr)
            self.assertIn(message, done.stderr)
            self.assertEqual(len(done.stderr.strip().splitlines()), 1, done.stderr)
            self.assertFalse(os.path.exists(self.path("eager.json")))
        double = fabricated_profile()
        double["dtype"] = "float64"
        done = self.retime(f"{CASES}:build_sleepy", double)
        self.assertEqual(done.returncode, 2)
        self.assertIn("the profile is of float64, the model's parameters are float32", done.stderr)
        done = self.retime(f"{CASES}:no_such_builder", fabricated_profile())
        self.assertEqual(done.returncode, 2)
        self.assertIn("no function no_such_builder", done.stderr)
        self.assertEqual(os.listdir(self.folder.name), ["profile.json"])  # no temporary left

    def export_profile_and_retime(self, builder):
        """`builder` of the cases exported, profiled by the CLI (float64, one thread) into
        real.json and retimed into eager.json; both profiles, loaded."""
        cli = os.environ["PIPETUNE"]
        prefix = self.path(builder)
        export = subprocess.run([sys.executable, os.path.join(SCRIPTS, "export_model.py"), f"{CASES}:{builder}",
                                 "--out", prefix], capture_output=True, text=True, timeout=240)
        self.assertEqual(export.returncode, 0, export.stderr)
        profiled = subprocess.run([cli, "profile", "--model", f"torchscript:path={prefix}.pt,batch={prefix}.batch.pt",
                                   "--batch", "8", "--dtype", "float64", "--threads", "1", "--repeats", "3",
                                   "--progress", "none", "-o", self.path("real.json")], capture_output=True, text=True, timeout=240)
        self.assertEqual(profiled.returncode, 0, profiled.stderr)
        with open(self.path("real.json")) as f:
            real = json.load(f)
        done = self.retime(f"{CASES}:{builder}", real, "--co-runners", "0")
        self.assertEqual(done.returncode, 0, done.stderr)
        with open(self.path("eager.json")) as f:
            return real, json.load(f)

    @unittest.skipUnless(os.environ.get("PIPETUNE"), "PIPETUNE (the CLI) not given")
    def test_pipetune_profiles_the_export_and_loads_the_retimed_profile(self):
        cli = os.environ["PIPETUNE"]
        real, eager = self.export_profile_and_retime("build")
        # Two counts of one thing: the profiler's allocator and the saved-tensor hooks agree on
        # a model without dropout.
        self.assertEqual([layer["saved_bytes"] for layer in eager["layers"]],
                         [layer["saved_bytes"] for layer in real["layers"]])
        simulated = subprocess.run([cli, "simulate", "--profile", self.path("eager.json"), "--balance", "4,3",
                                    "--chunks", "2", "--json"], capture_output=True, text=True, timeout=120)
        self.assertEqual(simulated.returncode, 0, simulated.stderr)
        self.assertGreater(json.loads(simulated.stdout)["iteration_ms"], 0.0)

    @unittest.skipUnless(os.environ.get("PIPETUNE"), "PIPETUNE (the CLI) not given")
    def test_torchs_v_is_predicted_with_its_tie_once_and_its_hand_overs_kept(self):
        # The tied MLP in a V: stages 0 and 3 (the two holders of the tie) on rank 0, stages 1 and
        # 2 on rank 1, which hands its tensors between them without a message. Predicted for
        # torch's runtime against torch's own run, every rank's peak counted by its profiler:
        # within 3 % (torch's memory target), where counting the tie twice and dropping the
        # hand-over buffers was 26 % over on rank 0 and 5 % short on rank 1. Not 1 %: with the
        # order the ranks' messages arrive in, rank 0's measured peak under dualpipev moved by
        # 1.2 % between runs (23,383 bytes against 23,104 predicted).
        cli = os.environ["PIPETUNE"]
        self.export_profile_and_retime("build_tied")
        with open(self.path("hardware.json"), "w") as f:
            json.dump({"format": "pipetune.hardware/1", "runtime": "torch.distributed.pipelining",
                       "devices": [{"name": "cpu:0", "memory_bytes": 0}, {"name": "cpu:1", "memory_bytes": 0}],
                       "link": {"bandwidth_bytes_per_s": 1e9, "latency_ms": 0.1}}, f)
        for schedule, chunks in (("zbv", 2), ("dualpipev", 4)):
            with self.subTest(schedule=schedule):
                with open(self.path("plan.json"), "w") as f:
                    json.dump({"format": "pipetune.plan/1", "balance": [1, 2, 1, 3], "chunks": chunks,
                               "checkpoint": "never", "schedule": schedule, "stages_per_device": 2}, f)
                simulated = subprocess.run([cli, "simulate", "--profile", self.path("eager.json"), "--hardware",
                                            self.path("hardware.json"), "--plan", self.path("plan.json"), "--json"],
                                           capture_output=True, text=True, timeout=120)
                self.assertEqual(simulated.returncode, 0, simulated.stderr)
                predicted = [d["peak_memory_bytes"] for d in json.loads(simulated.stdout)["devices"]]
                ran = subprocess.run([sys.executable, os.path.join(SCRIPTS, "torch_pipeline.py"), f"{CASES}:build_tied",
                                      "--plan", self.path("plan.json"), "--steps", "2", "--trace", self.path("t.json")],
                                     cwd=self.folder.name, capture_output=True, text=True, timeout=240)
                self.assertEqual(ran.returncode, 0, ran.stderr)
                with open(self.path("t.json")) as f:
                    measured = [d["peak_memory_bytes"] for d in json.load(f)["pipetune"]["summary"]["devices"]]
                self.assertEqual(len(predicted), 2)
                for rank, (p, m) in enumerate(zip(predicted, measured)):
                    self.assertLess(abs(p / m - 1), 0.03, f"rank {rank}: predicted {predicted}, measured {measured}")


if __name__ == "__main__":
    unittest.main()
