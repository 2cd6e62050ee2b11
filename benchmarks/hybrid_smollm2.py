"""HYBRID served on SmolLM2-135M on CPU (benchmarks/results/hybrid_smollm2[_mtp][_stepsN].json).

SmolLM2-135M-Instruct with a weak draft, four servers, one workload: plain decoding,
SUFFIX alone, STANDALONE alone (the 14 + 8-layer draft of ``build_truncated_draft``) and
HYBRID (the same draft plus the suffix drafter), all verifying ``--speculative-num-steps 3
--speculative-eagle-topk 1 --speculative-num-draft-tokens 4`` (SUFFIX at the same verify
width, chain drafts; ``--steps N`` verifies N-step chains at width N + 1 instead).
The workload mixes chat (MT-bench / ShareGPT first turns from the committed chat
trace) and code edits (the README demo's), interleaved, sent together. Prints and
writes (JSON) whether each server's greedy output equals plain serving, the accept
length the host reports (committed tokens per verify step), and HYBRID's per-source
shares from its log, in each serving mode of the CPU test bed: eager, overlap
scheduling (``SGLANG_SPEC_EXT_CPU_OVERLAP=1``) and graph runners with overlap
(``SGLANG_SPEC_EXT_CPU_GRAPHS=1`` too).

With ``--draft mtp`` the target is SmolLM2 as MiMo with its trained MTP layer
(``sglang-spec-ext make-model smollm2-mtp``) and the model draft is that layer: NEXTN
(``--speculative-algorithm NEXTN``, no draft path) instead of STANDALONE, and HYBRID
with no draft path (its MTP layer against the suffix drafts); plain and SUFFIX are
served on the same checkpoint.

    .venv/bin/python benchmarks/hybrid_smollm2.py [--per-kind 4] [--max-new-tokens 48]
        [--modes eager,overlap,graphs] [--draft weak|mtp] [--steps 3] [--rules]
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
sys.path.insert(0, str(REPO / "benchmarks"))

from model_draft_smollm2 import run, serve  # noqa: E402

from sglang_spec_ext.machine import machine_info  # noqa: E402


def shape(steps: int) -> list[str]:
    """A top-1 chain of ``steps`` draft steps, verify width ``steps + 1``."""
    return ["--speculative-num-steps", str(steps), "--speculative-eagle-topk", "1",
            "--speculative-num-draft-tokens", str(steps + 1)]  # fmt: skip


CHAIN = {"SGLANG_SPEC_EXT_USE_TREE": "0"}  # SUFFIX at the chain shape HYBRID verifies


def workload(tok, per_kind: int) -> list[tuple[str, list[int]]]:
    from sglang_spec_ext.bench.demo_workloads import code_edit_cases
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
    from sglang_spec_ext.sglang.workers.hybrid_worker import STATS_LOG_MARK

    lines = [ln for ln in log_path.read_text(errors="replace").splitlines() if STATS_LOG_MARK in ln]
    if not lines:
        return None
    stats = json.loads(lines[-1].split(STATS_LOG_MARK, 1)[1])
    return {"by_source": stats["by_source"], "learned": stats["learned"]}


#: Serving modes of the CPU test bed: (environment, extra server args).
MODES = {
    "eager": ({"SGLANG_SPEC_EXT_CPU_OVERLAP": "0", "SGLANG_SPEC_EXT_CPU_GRAPHS": "0"}, []),
    "overlap": ({"SGLANG_SPEC_EXT_CPU_OVERLAP": "1", "SGLANG_SPEC_EXT_CPU_GRAPHS": "0"}, []),
    "graphs": ({"SGLANG_SPEC_EXT_CPU_OVERLAP": "1", "SGLANG_SPEC_EXT_CPU_GRAPHS": "1"},
               ["--cuda-graph-bs-decode", "1", "2", "4", "8"]),
}  # fmt: skip


def summarize(cases: list, runs: dict[str, list[dict]], base: list[dict]) -> dict:
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
    return summary


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--per-kind", type=int, default=4)
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--modes", default="eager,overlap,graphs",
                    help=f"comma-separated, of {', '.join(MODES)}")  # fmt: skip
    ap.add_argument("--draft", choices=("weak", "mtp"), default="weak",
                    help="weak: 14+8-layer STANDALONE draft; mtp: the target's trained MTP layer")  # fmt: skip
    ap.add_argument("--rules", action="store_true",
                    help="also serve HYBRID with ArcticInference's threshold rule and the "
                    "match-length rule (SGLANG_SPEC_EXT_HYBRID_POLICY=arctic, match)")  # fmt: skip
    ap.add_argument("--steps", type=int, default=3,
                    help="draft steps of the chain (verify width steps + 1); 1 is the host "
                    "docs' MiMo-7B-RL setting")  # fmt: skip
    ap.add_argument(
        "--json",
        default=None,
        help="default benchmarks/results/hybrid_smollm2[_mtp][_stepsN].json (N when not 3)",
    )
    args = ap.parse_args(argv)
    modes = [m.strip() for m in args.modes.split(",") if m.strip()]
    if not modes or any(m not in MODES for m in modes):
        ap.error(f"--modes {args.modes!r}: expected a comma-separated subset of {list(MODES)}")
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from tqdm import tqdm
    from transformers import AutoTokenizer

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir, ensure_smollm2_draft

    if not 1 <= args.steps <= 8:
        ap.error(f"--steps {args.steps}: expected 1 to 8")
    mtp = args.draft == "mtp"
    chain = shape(args.steps)
    if args.json is None:
        tag = ("_mtp" if mtp else "") + (f"_steps{args.steps}" if args.steps != 3 else "")
        args.json = str(REPO / f"benchmarks/results/hybrid_smollm2{tag}.json")
    if mtp:
        from sglang_spec_ext.models.smollm2_mtp import ensure_smollm2_mtp

        model, single = ensure_smollm2_mtp(), "NEXTN"
        draft = chain  # the target's own MTP layer: no draft path
    else:
        model, single = ensure_smollm2_dir(), "STANDALONE"
        draft = ["--speculative-draft-model-path", str(ensure_smollm2_draft()), *chain]
    tok = AutoTokenizer.from_pretrained(model)
    cases = workload(tok, args.per_kind)
    prompts = [ids for _, ids in cases]
    configs = {
        "plain": ([], {}),
        "SUFFIX": (["--speculative-algorithm", "SUFFIX",
                    "--speculative-num-draft-tokens", str(args.steps + 1)], CHAIN),
        single: (["--speculative-algorithm", single, *draft], {}),
        "HYBRID": (["--speculative-algorithm", "HYBRID", *draft],
                   {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}),
    }  # fmt: skip
    if args.rules:  # HYBRID's choice by ArcticInference's and Baseten's fixed rules
        for rule in ("arctic", "match"):
            configs[f"HYBRID-{rule}"] = (configs["HYBRID"][0], {
                **configs["HYBRID"][1], "SGLANG_SPEC_EXT_HYBRID_POLICY": rule})  # fmt: skip
    by_mode: dict[str, dict] = {}
    # plain decoding once (greedy output does not depend on the mode): every mode's
    # reference for identical output
    jobs = [(modes[0], "plain")] + [(m, n) for m in modes for n in configs if n != "plain"]
    runs: dict[str, dict[str, list[dict]]] = {mode: {} for mode in modes}
    shares: dict[str, dict | None] = {}
    for mode, name in tqdm(jobs, desc="servers", unit="server"):
        extra, env = configs[name]
        mode_env, mode_args = MODES[mode]
        server = serve(model, [*extra, *mode_args], f"{name.lower()}-{mode}")
        server.env.update({**env, **mode_env})
        with server:
            run(server, [prompts[0][:8]], 4)  # warm-up
            runs[mode][name] = run_all(server, prompts, args.max_new_tokens)
            if name == "HYBRID":
                shares[mode] = hybrid_shares(server.log_path)
    base = runs[modes[0]]["plain"]
    for mode in modes:
        summary = summarize(cases, runs[mode], base)
        best_single = max(summary[n]["accept_length"] for n in ("SUFFIX", single))
        by_mode[mode] = {
            "results": summary,
            "hybrid_vs_best_single": summary["HYBRID"]["accept_length"] / best_single,
            f"hybrid_vs_{single.lower()}": summary["HYBRID"]["accept_length"]
            / summary[single]["accept_length"],
            "hybrid_sources": shares.get(mode),
        }
    result = {
        "what": (
            "SmolLM2-135M-Instruct as MiMo with its trained MTP layer (NEXTN, HYBRID: no "
            "draft path)"
            if mtp
            else "SmolLM2-135M-Instruct target, 14+8-layer truncated draft"
        )
        + ", SGLang CPU engine, "
        f"greedy, all requests sent together; steps {args.steps}, topk 1, verify width "
        f"{args.steps + 1}; per serving "
        "mode of the CPU test bed (eager; SGLANG_SPEC_EXT_CPU_OVERLAP=1; that plus "
        "SGLANG_SPEC_EXT_CPU_GRAPHS=1 with decode graphs for batch sizes 1, 2, 4, 8); plain "
        "decoding served once, in the first mode, as every mode's reference",
        "machine": machine_info(),
        "parameters": {
            "per_kind": args.per_kind,
            "max_new_tokens": args.max_new_tokens,
            "requests": len(prompts),
            "modes": modes,
            "draft": args.draft,
            "steps": args.steps,
            "rules": args.rules,
            "model": model.name,
        },  # fmt: skip
        "modes": by_mode,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'mode':<9}{'server':<12}{'accept len':>11}{'chat':>7}{'code-edit':>10}"
          f"{'identical':>11}")  # fmt: skip
    for mode, res in by_mode.items():
        for name, row in res["results"].items():
            k = row["accept_length_by_kind"]
            print(f"{mode:<9}{name:<12}{(row['accept_length'] or 1.0):>11.2f}"
                  f"{(k['chat'] or 1.0):>7.2f}{(k['code-edit'] or 1.0):>10.2f}"
                  f"{'yes' if row['identical_to_plain'] else 'NO':>11}")  # fmt: skip
    for mode, res in by_mode.items():
        by = (res["hybrid_sources"] or {}).get("by_source", {})
        if by:
            print(f"{mode}: HYBRID steps from suffix / model: "
                  f"{by['suffix']['step_share']:.0%} / {by['model']['step_share']:.0%}")  # fmt: skip
        print(f"{mode}: HYBRID / {single}: {res[f'hybrid_vs_{single.lower()}']:.3f}x; "
              f"HYBRID / best of SUFFIX and {single}: {res['hybrid_vs_best_single']:.3f}x")  # fmt: skip
    print(f"JSON: {args.json}")
    ok = all(r["identical_to_plain"] for res in by_mode.values() for r in res["results"].values())
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
