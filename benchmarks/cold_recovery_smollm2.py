"""Cold recovery after zero draft steps, served (benchmarks/results/cold_recovery_smollm2*.json).

What skipping the zero-step draft extend costs a request that later drafts again.

SGLang's ``SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND=1`` makes zero draft steps plain
decoding, but a request that lives through such steps keeps no draft KV for the tokens
committed meanwhile, and drafts from zeroed top-k after an upshift ("cold recovery", the
host's word). This script measures that on the SGLang CPU engine: SmolLM2-135M-Instruct
with the 14 + 8-layer truncated draft (STANDALONE, topk 1, 3 steps), our controller with
hand-set tiers (``SGLANG_SPEC_EXT_ADAPTIVE_TIERS=1,2``, ``_PINNED_KS=3,0``: three steps
alone, zero steps with company). For each prompt (from the chat, code-edit and agentic
traces in turn) a long request A runs

* alone (three steps throughout: the undamaged acceptance), then
* beside a short request B (the next prompt): zero steps while B lives, then three
  steps alone,

on servers of one build that differ only in the flag: ``warm`` (the host default,
the draft extend runs at zero steps), ``skip`` and ``repair`` (our draft-KV repair:
skip, then rebuild the skipped draft KV when the request drafts again;
``sglang/model_drafts/kv_repair.py``); ``--servers`` picks them (warm always). A's decode
steps after B finished (its verify steps minus B's) and the tokens they committed give
A's accept length after the upshift; the servers' outputs must be identical (greedy).
Measured here; accept lengths do not depend on the device.

    .venv/bin/python benchmarks/cold_recovery_smollm2.py [--prompts 16] [--long 128] [--short 32]
        [--servers warm,skip,repair]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import signal
import sys
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

from adaptive_smollm2 import shape  # noqa: E402
from model_draft_smollm2 import run, serve  # noqa: E402

from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.replay.trace import read_trace  # noqa: E402

SKIP_ENV = "SGLANG_SPEC_SKIP_ZERO_STEP_DRAFT_EXTEND"
#: Server name -> its flag: the host default, the host's skip, our repair (sets the skip).
SERVERS = {"warm": {}, "skip": {SKIP_ENV: "1"}, "repair": {"SGLANG_SPEC_EXT_DRAFT_KV_REPAIR": "1"}}
#: Prompt sources (SmolLM2 token ids), taken in turn.
TRACE_SETS = ("chat", "code-edit", "agentic")


def prompt_pool(n: int) -> list[list[int]]:
    """``n`` distinct prompts, one from each trace set in turn."""
    sets = [read_trace(REPO / f"benchmarks/traces/{name}.jsonl") for name in TRACE_SETS]
    pool = [
        list(rs[i].prompt_ids) for i in range(max(map(len, sets))) for rs in sets if i < len(rs)
    ]
    if n > len(pool):
        raise SystemExit(f"--prompts {n}: the traces hold {len(pool)} prompts")
    return pool[:n]


def pair(server, a: list[int], b: list[int], long: int, short: int) -> tuple[dict, dict]:
    """A (``long`` tokens) and B (``short`` tokens) sent together."""
    with cf.ThreadPoolExecutor(2) as pool:
        fa = pool.submit(run, server, [a], long)
        fb = pool.submit(run, server, [b], short)
        return fa.result()[0], fb.result()[0]


def after_b(ra: dict, rb: dict) -> tuple[int, int]:
    """(tokens, verify steps) of A after B finished: B's steps were shared ones."""
    return ra["tokens"] - rb["verify_steps"], ra["verify_steps"] - rb["verify_steps"]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--prompts", type=int, default=16, help="long requests (A) per server")
    ap.add_argument("--long", type=int, default=128, help="A's max new tokens")
    ap.add_argument("--short", type=int, default=32, help="B's max new tokens")
    ap.add_argument(
        "--topk", type=int, default=1, help="draft tree width (1: chains; >1: topk trees)"
    )
    ap.add_argument(
        "--servers", default="warm,skip,repair", help=f"comma list of {', '.join(SERVERS)}"
    )
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/cold_recovery_smollm2.json"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir, ensure_smollm2_draft

    model = ensure_smollm2_dir()
    weak = ensure_smollm2_draft()
    pool = prompt_pool(args.prompts + 1)
    cases = [(pool[i], pool[i + 1]) for i in range(args.prompts)]  # (A, B)
    extra = ["--speculative-algorithm", "STANDALONE", "--speculative-draft-model-path",
             str(weak), *shape(3)]  # fmt: skip
    if args.topk > 1:  # trees of 3 steps, verifying up to 2 * topk tokens
        extra[-3:] = [str(args.topk), "--speculative-num-draft-tokens", str(2 * args.topk)]
    env = {"SGLANG_SPEC_EXT_ADAPTIVE": "1", "SGLANG_SPEC_EXT_ADAPTIVE_TIERS": "1,2",
           "SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS": "3,0"}  # fmt: skip
    names = [n.strip() for n in args.servers.split(",") if n.strip()]
    if "warm" not in names or any(n not in SERVERS for n in names):
        raise SystemExit(f"--servers {args.servers}: warm plus any of {', '.join(SERVERS)}")
    servers = {n: SERVERS[n] for n in names}
    rows: dict[str, list[dict]] = {}
    bar = tqdm(total=len(servers) * len(cases), desc="servers x prompts", file=sys.stderr)
    for name, flag in servers.items():
        server = serve(model, extra, f"cold-{name}")
        server.env.update({**env, **flag})
        rows[name] = []
        with server:
            run(server, [pool[0][:8]], 4)  # warm-up
            for a, b in cases:
                alone = run(server, [a], args.long)[0]
                ra, rb = pair(server, a, b, args.long, args.short)
                rows[name].append({"alone": alone, "a": ra, "b": rb})
                bar.update(1)
    bar.close()

    def totals(name: str) -> dict:
        alone_tok = sum(r["alone"]["tokens"] for r in rows[name])
        alone_steps = sum(r["alone"]["verify_steps"] for r in rows[name])
        # pairs where A outlived B (an early end of A leaves nothing after B)
        after = [x for x in (after_b(r["a"], r["b"]) for r in rows[name]) if x[1] > 0]
        tok_after, steps_after = sum(t for t, _ in after), sum(s for _, s in after)
        return {
            "alone_accept_length": round(alone_tok / alone_steps, 3),
            "after_zero_steps_accept_length": round(tok_after / steps_after, 3),
            "a_tokens_after": tok_after,
            "a_steps_after": steps_after,
            "pairs_counted": len(after),
            "shared_steps": sum(r["b"]["verify_steps"] for r in rows[name]),
        }

    summary = {name: totals(name) for name in servers}
    same = all(
        x[key]["output_ids"] == y[key]["output_ids"]
        for name in servers
        for x, y in zip(rows["warm"], rows[name], strict=True)
        for key in ("alone", "a", "b")
    )
    warm_gain = summary["warm"]["after_zero_steps_accept_length"] - 1
    loss = {
        name: round(1 - (v["after_zero_steps_accept_length"] - 1) / warm_gain, 3)
        for name, v in summary.items()
        if name != "warm"
    }
    report = {
        "what": "accept length of a request after zero draft steps, with the zero-step draft "
        "extend run (warm), skipped (skip) or skipped and rebuilt at the upshift (repair); "
        "SmolLM2-135M-Instruct target, 14+8-layer truncated draft, STANDALONE 3 steps, SGLang CPU engine, greedy; measured",
        "machine": machine_info(),
        "parameters": {
            "prompts": args.prompts,
            "long": args.long,
            "short": args.short,
            "tiers": env["SGLANG_SPEC_EXT_ADAPTIVE_TIERS"],
            "pinned_ks": env["SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS"],
            "topk": args.topk,
        },
        "results": summary,
        "loses_of_accepted_drafts_vs_warm": loss,
        "outputs_identical": same,
        "rows": {  # per request: tokens, verify steps, seconds (output ids compared above)
            name: [
                {key: {f: v for f, v in r.items() if f != "output_ids"} for key, r in case.items()}
                for case in cases_rows
            ]
            for name, cases_rows in rows.items()
        },
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    print("accept length (tokens per verify step) of the long request A; measured here")
    print(f"{'server':<8}{'A alone':>10}{'A after zero steps':>20}{'A steps after':>15}")
    for name, v in summary.items():
        print(f"{name:<8}{v['alone_accept_length']:>10.3f}"
              f"{v['after_zero_steps_accept_length']:>20.3f}{v['a_steps_after']:>15}")  # fmt: skip
    for name, lost in loss.items():
        print(f"{name} loses {lost:.1%} of the drafts warm accepts after zero steps")
    print(f"outputs identical: {'yes' if same else 'NO'}")
    print(f"JSON: {args.json}")
    return 0 if same else 1


if __name__ == "__main__":
    sys.exit(main())
