"""Every hook accounted for, against SGLang 0.5.23's own classes and HookRegistry (in a subprocess with
the test bed's environment, as the server runs): applied or not, reached by the running worker or not."""

from __future__ import annotations

import json
import subprocess

from testbed.server import REPO_ROOT, server_env, venv_python

SCRIPT = r"""
import json
from draftscope_tracer.engine.sglang import coverage
from draftscope_tracer.engine.sglang import plugin
from draftscope_tracer.engine.hooks import HookHandle, register
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.speculative.spec_info import SpeculativeAlgorithm
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2, EagleDraftWorker
from sglang.srt.speculative.standalone_worker_v2 import StandaloneWorkerV2, StandaloneDraftWorker
from sglang.srt.speculative.multi_layer_eagle_worker_v2 import MultiLayerEagleWorkerV2, MultiLayerEagleDraftWorker
from sglang.srt.speculative.dflash_worker_v2 import DFlashWorkerV2

class Scheduler:  # the two attributes coverage.check reads
    def __init__(self, spec, draft, algorithm):
        self.draft_worker = None
        if spec is not None:
            self.draft_worker = object.__new__(spec)
            self.draft_worker.__dict__["speculative_algorithm"] = SpeculativeAlgorithm[algorithm]
            self.draft_worker.__dict__["_draft_worker"] = object.__new__(draft) if draft else None

hooks = {name: HookHandle(plugin.TARGETS[name], fn) for name, fn in plugin._AROUND.items()}
out = {"unregistered": coverage.check(Scheduler(EAGLEWorkerV2, EagleDraftWorker, "EAGLE3"), hooks)}
register(hooks.values())
renamed = HookHandle(plugin.TARGETS["verify"] + "_renamed", plugin._AROUND["verify"])
register([renamed])
HookRegistry.apply_hooks()  # logs "Failed to apply hooks" for the renamed one and goes on
cases = {"eagle3": (EAGLEWorkerV2, EagleDraftWorker, "EAGLE3"),
         "standalone": (StandaloneWorkerV2, StandaloneDraftWorker, "STANDALONE"),
         "multi_layer": (MultiLayerEagleWorkerV2, MultiLayerEagleDraftWorker, "EAGLE"),
         "dflash": (DFlashWorkerV2, None, "DFLASH"), "none": (None, None, "NONE")}
for key, (spec, draft, algo) in cases.items():
    out[key] = coverage.check(Scheduler(spec, draft, algo), hooks)
out["renamed"] = coverage.check(Scheduler(EAGLEWorkerV2, EagleDraftWorker, "EAGLE3"),
                                {**hooks, "verify": renamed})
out["messages"] = {k: coverage.uncovered_message(v) for k, v in out.items()}
print("RESULT " + json.dumps(out))
"""


def _check() -> tuple[dict, str]:
    proc = subprocess.run([str(venv_python()), "-c", SCRIPT], capture_output=True, text=True,
                          env=server_env({}), cwd=REPO_ROOT, timeout=300)
    lines = [line for line in proc.stdout.splitlines() if line.startswith("RESULT ")]
    assert lines, proc.stderr[-3000:]
    return json.loads(lines[-1][len("RESULT "):]), proc.stderr


def test_hooks_accounted_for_against_sglang_classes():
    out, log = _check()
    everything = ["prefill", "draft", "verify", "draft_extend", "finish"]
    assert out["eagle3"] == {"worker_class": "EAGLEWorkerV2", "draft_worker_class": "EagleDraftWorker",
                             "algorithm": "EAGLE3", "covered": True, "hooks_not_applied": [],
                             "hooks_not_reached": [], "expected_to_fire": everything}
    assert out["standalone"]["covered"] and out["standalone"]["algorithm"] == "STANDALONE"
    # registered but never applied: every hook is missing, none is expected to fire
    assert out["unregistered"]["hooks_not_applied"] == sorted(everything + ["event_loop", "graphs", "init"])
    assert out["unregistered"]["expected_to_fire"] == []
    # SGLang swallows the failure ("Failed to apply hooks"); the check does not
    assert "Failed to apply hooks" in log
    assert out["renamed"]["hooks_not_applied"] == ["verify"] and "verify" not in out["renamed"]["expected_to_fire"]
    for key, worker in (("multi_layer", "MultiLayerEagleWorkerV2"), ("dflash", "DFlashWorkerV2")):
        assert out[key]["covered"] is False and out[key]["worker_class"] == worker
        assert out[key]["hooks_not_reached"] == ["draft", "draft_extend", "prefill", "verify"]
        assert out[key]["expected_to_fire"] == ["finish"]
        assert out["messages"][key].startswith(f"this server runs {worker} (algorithm ")
        assert "draftscope traces nothing of it" in out["messages"][key]
    assert out["none"]["covered"] is False and out["messages"]["none"].startswith("this server runs no speculative")
    assert out["messages"]["eagle3"] is None
