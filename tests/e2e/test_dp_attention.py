"""DP attention on the CPU engine: two attention-DP ranks (``--tp-size 2 --dp-size 2
--enable-dp-attention``, gloo) serving the tiny DeepSeek-V3 (MLA + MoE, the family DP
attention is built for), against one plain server of the same checkpoint.

The host's CPU path pads each rank's batch for the gathered MLP through
``get_cpu_graph_seq_len_fill_value()``, which only its AMX backend defines: without
``sglang/cpu/dp_attention.py`` the first batch dies with an ``AttributeError``.

SUFFIX eagerly and adaptive SUFFIX with overlap scheduling on the same two ranks:
each rank drafts and verifies its own requests (the drafts' TP sync runs over the
attention-TP group, here one rank each), and every forward exchanges the ranks' real token
counts for the gathered MLP (``workers/dp_tokens.py``): a rank verifying beside an idle
rank (one request at a time), beside one that prefills or verifies other requests
(together). Without that exchange the SUFFIX server died at its first request (checked
once by hand, 2026-12-02); ``tests/host/test_dp_tokens.py`` shows the host's rescaling it
prevents, and two ranks at different widths. Not here: the graph emulation, whose capture
under DP attention fails for plain serving too (the host's DP-attention graph path reaches
a ``PyNcclCommunicator`` attribute on CPU). HYBRID refuses DP attention at start-up
(``tests/host/test_server_args.py``).
"""

from __future__ import annotations

import concurrent.futures as cf
from pathlib import Path

from sglang_spec_ext.models.testing.families import build_tiny_deepseek_v3
from sglang_spec_ext.sglang.cpu.overlap import LOOP_MESSAGE
from tests.e2e.soak_run import run_soak
from tests.e2e.test_model_families import PROMPTS, SUFFIX_ARGS, family_env
from tests.harness.server import ServerConfig

NEW_TOKENS = 24
DP_ARGS = ("--tp-size", "2", "--dp-size", "2", "--enable-dp-attention")
#: One core per rank: the host's CPU engine otherwise wants a NUMA node per rank.
DP_ENV = {"SGLANG_CPU_OMP_THREADS_BIND": "0|1"}
EAGER = {"SGLANG_SPEC_EXT_CPU_OVERLAP": "0", "SGLANG_SPEC_EXT_CPU_GRAPHS": "0"}
#: adaptive SUFFIX on the overlap-scheduling path, in one server (each DP server starts
#: four processes: more of them at once starved a parallel test worker's server start-up)
ADAPTIVE_OVERLAP = {"SGLANG_SPEC_EXT_CPU_OVERLAP": "1", "SGLANG_SPEC_EXT_CPU_GRAPHS": "0",
                    "SGLANG_SPEC_EXT_ADAPTIVE": "1"}  # fmt: skip


def test_dp_attention_serves_plain_output(tmp_path_factory, start_server):
    from transformers import AutoTokenizer

    model = build_tiny_deepseek_v3(tmp_path_factory.mktemp("ds-dp") / "m")
    servers = start_server.start_all({
        "plain": ServerConfig(model, (), family_env("deepseek_v3")),
        "SUFFIX dp2": ServerConfig(model, (*DP_ARGS, *SUFFIX_ARGS),
                                   family_env("deepseek_v3", {**DP_ENV, **EAGER})),
        "SUFFIX-adaptive dp2 overlap": ServerConfig(model, (*DP_ARGS, *SUFFIX_ARGS),
                                                    family_env("deepseek_v3", {**DP_ENV,
                                                               **ADAPTIVE_OVERLAP})),
    })  # fmt: skip
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]

    def greedy(name: str, ids: list[int]) -> dict:
        return servers[name].generate(input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0,
                                      ignore_eos=True)  # fmt: skip

    expected = [greedy("plain", ids)["output_ids"] for ids in prompts]
    for name in ("SUFFIX dp2", "SUFFIX-adaptive dp2 overlap"):
        # one at a time: a rank verifies beside an idle rank
        alone = [greedy(name, ids) for ids in prompts]
        assert [out["output_ids"] for out in alone] == expected, name
        # together: both ranks busy, prefills beside verifies, then again (drafts hit)
        for round_ in range(2):
            with cf.ThreadPoolExecutor(len(prompts)) as pool:
                together = list(pool.map(lambda ids, n=name: greedy(n, ids), prompts))
            assert [out["output_ids"] for out in together] == expected, (name, round_)
        log = servers[name].log_path.read_text(errors="replace")
        assert "DP attention is enabled" in log, servers[name].log_tail()
        assert "DP1" in log, f"{name}: the second attention-DP rank never logged"
        accept = [float(out["meta_info"].get("spec_accept_length") or 0.0) for out in together]
        print(f"\n{name}: accept length per prompt, second concurrent round "
              f"{[round(a, 2) for a in accept]}")  # fmt: skip
        assert max(accept) > 1.0, f"{name}: no draft accepted under DP attention: {accept}"
        assert "verify padded: DP attention" in log, servers[name].log_tail()
        if "adaptive" in name:  # the controller chose each request's widths (meta_info)
            assert all("verify_widths" in out["meta_info"].get("spec_ext", {})
                       for out in together), together[0]["meta_info"]  # fmt: skip
    log = servers["SUFFIX-adaptive dp2 overlap"].log_path.read_text(errors="replace")
    assert LOOP_MESSAGE in log, log[-3000:]  # the overlap event loop ran


def test_dp_attention_soak(tmp_path, capsys):
    """The soak harness (``tests/e2e/soak_run.py``) against SUFFIX on two attention-DP ranks
    (the plain reference on one): mixed load at concurrency 8 (greedy and sampled, prompts
    at the context limit, ``n`` = 2, logprobs, structured output, stop tokens), clients that
    disconnect mid-stream, invalid and guarded requests, tenants, corpus operations; the
    server alive, no fatal log line, the plain server's greedy output, also after aborts."""
    model = build_tiny_deepseek_v3(tmp_path / "ds")
    run, _record = run_soak(tmp_path, capsys, [
        "--model", str(model), "--requests", "40", "--max-running-requests", "8",
        "--width", "8", "--algorithms", "SUFFIX", "--deadline-s", "900",
        "--spec-args", " ".join(DP_ARGS),
    ], min_parity=10)  # fmt: skip
    log = Path(run["log"]).read_text(errors="replace")
    assert "DP1" in log and "verify padded: DP attention" in log, log[-3000:]
