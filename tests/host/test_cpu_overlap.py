"""``SGLANG_SPEC_EXT_CPU_OVERLAP`` (sglang/cpu/overlap.py) against the real host.

Off (the default) nothing changes: no hook is registered and the host's own argument
resolution turns overlap off for speculative decoding on CPU, for its algorithms and
ours. On (CPU engine), overlap stays on for SUFFIX, NGRAM, STANDALONE and HYBRID; the
stand-in for the host's Triton relay gather returns what the host's
kernel returns (run in Triton's CPU interpreter); the overlap trace counts what a
test reads from the log.
"""

from __future__ import annotations

import logging
from types import SimpleNamespace

import pytest
import torch

from sglang_spec_ext.sglang.cpu import overlap as cpu_overlap
from sglang_spec_ext.sglang.cpu.overlap import (
    DISABLE_FOR_CPU_TARGET,
    ENV,
    EVENT_LOOP_TARGET,
    GATHER_SPEC_EXTRAS_TARGET,
    ON_IDLE_TARGET,
    RUN_BATCH_TARGET,
    OverlapTrace,
    cpu_overlap_requested,
    gather_spec_extras,
    parse_trace,
)
from tests.harness.subproc import snippet_result

TARGETS = sorted(
    [
        DISABLE_FOR_CPU_TARGET,
        GATHER_SPEC_EXTRAS_TARGET,
        EVENT_LOOP_TARGET,
        RUN_BATCH_TARGET,
        ON_IDLE_TARGET,
    ]
)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory) -> str:
    # A real model directory: with --model-path dummy the host skips speculative validation.
    from sglang_spec_ext.models.testing.llama import build_tiny_llama

    return str(build_tiny_llama(tmp_path_factory.mktemp("tiny"), seed=0))


# Resolves each algorithm through the host's real argument pipeline after load_plugins(),
# and reports which of our targets carry hooks.
RESOLVE = """
import json, logging, sys
logging.disable(logging.WARNING)
from sglang.srt.plugins import load_plugins
load_plugins()
from sglang.srt.arg_groups.overrides import resolved_view
from sglang.srt.plugins.hook_registry import HookRegistry
from sglang.srt.server_args import prepare_server_args

MODEL = sys.argv[1] if len(sys.argv) > 1 else {model!r}
ALGOS = {{
    "SUFFIX": ["--speculative-num-draft-tokens", "8"],
    "NGRAM": ["--speculative-num-draft-tokens", "8"],
    "STANDALONE": ["--speculative-draft-model-path", MODEL, "--speculative-num-steps", "3",
                   "--speculative-eagle-topk", "1", "--speculative-num-draft-tokens", "4"],
    "HYBRID": ["--speculative-draft-model-path", MODEL],
}}
res = {{"overlap_off": {{}}, "hooks": sorted(t for t in {targets!r} if HookRegistry._hooks.get(t))}}
for algo, extra in ALGOS.items():
    sa = prepare_server_args(["--model-path", MODEL, "--device", "cpu",
                              "--attention-backend", "torch_native",
                              "--speculative-algorithm", algo, *extra])
    sa.resolve_once()
    res["overlap_off"][algo] = resolved_view(sa).disable_overlap_schedule
import torch
import sglang.srt.managers.overlap_utils as ou
res["gather_wrapped"] = hasattr(ou.gather_spec_extras, "__wrapped__")
buf = torch.arange(12).view(6, 2)
try:  # the relay's binding: the host's Triton kernel cannot run here (no driver)
    out = ou.gather_spec_extras(torch.tensor([4, 1]), buf, buf, buf[:, 0], None)
    res["relay_gather"] = [out[0].tolist(), out[2].tolist(), out[3]]
except Exception as e:
    res["relay_gather"] = type(e).__name__
print("RESULT " + json.dumps(res))
"""


def _resolve(model_dir: str, switch: str | None) -> dict:
    env = {ENV: switch} if switch is not None else {}
    code = RESOLVE.format(model=model_dir, targets=TARGETS)
    return snippet_result(code, env=env, cpu_engine=True)


def test_switch_off_changes_nothing(model_dir):
    res = _resolve(model_dir, None)
    assert res["hooks"] == []
    assert res["gather_wrapped"] is False  # the host's own Triton kernel
    # The host (NGRAM, STANDALONE) and our plugin (SUFFIX, HYBRID) turn overlap off on CPU.
    assert res["overlap_off"] == {"SUFFIX": True, "NGRAM": True, "STANDALONE": True, "HYBRID": True}


def test_switch_on_keeps_overlap_for_every_algorithm(model_dir):
    res = _resolve(model_dir, "1")
    assert res["hooks"] == TARGETS
    assert res["gather_wrapped"] is True
    assert res["relay_gather"] == [[[8, 9], [2, 3]], [8, 2], None]  # the stand-in ran
    assert res["overlap_off"] == {
        "SUFFIX": False,
        "NGRAM": False,
        "STANDALONE": False,
        "HYBRID": False,  # its suffix sessions read the worker's own outputs
    }


def test_switch_zero_is_off(model_dir, monkeypatch):
    for value, on in (("0", False), ("", False), ("false", False), ("1", True), ("yes", True)):
        assert cpu_overlap_requested({ENV: value}) is on, value
    assert cpu_overlap_requested({}) is False
    monkeypatch.setenv(ENV, "0")
    assert cpu_overlap.install_cpu_overlap() == []


def test_not_installed_off_the_cpu_engine(monkeypatch):
    import sglang.srt.utils as host_utils
    from sglang.srt.plugins.hook_registry import HookRegistry

    monkeypatch.setenv(ENV, "1")
    monkeypatch.setattr(host_utils, "is_cpu", lambda: False)
    monkeypatch.setattr(host_utils, "is_cuda", lambda: True)
    before = {t: list(h) for t, h in HookRegistry._hooks.items()}
    assert cpu_overlap.install_cpu_overlap() == []
    assert {t: list(h) for t, h in HookRegistry._hooks.items()} == before


def test_keep_overlap_hook_runs_the_host_only_with_the_switch_off(monkeypatch):
    calls = []

    def host(args):
        calls.append(args)

    monkeypatch.delenv(ENV, raising=False)
    cpu_overlap.keep_overlap_hook(host, "args")
    assert calls == ["args"]
    monkeypatch.setenv(ENV, "1")
    cpu_overlap.keep_overlap_hook(host, "args")
    assert calls == ["args"]  # skipped


# -- the relay gather -------------------------------------------------------------------
def _relay_buffers(seed: int, hidden: bool) -> tuple:
    g = torch.Generator().manual_seed(seed)
    rows = 7
    bufs = (
        torch.rand((rows, 4), generator=g),  # topk_p
        torch.randint(0, 1000, (rows, 4), generator=g),  # topk_index
        torch.randint(0, 1000, (rows,), generator=g, dtype=torch.int32),  # bonus tokens
        torch.rand((rows, 3, 5), generator=g) if hidden else None,  # hidden states
    )
    indices = torch.tensor([5, 0, 5, 2], dtype=torch.int64)
    return indices, bufs


def test_gather_stand_in_takes_the_indexed_rows_and_leaves_the_buffers():
    indices, bufs = _relay_buffers(0, hidden=True)
    before = [b.clone() for b in bufs]
    out = gather_spec_extras(indices, *bufs)
    for got, buf, kept in zip(out, bufs, before, strict=True):
        assert torch.equal(got, buf[[5, 0, 5, 2]])
        assert got.dtype == buf.dtype and got.shape[1:] == buf.shape[1:]
        assert torch.equal(buf, kept)
        got.add_(1)  # a copy: writing it leaves the relay buffer alone
        assert torch.equal(buf, kept)
    no_hidden = gather_spec_extras(indices.to(torch.int32), *bufs[:3], None)
    assert no_hidden[3] is None and torch.equal(no_hidden[2], bufs[2][[5, 0, 5, 2]])
    empty = gather_spec_extras(indices[:0], *bufs)
    assert [t.shape[0] for t in empty] == [0, 0, 0, 0]


# The host's Triton kernel in Triton's CPU interpreter against the stand-in.
HOST_GATHER = """
import json, os
os.environ["TRITON_INTERPRET"] = "1"
import torch
from sglang.kernels.ops.speculative.gather_spec_extras import gather_spec_extras as host
from sglang_spec_ext.sglang.cpu.overlap import gather_spec_extras as ours
from tests.host.test_cpu_overlap import _relay_buffers
same = []
for seed, hidden in ((0, True), (1, False)):
    indices, bufs = _relay_buffers(seed, hidden)
    a, b = host(indices, *bufs), ours(indices, *bufs)
    same.append(all((x is None and y is None) or torch.equal(x, y) for x, y in zip(a, b)))
print("RESULT " + json.dumps(same))
"""


def test_gather_stand_in_matches_the_host_kernel():
    import os

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = {
        "TRITON_INTERPRET": "1",
        "PYTHONPATH": root + os.pathsep + os.environ.get("PYTHONPATH", ""),
    }
    assert snippet_result(HOST_GATHER, env=env) == [True, True]


# -- the trace --------------------------------------------------------------------------
class _Mode:
    def __init__(self, kind: str) -> None:
        self.kind = kind

    def is_extend(self) -> bool:
        return self.kind == "extend"

    def is_decode(self) -> bool:
        return self.kind == "decode"


def _step(trace: OverlapTrace, kind: str, width: int | None = None, relayed: bool = True):
    batch = SimpleNamespace(forward_mode=_Mode(kind))
    result = SimpleNamespace(speculative_num_draft_tokens=width)
    trace.on_batch(batch, result, relayed)


def test_trace_counts_relays_prefills_between_decodes_and_width_changes(caplog):
    trace = OverlapTrace()
    _step(trace, "extend", 8)  # before any decode: not "between decodes"
    for width in (8, 8, 4, 2, 8):
        _step(trace, "decode", width)
    _step(trace, "extend", 8)
    _step(trace, "extend", 8)
    _step(trace, "decode", 4, relayed=False)
    _step(trace, "idle")
    state = trace.as_dict()
    assert state == {
        "decode_steps": 6,
        "relayed_steps": 5,
        "extend_steps": 3,
        "prefills_between_decodes": 1,
        "width_down": 3,
        "width_up": 1,
        "widths": [2, 4, 8],
    }
    parsed = parse_trace("[time] " + trace.summary())
    assert parsed["width_down"] == "3" and parsed["widths"] == "[2,4,8]"
    with caplog.at_level(logging.INFO, logger="sglang_spec_ext"):
        trace.log_if_changed()
        trace.log_if_changed()  # unchanged: no second line
    assert [r.getMessage() for r in caplog.records] == [trace.summary()]


def test_the_hosts_cpu_streams_and_events_are_synchronous():
    """The overlap path takes streams and events from ``torch.get_device_module``; on
    CPU those are synchronous (why cpu_overlap.py needs no stream/event stand-in)."""
    cpu = torch.get_device_module("cpu")
    stream, event = cpu.Stream(), cpu.Event()
    before = cpu.current_stream()
    with cpu.stream(stream):
        assert cpu.current_stream() is stream
        dst = torch.zeros(4, dtype=torch.int64)
        dst.copy_(torch.arange(4), non_blocking=True)
        event.record()
    assert cpu.current_stream() is before
    assert event.query() is True  # complete once recorded: the copy already happened
    assert dst.tolist() == [0, 1, 2, 3]
    stream.wait_event(event)
    stream.wait_stream(before)
    event.wait()
    event.synchronize()
    cpu.synchronize()
