"""Our suffix drafter driven by replay (skipped until sglang_spec_ext.suffix is there)."""

from __future__ import annotations

import pytest

suffix = pytest.importorskip("sglang_spec_ext.suffix")

from sglang_spec_ext.replay import (  # noqa: E402
    DrafterOptions,
    TraceRecord,
    acceptance_table,
    drafter_factory,
    make_drafter,
    replay,
    simulate_fixed_budget,
)
from sglang_spec_ext.replay.drafters import suffix_config_kwargs  # noqa: E402

LOOP = (5, 6, 7, 8, 9, 10, 11, 12)
BODY = tuple(range(100, 150))
RECORDS = [
    TraceRecord((1, 2) + LOOP, LOOP * 5, "loop"),
    TraceRecord(BODY, BODY[:30] + (3, 4), "copy"),
    TraceRecord((9,), BODY[10:40], "global"),  # continues an earlier prompt and output
]


def test_selectable_and_configured() -> None:
    opts = DrafterOptions(
        max_depth=32, spec_factor=2.0, min_token_prob=0.2, extra={"cache_prompts": False}
    )
    d = make_drafter("suffix", opts)
    assert isinstance(d, suffix.SuffixDrafter)
    assert d.config.max_depth == 32 and d.config.max_spec_factor == 2.0
    assert d.config.cache_prompts is False
    assert "max_cached_requests" not in suffix_config_kwargs(DrafterOptions())  # -1: keep default


def test_unknown_suffix_setting() -> None:
    with pytest.raises(ValueError, match="bad suffix setting"):
        make_drafter("suffix", DrafterOptions(extra={"no_such_field": 1}))


@pytest.mark.parametrize("width", [2, 8, 16])
def test_drafts_valid_and_replay_matches_table(width: int) -> None:
    factory = drafter_factory("suffix", DrafterOptions(width=width))
    res = replay(RECORDS, factory, width, check=True)
    rows = acceptance_table(RECORDS, factory, [width - 1])
    assert [simulate_fixed_budget(r, width - 1) for r in rows] == res.steps


def test_repetition_is_accepted() -> None:
    res = replay(RECORDS, drafter_factory("suffix", DrafterOptions(width=16)), 16)
    for name in ("loop", "copy", "global"):
        assert res.by_set[name].summary()["accept_len"] > 2, name


def test_backends_agree() -> None:
    if not suffix.native_available():
        pytest.skip("native suffix core not built")
    steps = [
        replay(
            RECORDS, drafter_factory("suffix", DrafterOptions(width=16, suffix_backend=b)), 16
        ).steps
        for b in ("native", "python")
    ]
    assert steps[0] == steps[1]


def test_previous_suffix_is_selectable_and_the_defaults_draft_wider() -> None:
    from sglang_spec_ext.suffix.config import PREVIOUS_SUFFIX_SETTINGS

    prev = make_drafter("suffix-prev", DrafterOptions(max_depth=32))
    assert prev.config.max_depth == 32  # other options still apply
    for name, value in PREVIOUS_SUFFIX_SETTINGS.items():
        assert getattr(prev.config, name) == value
    now = make_drafter("suffix", DrafterOptions())
    assert now.config == suffix.SuffixConfig()  # replay's defaults are the drafter's
    # A short match: the previous budget (1 x match length) drafts 2 tokens, the
    # tuned default drafts to the width, and replay accepts more tokens per step.
    records = [TraceRecord((1, 2, 3, 4, 5, 6, 7, 8, 1, 2), (3, 4, 5, 6, 7, 8), "x")]
    wide = replay(records, make_drafter("suffix", DrafterOptions()), 8).overall
    narrow = replay(records, make_drafter("suffix-prev", DrafterOptions()), 8).overall
    assert wide.steps < narrow.steps and wide.decode_tokens == narrow.decode_tokens == 5
