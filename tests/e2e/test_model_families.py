"""The model matrix on the CPU engine: SUFFIX on the model families users serve.

Each family is a tiny random-weight model built from transformers' config classes
(``sglang_spec_ext/models/testing/families.py``; nothing downloaded) and served by the
real host on the CPU engine: a plain server, SUFFIX at width 8 with its defaults (tree
drafts, ragged verify on) and adaptive SUFFIX (``SGLANG_SPEC_EXT_ADAPTIVE=1``), each
eagerly and with overlap scheduling (``SGLANG_SPEC_EXT_CPU_OVERLAP=1``), SUFFIX with chain
drafts (``SGLANG_SPEC_EXT_USE_TREE=0``) eagerly, and SUFFIX with
overlap plus the graph emulation (``SGLANG_SPEC_EXT_CPU_GRAPHS=1``). Greedy output must
be the plain server's token for token, sequentially (batch size 1) and concurrently; the
accept lengths are printed and must exceed 1 somewhere.

* Qwen3-MoE (every layer MoE) and Gemma 3 with a 16-token sliding window (prompts of 2
  to 150 tokens and 48 new ones: every verify reads a window that starts inside the
  prompt or the output): parity eagerly and under overlap.
* Under the graph emulation both replay their captured graphs with plain's output: the
  emulation's masked attention takes the sliding window (``cpu/masked_attention.py``) and
  its capture records a routing-independent MoE (``cpu/graph_moe.py``) where the host's
  CPU MoE reads its per-expert counts into Python. Until then both gave wrong greedy
  output under the emulation, plain decoding included.
* A draft longer than the window (Gemma 3 with a 4-token window, width 8): parity. The
  plugin's CPU verify attention (``sglang/cpu/fallbacks/verify_attention.py``) windows the
  draft keys as well as the committed prefix; before, a draft token deeper than the window
  still saw the draft tokens that fell out of it, and one prompt in six diverged.
* Qwen3-Next (Gated DeltaNet layers with a full-attention layer every 2nd, MoE with a
  shared expert): the plugin's pure-torch GDN kernels (``sglang/cpu/fallbacks/gdn_ops.py``)
  serve it; SUFFIX fixed and adaptive, eagerly, give plain serving's output (the GDN
  recurrent and conv states roll back to the accepted prefix through the host's
  ``commit_mamba_states_after_verify``). Its verify stays padded (the host's GDN verify
  takes one draft count per request), and overlap and the graph emulation are refused at
  start-up (no Mamba state snapshots on the CPU platform), which the parity test checks;
  plain decoding under the graph emulation differs (strict xfail, as for Qwen3-MoE).
* GPT-OSS and DeepSeek-V3: the plain server does not start on the CPU engine; each is
  skipped naming the host's error (``docs/models.md``).
"""

from __future__ import annotations

import concurrent.futures as cf
import re
import time
from pathlib import Path

import pytest

from sglang_spec_ext.models.testing.families import FAMILIES, build_tiny_gemma3
from sglang_spec_ext.sglang.cpu.graph_capture import ENV as GRAPHS_ENV
from sglang_spec_ext.sglang.cpu.graphs import REPLAY_MESSAGE
from sglang_spec_ext.sglang.cpu.overlap import ENV as OVERLAP_ENV
from sglang_spec_ext.sglang.cpu.overlap import LOOP_MESSAGE
from tests.harness.server import CPUServer, ServerConfig, ServerStartError, unserved_model_modules

WIDTH = 8
NEW_TOKENS = 48
SUFFIX_ARGS = ("--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH))
GRAPH_ARGS = ("--cuda-graph-bs-decode", "1", "2", "4")
EAGER = {OVERLAP_ENV: "0", GRAPHS_ENV: "0"}  # also under pytest --gpu-path
OVERLAP = {OVERLAP_ENV: "1", GRAPHS_ENV: "0"}
ADAPTIVE = {  # short patience and frequent probes, as test_adaptive_serving.py
    "SGLANG_SPEC_EXT_ADAPTIVE": "1",
    "SGLANG_SPEC_EXT_ADAPTIVE_SWITCH_PATIENCE": "2",
    "SGLANG_SPEC_EXT_ADAPTIVE_PROBE_INTERVAL": "4",
}
#: Server name -> (extra arguments, environment) of the speculative servers.
SPEC_SERVERS = {
    "SUFFIX": (SUFFIX_ARGS, EAGER),
    "SUFFIX-adaptive": (SUFFIX_ARGS, {**EAGER, **ADAPTIVE}),
    # chain drafts: the host's ragged layout on torch_native, the GDN chain verify
    "SUFFIX chains": (SUFFIX_ARGS, {**EAGER, "SGLANG_SPEC_EXT_USE_TREE": "0"}),
    "SUFFIX overlap": (SUFFIX_ARGS, OVERLAP),
    "SUFFIX-adaptive overlap": (SUFFIX_ARGS, {**OVERLAP, **ADAPTIVE}),
    "SUFFIX overlap+graphs": ((*SUFFIX_ARGS, *GRAPH_ARGS), {OVERLAP_ENV: "1", GRAPHS_ENV: "1"}),
}
NARROW_WINDOW = 4  # shorter than a width-8 draft

#: Families whose parity the CPU engine shows, each with the servers whose parity it
#: cannot show and why (a strict xfail: a fix of the emulation makes the test fail until
#: the entry goes).
SERVED: dict[str, dict[str, str]] = {
    "qwen3_moe": {},
    "gemma3": {},
    "deepseek_v3": {},
    "qwen3_next": {
        "plain graphs": "CPU graph emulation: the GDN backend's graph metadata is not "
        "emulated (plain decoding differs from the first decode token); SUFFIX refuses the "
        "emulation for this model",
    },
}
_NEXT = "Qwen3NextForCausalLM (Mamba-style state)"
#: Servers a family's start refuses, with the plugin's line: not in the matrix
#: (the parity test checks the refusal instead).
REFUSED = {
    "qwen3_next": {
        "SUFFIX overlap": f"SGLANG_SPEC_EXT_CPU_OVERLAP=1 with {_NEXT}",
        "SUFFIX-adaptive overlap": f"SGLANG_SPEC_EXT_CPU_OVERLAP=1 with {_NEXT}",
        "SUFFIX overlap+graphs": f"SGLANG_SPEC_EXT_CPU_GRAPHS=1 with {_NEXT}",
    },
}
#: Families whose verify stays padded, with the worker's start-up line.
PADDED = {"qwen3_next": "SUFFIX: verify padded: linear-attention layers"}

#: Families the CPU engine does not serve: (extra server arguments, the host's error the
#: plain start must stop at). The arguments get each as far as the host lets it.
UNSERVED = {
    "gpt_oss": ((), "requires one of ['triton', 'trtllm_mha', 'fa3'"),
}

PROMPTS = [
    ", ".join(str(i) for i in range(40)),
    "The quick brown fox jumps over the lazy dog. " * 4,
    "def reverse(items):\n    result = []\n    for item in items:\n",
    "for i in range(10):\n    print(i, add(i, i))\n" * 3,
    "hello world",
    "class Counter:\n    def __init__(self):\n        self.count = 0\n" * 2,
]


def family_env(family: str, extra: dict[str, str] | None = None) -> dict[str, str]:
    """A test server's environment for ``family``: the harness leaves out every host model
    module the Llama tests do not serve; this one keeps the family's own."""
    keep = set(FAMILIES[family][1])
    disabled = sorted(set(unserved_model_modules().split(",")) - keep)
    return {"SGLANG_DISABLED_MODEL_ARCHS": ",".join(disabled), **(extra or {})}


def _greedy(server: CPUServer, ids: list[int]) -> dict:
    return server.generate(input_ids=ids, max_new_tokens=NEW_TOKENS, temperature=0,
                           ignore_eos=True)  # fmt: skip


@pytest.fixture(scope="module", params=list(SERVED))
def family(request, tmp_path_factory, start_module_server):
    """One family's plain server (eager, and under the graph emulation) and every
    speculative server of SPEC_SERVERS, started side by side; the previous family's are
    stopped first. Yields ``(name, servers,
    prompts, the plain server's outputs)``."""
    name = request.param
    began = time.monotonic()
    model = FAMILIES[name][0](tmp_path_factory.mktemp("families") / name)
    refused = REFUSED.get(name, {})
    configs = {
        "plain": ServerConfig(model, (), family_env(name)),
        "plain graphs": ServerConfig(model, GRAPH_ARGS, family_env(name, {GRAPHS_ENV: "1"})),
    }
    for server, (args, env) in SPEC_SERVERS.items():
        if server not in refused:  # the refused: the parity test checks the refusal
            configs[server] = ServerConfig(model, args, family_env(name, env))
    servers = start_module_server.start_all(configs)
    prompts, expected = _expected(model, servers["plain"])
    print(f"\n{name}: {len(servers)} servers up in {time.monotonic() - began:.0f} s")
    yield name, servers, prompts, expected
    for server in servers.values():
        server.stop(term_wait=3)  # nothing to flush


def _expected(model: Path, plain: CPUServer) -> tuple[list[list[int]], list[list[int]]]:
    """The prompts' token ids and the plain server's greedy outputs for them."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(model)
    prompts = [tok(p)["input_ids"] for p in PROMPTS]
    return prompts, [_greedy(plain, ids)["output_ids"] for ids in prompts]


def test_draft_longer_than_the_window(tmp_path_factory, start_server, request):
    """Gemma 3 with a 4-token window, SUFFIX at width 8: drafts deeper than the window,
    eagerly and replayed under the graph emulation. (Wrong output before
    cpu/fallbacks/verify_attention.py windowed the draft keys too, and the graphs' masked
    verify, cpu/masked_attention.py, does the same.)"""
    model = build_tiny_gemma3(tmp_path_factory.mktemp("narrow") / "gemma3-w4",
                              sliding_window=NARROW_WINDOW)  # fmt: skip
    runs = ("SUFFIX", "SUFFIX overlap+graphs")
    servers = start_server.start_all({
        "plain": ServerConfig(model, (), family_env("gemma3")),
        **{run: ServerConfig(model, SPEC_SERVERS[run][0], family_env("gemma3", SPEC_SERVERS[run][1]))
           for run in runs},
    })  # fmt: skip
    prompts, expected = _expected(model, servers["plain"])
    for run in runs:
        _check_parity(f"gemma3 window {NARROW_WINDOW}", run, servers[run], prompts, expected)


@pytest.mark.parametrize("server", list(SPEC_SERVERS))
def test_greedy_parity_with_plain_serving(family, server, request, tmp_path_factory):
    """Sequential then concurrent greedy requests: the plain server's output token for
    token; verify ragged (the worker's start-up line), drafts accepted somewhere. Where
    the plugin refuses the server for the family (:data:`REFUSED`), its start-up stops
    with one line naming the setting to drop."""
    name, servers, prompts, expected = family
    if server in REFUSED.get(name, {}):
        _check_refused(name, server, tmp_path_factory)
        return
    known = SERVED[name].get(server)
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, raises=AssertionError, reason=known))
    _check_parity(name, server, servers[server], prompts, expected)


def test_graph_emulation_plain_decoding(family, request):
    """Plain decoding under the graph emulation, against the eager plain server: where it
    differs, the emulation (not SUFFIX) cannot show this family's graph path."""
    name, servers, prompts, expected = family
    known = SERVED[name].get("plain graphs") or SERVED[name].get("SUFFIX overlap+graphs")
    if known:
        request.applymarker(pytest.mark.xfail(strict=True, raises=AssertionError, reason=known))
    got = [_greedy(servers["plain graphs"], ids)["output_ids"] for ids in prompts]
    firsts = [_first_difference(g, w) for g, w in zip(got, expected, strict=True)]
    print(f"\n{name} plain graphs: first token differing from eager per prompt {firsts}")
    assert got == expected, f"{name}: plain decoding under the graph emulation differs"
    log = servers["plain graphs"].log_path.read_text(errors="replace")
    assert REPLAY_MESSAGE in log, f"{name} plain graphs: no decode graph was replayed"


def _check_parity(
    name: str, server: str, spec: CPUServer, prompts: list[list[int]], expected: list[list[int]]
) -> None:
    """``spec``'s greedy outputs for ``prompts``, one at a time and then together, equal
    ``expected``; its log shows ragged verify (and the overlap loop where it is on); some
    prompt accepted a draft token."""
    began = time.monotonic()
    got = [_greedy(spec, ids) for ids in prompts]
    firsts = [
        _first_difference(out["output_ids"], want) for out, want in zip(got, expected, strict=True)
    ]
    if any(first is not None for first in firsts):
        print(f"\n{name} {server}: first token differing from plain per prompt {firsts}")
    assert firsts == [None] * len(prompts), f"{name} {server}: output differs from plain"
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        again = list(pool.map(lambda ids: _greedy(spec, ids), prompts))
    together = [out["output_ids"] for out in again]
    assert together == expected, f"{name} {server}: concurrent output differs from plain"
    accept = [float(out["meta_info"].get("spec_accept_length") or 0.0) for out in got]
    repeat = [float(out["meta_info"].get("spec_accept_length") or 0.0) for out in again]
    log = spec.log_path.read_text(errors="replace")
    widths = sorted({int(w) for w in re.findall(r"(\d+): \d+", _widths_lines(log))})
    print(f"\n{name} {server}: accept length per prompt {[round(a, 2) for a in accept]}"
          f" (concurrent repeat {[round(a, 2) for a in repeat]})"
          + (f", verify widths used {widths}" if widths else "")
          + f", {time.monotonic() - began:.1f} s")  # fmt: skip
    if name in PADDED:
        assert PADDED[name] in log, f"{name} {server}: no padded-verify line"
    else:
        assert "SUFFIX: verify ragged" in log, f"{name} {server}: ragged verify is off"
    if SPEC_SERVERS.get(server, ((), {}))[1].get(OVERLAP_ENV) == "1":
        assert LOOP_MESSAGE in log, f"{name} {server}: the overlap loop never ran"
    if SPEC_SERVERS.get(server, ((), {}))[1].get(GRAPHS_ENV) == "1":
        assert REPLAY_MESSAGE in log, f"{name} {server}: no verify graph was replayed"
    assert max(accept) > 1.0, f"{name} {server}: no draft token accepted: {accept}"


def _check_refused(fam: str, server: str, tmp_path_factory) -> None:
    """The plugin refuses ``server`` for ``fam`` at start-up, with one line naming the
    setting to drop (:data:`REFUSED`)."""
    model = FAMILIES[fam][0](tmp_path_factory.mktemp("refused") / fam)
    args, env = SPEC_SERVERS[server]
    spec = CPUServer(model, args, env=family_env(fam, env), log_path=model.parent / "server.log")
    with pytest.raises(ServerStartError):
        try:
            spec.start(timeout=300)
        finally:
            spec.stop(term_wait=3)
    log = spec.log_path.read_text(errors="replace")
    assert "cannot start" in log and REFUSED[fam][server] in log, _host_error(log)


def _first_difference(got: list[int], want: list[int]) -> int | None:
    """The index of the first token where ``got`` and ``want`` differ (None: equal)."""
    if got == want:
        return None
    return next((i for i, (a, b) in enumerate(zip(got, want, strict=False)) if a != b),
                min(len(got), len(want)))  # fmt: skip


def _widths_lines(log: str) -> str:
    """The adaptive worker's width histograms (``{width: steps, ...}``) of ``log``."""
    marks = [ln for ln in log.splitlines() if "verify widths used in the last" in ln]
    return " ".join(ln[ln.index("{") : ln.index("}") + 1] for ln in marks if "{" in ln)


def _host_error(log: str) -> str:
    """The last exception line of a server log, with the host frame that raised it."""
    lines = log.splitlines()
    error = next(
        (i for i in range(len(lines) - 1, -1, -1)
         if re.match(r"^\w+(\.\w+)*(Error|Exception): ", lines[i])),
        None,
    )  # fmt: skip
    if error is None:
        return "\n".join(lines[-5:])
    frames = [ln.strip() for ln in lines[:error] if ln.strip().startswith("File ")]
    host = [f for f in frames if "/sglang/" in f]  # the host's frame, not torch's below it
    frame = (host or frames or [""])[-1]
    frame = re.sub(r'File ".*?site-packages/', 'File "', frame)
    return f"{lines[error]} ({frame})"


@pytest.fixture(scope="module")
def unserved_starts(tmp_path_factory) -> dict[str, str]:
    """Plain start-up of each family the CPU engine does not serve, side by side:
    ``family -> the host's error``, or ``""`` where a server came up (then stopped)."""
    root = tmp_path_factory.mktemp("unserved")
    servers = {
        fam: CPUServer(
            FAMILIES[fam][0](root / fam), args, env=family_env(fam), log_path=root / f"{fam}.log"
        )  # fmt: skip
        for fam, (args, _) in UNSERVED.items()
    }

    def start(server: CPUServer) -> str:
        try:
            server.start(timeout=300)
        except ServerStartError:
            return _host_error(server.log_path.read_text(errors="replace"))
        finally:
            server.stop(term_wait=3)  # the whole process group, up or not
        return ""

    with cf.ThreadPoolExecutor(len(servers)) as pool:
        return dict(zip(servers, pool.map(start, servers.values()), strict=True))


@pytest.mark.parametrize("fam", list(UNSERVED))
def test_family_the_cpu_engine_cannot_serve(unserved_starts, fam):
    """The plain server stops at start-up with the host's known error: skipped, naming
    it. A server that comes up fails the test: the family joins the matrix then."""
    error = unserved_starts[fam]
    assert error, f"{fam} now serves plainly on the CPU engine: add it to SERVED"
    assert UNSERVED[fam][1] in error, f"{fam}: another start-up error than known: {error}"
    pytest.skip(f"{fam} needs a GPU on this host (or sgl-kernel's CPU build): {error}")
