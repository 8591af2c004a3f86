"""scripts/export_model.py on models that reproduce, with torch alone, what real libraries'
modules do (export_cases.py): a child that does not script is traced, and the trace is saved
only where it matches Python at every micro-batch size; every bad input is one line on stderr,
exit status 2, and nothing written. Each case runs the exporter as a user does, in a process
of its own."""
import importlib.util
import os
import subprocess
import sys
import tempfile
import unittest
import warnings

import torch

HERE = os.path.dirname(os.path.abspath(__file__))
EXPORTER = os.path.join(HERE, "..", "..", "scripts", "export_model.py")
CASES = os.path.join(HERE, "export_cases.py")
sys.dont_write_bytecode = True  # no __pycache__ in the source tree


def load_cases():
    spec = importlib.util.spec_from_file_location("export_cases", CASES)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


class ExportModelTest(unittest.TestCase):
    def setUp(self):
        self.folder = tempfile.TemporaryDirectory()
        self.addCleanup(self.folder.cleanup)
        self.prefix = os.path.join(self.folder.name, "model")

    def export(self, case):
        environment = dict(os.environ, PYTHONDONTWRITEBYTECODE="1")
        return subprocess.run([sys.executable, EXPORTER, f"{CASES}:{case}", "--out", self.prefix],
                              cwd=self.folder.name, env=environment, capture_output=True, text=True, timeout=120)

    def refused(self, case):
        """The exporter's one-line error for a case it must refuse, having written nothing."""
        r = self.export(case)
        self.assertEqual(r.returncode, 2, r.stdout + r.stderr)
        self.assertEqual(r.stderr.count("\n"), 1, r.stderr)
        self.assertTrue(r.stderr.startswith("export_model: error: "), r.stderr)
        self.assertEqual(os.listdir(self.folder.name), [])
        return r.stderr

    def test_child_that_does_not_script_is_traced_and_reproduces_python(self):
        r = self.export("traced")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "scripted: '0' (Linear), '2' (Linear)")
        self.assertTrue(lines[1].startswith("traced: '1' (KeywordOnly); "), lines[1])
        self.assertIn("micro-batches of 1 to 5 samples", lines[1])
        self.assertEqual(lines[-1], f"torchscript:path={self.prefix}.pt,batch={self.prefix}.batch.pt")

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's, from torch 2.10 on
            saved = torch.jit.load(self.prefix + ".pt")
        model, (inputs, _) = load_cases().traced()
        model = torch.nn.Sequential(*model)  # parameters drawn from the same seed as the exporter's
        for size in (1, 3):
            # In training mode, as exported: the same seed draws the same dropout masks.
            torch.manual_seed(size)
            expected = model(inputs[:size])
            torch.manual_seed(size)
            got = saved(inputs[:size])
            torch.testing.assert_close(got, expected, rtol=1e-4, atol=1e-5)
        # The trace keeps its dropout as a node the executor finds to replay masks on a recompute.
        graph = getattr(saved, "1").graph.copy()
        torch._C._jit_pass_inline(graph)
        self.assertIn("aten::dropout", [node.kind() for node in graph.nodes()])

    def load_saved(self):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's, from torch 2.10 on
            return torch.jit.load(self.prefix + ".pt")

    def test_a_dropout_of_zero_before_a_dropout_is_proved_as_its_graph_runs(self):
        # The optimised graph executor draws a mask for the p = 0 dropout from a trace's second
        # run on; refused before ("its output differs from Python's by up to 3.01").
        r = self.export("zero_then_dropout")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("traced: '1' (ZeroThenDropout); each trace matched", r.stdout)
        saved = self.load_saved()
        model, (inputs, _) = load_cases().zero_then_dropout()
        model = torch.nn.Sequential(*model)
        with torch.jit.optimized_execution(False):
            for size in (1, 2, 2, 6):
                torch.manual_seed(size)
                expected = model(inputs[:size])
                torch.manual_seed(size)
                torch.testing.assert_close(saved(inputs[:size]), expected, rtol=1e-4, atol=1e-5)
        graph = getattr(saved, "1").graph.copy()
        torch._C._jit_pass_inline(graph)
        self.assertEqual([node.kind() for node in graph.nodes()].count("aten::dropout"), 2)

    def test_a_check_that_only_raises_does_not_refuse_the_trace(self):
        # nn.Embedding's padding index check and the child's own length check make the tracer
        # warn; neither can bake an output. The branch on the batch size still refuses
        # (test_tracer_warning_refuses_the_child).
        r = self.export("checked_embedding")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("traced: '0' (CheckedEmbedding); each trace matched", r.stdout)
        saved = self.load_saved()
        model, (inputs, _) = load_cases().checked_embedding()
        model = torch.nn.Sequential(*model)
        for size in (1, 3, 4):
            torch.testing.assert_close(saved(inputs[:size]), model(inputs[:size]), rtol=1e-4, atol=1e-5)

    def test_batch_norm_in_a_traced_child_updates_its_statistics_as_python(self):
        # F.batch_norm's check of one value per channel only raises: before, its tracer warning
        # refused every traced child with batch norm. At one sample Python itself fails, and the
        # report says so.
        r = self.export("traced_batch_norm")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("traced: '1' (NormedKeywordOnly); each trace matched", r.stdout)
        self.assertIn("but for '1' (NormedKeywordOnly) at 1 sample (Python itself fails: Expected more than 1 "
                      "value per channel", r.stdout)
        saved = self.load_saved()
        model, (inputs, _) = load_cases().traced_batch_norm()
        model = torch.nn.Sequential(*model)
        for size in (2, 5, 6):
            torch.testing.assert_close(saved(inputs[:size]), model(inputs[:size]), rtol=1e-4, atol=1e-5)
        traced_norm = dict(getattr(saved, "1").named_buffers())
        for name, buffer in model[1].named_buffers():  # three forwards on each
            torch.testing.assert_close(traced_norm[name], buffer, rtol=1e-5, atol=1e-6)
        self.assertEqual(int(traced_norm["norm.num_batches_tracked"]), 3)

    def test_tracer_warning_refuses_the_child(self):
        error = self.refused("size_branch")
        self.assertIn("child '1' (SizeBranch) cannot be scripted: ", error)
        self.assertIn("Converting a tensor to a Python boolean might cause the trace to be incorrect", error)
        with open(CASES) as source:
            line = next(i for i, text in enumerate(source, 1) if "if x.size(0) > 2:" in text)
        self.assertIn(f"at {CASES}:{line}: `if x.size(0) > 2:`", error)

    def test_a_warning_torch_raises_inside_itself_names_the_models_line(self):
        # GPT-J's rotary embedding splits at half a traced size; torch warns in Tensor.split.
        error = self.refused("warns_inside_torch")
        self.assertIn("Converting a tensor to a Python integer might cause the trace to be incorrect", error)
        with open(CASES) as source:
            line = next(i for i, text in enumerate(source, 1) if "torch.split(x, x.shape[-1] // 2" in text)
        self.assertIn(f"at {CASES}:{line}: `first, second = torch.split(x, x.shape[-1] // 2, dim=-1)` "
                      f"(torch raised it at {os.path.dirname(torch.__file__)}{os.sep}", error)

    def test_a_second_child_of_a_class_that_did_not_script_gives_the_first_ones_reason(self):
        # TorchScript's own message for the second would be "Can't redefine method: forward".
        error = self.refused("same_class_fails_twice")
        reasons = [part.split(" cannot be scripted: ")[1].split("; its trace")[0]
                   for part in error.split("; child ")]
        self.assertEqual(len(reasons), 2, error)
        self.assertEqual(reasons[0], reasons[1])
        self.assertIn("Tensor scale", reasons[0])
        self.assertNotIn("redefine", error)

    def test_a_tensor_made_of_python_values_is_kept_as_a_constant_after_proof(self):
        # torch.tensor(finfo.min): the tracer warns that it keeps a constant, which is right at
        # every size; GPT-Neo's attention was refused for it.
        r = self.export("tensor_constant")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("traced: '1' (FloorMasked); each trace matched", r.stdout)
        saved = self.load_saved()
        model, (inputs, _) = load_cases().tensor_constant()
        model = torch.nn.Sequential(*model)
        for size in (1, 2, 5):
            torch.testing.assert_close(saved(inputs[:size]), model(inputs[:size]), rtol=1e-4, atol=1e-5)

    def test_a_tensor_of_the_batch_size_fails_the_proof(self):
        error = self.refused("tensor_of_the_batch_size")
        self.assertIn("child '1' (PerSample) cannot be scripted: ", error)
        self.assertRegex(error, r"its trace does not generalise: at a micro-batch of 1 sample, its output differs")

    def test_a_tensor_of_the_inputs_data_is_refused_by_its_warning(self):
        error = self.refused("tensor_of_the_data")
        self.assertIn("child '1' (ItemScaled) cannot be scripted: ", error)
        self.assertIn("its trace would be wrong for other inputs: torch warns: \"Converting a tensor to a Python "
                      "number might cause the trace to be incorrect\"", error)

    def test_a_python_autograd_function_is_refused_by_name_before_writing(self):
        error = self.refused("python_function")
        with open(CASES) as source:
            line = next(i for i, text in enumerate(source, 1) if "return HalfSquare.apply(x)" in text)
        self.assertIn(f"child '1' (CallsAFunction) cannot be scripted: ", error)
        self.assertIn(f"its trace calls the Python autograd function HalfSquare (at {CASES}:{line}), which "
                      "TorchScript cannot hold: replace the module that calls it with one of torch's operations",
                      error)

    def test_a_script_that_cannot_be_saved_is_traced_instead(self):
        r = self.export("ignored_branch")
        self.assertEqual(r.returncode, 0, r.stderr)
        lines = r.stdout.splitlines()
        self.assertEqual(lines[0], "scripted: '0' (Linear)")
        self.assertTrue(lines[1].startswith("traced: '1' (IgnoredBranch); "), lines[1])
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", DeprecationWarning)
            saved = torch.jit.load(self.prefix + ".pt")
        model, (inputs, _) = load_cases().ignored_branch()
        model = torch.nn.Sequential(*model)
        for size in (1, 5):
            torch.testing.assert_close(saved(inputs[:size]), model(inputs[:size]), rtol=1e-5, atol=1e-6)

    def test_trace_that_bakes_the_batch_size_is_refused(self):
        error = self.refused("baked_size")
        self.assertIn("child '1' (BakedSize) cannot be scripted: Compiled functions can't take variable number", error)
        self.assertIn("its trace does not generalise: at a micro-batch of 1 sample it fails: ", error)

    def test_trace_that_differs_at_another_size_is_refused(self):
        error = self.refused("silent_branch")
        self.assertIn("child '1' (SilentBranch) cannot be scripted: ", error)
        self.assertRegex(error, r"its trace does not generalise: at a micro-batch of 1 sample, its output differs "
                                r"from Python's by up to [0-9.e+-]+ \(allowed: rtol 0.0001, atol 1e-05 x ")

    def test_tuple_return_is_refused(self):
        error = self.refused("returns_tuple")
        self.assertEqual(error, "export_model: error: child '1' (Pair) returns a tuple of 2; each child must "
                                "return one tensor: wrap it so that it does, e.g. `hidden_states = block(x)[0]` "
                                "where the rest are extras (attention weights, a cache), or pack what the next child "
                                "needs into one tensor (torch.cat) and split it there\n")

    def test_dict_return_is_refused(self):
        error = self.refused("returns_dict")
        self.assertEqual(error, "export_model: error: child '1' (Named) returns a dict (keys last_hidden_state, "
                                "pooled); each child must return one tensor: wrap it so that it does, e.g. "
                                "`hidden_states = block(x)['last_hidden_state']`\n")

    def test_two_inputs_are_refused(self):
        error = self.refused("two_inputs")
        self.assertEqual(error, "export_model: error: child '1' (Masked) takes 2 inputs (x, mask); each child must "
                                "take one tensor: wrap it in a module whose forward(x) supplies the others\n")

    def exported_tie(self, case, line):
        """Exports `case`, whose children 0 and 2 hold one weight: the report says `line`, and the
        saved model's two children still hold one tensor. Returns the saved model."""
        r = self.export(case)
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(line, r.stdout.splitlines())
        saved = self.load_saved()
        self.assertIs(getattr(saved, "0").weight, getattr(saved, "2").weight)
        return saved

    def test_tied_parameters_stay_one_tensor_through_scripting_and_tracing(self):
        self.exported_tie("tied", "tied: 0.weight is 2.weight (one tensor: pipetune sums its gradients over the "
                                  "stages holding it)")

    def test_a_frozen_tied_parameter_is_said_to_be_frozen_and_stays_so(self):
        saved = self.exported_tie("tied_frozen", "tied: 0.weight is 2.weight (one tensor, frozen: each stage holding "
                                                 "it keeps a copy that does not train)")
        self.assertFalse(getattr(saved, "0").weight.requires_grad)
        self.assertTrue(getattr(saved, "1").weight.requires_grad)

    def test_a_buffer_no_forward_changes_is_copied_into_each_child(self):
        # Refused before ("share a buffer ... pipetune would keep two copies").
        r = self.export("shared_constant_buffer")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("copied: 1.shared.table, 2.shared.table (one buffer no forward changes: each child now "
                      "keeps its own copy)", r.stdout.splitlines())
        saved = self.load_saved()
        first, second = getattr(saved, "1").shared.table, getattr(saved, "2").shared.table
        self.assertNotEqual(first.data_ptr(), second.data_ptr())
        torch.testing.assert_close(first, second, rtol=0, atol=0)
        model, (inputs, _) = load_cases().shared_constant_buffer()
        torch.testing.assert_close(saved(inputs), torch.nn.Sequential(*model)(inputs), rtol=1e-5, atol=1e-6)

    def test_a_buffer_a_forward_changes_stays_refused(self):
        error = self.refused("shared_batch_norm")
        self.assertIn("children '1' (BatchNorm1d) and '3' (BatchNorm1d) share a buffer that a forward changes "
                      "(1.running_mean is 3.running_mean", error)

    def test_a_module_used_at_two_places_is_a_layer_at_each(self):
        # Before, its second use was left out of the export: a model of 3 layers, silently.
        r = self.export("reused_activation")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn(f"wrote {self.prefix}.pt (4 layers: 0, 1, 2, 3)", r.stdout)
        saved = self.load_saved()
        model, (inputs, _) = load_cases().reused_activation()
        torch.testing.assert_close(saved(inputs), torch.nn.Sequential(*model)(inputs), rtol=1e-5, atol=1e-6)

    def test_a_view_of_another_childs_weight_is_refused_before_any_work(self):
        error = self.refused("tied_view")
        self.assertTrue(error.startswith("export_model: error: children '0' (Embedding) and '2' (Linear) share a "
                                         "view of another child's tensor (0.weight is 2.weight): pipetune would "
                                         "train two copies; "), error)

    def test_one_module_at_every_depth_is_a_layer_at_each_holding_one_tensor(self):
        r = self.export("one_block_at_every_depth")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("tied: 4 parameters, each held by children '1', '2', '3', '4' (1.a.weight is 2.a.weight is "
                      "3.a.weight is 4.a.weight, and 3 more; each one tensor: pipetune sums its gradients over the "
                      "stages holding it)", r.stdout.splitlines())
        saved = self.load_saved()
        for depth in "234":
            for name in ("a.weight", "a.bias", "b.weight", "b.bias"):
                self.assertIs(dict(getattr(saved, depth).named_parameters())[name],
                              dict(getattr(saved, "1").named_parameters())[name])
        model, (inputs, _) = load_cases().one_block_at_every_depth()
        torch.testing.assert_close(saved(inputs), torch.nn.Sequential(*model)(inputs), rtol=1e-5, atol=1e-6)

    def test_a_child_holding_parameters_others_train_and_it_never_uses_is_refused(self):
        # Exported before, every holder "tied": each stage holding a wrapper kept the whole model.
        error = self.refused("whole_model_wrappers")
        self.assertIn("child '0' (Front) holds 6 parameters (0.7 kB) that other children train and its forward "
                      "never uses (0.model.blocks.0.weight is 1.weight, and 5 more): every stage holding '0' would "
                      "keep a copy of them and their gradients; give '0' only the modules its forward uses", error)
        self.assertIn("; child '3' (Back) holds 6 parameters (0.7 kB) that other children train and its forward "
                      "never uses (3.model.embed.weight is 0.model.embed.weight, and 5 more)", error)

    def test_a_parameter_no_forward_reaches_is_said_and_exported(self):
        r = self.export("spare_parameters")
        self.assertEqual(r.returncode, 0, r.stderr)
        self.assertIn("unused: '1' (WithSpare) holds 2 trainable parameters (0.3 kB) its forward does not reach on "
                      "the example (1.spare.weight, 1.spare.bias): they get no gradient there, yet take memory on "
                      "its stage, and pipetune's memory model counts a gradient for them", r.stdout.splitlines())
        self.assertEqual(sum(line.startswith("unused: ") for line in r.stdout.splitlines()), 1, r.stdout)

    def test_child_that_neither_scripts_nor_traces_gives_both_reasons(self):
        error = self.refused("neither")
        self.assertIn("child '1' (Untraceable) cannot be scripted: Compiled functions can't take variable", error)
        self.assertIn("; nor traced: no tracing here", error)


if __name__ == "__main__":
    unittest.main()
