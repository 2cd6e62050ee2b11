"""sglang/serving/metrics.py against the real host (fresh interpreter: HookRegistry is
process-wide): every hook lands on the host method it names, the host's output
streamer treats our key as request-level, and the host's tokenizer manager turns our
customized field into one record in ``meta_info``. Fails loudly when a host version
moves any of them."""

from __future__ import annotations

from tests.harness.subproc import snippet_result

SNIPPET = """
import json
from types import SimpleNamespace
from sglang_spec_ext.plugin import register
register()
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang_spec_ext.sglang.serving import metrics as m

targets = [m.REPORTER_TARGET, m.ACCEPT_TARGET, m.REQUEST_LEVEL_TARGET, m.META_TARGET,
           m.VERIFY_TARGET]
res = {"patched": [t in HookRegistry._patched for t in targets]}

from sglang.srt.managers.scheduler_components.output_streamer import SchedulerOutputStreamer
streamer = object.__new__(SchedulerOutputStreamer)
res["request_level"] = [SchedulerOutputStreamer.is_request_level_customized_info_key(streamer, k)
                        for k in (m.META_KEY, "other")]

from sglang.srt.managers.tokenizer_manager import TokenizerManager
state = SimpleNamespace(customized_info_accumulated={}, customized_info_reported_keys=set())
meta = {}
record = {"drafted_by": {"suffix": {"steps": 2, "committed_tokens": 5}}}
TokenizerManager.update_request_meta_info(
    object.__new__(TokenizerManager), meta, state, {m.META_KEY: [[record]]}, 0, None)
res["meta"] = meta
print("RESULT " + json.dumps(res))
"""


def test_metrics_hooks_land_on_the_host():
    res = snippet_result(SNIPPET)
    assert res["patched"] == [True] * 5, res["patched"]
    assert res["request_level"] == [True, False]
    assert res["meta"] == {
        "spec_ext": {"drafted_by": {"suffix": {"steps": 2, "committed_tokens": 5}}}
    }
