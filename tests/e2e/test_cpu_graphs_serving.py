"""Graph runners on the CPU engine (``SGLANG_SPEC_EXT_CPU_GRAPHS=1``, sglang/cpu/graphs.py):
plain decoding and target verify through the host's DecodeCudaGraphRunner, the model
drafts' draft and draft extend through its EAGLEDraft(Extend)CudaGraphRunner
(sglang/cpu/draft_graphs.py).

The server captures one traced graph per decode batch size (1, 2, 4), pads other batch
sizes up to a captured one and sends larger batches to the eager path; its greedy
output must equal the plain server's token for token, and its log must show that the
captured graphs were replayed. What only a GPU can check is listed in the module
docstring of ``sglang_spec_ext/sglang/cpu/graphs.py``.
"""

from __future__ import annotations

import concurrent.futures as cf
import re

import pytest

from sglang_spec_ext.sglang.cpu.graph_capture import ENV
from sglang_spec_ext.sglang.cpu.graphs import CAPTURE_MESSAGE, REPLAY_MESSAGE
from tests.harness.server import ServerConfig

CAPTURE_BS = (1, 2, 4)
NEW_TOKENS = 24
PROMPTS = [
    "def reverse(items):\n    result = []\n    for item in items:\n",
    "The quick brown fox jumps over the lazy dog. " * 3,
    ", ".join(str(i) for i in range(30)),
    "hello world",
    "A speculative decoder proposes several tokens and the target model",
    "class Counter:\n    def __init__(self):\n        self.count = 0\n",
]


#: Verify width of the SUFFIX servers.
WIDTH = 8


@pytest.fixture(scope="module")
def graph_servers(tiny_model_dir, start_module_server):
    """The plain and the SUFFIX server with graphs on, started side by side."""
    graphs = ("--cuda-graph-bs-decode", *map(str, CAPTURE_BS))
    suffix = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH))
    return start_module_server.start_all({
        "plain": ServerConfig(tiny_model_dir, graphs, {ENV: "1"}),
        "SUFFIX": ServerConfig(tiny_model_dir, (*suffix, *graphs),
                               {ENV: "1", "SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}),
    })  # fmt: skip


@pytest.fixture(scope="module")
def graph_server(graph_servers):
    return graph_servers["plain"]


def _ids(tok, text: str) -> list[int]:
    return tok(text)["input_ids"]


def _greedy(server, ids, n=NEW_TOKENS):
    out = server.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True)
    return out["output_ids"]


def _log(server) -> str:
    return server.log_path.read_text(errors="replace")


def test_decode_graphs_are_captured_per_batch_size(graph_server):
    log = _log(graph_server)
    assert "DecodeCudaGraphRunner captured bs=[1, 2, 4]" in log, graph_server.log_tail()
    captured = re.findall(re.escape(CAPTURE_MESSAGE) + r" (.*) \(", log)
    assert len(captured) == len(CAPTURE_BS), captured


def test_sequential_greedy_parity_and_replays(tiny_baseline_server, graph_server, tok):
    for text in PROMPTS:
        ids = _ids(tok, text)
        assert _greedy(graph_server, ids) == _greedy(tiny_baseline_server, ids), text
    log = _log(graph_server)
    assert REPLAY_MESSAGE in log, "decode never replayed a captured graph"


def _replayed_sizes(server) -> set[int]:
    return {
        int(m) for m in re.findall(re.escape(REPLAY_MESSAGE) + r" \S*?size=(\d+)", _log(server))
    }


def _concurrent_parity(base, server, tok, sizes_in: set[int] | None = None) -> None:
    """Six concurrent requests of different lengths, so the batch shrinks 6 -> 1: 6 and 5
    exceed the largest captured size and run eager (can_run_graph false), 3 pads to the
    bs=4 graph, 4, 2 and 1 replay their own; every output must match. ``sizes_in``: the
    graph keys a speculative server may replay (several tokens per step: requests may
    finish together and skip a size)."""
    prompts = [_ids(tok, text) for text in PROMPTS]
    lengths = [8 + 6 * i for i in range(len(prompts))]
    want = [_greedy(base, ids, n) for ids, n in zip(prompts, lengths, strict=True)]
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        got = list(pool.map(lambda a: _greedy(server, *a), zip(prompts, lengths, strict=True)))
    assert got == want
    sizes = _replayed_sizes(server)
    if sizes_in is None:  # one token per step: the batch passes through every size
        assert sizes == set(CAPTURE_BS), sizes
    else:
        assert len(sizes) >= 2 and sizes <= sizes_in, sizes


def test_concurrent_greedy_parity_padded_and_eager(tiny_baseline_server, graph_server, tok):
    _concurrent_parity(tiny_baseline_server, graph_server, tok)


# ---------------------------------------------------------------------------
# SUFFIX: the target verify replays the decode graph runner at the verify width
# ---------------------------------------------------------------------------


@pytest.fixture(scope="module")
def suffix_graph_server(graph_servers):
    return graph_servers["SUFFIX"]


def test_suffix_verify_graphs_greedy_parity(tiny_baseline_server, suffix_graph_server, tok):
    log = _log(suffix_graph_server)
    assert "DecodeCudaGraphRunner captured bs=[1, 2, 4]" in log, suffix_graph_server.log_tail()
    accept = []
    for text in PROMPTS:
        ids = _ids(tok, text)
        out = suffix_graph_server.generate(
            input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0, ignore_eos=True
        )
        assert out["output_ids"] == _greedy(tiny_baseline_server, ids), text
        accept.append(out["meta_info"].get("spec_accept_length") or 0.0)
    print(f"\nSUFFIX under CPU graphs, accept length per prompt: {accept}")
    assert max(accept) > 1.5, accept  # the counting prompt repeats itself
    assert REPLAY_MESSAGE in _log(suffix_graph_server), "verify never replayed a graph"


def test_suffix_verify_graphs_concurrent_parity(tiny_baseline_server, suffix_graph_server, tok):
    """SUFFIX verifies ragged (each request its own draft): its verify graphs are keyed by
    the batch's verify tokens, one bucket per captured batch size at each captured width
    (8, and 1 for steps without drafts) (verify/ragged_graphs.py)."""
    buckets = {bs * w for bs in CAPTURE_BS for w in (WIDTH, 1)}
    assert "token buckets" in _log(suffix_graph_server), suffix_graph_server.log_tail()
    _concurrent_parity(tiny_baseline_server, suffix_graph_server, tok, sizes_in=buckets)


def test_suffix_steps_without_drafts_replay_width_1_graphs(
    tiny_baseline_server, suffix_graph_server, tok
):
    """Random-token prompts: steps where no request of the batch has a draft cannot run
    as plain decode steps under graphs (a verify graph runs the step); fixed-width SUFFIX
    captures width-1 verify graphs too and replays those (a decode-shaped forward)
    instead of the width-8 ones, its relay padded back to width 8 (suffix_worker.py,
    width_switch.py). Greedy output stays plain serving's."""
    import random

    from tests.e2e.spec_metrics import plain_step_counts

    rng = random.Random(5)
    prompts = [[rng.randrange(100, len(tok) - 1) for _ in range(40)] for _ in range(3)]
    want = [_greedy(tiny_baseline_server, ids) for ids in prompts]
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        assert list(pool.map(lambda ids: _greedy(suffix_graph_server, ids), prompts)) == want
    log = _log(suffix_graph_server)
    assert "SUFFIX: target verify graphs captured at widths [1] besides the startup width 8" in log
    counts = plain_step_counts(log)
    print(f"\nSUFFIX under CPU graphs, random tokens: plain-step counters {counts}")
    assert counts.get("narrow_graph", 0) >= 1, counts


def test_adaptive_suffix_under_graphs_parity(
    tiny_model_dir, tiny_baseline_server, start_server, tok
):
    """The adaptive controller changes the verify width per step: the target's verify
    graphs are captured at every width it can choose (adaptive_worker.py,
    verify_width.py), each swapped in with its width, so graphs replay at several
    widths; output stays identical. (The print shows how often the graph path was
    taken.)"""
    server = start_server(
        tiny_model_dir,
        "--speculative-algorithm",
        "SUFFIX",
        "--speculative-num-draft-tokens",
        str(WIDTH),
        "--cuda-graph-bs-decode",
        *map(str, CAPTURE_BS),
        env={
            ENV: "1",
            "SGLANG_SPEC_EXT_ADAPTIVE": "1",
            "SGLANG_SPEC_EXT_ADAPTIVE_SWITCH_PATIENCE": "2",
            "SGLANG_SPEC_EXT_ADAPTIVE_PROBE_INTERVAL": "4",
        },
    )
    prompts = [_ids(tok, text) for text in PROMPTS] * 2
    want = [_greedy(tiny_baseline_server, ids, 40) for ids in prompts]
    assert [_greedy(server, ids, 40) for ids in prompts[: len(PROMPTS)]] == want[: len(PROMPTS)]
    with cf.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda ids: _greedy(server, ids, 40), prompts)) == want
    log = _log(server)
    used = set()
    for line in log.splitlines():
        if "verify widths used in the last" in line:
            used |= {int(w) for w in re.findall(r"(\d+): \d+", line[line.index("{") :])}
    graph_steps = len(re.findall(r"Decode batch.*cpu graph: True", log))
    eager_steps = len(re.findall(r"Decode batch.*cpu graph: False", log))
    print(
        f"\nadaptive SUFFIX under CPU graphs: widths used {sorted(used)}, logged decode "
        f"batches replayed/eager {graph_steps}/{eager_steps}, "
        f"first replays: {log.count(REPLAY_MESSAGE)}"
    )
    from sglang_spec_ext.sglang.workers.adaptive_worker import verify_graph_widths

    graph_widths = verify_graph_widths(WIDTH)
    assert len(graph_widths) > 2, graph_widths
    assert log.count(CAPTURE_MESSAGE) == len(CAPTURE_BS) * len(graph_widths)
    # each captured graph logs its first replay: more than one batch size's worth means
    # graphs of several widths replayed
    assert log.count(REPLAY_MESSAGE) > len(CAPTURE_BS), log.count(REPLAY_MESSAGE)
    assert graph_steps > 0


def test_adaptive_suffix_verify_graph_widths_bound(
    tiny_model_dir, tiny_baseline_server, start_server, tok
):
    """SGLANG_SPEC_EXT_VERIFY_GRAPH_WIDTHS=1: graphs at the startup width and the
    narrowest other width only, the start-up log names the widths left without graphs,
    and output stays plain serving's whichever width the controller picks."""
    server = start_server(
        tiny_model_dir, "--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens",
        str(WIDTH), "--cuda-graph-bs-decode", *map(str, CAPTURE_BS),
        env={ENV: "1", "SGLANG_SPEC_EXT_ADAPTIVE": "1",
             "SGLANG_SPEC_EXT_ADAPTIVE_PROBE_INTERVAL": "4",
             "SGLANG_SPEC_EXT_VERIFY_GRAPH_WIDTHS": "1"},
    )  # fmt: skip
    prompts = [_ids(tok, text) for text in PROMPTS[:4]]
    want = [_greedy(tiny_baseline_server, ids) for ids in prompts]
    with cf.ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda ids: _greedy(server, ids), prompts)) == want
    log = _log(server)
    assert log.count(CAPTURE_MESSAGE) == len(CAPTURE_BS) * 2, server.log_tail()
    assert "verify without graphs of their own (SGLANG_SPEC_EXT_VERIFY_GRAPH_WIDTHS=1)" in log


# ---------------------------------------------------------------------------
# Model drafts: the target verify, the multi-step draft and the draft extend replay
# graphs (the host skips the draft's two runners on CPU; cpu_draft_graphs.py builds them)
# ---------------------------------------------------------------------------

TOPK2 = ("--speculative-num-steps", "2", "--speculative-eagle-topk", "2",
         "--speculative-num-draft-tokens", "4")  # fmt: skip
TOPK1 = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4")  # fmt: skip


def _model_draft_parity(base, server, tok, label: str) -> None:
    accept = []
    for text in PROMPTS[:4]:
        ids = _ids(tok, text)
        out = server.generate(input_ids=ids, max_new_tokens=20, temperature=0, ignore_eos=True)
        assert out["output_ids"] == _greedy(base, ids, 20), (label, text)
        accept.append(round(out["meta_info"].get("spec_accept_length") or 0.0, 2))
    log = _log(server)
    assert "DecodeCudaGraphRunner captured bs=[1, 2, 4]" in log, server.log_tail()
    for runner in ("DecodeCudaGraphRunner", *DRAFT_RUNNERS):
        captured = _runner_sizes(log, CAPTURE_MESSAGE, runner)
        replayed = _runner_sizes(log, REPLAY_MESSAGE, runner)
        assert captured == set(CAPTURE_BS), (label, runner, captured)
        assert replayed, f"{label}: {runner} never replayed a graph"
    print(f"\n{label} under CPU graphs (verify, draft, draft extend replayed), accept {accept}")


#: The model draft's own graph runners (built on CPU by cpu_draft_graphs.py).
DRAFT_RUNNERS = ("EAGLEDraftCudaGraphRunner", "EAGLEDraftExtendCudaGraphRunner")


def _runner_sizes(log: str, message: str, runner: str) -> set[int]:
    pattern = re.escape(message) + r" \S*?size=(\d+).*runner=" + re.escape(runner) + r"\b"
    return {int(m) for m in re.findall(pattern, log)}


def test_model_draft_target_verify_graphs_parity(
    tiny_model_dir, weak_draft_dir, tiny_baseline_server, start_server, tok
):
    server = start_server(
        tiny_model_dir,
        "--speculative-algorithm",
        "STANDALONE",
        "--speculative-draft-model-path",
        str(weak_draft_dir),
        *TOPK2,
        "--cuda-graph-bs-decode",
        *map(str, CAPTURE_BS),
        env={ENV: "1"},
    )
    _model_draft_parity(tiny_baseline_server, server, tok, "STANDALONE")


#: A tree draft of three steps: two draft forwards inside the draft graph, so two
#: per-step confidence columns (sglang/workers/hybrid_confidence.py).
TREE3 = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "2",
         "--speculative-num-draft-tokens", "6")  # fmt: skip


def _hybrid_stats(server) -> dict:
    import json

    from sglang_spec_ext.sglang.workers.hybrid_worker import STATS_LOG_MARK

    lines = [ln for ln in _log(server).splitlines() if STATS_LOG_MARK in ln]
    assert lines, server.log_tail()
    return json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])


def test_hybrid_scores_choices_and_output_under_graphs_equal_eager(
    tiny_model_dir, weak_draft_dir, tiny_baseline_server, start_server, tok
):
    """HYBRID's model score comes from the draft's own graphs: a server whose draft and
    draft extend replay graphs learns the same table (per source and score bucket: drafts
    seen, mean raw score, mean accepted tokens) and makes the same choices as one that
    drafts eagerly, on the same sequential requests, and both give plain serving's
    output. (Before the confidence tap, a replayed draft left the model's score at the
    prefill's first-token probability: the tables differed.)"""
    args = (
        "--speculative-algorithm", "HYBRID", "--speculative-draft-model-path",
        str(weak_draft_dir), *TREE3, "--cuda-graph-bs-decode", *map(str, CAPTURE_BS),
    )  # fmt: skip
    quiet = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}  # a stats line per decode step
    # wide steps off: whether a step goes wide follows each server's step timing, so the
    # two servers' choices would differ there (wide steps under graphs: test_hybrid_wide)
    quiet["SGLANG_SPEC_EXT_HYBRID_SUFFIX_WIDTH"] = "1"
    graphs = start_server(tiny_model_dir, *args, env={ENV: "1", **quiet})
    eager = start_server(tiny_model_dir, *args, env={ENV: "0", **quiet})
    prompts = [_ids(tok, text) for text in PROMPTS] + [_ids(tok, PROMPTS[0] * 2)]
    for ids in prompts:
        want = _greedy(tiny_baseline_server, ids, 20)
        for name, server in (("graphs", graphs), ("eager", eager)):
            out = server.generate(input_ids=ids, max_new_tokens=20, temperature=0, ignore_eos=True)
            assert out["output_ids"] == want, name
    log = _log(graphs)
    for runner in DRAFT_RUNNERS:
        assert _runner_sizes(log, REPLAY_MESSAGE, runner), f"{runner} never replayed"
    got = {name: _hybrid_stats(server) for name, server in (("graphs", graphs), ("eager", eager))}
    print(
        f"\nHYBRID under graphs vs eager: {got['graphs']['by_source']} / {got['eager']['by_source']}"
    )
    assert got["graphs"]["by_source"] == got["eager"]["by_source"]
    tables = {name: stats["learned"] for name, stats in got.items()}
    assert tables["graphs"].keys() == tables["eager"].keys()
    for source, rows in tables["eager"].items():
        other = tables["graphs"][source]
        assert [(r["lo"], r["seen"]) for r in other] == [(r["lo"], r["seen"]) for r in rows]
        for a, b in zip(other, rows, strict=True):
            assert a["mean_raw"] == pytest.approx(b["mean_raw"], rel=1e-5, abs=1e-6), source
            assert a["mean_accepted"] == pytest.approx(b["mean_accepted"]), source
    shares = got["eager"]["by_source"]  # both sources won steps: the choice was exercised
    assert all(shares.get(s, {}).get("steps", 0) > 0 for s in ("model", "suffix")), shares


def test_eagle3_target_verify_graphs_parity(
    tiny_model_dir, tmp_path_factory, tiny_baseline_server, start_server, tok
):
    from sglang_spec_ext.models.testing.llama import build_eagle3_head

    head = build_eagle3_head(tiny_model_dir, tmp_path_factory.mktemp("eagle3") / "head")
    server = start_server(
        tiny_model_dir,
        "--speculative-algorithm",
        "EAGLE3",
        "--speculative-draft-model-path",
        str(head),
        *TOPK1,
        "--cuda-graph-bs-decode",
        *map(str, CAPTURE_BS),
        env={ENV: "1"},
    )
    _model_draft_parity(tiny_baseline_server, server, tok, "EAGLE3")


def test_draft_graphs_draft_what_the_eager_draft_drafts(
    tiny_model_dir, weak_draft_dir, tiny_baseline_server, start_server, tok
):
    """A chain draft (3 steps) whose draft and draft-extend graphs replay proposes the
    tokens the eager draft proposes: per prompt, the same accept length as a server
    with graphs off (a replay that read stale capture-time inputs would propose other
    tokens and accept fewer), and the output of plain serving."""
    args = (
        "--speculative-algorithm", "STANDALONE",
        "--speculative-draft-model-path", str(weak_draft_dir),
        *TOPK1, "--cuda-graph-bs-decode", *map(str, CAPTURE_BS),
    )  # fmt: skip
    pair = start_server.start_all({
        "graphs": ServerConfig(tiny_model_dir, args, {ENV: "1"}),
        "eager": ServerConfig(tiny_model_dir, args, {ENV: "0"}),
    })  # fmt: skip
    graphs, eager = pair["graphs"], pair["eager"]
    accept = {}
    for name, server in (("graphs", graphs), ("eager", eager)):
        accept[name] = []
        for text in PROMPTS[:4]:
            ids = _ids(tok, text)
            out = server.generate(input_ids=ids, max_new_tokens=20, temperature=0, ignore_eos=True)
            assert out["output_ids"] == _greedy(tiny_baseline_server, ids, 20), (name, text)
            accept[name].append(out["meta_info"]["spec_accept_length"])
    log = _log(graphs)
    for runner in DRAFT_RUNNERS:
        assert _runner_sizes(log, REPLAY_MESSAGE, runner), f"{runner} never replayed"
    assert not _runner_sizes(_log(eager), CAPTURE_MESSAGE, DRAFT_RUNNERS[0])
    print(f"\nchain draft accept lengths: graphs {accept['graphs']}, eager {accept['eager']}")
    assert accept["graphs"] == pytest.approx(accept["eager"], abs=1e-6)
