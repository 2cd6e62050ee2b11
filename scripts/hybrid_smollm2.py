"""HYBRID served on SmolLM2-135M-Instruct with a weak draft, SGLang CPU engine.

Four servers, one workload: plain decoding, SUFFIX alone, STANDALONE alone (the
14 + 8-layer draft of ``build_truncated_draft``) and HYBRID (the same draft plus the
suffix drafter), all verifying ``--speculative-num-steps 3 --speculative-eagle-topk 1
--speculative-num-draft-tokens 4`` (SUFFIX at the same verify width, chain drafts).
The workload mixes chat (MT-bench / ShareGPT first turns from the committed chat
trace) and code edits (the README demo's), interleaved, sent together. Prints and
writes (JSON) whether each server's greedy output equals plain serving, the accept
length the host reports (committed tokens per verify step), and HYBRID's per-source
shares from its log.

    .venv/bin/python scripts/hybrid_smollm2.py [--per-kind 4] [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import concurrent.futures as cf
import json
import signal
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "scripts"))

from model_draft_smollm2 import run, serve  # noqa: E402

from sglang_spec_ext.machine import machine_info  # noqa: E402

SHAPE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]  # fmt: skip
CHAIN = {"SGLANG_SPEC_EXT_USE_TREE": "0"}  # SUFFIX at the chain shape HYBRID verifies


def workload(tok, per_kind: int) -> list[tuple[str, list[int]]]:
    from sglang_spec_ext.demo_workloads import code_edit_cases
    from sglang_spec_ext.replay.trace import read_trace

    chat = [("chat", list(r.prompt_ids)) for r in read_trace(REPO / "benchmarks/traces/chat.jsonl")]
    edits = [
        ("code-edit", tok.apply_chat_template(
            [{"role": r, "content": c} for r, c in case.messages],
            add_generation_prompt=True, tokenize=True, return_dict=False))
        for case in code_edit_cases(per_kind)
    ]  # fmt: skip
    mixed = []
    for a, b in zip(chat[:per_kind], edits[:per_kind], strict=False):
        mixed += [a, b]
    return mixed


def run_all(server, prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    with cf.ThreadPoolExecutor(len(prompts)) as pool:
        return list(pool.map(lambda p: run(server, [p], max_new_tokens)[0], prompts))


def hybrid_shares(log_path: Path) -> dict | None:
    from sglang_spec_ext.sglang.hybrid_worker import STATS_LOG_MARK

    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if STATS_LOG_MARK in ln]
    if not lines:
        return None
    stats = json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])
    return {"by_source": stats["by_source"], "learned": stats["learned"]}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-kind", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/hybrid_smollm2.json"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from sglang_spec_ext.demo_model import ensure_smollm2_dir, ensure_smollm2_draft

    model = ensure_smollm2_dir()
    weak = ensure_smollm2_draft()
    tok = AutoTokenizer.from_pretrained(model)
    cases = workload(tok, args.per_kind)
    prompts = [ids for _, ids in cases]
    draft = ["--speculative-draft-model-path", str(weak), *SHAPE]
    configs = {
        "plain": ([], {}),
        "SUFFIX": (["--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", "4"],
                   CHAIN),
        "STANDALONE": (["--speculative-algorithm", "STANDALONE", *draft], {}),
        "HYBRID": (["--speculative-algorithm", "HYBRID", *draft],
                   {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}),
    }  # fmt: skip
    runs, shares = {}, None
    for name, (extra, env) in configs.items():
        print(f"[hybrid] {name} ...", file=sys.stderr)
        server = serve(model, extra, name.lower())
        server.env.update(env)
        with server:
            run(server, [prompts[0][:8]], 4)  # warm-up
            runs[name] = run_all(server, prompts, args.max_new_tokens)
            if name == "HYBRID":
                shares = hybrid_shares(server.log_path)
    base = runs["plain"]
    summary = {}
    for name, rows in runs.items():
        per_kind = {}
        for kind in ("chat", "code-edit"):
            sel = [r for (k, _), r in zip(cases, rows, strict=True) if k == kind]
            tokens, steps = sum(r["tokens"] for r in sel), sum(r["verify_steps"] for r in sel)
            per_kind[kind] = tokens / steps if steps else None
        tokens, steps = sum(r["tokens"] for r in rows), sum(r["verify_steps"] for r in rows)
        summary[name] = {
            "identical_to_plain": all(
                a["output_ids"] == b["output_ids"] for a, b in zip(rows, base, strict=True)
            ),
            "accept_length": tokens / steps if steps else None,
            "accept_length_by_kind": per_kind,
            "tokens": tokens,
        }
    best_single = max(summary[n]["accept_length"] for n in ("SUFFIX", "STANDALONE"))
    ratio = summary["HYBRID"]["accept_length"] / best_single
    result = {
        "what": "SmolLM2-135M-Instruct target, 14+8-layer truncated draft, SGLang CPU engine, "
        "greedy, all requests sent together; steps 3, topk 1, verify width 4",
        "machine": machine_info(),
        "parameters": {
            "per_kind": args.per_kind,
            "max_new_tokens": args.max_new_tokens,
            "requests": len(prompts),
        },  # fmt: skip
        "results": summary,
        "hybrid_vs_best_single": ratio,
        "hybrid_sources": shares,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'server':<12}{'accept len':>11}{'chat':>7}{'code-edit':>10}{'identical':>11}")
    for name, row in summary.items():
        k = row["accept_length_by_kind"]
        print(f"{name:<12}{(row['accept_length'] or 1.0):>11.2f}{(k['chat'] or 1.0):>7.2f}"
              f"{(k['code-edit'] or 1.0):>10.2f}"
              f"{'yes' if row['identical_to_plain'] else 'NO':>11}")  # fmt: skip
    if shares:
        by = shares["by_source"]
        print("HYBRID steps from suffix / model: "
              f"{by['suffix']['step_share']:.0%} / {by['model']['step_share']:.0%}; committed "
              f"tokens {by['suffix']['token_share']:.0%} / {by['model']['token_share']:.0%}")  # fmt: skip
    print(f"HYBRID / best of SUFFIX and STANDALONE: {ratio:.3f}x")
    print(f"JSON: {args.json}")
    return 0 if all(r["identical_to_plain"] for r in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
