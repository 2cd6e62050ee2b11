"""Plain decode steps (sglang/workers/plain_step.py) reach the host's real worker.

The host's ``HookRegistry.apply_hooks`` patches each target once, so a hook registered
for a target an earlier apply already patched would be recorded and never run: our
metrics' AFTER hook on ``EAGLEWorkerV2.verify`` is registered first by one install and
the plain-step AROUND hook by another. ``register_hooks_once`` wraps such a late hook
around the patched attribute; checked here on a target of this module and, after the
host's real ``load_plugins()``, on the real ``EAGLEWorkerV2.verify`` (both of our hooks
in its wrapper chain, the plain step inside the metrics hook so that the metrics see
plain steps too). Serving (greedy parity, the step counters in every CPU mode) is in
``tests/e2e/test_plain_steps.py``.
"""

from __future__ import annotations

from tests.harness.subproc import run_snippet

CALLS: list[str] = []


class Target:
    def step(self, x: int) -> int:
        CALLS.append("original")
        return x + 1


def _after(result: int, _self: Target, x: int) -> None:
    CALLS.append(f"after({result})")


def _around(original, self: Target, x: int) -> int:
    CALLS.append("around")
    return original(self, x) * 10


def test_a_hook_registered_after_its_target_was_patched_still_runs():
    from sglang.srt.plugins.hook_registry import HookRegistry, HookType

    from sglang_spec_ext.sglang.host.hooks import register_hooks_once

    target = f"{__name__}.Target.step"
    original = Target.step
    try:
        assert register_hooks_once([(target, _after, HookType.AFTER)])
        assert target in HookRegistry._patched
        assert register_hooks_once([(target, _around, HookType.AROUND)])
        assert not register_hooks_once([(target, _around, HookType.AROUND)])  # once only
        CALLS.clear()
        assert Target().step(1) == 20
        assert CALLS == ["around", "original", "after(2)"]
    finally:
        Target.step = original
        HookRegistry._hooks.pop(target, None)
        HookRegistry._patched.discard(target)


CHAIN = """
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.speculative.eagle_worker_v2 import EAGLEWorkerV2

def hooks(fn):
    names = []
    while fn is not None:
        for cell in fn.__closure__ or ():
            value = cell.cell_contents
            if callable(value) and getattr(value, "__module__", "").startswith("sglang_spec_ext"):
                names.append(value.__module__ + "." + value.__name__)
        fn = getattr(fn, "__wrapped__", None)
    return names

print("CHAIN", hooks(EAGLEWorkerV2.verify))
"""


def test_the_plain_step_hook_sits_inside_the_metrics_hook_on_the_real_verify():
    out = run_snippet(CHAIN)
    line = next((ln for ln in out.stdout.splitlines() if ln.startswith("CHAIN")), None)
    assert line is not None, out.stdout + out.stderr
    assert line == (
        "CHAIN ['sglang_spec_ext.sglang.serving.metrics._after_verify', "
        "'sglang_spec_ext.sglang.workers.plain_step.verify_hook']"
    ), line


def test_plain_steps_off_leaves_the_host_verify_alone():
    out = run_snippet(CHAIN, env={"SGLANG_SPEC_EXT_PLAIN_STEPS": "0"})
    assert "CHAIN ['sglang_spec_ext.sglang.serving.metrics._after_verify']" in out.stdout, (
        out.stdout + out.stderr
    )


def test_stats_line_counts_plain_host_and_narrow_steps():
    from sglang_spec_ext.sglang.workers.plain_step import PlainStepStats

    stats = PlainStepStats(log_interval_s=3600)
    stats.count(True)
    stats.count(False, "graph")
    stats.count(False, narrow=True)
    stats.count(False, narrow=True)
    assert dict(kv.split("=") for kv in stats.line().split()) == {
        "plain": "1", "host_graph": "1", "narrow_graph": "2"}  # fmt: skip
    stats.reset()
    assert stats.line() == "plain=0"
