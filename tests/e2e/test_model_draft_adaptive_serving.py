"""The goodput controller for model drafts on the real host's CPU engine
(``SGLANG_SPEC_EXT_ADAPTIVE=1``, sglang/model_drafts/adaptive.py): STANDALONE (the
tiny model as its own draft) and HYBRID (a 1-layer draft plus suffix drafts) switch
draft step counts through the host's own per-step-count runtime states, and greedy
output stays identical to plain serving at batch size 1 and under concurrency. The
step counts chosen per batch-size tier are read back from the server log; the HYBRID
server also pins its batch-4 tier at zero steps (``_PINNED_KS``), which the log must show,
and runs the draft-KV repair (``SGLANG_SPEC_EXT_DRAFT_KV_REPAIR``), whose counters the log
must show without failures."""

from __future__ import annotations

import ast
import concurrent.futures as cf

import pytest

from sglang_spec_ext.sglang.model_drafts.kv_repair_marks import STATS_LOG_MARK as REPAIR_MARK
from sglang_spec_ext.sglang.model_drafts.step_policy import STEPS_LOG_MARK
from tests.e2e.spec_metrics import plain_step_counts
from tests.e2e.test_standalone_serving import TOPK1, TOPK2, _cases, _greedy
from tests.harness.server import ServerConfig

#: Short patience and frequent probes (no exploration budget) so step counts really
#: change within the test; a log line with the chosen step counts every decode step.
ADAPTIVE_ENV = {
    "SGLANG_SPEC_EXT_ADAPTIVE": "1",
    "SGLANG_SPEC_EXT_ADAPTIVE_SWITCH_PATIENCE": "2",
    "SGLANG_SPEC_EXT_ADAPTIVE_PROBE_INTERVAL": "4",
    "SGLANG_SPEC_EXT_ADAPTIVE_PROBE_BUDGET": "1",
    "SGLANG_SPEC_EXT_ADAPTIVE_PROBE_BUDGET_THIN": "1",
    "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0",
}


#: HYBRID also runs hand-set tiers: from batch 4 up it never drafts (pinned at zero),
#: and with the draft-KV repair: those zero steps skip the draft extend, and a request
#: that drafts again when the batch shrinks first rebuilds its skipped draft KV.
PINNED_ENV = {
    "SGLANG_SPEC_EXT_ADAPTIVE_TIERS": "1,2,4",
    "SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS": "-1,-1,0",
    "SGLANG_SPEC_EXT_DRAFT_KV_REPAIR": "1",
}


def _config(tiny_model_dir, algo, draft_dir, shape, env) -> ServerConfig:
    return ServerConfig(tiny_model_dir, (
        "--speculative-algorithm", algo, "--speculative-draft-model-path", str(draft_dir), *shape,
    ), env)  # fmt: skip


@pytest.fixture(scope="module")
def servers(tiny_model_dir, weak_draft_dir, start_module_server):
    """The module's four adaptive servers, started side by side: chain drafts (STANDALONE
    with the tiny model as its own draft; HYBRID pinned, with the draft-KV repair) and
    topk-2 trees (the 1-layer draft) of both algorithms."""
    return start_module_server.start_all({
        "STANDALONE": _config(tiny_model_dir, "STANDALONE", tiny_model_dir, TOPK1, ADAPTIVE_ENV),
        "HYBRID": _config(tiny_model_dir, "HYBRID", weak_draft_dir, TOPK1,
                          {**ADAPTIVE_ENV, **PINNED_ENV}),
        "STANDALONE-tree": _config(tiny_model_dir, "STANDALONE", weak_draft_dir, TOPK2,
                                   ADAPTIVE_ENV),
        "HYBRID-tree": _config(tiny_model_dir, "HYBRID", weak_draft_dir, TOPK2, ADAPTIVE_ENV),
    })  # fmt: skip


@pytest.fixture(scope="module")
def standalone_adaptive(servers):
    return servers["STANDALONE"]


@pytest.fixture(scope="module")
def hybrid_adaptive(servers):
    return servers["HYBRID"]


def _steps_used(server) -> dict[int, set[int]]:
    """Batch-size tier -> draft step counts the controller chose, from the log."""
    used: dict[int, set[int]] = {}
    for line in server.log_path.read_text(errors="replace").splitlines():
        if STEPS_LOG_MARK in line:
            counts = ast.literal_eval(line.split(STEPS_LOG_MARK, 1)[1].strip())
            for tier, per_steps in counts.items():
                used.setdefault(int(tier), set()).update(int(s) for s in per_steps)
    return used


def _check(base, spec, tok, name):
    cases = [ids for _, ids in _cases(tok)]
    want = [_greedy(base, ids)["output_ids"] for ids in cases]
    for ids, w in zip(cases, want, strict=True):  # one at a time: batch size 1
        assert _greedy(spec, ids)["output_ids"] == w, f"{name}: output differs at batch size 1"
    with cf.ThreadPoolExecutor(len(cases)) as pool:  # then batches of several sizes
        got = list(pool.map(lambda ids: _greedy(spec, ids)["output_ids"], cases))
    assert got == want, f"{name}: output differs under concurrency"
    log = spec.log_path.read_text(errors="replace")
    assert "sglang-spec-ext adaptive steps on" in log
    # the cost prior carries the served models' sizes, read from the real host's runners
    assert "with the served models' sizes" in log and "CPU device constants" in log
    used = _steps_used(spec)
    print(f"\n{name}: draft steps chosen per batch-size tier: {used}")
    assert 1 in used, "no decisions logged at batch size 1"
    assert len(set().union(*used.values())) >= 2, "the controller never changed the step count"
    assert set().union(*used.values()) <= {0, 1, 2, 3}  # 0..--speculative-num-steps (<= 3)


def test_standalone_adaptive_steps_parity(tiny_baseline_server, standalone_adaptive, tok):
    _check(tiny_baseline_server, standalone_adaptive, tok, "STANDALONE adaptive")


def test_hybrid_adaptive_steps_parity(tiny_baseline_server, hybrid_adaptive, tok):
    _check(tiny_baseline_server, hybrid_adaptive, tok, "HYBRID adaptive")
    used = _steps_used(hybrid_adaptive)
    assert used.get(4) == {0}, f"the tier pinned at zero steps chose {used.get(4)}"
    log = hybrid_adaptive.log_path.read_text(errors="replace")
    assert "pinned (tier: steps) {4: 0}" in log
    assert "draft-KV repair on" in log
    repairs = [line.split(REPAIR_MARK, 1)[1] for line in log.splitlines() if REPAIR_MARK in line]
    print(f"\nHYBRID draft-KV repair counters: {repairs[-1] if repairs else None}")
    assert repairs, "no request drafted again after zero steps: the repair never ran"
    last = dict(kv.split("=") for kv in repairs[-1].split())
    assert int(last["requests"]) >= 1 and int(last["tokens"]) >= 2 and last["failures"] == "0"
    # the pinned tier's zero steps ran as plain decode steps (sglang/workers/plain_step.py)
    plain = plain_step_counts(log)
    print(f"HYBRID plain-step counters: {plain}")
    assert plain.get("plain", 0) >= 1, "HYBRID at zero steps ran no plain decode step"


@pytest.mark.parametrize("algo", ["STANDALONE", "HYBRID"])
def test_tree_adaptive_steps_parity(algo, servers, tiny_baseline_server, tok):
    """topk 2: every step count (0..2) verifies its own tree width (1, 3, 4); HYBRID
    splices suffix trees into whichever width the step runs at."""
    server = servers[f"{algo}-tree"]
    _check(tiny_baseline_server, server, tok, f"{algo} topk 2 adaptive")
    log = server.log_path.read_text(errors="replace")
    assert "step counts [0, 1, 2]" in log
    assert "draft_tokens 1 -> 3" in log or "draft_tokens 3 -> 1" in log  # the host's switch
