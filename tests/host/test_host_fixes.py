"""Host fixes (sglang_spec_ext/sglang/host/fixes.py) against the real host code.

Each scenario runs in a fresh interpreter (the host's HookRegistry is process-wide):
the real ``get_req_to_token_extra_context_len`` as the real request-to-token pool
builder (``kv_cache_configurator``) sees it, under the host's own published config.
"""

from __future__ import annotations

from tests.harness.subproc import snippet_result

MEASURE = """
import json
from sglang.srt.runtime_context import get_context
import sglang.srt.mem_cache.allocation_sizing as sizing
import sglang.srt.mem_cache.kv_cache_configurator as configurator

def spec(algo, tokens, steps, topk):
    return dict(speculative_algorithm=algo, speculative_num_draft_tokens=tokens,
                speculative_num_steps=steps, speculative_eagle_topk=topk, page_size=1)

CASES = {
    "NGRAM-16": spec("NGRAM", 16, 1, 1),
    "NGRAM-4": spec("NGRAM", 4, 1, 1),
    "EAGLE-5x1-6": spec("EAGLE", 6, 5, 1),
    "none": dict(page_size=1),
}

def measure():
    out = {}
    for name, fields in CASES.items():
        with get_context().override_server_args(**fields):
            reserve = sizing.get_alloc_reserve_per_decode() if "speculative_algorithm" in fields else 0
            out[name] = {"row_headroom": configurator.get_req_to_token_extra_context_len(),
                         "reserve": reserve}
    return out

res = {"before": measure()}
"""


def _run(code: str, env: dict[str, str] | None = None) -> dict:
    return snippet_result(MEASURE + code + "\nprint('RESULT', json.dumps(res))\n", env=env)


def test_row_headroom_fix_covers_the_decode_reserve():
    res = _run(
        """
from sglang_spec_ext.sglang.host.fixes import install_host_fixes
res["installed"] = install_host_fixes()
res["again"] = install_host_fixes()
res["after"] = measure()
"""
    )
    before, after = res["before"], res["after"]
    # The host bug this fix exists for: rows shorter than the per-step reserve at
    # width 16 and for EAGLE chains. If this fails, the host fixed it: drop the fix.
    assert before["NGRAM-16"]["row_headroom"] < before["NGRAM-16"]["reserve"], before
    assert before["EAGLE-5x1-6"]["row_headroom"] < before["EAGLE-5x1-6"]["reserve"], before
    assert res["installed"] == ["req_to_token_row_headroom"] and res["again"] == []
    for name, row in after.items():
        assert row["row_headroom"] >= row["reserve"], (name, row)
    # Nothing changes where the host was already right.
    assert after["none"] == before["none"]
    assert after["NGRAM-4"] == before["NGRAM-4"]


def test_plugin_installs_it_and_the_switch_turns_it_off():
    code = """
from sglang_spec_ext.plugin import install_runtime_hooks
res["installed"] = install_runtime_hooks()
res["after"] = measure()
"""
    on = _run(code)
    assert "req_to_token_row_headroom" in on["installed"]
    assert on["after"]["NGRAM-16"]["row_headroom"] >= 32
    off = _run(code, env={"SGLANG_SPEC_EXT_HOST_FIXES": "0"})
    assert "req_to_token_row_headroom" not in off["installed"]
    assert off["after"] == off["before"]


def test_a_moved_target_fails_by_name(monkeypatch):
    import pytest

    from sglang_spec_ext.sglang.host import fixes as host_fixes

    moved = host_fixes.HostFix(
        "moved", "sglang.srt.mem_cache.allocation_sizing.no_such_function", "AFTER", len, "test"
    )
    monkeypatch.setattr(host_fixes, "HOST_FIXES", (moved,))
    with pytest.raises(RuntimeError, match="no_such_function.*0.5.23"):
        host_fixes.install_host_fixes()
