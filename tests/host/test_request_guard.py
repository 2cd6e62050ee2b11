"""The request guard against the host's real ``SamplingParams.verify`` (fresh interpreter:
HookRegistry is process-wide). The served path (a 400 from the real server) is covered
by the soak harness's short mode (tests/e2e/test_soak.py)."""

from __future__ import annotations

from tests.harness.subproc import snippet_result

SNIPPET = """
import json
from sglang_spec_ext.plugin import register
register()
from sglang.srt.runtime_context import get_context
from sglang.srt.sampling.sampling_params import SamplingParams

CASES = {"plain": {}, "repetition": {"repetition_penalty": 1.3},
         "frequency": {"frequency_penalty": 0.5}, "presence": {"presence_penalty": -0.5},
         "min_new": {"min_new_tokens": 4}, "neutral": {"repetition_penalty": 1.0,
         "frequency_penalty": 0.0, "min_new_tokens": 0},
         "spec_off": {"custom_params": {"spec_ext": {"max_draft_tokens": 0}}},
         "spec_bad": {"custom_params": {"spec_ext": {"max_draft_tokens": -2}}}}
res = {}
for algo in ("SUFFIX", "NGRAM", None, "prefill"):
    fields = {"page_size": 1}
    if algo == "prefill":  # the plain prefill server of a PD pair
        fields.update(disaggregation_mode="prefill")
    elif algo:
        fields.update(speculative_algorithm=algo, speculative_num_draft_tokens=8)
    with get_context().override_server_args(**fields):
        for name, kw in CASES.items():
            try:
                SamplingParams(max_new_tokens=8, **kw).verify(1000)
                res[f"{algo}/{name}"] = "ok"
            except ValueError as e:
                res[f"{algo}/{name}"] = str(e)
print("RESULT " + json.dumps(res))
"""


def test_penalizer_options_are_refused_only_under_our_algorithms():
    res = snippet_result(SNIPPET)
    for name in ("repetition", "frequency", "presence", "min_new"):
        msg = res[f"SUFFIX/{name}"]
        assert "not supported with --speculative-algorithm SUFFIX" in msg, msg
        # The host's own algorithms and plain serving keep the host's behaviour.
        assert res[f"NGRAM/{name}"] == "ok" and res[f"None/{name}"] == "ok"
    assert "repetition_penalty=1.3" in res["SUFFIX/repetition"]
    assert "min_new_tokens=4" in res["SUFFIX/min_new"]
    assert res["SUFFIX/plain"] == res["SUFFIX/neutral"] == "ok"


def test_bad_per_request_speculation_settings_are_refused_under_our_algorithms():
    res = snippet_result(SNIPPET)
    assert res["SUFFIX/spec_off"] == "ok"
    msg = res["SUFFIX/spec_bad"]
    assert "sampling_params.custom_params.spec_ext.max_draft_tokens=-2" in msg, msg
    assert "--speculative-algorithm SUFFIX" in msg
    # other algorithms and plain serving do not read the setting: the host's behaviour
    assert res["NGRAM/spec_bad"] == "ok" and res["None/spec_bad"] == "ok"


def test_a_pd_prefill_server_refuses_bad_settings_as_its_decode_server_does():
    """Both servers of a pair get each request: a bad setting refused by both at once."""
    res = snippet_result(SNIPPET)
    msg = res["prefill/spec_bad"]
    assert msg.startswith("prefill server of a prefill-decode pair: "), msg
    assert "max_draft_tokens=-2" in msg
    assert res["prefill/spec_off"] == res["prefill/plain"] == "ok"
    # penalties are refused by a SUFFIX server only (a prefill server cannot know its peer's)
    assert res["prefill/repetition"] == "ok"
