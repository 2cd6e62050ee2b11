"""STANDALONE served on SmolLM2-135M on CPU (benchmarks/results/model_draft_smollm2.json).

Serves SmolLM2-135M-Instruct on the SGLang CPU engine without speculation, then with
``--speculative-algorithm STANDALONE`` and two locally built drafts: the model itself (acceptance near the maximum: the
mechanics) and a layer-skipping draft (its first 14 + last 8 of 30 layers:
``build_truncated_draft``). Greedy, one request at a time, the README demo's chat
workload. Prints and writes (JSON) whether outputs are identical, the accept length
the host reports and tokens/s. Servers start as ``sglang-spec-ext serve-cpu`` would.

    .venv/bin/python benchmarks/model_draft_smollm2.py [--max-new-tokens 48]
"""

from __future__ import annotations

import argparse
import json
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402

from sglang_spec_ext.bench.demo_workloads import demo_cases  # noqa: E402
from sglang_spec_ext.bench.servers import LaunchedServer  # noqa: E402
from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.sglang.cpu.serving import cpu_serving_env, with_cpu_defaults  # noqa: E402

SHAPE = ["--speculative-num-steps", "3", "--speculative-eagle-topk", "1",
         "--speculative-num-draft-tokens", "4"]  # fmt: skip


def serve(model_dir: Path, extra: list[str], name: str) -> LaunchedServer:
    args = ["--max-total-tokens", "16384", "--random-seed", "0", "--sleep-on-idle", *extra]
    return LaunchedServer(str(model_dir), with_cpu_defaults(args), env=cpu_serving_env(), name=name)


def run(server: LaunchedServer, prompts: list[list[int]], max_new_tokens: int) -> list[dict]:
    rows = []
    for ids in prompts:
        payload = {"input_ids": ids,
                   "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}  # fmt: skip
        t0 = time.perf_counter()
        r = requests.post(server.url + "/generate", json=payload, timeout=600)
        r.raise_for_status()
        out = r.json()
        meta = out["meta_info"]
        rows.append({"output_ids": out["output_ids"], "tokens": meta["completion_tokens"],
                     "seconds": time.perf_counter() - t0,
                     "verify_steps": meta.get("spec_verify_ct") or 0})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=48)
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/model_draft_smollm2.json"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir, ensure_smollm2_draft

    model = ensure_smollm2_dir()
    weak = ensure_smollm2_draft()
    tok = AutoTokenizer.from_pretrained(model)
    prompts = [
        tok.apply_chat_template([{"role": r, "content": c} for r, c in case.messages],
                                add_generation_prompt=True, tokenize=True, return_dict=False)
        for case in demo_cases()
    ]  # fmt: skip
    configs = {
        "baseline": [],
        "STANDALONE self-draft": ["--speculative-algorithm", "STANDALONE",
                                  "--speculative-draft-model-path", str(model), *SHAPE],
        "STANDALONE 14+8-layer draft": ["--speculative-algorithm", "STANDALONE",
                                        "--speculative-draft-model-path", str(weak), *SHAPE],
    }  # fmt: skip
    runs = {}
    for name, extra in configs.items():
        print(f"[model-draft] {name} ...", file=sys.stderr)
        with serve(model, extra, name.split()[0].lower()) as server:
            run(server, [prompts[0][:8]], 4)  # warm-up
            runs[name] = run(server, prompts, args.max_new_tokens)
    base = runs["baseline"]
    summary = {}
    for name, rows in runs.items():
        tokens = sum(r["tokens"] for r in rows)
        steps = sum(r["verify_steps"] for r in rows)
        summary[name] = {
            "identical_to_baseline": all(
                a["output_ids"] == b["output_ids"] for a, b in zip(rows, base, strict=True)
            ),
            "tokens_per_second": tokens / sum(r["seconds"] for r in rows),
            "accept_length": tokens / steps if steps else None,
        }
    result = {
        "what": "SmolLM2-135M-Instruct, SGLang CPU engine, greedy, batch size 1, "
        "STANDALONE steps 3 topk 1 draft tokens 4",
        "machine": machine_info(),
        "parameters": {"max_new_tokens": args.max_new_tokens, "cases": len(prompts)},
        "results": summary,
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"{'server':<30}{'tok/s':>8}{'accept len':>12}{'identical':>11}")
    for name, row in summary.items():
        acc = row["accept_length"]
        print(f"{name:<30}{row['tokens_per_second']:>8.1f}{(acc or 1.0):>12.2f}"
              f"{'yes' if row['identical_to_baseline'] else 'NO':>11}")  # fmt: skip
    print(f"JSON: {args.json}")
    return 0 if all(r["identical_to_baseline"] for r in summary.values()) else 1


if __name__ == "__main__":
    sys.exit(main())
