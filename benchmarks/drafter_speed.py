#!/usr/bin/env python
"""Drafter cost, acceptance: ours vs ArcticInference (benchmarks/results/drafter_speed.json).

Every drafter replays the same token streams the way a server drives it:
``start`` with the prompt, then per decoding step ``speculate`` (same depth,
width, factor, offset and min-prob for all) and ``extend`` with the committed
tokens (accepted draft tokens + the target's bonus token, found by greedy
verification against the recorded output), ``finish`` at the end; requests run
`--concurrency` at a time, round-robin. Only the drafter calls are timed.
The compiled drafters run in the same process in lockstep (one decoding step
each in turn, order rotated per repeat, so machine load and cache pressure hit
them alike); the slow Python reference runs on its own. The median over repeats
is reported.

Streams: synthetic repetitive sets (agentic edit loop, RAG copy, low-repetition
control) and, when present, recorded traces benchmarks/traces/*.jsonl (lines
``{"prompt_ids": [...], "output_ids": [...], "set": "..."}``), one row per set.

    python benchmarks/drafter_speed.py                       # ~1-3 min on 2 cores
    python benchmarks/drafter_speed.py --repeats 5 --width 8 --chain
ArcticInference comes from scripts/build_arctic.sh; without it its rows are skipped.
"""

from __future__ import annotations

import argparse
import gc
import importlib.metadata
import json
import statistics
import sys
import time
from collections import defaultdict, deque
from pathlib import Path

import numpy as np
from tqdm import tqdm

from sglang_spec_ext.machine import machine_info as shared_machine_info
from sglang_spec_ext.suffix import SuffixConfig, SuffixDrafter, native_available
from sglang_spec_ext.verify.layout import accepted_length

HERE = Path(__file__).resolve().parent
Stream = list[tuple[list[int], list[int]]]  # (prompt_ids, output_ids) per request


# ------------------------------------------------------------------ streams


def _zipf_tokens(rng: np.random.Generator, n: int, vocab: int = 32000) -> list[int]:
    return [int(t) % vocab for t in rng.zipf(1.2, size=n)]


def _edit(rng: np.random.Generator, toks: list[int], rate: float) -> list[int]:
    """Copy with chunk-level edits (replace / insert / delete), like a code edit."""
    out: list[int] = []
    for i in range(0, len(toks), 16):
        chunk = toks[i : i + 16]
        r = rng.random()
        if r < rate:
            out += _zipf_tokens(rng, int(rng.integers(4, 24)))
        elif r < rate * 1.5:
            continue
        else:
            out += chunk
    return out


def synthetic_streams(n_requests: int, seed: int) -> dict[str, Stream]:
    rng = np.random.default_rng(seed)
    system = _zipf_tokens(rng, 200)
    files = [_zipf_tokens(rng, int(rng.integers(200, 600))) for _ in range(12)]
    agentic: Stream = []
    for _ in range(n_requests):
        k = int(rng.integers(len(files)))
        prompt = system + files[k] + _zipf_tokens(rng, 24)
        out = _edit(rng, files[k], 0.08)
        files[k] = out  # the next turn on this file sees the edited version
        agentic.append((prompt, out))
    passages = [_zipf_tokens(rng, 150) for _ in range(60)]
    rag: Stream = []
    for _ in range(n_requests):
        chosen = [passages[int(i)] for i in rng.choice(len(passages), 3, replace=False)]
        prompt = system[:50] + sum(chosen, []) + _zipf_tokens(rng, 20)
        out: list[int] = []
        while len(out) < 250:
            p = chosen[int(rng.integers(3))]
            s = int(rng.integers(len(p)))
            out += p[s : s + int(rng.geometric(1 / 12))] + _zipf_tokens(
                rng, int(rng.integers(0, 4))
            )
        rag.append((prompt, out))
    control = [(_zipf_tokens(rng, 200), _zipf_tokens(rng, 200)) for _ in range(n_requests)]
    return {"synthetic-agentic": agentic, "synthetic-rag": rag, "synthetic-lowrep": control}


def trace_streams(directory: Path, limit: int | None) -> dict[str, Stream]:
    sets: dict[str, Stream] = defaultdict(list)
    for path in sorted(directory.glob("*.jsonl")):
        with open(path) as f:
            for line in f:
                if not line.strip():
                    continue
                rec = json.loads(line)
                label = "trace-" + str(rec.get("set", path.stem))
                if limit is None or len(sets[label]) < limit:
                    sets[label].append((list(rec["prompt_ids"]), list(rec["output_ids"])))
    return dict(sets)


# ----------------------------------------------------------------- drafters


class Ours:
    def __init__(self, cfg: SuffixConfig, backend: str) -> None:
        self.d = SuffixDrafter(cfg, backend)

    def start(self, rid: str, prompt: list[int]) -> None:
        self.d.start_request(rid, prompt)

    def draft(self, rid: str, hist: np.ndarray, n: int, max_nodes: int):
        return self.d.speculate(rid, max_nodes)

    def commit(self, rid: str, toks: list[int]) -> None:
        self.d.extend_request(rid, toks)

    def finish(self, rid: str) -> None:
        self.d.finish_request(rid)


class Arctic:
    """ArcticInference SuffixDecodingCache; the context goes in as a zero-copy
    int32 view (its fast path), as vLLM passes it."""

    def __init__(self, cfg: SuffixConfig) -> None:
        from arctic_inference.suffix_decoding import SuffixDecodingCache

        self.cfg = cfg
        self.c = SuffixDecodingCache(
            max_tree_depth=cfg.max_depth, max_cached_requests=cfg.max_cached_requests
        )

    def start(self, rid: str, prompt: list[int]) -> None:
        self.c.start_request(rid, prompt)

    def draft(self, rid: str, hist: np.ndarray, n: int, max_nodes: int):
        c = self.cfg
        d = self.c.speculate(
            rid,
            hist[max(0, n - c.max_depth) : n],
            max_spec_tokens=max_nodes,
            max_spec_factor=c.max_spec_factor,
            max_spec_offset=c.max_spec_offset,
            min_token_prob=c.min_token_prob,
            use_tree_spec=c.use_tree,
        )
        return _ArcticTree(d.token_ids, d.parents)

    def commit(self, rid: str, toks: list[int]) -> None:
        self.c.add_active_response(rid, toks)

    def finish(self, rid: str) -> None:
        self.c.stop_request(rid)


class _ArcticTree:
    __slots__ = ("tokens", "parents")

    def __init__(self, tokens, parents) -> None:
        self.tokens = list(tokens)
        self.parents = list(parents)


def arctic_version() -> str | None:
    try:
        import arctic_inference.suffix_decoding  # noqa: F401
    except ImportError:
        return None
    return importlib.metadata.version("arctic-inference")


# ------------------------------------------------------------------- replay


def replay(drafter, stream: Stream, width: int, concurrency: int, stats: dict):
    """Generator: runs the stream through one drafter, yielding after every
    decoding step (so several drafters can advance in lockstep); fills `stats`
    with times (ns, drafter calls only) and acceptance."""
    clock = time.perf_counter_ns
    max_nodes = width - 1
    t_spec = t_ext = t_life = 0
    steps = committed = 0
    pending = deque(enumerate(stream))
    active: list = []
    while pending or active:
        while pending and len(active) < concurrency:
            i, (prompt, out) = pending.popleft()
            rid = f"r{i}"
            hist = np.zeros(len(prompt) + len(out) + 1, dtype=np.int32)
            hist[: len(prompt)] = prompt
            t0 = clock()
            drafter.start(rid, prompt)
            t_life += clock() - t0
            active.append([rid, out, 0, hist, len(prompt)])
        still = []
        for req in active:
            rid, out, pos, hist, n = req
            t0 = clock()
            tree = drafter.draft(rid, hist, n, max_nodes)
            t_spec += clock() - t0
            acc = accepted_length(tree, out[pos : pos + max_nodes])
            take = out[pos : pos + acc + 1]
            t0 = clock()
            drafter.commit(rid, take)
            t_ext += clock() - t0
            hist[n : n + len(take)] = take
            req[2] = pos + len(take)
            req[4] = n + len(take)
            steps += 1
            committed += len(take)
            if req[2] >= len(out):
                t0 = clock()
                drafter.finish(rid)
                t_life += clock() - t0
            else:
                still.append(req)
            yield
        active = still
    stats.update(
        tokens=committed,
        steps=steps,
        accept_len=committed / max(steps, 1),
        ns_total=t_spec + t_ext + t_life,
        ns_speculate=t_spec,
        ns_extend=t_ext,
        ns_start_finish=t_life,
    )


def run_lockstep(drafters: dict, stream: Stream, width: int, concurrency: int) -> dict:
    """Replays the stream through all drafters, one decoding step each in turn."""
    stats = {name: {} for name in drafters}
    gens = [replay(d, stream, width, concurrency, stats[n]) for n, d in drafters.items()]
    gc.collect()
    while gens:
        gens = [g for g in gens if next(g, StopIteration) is not StopIteration]
    return stats


# --------------------------------------------------------------------- main


def machine_info() -> dict:
    """The shared machine description plus what this benchmark depends on."""
    info = shared_machine_info()
    info["native_backend"] = native_available()
    info["arctic_inference"] = arctic_version()
    return info


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    ap.add_argument(
        "--width", type=int, default=16, help="verify width incl. root (draft nodes = width-1)"
    )
    ap.add_argument("--max-depth", type=int, default=64)
    d = SuffixConfig()  # defaults: ours; ArcticInference gets the same settings
    ap.add_argument("--factor", type=float, default=d.max_spec_factor)
    ap.add_argument("--offset", type=float, default=d.max_spec_offset)
    ap.add_argument("--min-prob", type=float, default=d.min_token_prob)
    ap.add_argument("--chain", action="store_true", help="single-chain drafts (default: trees)")
    ap.add_argument("--concurrency", type=int, default=8)
    ap.add_argument("--requests", type=int, default=80, help="requests per synthetic set")
    ap.add_argument("--trace-limit", type=int, default=None, help="max requests per trace set")
    ap.add_argument("--repeats", type=int, default=5)
    ap.add_argument(
        "--python-repeats",
        type=int,
        default=1,
        help="repeats for the slow Python reference (0: skip)",
    )
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--out", type=Path, default=HERE / "results" / "drafter_speed.json")
    args = ap.parse_args(argv)

    cfg = SuffixConfig(
        max_depth=args.max_depth,
        max_spec_factor=args.factor,
        max_spec_offset=args.offset,
        min_token_prob=args.min_prob,
        use_tree=not args.chain,
    )
    sets = synthetic_streams(args.requests, args.seed)
    sets.update(trace_streams(HERE / "traces", args.trace_limit))
    makers = {}
    if native_available():
        makers["ours-native"] = lambda: Ours(cfg, "native")
    if args.python_repeats > 0:
        makers["ours-python"] = lambda: Ours(cfg, "python")
    if arctic_version() is not None:
        makers["arctic"] = lambda: Arctic(cfg)
    else:
        print(
            "arctic-inference not importable (run scripts/build_arctic.sh); skipping it",
            file=sys.stderr,
        )

    runs: dict[tuple[str, str], list[dict]] = defaultdict(list)
    names = list(makers)
    jobs = []
    fast = [n for n in names if n != "ours-python"]
    for rep in range(max(args.repeats, args.python_repeats)):
        for set_name in sets:
            order = fast[rep % len(fast) :] + fast[: rep % len(fast)] if fast else []
            if rep < args.repeats and order:
                jobs.append((set_name, order))
            if rep < args.python_repeats and "ours-python" in names:
                jobs.append((set_name, ["ours-python"]))  # alone: it would slow the others
    for set_name, order in tqdm(jobs, desc="lockstep replays", unit="run"):
        drafters = {name: makers[name]() for name in order}
        for name, st in run_lockstep(
            drafters, sets[set_name], args.width, args.concurrency
        ).items():
            runs[(set_name, name)].append(st)

    rows = []
    for set_name, stream in sets.items():
        base = runs.get((set_name, "arctic"))
        base_ns = statistics.median(r["ns_total"] for r in base) if base else None
        for name in names:
            rs = runs[(set_name, name)]
            ns = statistics.median(r["ns_total"] for r in rs)
            tok = rs[0]["tokens"]
            rows.append(
                {
                    "set": set_name,
                    "drafter": name,
                    "requests": len(stream),
                    "output_tokens": tok,
                    "steps": rs[0]["steps"],
                    "repeats": len(rs),
                    "us_per_token": ns / tok / 1e3,
                    "us_per_step_speculate": statistics.median(r["ns_speculate"] for r in rs)
                    / rs[0]["steps"]
                    / 1e3,
                    "us_per_token_extend": statistics.median(r["ns_extend"] for r in rs)
                    / tok
                    / 1e3,
                    "time_vs_arctic": ns / base_ns if base_ns else None,
                    "accept_len": rs[0]["accept_len"],
                    "all_us_per_token": [r["ns_total"] / tok / 1e3 for r in rs],
                }
            )
    params = vars(args) | {"out": str(args.out), "config": cfg.as_dict()}
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(
        json.dumps({"machine": machine_info(), "parameters": params, "rows": rows}, indent=2)
    )

    print(
        f"\nwidth={args.width} depth={args.max_depth} factor={args.factor} offset={args.offset} "
        f"min_prob={args.min_prob} {'chain' if args.chain else 'tree'} concurrency={args.concurrency}"
    )
    head = f"{'set':<22} {'drafter':<12} {'tokens':>7} {'us/token':>9} {'spec us/step':>12} {'ext us/tok':>10} {'vs arctic':>9} {'accept':>7}"
    print(head)
    print("-" * len(head))
    for r in rows:
        ratio = f"{r['time_vs_arctic']:.2f}x" if r["time_vs_arctic"] else "-"
        print(
            f"{r['set']:<22} {r['drafter']:<12} {r['output_tokens']:>7} {r['us_per_token']:>9.2f} "
            f"{r['us_per_step_speculate']:>12.2f} {r['us_per_token_extend']:>10.2f} {ratio:>9} {r['accept_len']:>7.3f}"
        )
    print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
