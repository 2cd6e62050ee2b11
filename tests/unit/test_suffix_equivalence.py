"""The native core returns exactly what the Python reference returns.

Random programs of start (in one of several scopes, or none) / extend (random
or copied tokens) / speculate / finish / abort / forced rebuild / corpora
attached and removed / the cached sequences exported and imported, over small
vocabularies and varied configs,
run side by side on: the native engine, the reference, and the reference with
its search shortcuts off (exhaustive over match lengths). After every step the
native tree's structural invariants are checked.
"""

from __future__ import annotations

import random

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter, native_available
from sglang_spec_ext.suffix.reference_engine import ReferenceEngine

pytestmark = pytest.mark.skipif(not native_available(), reason="native backend not built")


@st.composite
def configs(draw):
    """Varied settings, with small per-request windows, prompt caps and step
    budgets so that incremental insertion, window trimming and queued output
    tokens all happen within short programs."""
    depth = draw(st.integers(1, 10))
    return draw(
        base_configs.map(
            lambda c: SuffixConfig(
                **{
                    **c.as_dict(),
                    "max_depth": depth,
                    "max_request_tokens": depth + draw(st.sampled_from([0, 3, 12, 10**6])),
                    "global_prompt_cap": draw(st.sampled_from([0, 5, 10**6])),
                    "step_insert_tokens": draw(st.sampled_from([1, 4, 17, 4096])),
                    "max_scope_tokens": draw(st.sampled_from([0, 0, 6, 20])),
                }
            )
        )
    )


base_configs = st.builds(
    SuffixConfig,
    max_depth=st.just(1),
    max_spec_factor=st.sampled_from([0.0, 0.5, 1.0, 2.0]),
    max_spec_offset=st.sampled_from([-1.0, 0.0, 1.0, 2.5, 64.0]),
    min_token_prob=st.sampled_from([0.0, 0.1, 0.3, 0.6, 1.0]),
    max_cached_requests=st.sampled_from([0, 1, 2, 3, 100, 100]),
    max_cached_tokens=st.sampled_from([0, 8, 30, 1000, 1000]),
    cache_prompts=st.booleans(),
    use_tree=st.booleans(),
    merge_drafts=st.booleans(),
)
ops = st.lists(
    st.one_of(
        st.tuples(st.just("start"), st.integers(0, 20)),
        st.tuples(st.just("extend"), st.integers(0, 5)),
        st.tuples(st.just("copy"), st.integers(1, 10)),
        st.tuples(st.just("copy"), st.integers(1, 10)),
        st.tuples(st.just("spec"), st.integers(0, 9)),
        st.tuples(st.just("spec"), st.integers(3, 9)),
        st.tuples(st.just("finish"), st.just(0)),
        st.tuples(st.just("abort"), st.just(0)),
        st.tuples(st.just("compact"), st.just(0)),
        st.tuples(st.just("batch"), st.integers(0, 9)),
        st.tuples(st.just("flush"), st.just(0)),
        st.tuples(st.just("corpus"), st.integers(0, 4)),
        st.tuples(st.just("uncorpus"), st.integers(0, 4)),
        st.tuples(st.just("export"), st.just(0)),
        st.tuples(st.just("import"), st.integers(0, 3)),
    ),
    min_size=20,
    max_size=150,
)


SCOPES = ("", "a", "b", None)  # None: no global tree


def same(a, b) -> bool:
    return (
        a.tokens == b.tokens
        and a.parents == b.parents
        and a.match_len == b.match_len
        and len(a.probs) == len(b.probs)
        and all(abs(x - y) <= 1e-9 for x, y in zip(a.probs, b.probs, strict=True))
        and abs(a.score - b.score) <= 1e-9
    )


def run_program(cfg: SuffixConfig, vocab: int, program, seed: int) -> None:
    rng = random.Random(seed)
    native = SuffixDrafter(cfg, backend="native")
    ref = SuffixDrafter(cfg, backend="python")
    exhaustive = SuffixDrafter(cfg, backend="python")
    exhaustive._engine = ReferenceEngine(cfg, exhaustive=True, max_scope_tokens=cfg.scope_tokens)
    drafters = (native, ref, exhaustive)
    history: dict[str, list[int]] = {}  # every request ever started
    active: list[str] = []
    for n_op, (op, arg) in enumerate(program):
        rid = rng.choice(active) if active else None
        if op == "start" or rid is None:
            rid = f"r{n_op}"
            prompt = [rng.randrange(vocab) for _ in range(arg)]
            scope = SCOPES[arg % len(SCOPES)]
            for d in drafters:
                d.start_request(rid, prompt, scope=scope)
            history[rid] = list(prompt)
            active.append(rid)
        elif op in ("extend", "copy"):
            if op == "extend":
                toks = [rng.randrange(vocab) for _ in range(arg + 1)]
            else:  # repeat a stretch seen before: the case suffix decoding is for
                src = history[rng.choice(list(history))]
                start = rng.randrange(len(src) + 1)
                toks = src[start : start + arg] or [rng.randrange(vocab)]
            for d in drafters:
                d.extend_request(rid, toks)
            history[rid] += toks
        elif op == "spec":
            a, b, c = (d.speculate(rid, arg) for d in drafters)
            assert same(a, b), (cfg, history[rid], a, b)
            assert same(b, c), ("shortcut changed the result", cfg, b, c)
        elif op in ("finish", "abort"):
            for d in drafters:
                getattr(d, f"{op}_request")(rid)
            active.remove(rid)
        elif op == "batch":
            rids = active[: 1 + arg % 4]
            a, b, c = (d.speculate_batch(rids, arg) for d in drafters)
            for x, y, z in zip(a, b, c, strict=True):
                assert same(x, y), (cfg, x, y)
                assert same(y, z), ("shortcut changed the result", cfg, y, z)
        elif op == "flush":
            for d in drafters:
                d.flush()
        elif op == "compact":
            native._engine._compact()
        elif op == "corpus":  # stretches seen before, for some scopes or all
            docs = [history[r][rng.randrange(len(history[r]) + 1) :] for r in history]
            scopes = [s for s in SCOPES[: arg % 3] if s is not None]
            for d in drafters:
                d.attach_corpus(f"c{arg}", d.build_corpus(docs), scopes)
        elif op == "uncorpus":
            assert len({d.remove_corpus(f"c{arg}") for d in drafters}) == 1
        elif op == "export":
            a, b, c = (d.export_cached() for d in drafters)
            assert a == b == c
        elif op == "import":
            toks = history[rng.choice(list(history))]
            for d in drafters:
                d.import_cached(SCOPES[arg % 3], toks)
        assert native._engine._check() == ""
        keys = ("active_requests", "cached_requests", "cached_tokens", "local_tokens")
        keys += ("pending_tokens", "scopes", "corpora", "corpus_tokens")
        assert [native.stats()[k] for k in keys] == [ref.stats()[k] for k in keys]


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(cfg=configs(), vocab=st.sampled_from([2, 3, 5, 40]), program=ops, seed=st.integers(0, 2**16))
def test_native_matches_reference(cfg, vocab, program, seed):
    run_program(cfg, vocab, program, seed)


@pytest.mark.parametrize("seed", range(4))
def test_native_matches_reference_on_long_streams(seed):
    """Longer runs: hash-indexed nodes (many children), evictions, rebuilds."""
    rng = random.Random(seed)
    cfg = SuffixConfig(
        max_depth=rng.choice([6, 16]),
        max_cached_requests=rng.choice([4, 50]),
        max_cached_tokens=rng.choice([300, 5000]),
        max_spec_offset=rng.choice([0.0, 2.0, 64.0]),
        merge_drafts=seed < 2,
        use_tree=seed % 2 == 0,
        max_request_tokens=rng.choice([40, 10**6]),
        step_insert_tokens=rng.choice([7, 4096]),
    )
    program = [
        (
            rng.choice(["extend", "copy", "copy", "spec", "spec", "start", "finish", "abort"]),
            rng.randrange(1, 9) if rng.random() < 0.9 else 60,
        )
        for _ in range(600)
    ]
    program += [("compact", 0)]
    run_program(cfg, 40, program, seed)
