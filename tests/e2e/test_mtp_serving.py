"""The host's MTP speculation (``--speculative-algorithm NEXTN``, an alias of EAGLE) on the
CPU engine: a tiny MiMo-shaped model whose own MTP layer is the draft
(sglang_spec_ext/models/testing/mtp.py), served with and without ``--speculative-draft-model-path``
(the model directory itself) and under both spellings, chains of 1 and 3 draft steps.

Lossless greedy output against plain serving of the same model, verify steps counted,
16 concurrent requests, an abort mid-stream, a sampled request. The MTP layer shares the
target's weights (the draft is the one-layer target run one token ahead), so drafts are
accepted as well as rejected. One server (NEXTN, 3 steps, draft path) runs on the CPU
emulation of the GPU default path (graph runners for verify, draft and draft extend, and
overlap scheduling: ``cpu_serving.GPU_PATH_ENV["both"]``), so MTP is checked there in the
default run too. One (EAGLE, 3 steps, no draft path) runs our goodput controller
(``SGLANG_SPEC_EXT_ADAPTIVE=1``): the log must show it attached to the MTP draft with
the MTP layer's cost prior and switching step counts, with greedy output unchanged.
HYBRID on the same target with no draft path (its MTP layer as the model draft, suffix
drafts beside it): greedy parity, both sources verified. See docs/mtp.md.
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import re

import pytest

from sglang_spec_ext.sglang.cpu.graphs import CAPTURE_MESSAGE, REPLAY_MESSAGE
from sglang_spec_ext.sglang.cpu.overlap import LOOP_MESSAGE
from sglang_spec_ext.sglang.cpu.serving import GPU_PATH_ENV
from sglang_spec_ext.sglang.model_drafts.step_prior import KIND_PRESETS
from sglang_spec_ext.sglang.workers.hybrid_worker import STATS_LOG_MARK
from tests.e2e.spec_metrics import accept_length
from tests.e2e.test_model_draft_adaptive_serving import ADAPTIVE_ENV, _steps_used
from tests.e2e.test_suffix_serving import CODE, PROMPTS
from tests.harness.server import ServerConfig, abort_mid_stream

NEW_TOKENS = 20
#: The host docs' MiMo-7B-RL setting: one MTP step, verify width 2.
STEPS1 = ("--speculative-num-steps", "1", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "2")  # fmt: skip
STEPS3 = ("--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
          "--speculative-num-draft-tokens", "4")  # fmt: skip
#: Batch sizes the graph server captures (16: the concurrent test's batches replay padded).
CAPTURE_BS = (1, 2, 4, 16)
GRAPH_RUNNERS = ("DecodeCudaGraphRunner", "EAGLEDraftCudaGraphRunner",
                 "EAGLEDraftExtendCudaGraphRunner")  # fmt: skip


@pytest.fixture(scope="module")
def mimo_dir(tmp_path_factory):
    from sglang_spec_ext.models.testing.mtp import build_tiny_mimo_mtp

    return build_tiny_mimo_mtp(tmp_path_factory.mktemp("tiny-mimo") / "model", seed=0)


@pytest.fixture(scope="module")
def tok(mimo_dir):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(mimo_dir)


@pytest.fixture(scope="module")
def servers(mimo_dir, start_module_server):
    """Plain serving of the MiMo model, three MTP servers and HYBRID on the MTP draft,
    started side by side."""
    path = ("--speculative-draft-model-path", str(mimo_dir))
    graphs = ("--cuda-graph-bs-decode", *map(str, CAPTURE_BS))
    return start_module_server.start_all({
        "plain": ServerConfig(mimo_dir),
        # no draft path: the host loads the target's checkpoint again as MiMoMTP
        "nextn1": ServerConfig(mimo_dir, ("--speculative-algorithm", "NEXTN", *STEPS1)),
        "nextn3_path": ServerConfig(
            mimo_dir, ("--speculative-algorithm", "NEXTN", *path, *STEPS3, *graphs),
            GPU_PATH_ENV["both"],
        ),
        # the spelling the host docs use for MTP, under our goodput controller
        "eagle3": ServerConfig(mimo_dir, ("--speculative-algorithm", "EAGLE", *STEPS3),
                               ADAPTIVE_ENV),
        # HYBRID, no draft path: the MTP layer is its model draft (a stats line every step)
        "hybrid3": ServerConfig(mimo_dir, ("--speculative-algorithm", "HYBRID", *STEPS3),
                                {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}),
    })  # fmt: skip


def _greedy(server, ids, n=NEW_TOKENS):
    return server.generate(input_ids=ids, max_new_tokens=n, temperature=0, ignore_eos=True)


def _cases(tok):
    cases = [(label, tok(p)["input_ids"]) for label, p, _ in PROMPTS]
    return cases + [("code", tok(CODE)["input_ids"])]


@pytest.mark.parametrize(
    ("name", "max_accept", "min_mean"),
    # eagle3 runs the adaptive controller, which may settle at zero steps on this CPU
    [("nextn1", 2.0, 1.1), ("nextn3_path", 4.0, 1.1), ("eagle3", 4.0, 1.0)],
)
def test_mtp_greedy_parity_with_plain_serving(servers, tok, name, max_accept, min_mean):
    plain, spec = servers["plain"], servers[name]
    print(f"\n{name} accept length per prompt (tiny MiMo, MTP draft, CPU engine):")
    accepted = []
    for label, ids in _cases(tok):
        want = _greedy(plain, ids)["output_ids"]
        got = _greedy(spec, ids)
        assert got["output_ids"] == want, f"{label}: {name} output differs from plain serving"
        acc = accept_length(got["meta_info"])  # asserts verify steps happened
        assert 1.0 <= acc <= max_accept, (label, acc)
        accepted.append(acc)
        print(
            f"  {label:<12} accept_len={acc:5.2f}  verify_steps={got['meta_info']['spec_verify_ct']}"
        )
    mean = sum(accepted) / len(accepted)
    print(f"  mean accept length {mean:.2f}")
    # The MTP layer copies the target's layer: its drafts must be accepted some of the time.
    assert mean > min_mean, accepted


def test_mtp_under_the_goodput_controller(servers, tok):
    """SGLANG_SPEC_EXT_ADAPTIVE=1 takes effect on the host's EAGLE path with the MTP
    layer as the draft (what NEXTN resolves to): the controller attaches to the worker as
    an MTP draft (the MTP layer's cost prior, sized from the served models), chooses the
    step count per batch-size tier (the log shows at least two of 0..3, drafting among
    them) and output stays the plain server's (the parity test above)."""
    server = servers["eagle3"]
    assert _greedy(server, tok(CODE)["input_ids"])["meta_info"]["spec_verify_ct"] > 0
    log = server.log_path.read_text(errors="replace")
    attached = [ln for ln in log.splitlines() if "sglang-spec-ext adaptive steps on" in ln]
    assert attached, server.log_tail()
    print(f"\n{attached[0].split('sglang-spec-ext ', 1)[1]}")
    assert "EAGLEWorkerV2 (mtp draft): step counts [0, 1, 2, 3]" in attached[0]
    assert f"cost prior {KIND_PRESETS['mtp']} with the served models' sizes" in attached[0]
    used = _steps_used(server)
    print(f"MTP adaptive: draft steps chosen per batch-size tier: {used}")
    chosen = set().union(*used.values())
    assert len(chosen) >= 2 and chosen <= {0, 1, 2, 3}, used
    assert chosen & {1, 2, 3}, "the controller never drafted"


def test_mtp_16_concurrent_requests(servers, tok):
    plain, spec = servers["plain"], servers["nextn3_path"]
    prompts = [ids for _, ids in _cases(tok)]
    prompts = [ids + ids[: i % 5] for i, ids in enumerate(prompts * 2)][:16]
    want = [_greedy(plain, ids, 16)["output_ids"] for ids in prompts]
    with cf.ThreadPoolExecutor(16) as pool:
        got = list(pool.map(lambda ids: _greedy(spec, ids, 16)["output_ids"], prompts))
    assert got == want


def test_mtp_abort_mid_stream_leaves_the_server_healthy(servers, tok):
    plain, spec = servers["plain"], servers["eagle3"]
    ids = tok(CODE)["input_ids"]
    last = abort_mid_stream(spec, ids, 3000)
    assert last["finish_reason"]["type"] == "abort", last["finish_reason"]
    assert spec.healthy()
    assert _greedy(spec, ids, 16)["output_ids"] == _greedy(plain, ids, 16)["output_ids"]


def test_mtp_sampled_request_completes(servers, tok):
    out = servers["nextn1"].generate(
        input_ids=tok(CODE)["input_ids"], max_new_tokens=16, temperature=0.8, top_p=0.95,
        ignore_eos=True,
    )  # fmt: skip
    assert len(out["output_ids"]) == 16 and all(0 <= t < len(tok) for t in out["output_ids"])
    assert out["meta_info"]["spec_verify_ct"] > 0


def test_mtp_on_the_gpu_default_path_emulation(servers, tok):
    """The graph server captured and replayed its verify, draft and draft-extend graphs
    at every capture size and ran the overlap loop (its parity is checked above)."""
    server = servers["nextn3_path"]
    assert _greedy(server, tok(CODE)["input_ids"])["meta_info"]["spec_verify_ct"] > 0
    log = server.log_path.read_text(errors="replace")
    assert LOOP_MESSAGE in log, server.log_tail()
    for runner in GRAPH_RUNNERS:
        pattern = r" \S*?size=(\d+).*runner=" + re.escape(runner) + r"\b"
        captured = {int(m) for m in re.findall(re.escape(CAPTURE_MESSAGE) + pattern, log)}
        replayed = {int(m) for m in re.findall(re.escape(REPLAY_MESSAGE) + pattern, log)}
        assert captured == set(CAPTURE_BS), (runner, captured)
        assert replayed, f"{runner} never replayed a graph"


def _hybrid_stats(server) -> dict:
    text = server.log_path.read_text(errors="replace")
    lines = [ln for ln in text.splitlines() if STATS_LOG_MARK in ln]
    assert lines, "no HYBRID stats line in the server log"
    return json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])


def test_hybrid_on_the_mtp_draft_parity_and_both_sources_used(servers, tok):
    """HYBRID with no draft path on the MTP target: the host's EAGLE path with the MTP
    layer as the model draft, suffix drafts scored beside it every step. Greedy output
    identical to plain serving, on prose and on repetitive code (code x3, list x3,
    counting); both sources verified; the model draft as good through HYBRID as through
    NEXTN with the same chain (fixed at 3 steps), prompt by prompt. This MTP layer is
    the target run one token ahead, so it out-predicts the suffix drafts even on the
    repetitive prompts, and the learned table rightly picks it nearly always (measured:
    3 suffix steps of 88, none accepted beyond the bonus token)."""
    plain, hybrid, nextn = servers["plain"], servers["hybrid3"], servers["nextn3_path"]
    print("\nHYBRID (MTP draft + suffix) vs NEXTN, 3 steps, accept length per prompt:")
    accepted = {"hybrid": [], "nextn": []}
    for label, ids in _cases(tok):
        want = _greedy(plain, ids)["output_ids"]
        got = _greedy(hybrid, ids)
        assert got["output_ids"] == want, f"{label}: HYBRID output differs from plain serving"
        acc = accept_length(got["meta_info"])  # asserts verify steps happened
        assert 1.0 <= acc <= 16.0, (label, acc)  # wide steps: up to the suffix width
        accepted["hybrid"].append(acc)
        accepted["nextn"].append(accept_length(_greedy(nextn, ids)["meta_info"]))
        print(f"  {label:<12} hybrid={acc:5.2f}  nextn={accepted['nextn'][-1]:5.2f}")
    means = {k: sum(v) / len(v) for k, v in accepted.items()}
    print(f"  mean accept length: hybrid {means['hybrid']:.2f}, nextn {means['nextn']:.2f}")
    stats = _hybrid_stats(hybrid)
    by = stats["by_source"]
    print("  per source:", json.dumps(by))
    assert stats["choice_faults"] == 0
    assert by["suffix"]["steps"] > 0 and by["model"]["steps"] > 0
    # both sources scored and learned from at every step, whichever won
    assert {"suffix", "model"} <= set(stats["learned"])
    # the MTP draft loses nothing by running inside HYBRID
    assert means["hybrid"] >= means["nextn"] - 0.25, means
    log = hybrid.log_path.read_text(errors="replace")
    assert "HybridEagleWorker" in log, hybrid.log_tail()  # the host's EAGLE path, as NEXTN
    assert "the target's own MTP layers draft (MiMoForCausalLM as MiMoMTP" in log


def _offline_verify_steps(chains: list[list[int]], output: list[int], steps: int) -> int:
    """Verify steps a greedy top-1 chain of ``steps`` drafts needs to commit ``output``
    (its first token comes from the prefill): ``chains[j]`` is the chain after the
    prompt plus ``output[: j + 1]``."""
    done, count = 1, 0
    while done < len(output):
        row, accepted = chains[done - 1], 0
        while (
            accepted < steps
            and done + accepted < len(output)
            and (row[accepted] == output[done + accepted])
        ):
            accepted += 1
        done, count = done + accepted + 1, count + 1
    return count


@pytest.mark.parametrize(("name", "steps"), [("nextn1", 1), ("nextn3_path", 3)])
def test_offline_mtp_layer_predicts_the_host_verify_steps(servers, tok, mimo_dir, name, steps):
    """sglang_spec_ext.models.mtp_layer (the torch MTP layer the SmolLM2 MTP is trained and
    replayed with) computes what the host's MiMoMTP draft proposes: its offline chains
    give every prompt's verify-step count exactly (eager, and on the graphs + overlap
    emulation)."""
    from sglang_spec_ext.models.mtp_layer import load_mimo_checkpoint, mtp_chains

    target, mtp = load_mimo_checkpoint(mimo_dir)
    rows = []
    for label, ids in _cases(tok):
        got = _greedy(servers[name], ids)
        output = got["output_ids"]
        chains, _ = mtp_chains(target, mtp, [*ids, *output], len(ids) + 1, steps)
        rows.append((label, _offline_verify_steps(chains, output, steps),
                     got["meta_info"]["spec_verify_ct"]))  # fmt: skip
    print(f"\n{name}: verify steps offline / served: {[(r[1], r[2]) for r in rows]}")
    assert all(offline == served for _, offline, served in rows), rows
