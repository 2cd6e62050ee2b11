"""The target's own top-k as a draft source, served (benchmarks/results/recycle_smollm2.json).

SmolLM2-135M-Instruct on the SGLang CPU engine (fp32, greedy), one request at a time, on
first-time chat: questions nobody asked the server before (``bench/first_time_chat.py``;
``--set held-out`` by default: questions never used to choose any setting). Servers of one
build, one after another, each fresh: plain decoding; SUFFIX at width 16 without the
recycled source (``SGLANG_SPEC_EXT_RECYCLE_TOPK=0``: SUFFIX as before it); SUFFIX at width
16 with it (opt-in, ``SGLANG_SPEC_EXT_RECYCLE_TOPK=8``). Outputs are compared with plain decoding token for token; the
accept length is committed tokens per verify step as the host counts them (bonus included);
tokens per second are measured here, as ratios against plain in the same run.

    .venv/bin/python benchmarks/recycle_smollm2.py [--set held-out|tuning] [--rounds 2]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
from pathlib import Path

from tqdm import tqdm

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(REPO / "benchmarks"))

import requests  # noqa: E402
from model_draft_smollm2 import run  # noqa: E402

from sglang_spec_ext.bench.servers import LaunchedServer  # noqa: E402
from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.sglang.cpu.serving import cpu_serving_env, with_cpu_defaults  # noqa: E402

WIDTH = 16
SUFFIX = ["--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH)]
STATS = {"SGLANG_SPEC_EXT_STATS_LOG_INTERVAL_S": "0"}
CONFIGS = {
    "plain": ([], {}),
    "SUFFIX (no recycling)": (SUFFIX, {**STATS, "SGLANG_SPEC_EXT_RECYCLE_TOPK": "0"}),
    "SUFFIX + recycled top-k": (SUFFIX, {**STATS, "SGLANG_SPEC_EXT_RECYCLE_TOPK": "8"}),
}


def serve(model_dir: Path, extra: list[str], name: str, env: dict[str, str]) -> LaunchedServer:
    args = ["--max-total-tokens", "16384", "--random-seed", "0", "--sleep-on-idle", *extra]
    return LaunchedServer(
        str(model_dir), with_cpu_defaults(args), env=cpu_serving_env(extra=env), name=name
    )


def _prompts(tok, which: str, limit: int | None) -> list[list[int]]:
    from sglang_spec_ext.bench.first_time_chat import HELD_OUT, TUNING

    questions = HELD_OUT if which == "held-out" else TUNING
    return [
        tok.apply_chat_template(
            [{"role": "user", "content": q}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        for q in questions[:limit]
    ]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--set", choices=("held-out", "tuning"), default="held-out")
    ap.add_argument("--limit", type=int, help="first N questions of the set")
    ap.add_argument("--max-new-tokens", type=int, default=128)
    ap.add_argument("--rounds", type=int, default=1, help="servers restarted each round")
    ap.add_argument("--configs", default=",".join(CONFIGS), help=f"of: {', '.join(CONFIGS)}")
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/recycle_smollm2.json"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    model = ensure_smollm2_dir()
    tok = AutoTokenizer.from_pretrained(model)
    prompts = _prompts(tok, args.set, args.limit)
    names = [n.strip() for n in args.configs.split(",")]
    runs: dict[str, list[list[dict]]] = {n: [] for n in names}
    for rnd in range(args.rounds):
        for name in names:
            extra, env = CONFIGS[name]
            print(f"[recycle] round {rnd + 1}: {name}", file=sys.stderr)
            with serve(model, extra, name, env) as server:
                requests.post(server.url + "/generate", timeout=600, json={"text": "Hello",
                              "sampling_params": {"max_new_tokens": 4}})  # warm-up  # fmt: skip
                rows = []
                for ids in tqdm(prompts, desc=name, unit="req", file=sys.stderr):
                    rows += run(server, [ids], args.max_new_tokens)
                runs[name].append(rows)

    plain = runs.get("plain")
    table = []
    for name, rounds in runs.items():
        tokens = sum(r["tokens"] for rows in rounds for r in rows)
        secs = sum(r["seconds"] for rows in rounds for r in rows)
        steps = sum(r["verify_steps"] for rows in rounds for r in rows)
        identical = plain is None or all(
            a["output_ids"] == b["output_ids"]
            for rows, prows in zip(rounds, plain, strict=True)
            for a, b in zip(rows, prows, strict=True)
        )
        table.append(
            {
                "config": name,
                "tokens": tokens,
                "tok_s": tokens / secs,
                "accept_length": tokens / steps if steps else None,
                "identical_to_plain": identical,
            }
        )
    base = next((r["tok_s"] for r in table if r["config"] == "plain"), None)
    ref = next((r["accept_length"] for r in table if r["config"] == "SUFFIX (no recycling)"), None)
    for r in table:
        r["tok_s_vs_plain"] = r["tok_s"] / base if base else None
        al = r["accept_length"]
        r["accept_vs_suffix"] = al / ref if (al and ref) else None
    doc = {
        "what": "SmolLM2-135M-Instruct, SGLang CPU engine (fp32, torch_native), greedy, batch "
        f"1, first-time chat ({args.set} questions of bench/first_time_chat.py), width "
        f"{WIDTH}; each server fresh per round; tok/s measured here, as ratios to plain",
        "machine": machine_info(),
        "parameters": {
            "set": args.set,
            "questions": len(prompts),
            "rounds": args.rounds,
            "max_new_tokens": args.max_new_tokens,
            "width": WIDTH,
            "configs": {n: CONFIGS[n] for n in names},
        },  # fmt: skip
        "table": table,
    }
    Path(args.json).write_text(json.dumps(doc, indent=1) + "\n")
    print(f"\nmeasured on {doc['machine']['cpu']}; JSON: {args.json}")
    print(f"{'config':<26}{'tok/s':>8}{'vs plain':>10}{'accept':>8}{'vs SUFFIX':>11}{'same':>6}")
    for r in table:
        al, vs = r["accept_length"], r["accept_vs_suffix"]
        print(
            f"{r['config']:<26}{r['tok_s']:>8.1f}{r['tok_s_vs_plain'] or 0:>9.2f}x"
            f"{al or 1.0:>8.2f}{(f'{vs:.2f}x' if vs else '-'):>11}"
            f"{'yes' if r['identical_to_plain'] else 'NO':>6}"
        )
    return 0 if all(r["identical_to_plain"] for r in table) else 1


if __name__ == "__main__":
    sys.exit(main())
