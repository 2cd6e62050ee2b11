"""HYBRID replay: trace records with model drafts, exact accept lengths on hand-made
cases, the single-source policies against the plain replay engine, and the learned
choice on a workload where each source is right on half the requests."""

from __future__ import annotations

import json
import random

import pytest

pytest.importorskip("sglang_spec_ext.suffix")

from sglang_spec_ext.hybrid.choice import MODEL, SUFFIX, HybridState  # noqa: E402
from sglang_spec_ext.replay import DrafterOptions, make_drafter, replay  # noqa: E402
from sglang_spec_ext.replay.hybrid import ORACLE, interleave, replay_hybrid  # noqa: E402
from sglang_spec_ext.replay.trace import (  # noqa: E402
    ModelDrafts,
    TraceError,
    TraceRecord,
    read_trace,
    write_trace,
)

DRAFT = "toy"


def _drafts(chains: list[list[int]], probs: list[list[float]] | float) -> dict[str, ModelDrafts]:
    k = len(chains[0]) if chains else 1
    if isinstance(probs, float):
        probs = [[probs] * k for _ in chains]
    return {
        DRAFT: ModelDrafts(
            k=k,
            tokens=tuple(tuple(c) for c in chains),
            probs=tuple(tuple(p) for p in probs),
        )
    }


def _true_chains(out: tuple[int, ...], k: int, pad: int = 0) -> list[list[int]]:
    return [[out[p + j] if p + j < len(out) else pad for j in range(k)] for p in range(len(out))]


# -- trace format ---------------------------------------------------------------------


def test_model_drafts_round_trip_and_stay_optional(tmp_path):
    out = (10, 11, 12)
    rec = TraceRecord((1, 2), out, "chat", _drafts(_true_chains(out, 2), 0.5))
    plain = TraceRecord((1, 2), out, "chat")
    path = tmp_path / "t.jsonl"
    write_trace(path, [rec, plain])
    lines = [json.loads(x) for x in path.read_text().splitlines()]
    assert lines[0]["model_drafts"][DRAFT]["tokens"] == [[10, 11], [11, 12], [12, 0]]
    assert "model_drafts" not in lines[1]
    assert read_trace(path) == [rec, plain]
    assert hash(rec) == hash(TraceRecord((1, 2), out, "chat"))  # still hashable


@pytest.mark.parametrize(
    ("drafts", "message"),
    [
        ({"d": {"k": 2, "tokens": [[1, 2]], "probs": [[0.5, 0.5]]}}, "one per output token"),
        ({"d": {"k": 2, "tokens": [[1, 2], [1]], "probs": [[0.5, 0.5]] * 2}}, "position 1"),
        ({"d": {"k": 2, "tokens": [[1, 2]] * 2, "probs": [[0.5, 1.5]] * 2}}, "probability"),
        ({"d": {"k": 2, "tokens": [[1, -2]] * 2, "probs": [[0.5, 0.5]] * 2}}, "token id"),
        ({"d": {"k": 0, "tokens": [[], []], "probs": [[], []]}}, '"k"'),
        ({"d": {"tokens": [[1]] * 2, "probs": [[0.5]] * 2}}, 'missing "k"'),
        ({"d": [1, 2]}, "must be an object"),
        ([1], '"model_drafts" must be an object'),
    ],
)
def test_bad_model_drafts_name_file_and_line(tmp_path, drafts, message):
    path = tmp_path / "bad.jsonl"
    good = {"prompt_ids": [1], "output_ids": [5, 6]}
    path.write_text(json.dumps(good) + "\n" + json.dumps({**good, "model_drafts": drafts}) + "\n")
    with pytest.raises(TraceError, match=rf"bad\.jsonl:2: .*{message}"):
        read_trace(path)


# -- exact replay -----------------------------------------------------------------------

OUT = tuple(range(10, 18))  # 8 output tokens


def _handmade(k: int) -> TraceRecord:
    """At positions p % 3 == 1 the chain is right throughout, elsewhere only its
    first token is."""
    chains = []
    for p in range(len(OUT)):
        if p % 3 == 1:
            chains.append([OUT[p + j] if p + j < len(OUT) else 0 for j in range(k)])
        else:
            chains.append([OUT[p]] + [99] * (k - 1))
    return TraceRecord((1, 2, 3), OUT, "x", _drafts(chains, 0.5))


def test_model_policy_accept_length_by_hand():
    # Prefill commits OUT[0]. K=3: pos 1 accepts 3 (+bonus: 4 tokens) -> pos 5 accepts
    # 1 (2 tokens) -> pos 7 accepts its first token, the output's last: 1 token.
    res = replay_hybrid([_handmade(4)], "model", steps=3)
    assert res.commits == [[4, 2, 1]] and res.sources == [[MODEL] * 3]
    assert res.overall.summary()["accept_len"] == pytest.approx(7 / 3)
    assert res.overall.accepted == 3 + 1 + 1
    # K=4 uses the stored chains' 4th token: pos 1 -> 5 tokens, pos 6 -> 2 tokens.
    res4 = replay_hybrid([_handmade(4)], "model", steps=4)
    assert res4.commits == [[5, 2]] and res4.overall.summary()["accept_len"] == 3.5
    # A narrower verify width truncates the chain: width 3 holds 2 draft tokens;
    # pos 1 -> 3 tokens, pos 4 -> 3 tokens, pos 7 -> the last token.
    res_w = replay_hybrid([_handmade(4)], "model", steps=4, width=3)
    assert res_w.commits == [[3, 3, 1]]
    by = res.overall.summary()["by_source"]
    assert by[MODEL]["step_share"] == 1.0 and by[SUFFIX]["steps"] == 0


def test_replay_rejects_records_without_the_draft():
    with pytest.raises(ValueError, match="no model draft"):
        replay_hybrid(
            [_handmade(3), TraceRecord((1,), (2, 3), "y")], "model", steps=3, draft_name=DRAFT
        )
    with pytest.raises(ValueError, match="fewer than"):
        replay_hybrid([_handmade(3)], "model", steps=5)
    with pytest.raises(ValueError, match="name one"):
        replay_hybrid([TraceRecord((1,), (2, 3), "y")], "model")


def _random_records(seed: int, n: int = 8) -> list[TraceRecord]:
    """Repetitive outputs (loops, copies of the prompt, text of earlier requests) with
    random model drafts."""
    rng = random.Random(seed)
    body = [rng.randrange(100, 160) for _ in range(60)]
    recs = []
    for i in range(n):
        a = rng.randrange(0, 30)
        out = tuple(body[a : a + 25] + [rng.randrange(100, 160) for _ in range(10)] + body[:8])
        prompt = tuple(body[a : a + 20]) if i % 2 else (1, 2, 3)
        chains = [[rng.choice((t, 7)) for t in c] for c in _true_chains(out, 8)]
        probs = [[round(rng.random(), 3) for _ in range(8)] for _ in out]
        recs.append(TraceRecord(prompt, out, f"s{i % 2}", _drafts(chains, probs)))
    return recs


@pytest.mark.parametrize("k", [3, 5, 8])
def test_suffix_policy_equals_the_plain_replay_engine(k):
    records = _random_records(seed=k)
    width = k + 1
    res = replay_hybrid(records, SUFFIX, steps=k)
    plain = replay(records, make_drafter("suffix", DrafterOptions(width=width)), width)
    assert res.commits == plain.steps
    assert res.overall.summary()["accept_len"] == plain.overall.summary()["accept_len"]
    for name, stats in plain.by_set.items():
        assert res.by_set[name].summary()["accept_len"] == stats.summary()["accept_len"]
    assert res.overall.by_source[SUFFIX].steps == plain.overall.steps
    assert res.overall.by_source[MODEL].steps == 0  # even where the suffix draft is empty


def _two_kinds(n: int, copy_prob: float = 0.97, seed: int = 0) -> list[TraceRecord]:
    """Half the requests copy a document from their prompt (the suffix draft is right,
    the model draft is confidently wrong: ``copy_prob`` per token); the others write
    fresh text the model predicts (with modest confidence) and the suffix tree has
    never seen."""
    rng = random.Random(seed)
    recs = []
    for i in range(n):
        if i % 2 == 0:
            doc = tuple(rng.randrange(1000, 9000) for _ in range(60))
            out = doc[:50]
            chains = [[rng.randrange(1000, 9000) for _ in range(5)] for _ in out]
            recs.append(TraceRecord((1,) + doc, out, "copy", _drafts(chains, copy_prob)))
        else:
            out = tuple(rng.randrange(1000, 9000) for _ in range(50))
            recs.append(TraceRecord((2, 3), out, "fresh", _drafts(_true_chains(out, 5), 0.6)))
    return recs


def test_learned_choice_beats_each_source_alone_and_the_fixed_rules():
    records = _two_kinds(24)
    al = {
        p: replay_hybrid(records, p, steps=5).overall.summary()["accept_len"]
        for p in ("suffix", "model", "arctic", "match", "learned", ORACLE)
    }
    assert al[ORACLE] >= max(al.values()), al  # the hindsight bound
    best_single = max(al["suffix"], al["model"])
    assert al["learned"] >= best_single + 0.5, al  # each source is right on half the work
    assert al["learned"] >= al["arctic"] and al["learned"] >= al["match"], al
    res = replay_hybrid(records, "learned", steps=5)
    late = res.sources[len(records) // 2 :]
    copy_steps = [s for i, src in enumerate(late) if records[len(records) // 2 + i].set == "copy"
                  for s in src]  # fmt: skip
    fresh_steps = [s for i, src in enumerate(late) if records[len(records) // 2 + i].set == "fresh"
                   for s in src]  # fmt: skip
    assert copy_steps.count(SUFFIX) > 0.9 * len(copy_steps)
    assert fresh_steps.count(MODEL) > 0.9 * len(fresh_steps)
    by = res.overall.summary()["by_source"]
    assert by[SUFFIX]["step_share"] + by[MODEL]["step_share"] == pytest.approx(1.0)
    assert res.estimator[MODEL] and res.estimator[SUFFIX]


def test_learning_overrides_a_misleading_prior():
    """The model draft is certain (score 5, as high as the suffix draft's) and wrong
    on the copy requests: the priors alone pick it there, the learned gains do not."""
    records = _two_kinds(24, copy_prob=1.0)
    al = {p: replay_hybrid(records, p, steps=5).overall.summary()["accept_len"]
          for p in ("suffix", "model", "learned")}  # fmt: skip
    assert al["learned"] >= max(al["suffix"], al["model"]) + 0.5, al
    frozen = HybridState("learned")
    frozen.estimator.observe = lambda *a: None  # type: ignore[method-assign]  # no learning
    prior_only = replay_hybrid(records, "learned", steps=5, state=frozen)
    assert prior_only.overall.summary()["accept_len"] < al["learned"] - 1.0


def test_interleave_alternates_and_relabels():
    a = [TraceRecord((1,), (i,), "a") for i in range(3)]
    b = [TraceRecord((2,), (10 + i,), "b") for i in range(2)]
    mixed = interleave(a, b)
    assert [r.output_ids[0] for r in mixed] == [0, 10, 1, 11, 2]
    assert {r.set for r in mixed} == {"mixed"}


def test_skipping_the_model_draft_where_the_suffix_wins_before_it():
    """With ``skip_model`` the replay takes the suffix draft without a model draft
    exactly where the pre-draft rule says it wins whatever the model drafts: on copy
    requests (the model's first token at low confidence) most steps; never a loss of
    committed tokens against choosing after the model drafted there."""
    records = _two_kinds(24, copy_prob=0.05)
    full = replay_hybrid(records, "learned", steps=5)
    skip = replay_hybrid(records, "learned", steps=5, skip_model=True)
    assert skip.overall.model_skipped > 0
    assert full.overall.model_skipped == 0
    assert sum(map(sum, skip.commits)) == sum(map(sum, full.commits))  # every output token
    share = skip.overall.summary()["model_skipped_share"]
    print(f"\nsteps with no model draft: {share:.1%}; accept length "
          f"{full.overall.summary()['accept_len']:.3f} -> {skip.overall.summary()['accept_len']:.3f}")  # fmt: skip
    assert skip.by_set["fresh"].model_skipped <= skip.by_set["copy"].model_skipped
    always = replay_hybrid(records, SUFFIX, steps=5, skip_model=True)
    assert always.overall.model_skipped == always.overall.steps  # the suffix policy never needs it
    assert always.commits == replay_hybrid(records, SUFFIX, steps=5).commits
