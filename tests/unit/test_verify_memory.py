"""The verify-width memory estimate and its start-up refusal (sglang/verify/memory_check.py),
as pure functions of the sizes; the hook on the host is tests/host/test_verify_memory_check.py."""

from __future__ import annotations

import logging

import pytest

from sglang_spec_ext.sglang.verify import memory_check as vm

CTX, BS, W, VOCAB = 131072, 48, 64, 128256  # the issue's example, a Llama-3 vocabulary


def _shape(**kw):
    fields = dict(
        backends=("flashinfer",), max_bs=BS, widths=(W,), context_len=CTX, vocab_size=VOCAB
    )
    return vm.VerifyShape(**{**fields, **kw})


def test_the_issues_example_is_about_two_gb_of_flashinfer_graph_buffers_plus_the_logits():
    # kv indices int32 + custom mask uint8, T = 48 x 64 tokens of 128k keys each
    assert vm.attention_buffer_bytes("flashinfer", BS, W, CTX) == 3072 * 131072 * (4 + 1)
    assert vm.attention_buffer_bytes("flashinfer", BS, W, CTX) == 2_013_265_920  # ~2 GB
    assert vm.logits_bytes(BS, W, VOCAB) == 1_576_009_728  # fp32, 48 x 64 rows
    parts = vm.verify_buffer_bytes(_shape())
    assert parts == {"attention": 2_013_265_920, "logits": 1_576_009_728}
    # two flashinfer wrappers (sliding window / cross attention): two index buffers
    assert vm.attention_buffer_bytes("flashinfer", BS, W, CTX, flashinfer_wrappers=2) == (
        3072 * 131072 * 9
    )


def test_fa3_and_triton_formulas():
    tree = vm.attention_buffer_bytes("fa3", BS, W, CTX, topk=8)
    assert tree == BS * W * (CTX + W) + BS * W * W * 4  # full verify mask + expand page table
    assert vm.attention_buffer_bytes("fa3", BS, W, CTX, topk=1) == BS * W * W  # qlen-only mask
    triton = vm.attention_buffer_bytes("triton", BS, W, CTX, triton_bytes_per_token=100)
    assert triton == 3072 * CTX * 8 + BS * W * (CTX + W) + 3072 * 100
    assert vm.attention_buffer_bytes("torch_native", BS, W, CTX) == 0  # not estimated


def test_runners_add_up_and_logits_count_once_at_the_widest():
    parts = vm.verify_buffer_bytes(_shape(widths=(W, W, 9, 9)))  # HYBRID + an adaptive state
    one = vm.attention_buffer_bytes("flashinfer", BS, W, CTX)
    assert parts["attention"] == 2 * one + 2 * vm.attention_buffer_bytes("flashinfer", BS, 9, CTX)
    assert parts["logits"] == vm.logits_bytes(BS, W, VOCAB)
    both = vm.verify_buffer_bytes(_shape(backends=("flashinfer", "fa3"), topk=8))
    assert both["attention"] == one + vm.attention_buffer_bytes("fa3", BS, W, CTX, topk=8)
    eager = vm.verify_buffer_bytes(_shape(cuda_graphs=False))
    assert eager == {"attention": 0, "logits": vm.logits_bytes(BS, W, VOCAB)}


def test_refusal_names_the_flags_the_numbers_and_what_fits():
    gib = float(1 << 30)
    free = 3.0 * gib  # the issue's 3.34 GiB does not fit
    with pytest.raises(vm.VerifyMemoryError) as err:
        vm.check_verify_memory(
            _shape(), free, mem_fraction_static=0.9, pre_model_load_bytes=79.0 * gib
        )
    msg = str(err.value)
    for flag in (
        "--speculative-num-draft-tokens 64",
        "--cuda-graph-max-bs-decode",
        "--context-length",
        "--mem-fraction-static",
    ):
        assert flag in msg, msg
    assert "3.34 GiB" in msg and "3.00 GiB" in msg and "1.88 GiB" in msg and "1.47 GiB" in msg

    # suggestions keep the buffers within half the free memory; brute force agrees
    def total(**kw):
        return sum(vm.verify_buffer_bytes(_shape(**kw)).values())

    fits = [w for w in range(2, W) if total(widths=(w,)) <= free / 2]
    assert f"--speculative-num-draft-tokens {max(fits)} (largest" in msg
    assert total(widths=(max(fits) + 1,)) > free / 2
    bs = [b for b in range(1, BS) if total(max_bs=b) <= free / 2]
    assert f"--cuda-graph-max-bs-decode {max(bs)} and --max-running-requests {max(bs)}" in msg
    # outside the KV cache twice the estimate: 0.9 - (2 x 3.34 - 3.00) / 79, rounded down
    lower = int((0.9 - (2 * total() - free) / (79.0 * gib)) * 1000) / 1000
    assert f"--mem-fraction-static {lower} " in msg


def test_fits_quietly_or_with_a_warning_above_half_the_free_memory(caplog):
    gib = float(1 << 30)
    with caplog.at_level(logging.WARNING, logger="sglang_spec_ext"):
        parts = vm.check_verify_memory(_shape(context_len=8192), 20.0 * gib)
    assert sum(parts.values()) < 10 * gib and not caplog.records
    with caplog.at_level(logging.WARNING, logger="sglang_spec_ext"):
        vm.check_verify_memory(_shape(), 5.0 * gib)
    assert "left after the KV cache" in caplog.text
