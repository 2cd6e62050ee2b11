#!/usr/bin/env python
"""SUFFIX with and without an external corpus, served (benchmarks/results/external_corpus.json).

Accept length on a docs-style trace with and without the corpus. Served on the SGLang CPU
engine: SmolLM2-135M-Instruct (the embedded model), one SUFFIX server (width 16, greedy, one
request at a time). The trace asks for the documentation of Python standard-library
functions ("What does ``json.dumps`` do? Quote its documentation."); the corpus is those
functions' docstrings as Python ships them (``inspect.getdoc``), loaded through the host's
``/add_external_corpus`` endpoint as documents. Each request carries a cache salt of its
own, so no request drafts from another's output: the only difference between the two passes
is the corpus. Both passes must give identical outputs. Prints a table last and writes
``benchmarks/results/external_corpus.json``.

    .venv/bin/python benchmarks/external_corpus.py [--max-new-tokens 96] [--functions 32]
"""

from __future__ import annotations

import argparse
import importlib
import inspect
import json
import signal
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

import requests  # noqa: E402
from tqdm import tqdm  # noqa: E402

from sglang_spec_ext.bench.servers import LaunchedServer  # noqa: E402
from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.sglang.cpu.serving import cpu_serving_env, with_cpu_defaults  # noqa: E402

WIDTH = 16
#: Standard-library functions the trace asks about (their docstrings are the corpus).
FUNCTIONS = [
    "json.dumps", "json.loads", "os.path.join", "os.path.splitext", "os.makedirs",
    "shutil.copyfile", "shutil.rmtree", "itertools.groupby", "itertools.chain",
    "functools.lru_cache", "functools.partial", "functools.reduce", "collections.namedtuple",
    "collections.Counter", "collections.defaultdict", "re.sub", "re.findall", "re.compile",
    "textwrap.dedent", "textwrap.wrap", "subprocess.run", "glob.glob", "random.choice",
    "random.shuffle", "math.isclose", "statistics.median", "heapq.heappush", "bisect.bisect_left",
    "csv.reader", "datetime.datetime.strptime", "pathlib.Path.glob", "zipfile.ZipFile",
]  # fmt: skip


def resolve(name: str):
    parts = name.split(".")
    for i in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:i]))
        except ImportError:
            continue
        for attr in parts[i:]:
            obj = getattr(obj, attr)
        return obj
    raise ImportError(name)


def generate(url: str, ids: list[int], salt: str, max_new_tokens: int) -> dict:
    payload = {"input_ids": ids, "cache_salt": salt,
               "sampling_params": {"max_new_tokens": max_new_tokens, "temperature": 0}}  # fmt: skip
    r = requests.post(url + "/generate", json=payload, timeout=600)
    r.raise_for_status()
    out = r.json()
    meta = out["meta_info"]
    return {"output_ids": out["output_ids"], "tokens": meta["completion_tokens"],
            "verify_steps": meta.get("spec_verify_ct") or 0}  # fmt: skip


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument("--functions", type=int, default=len(FUNCTIONS))
    ap.add_argument("--json", default=str(REPO / "benchmarks/results/external_corpus.json"))
    args = ap.parse_args(argv)
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    model = ensure_smollm2_dir()
    tok = AutoTokenizer.from_pretrained(model)
    names = FUNCTIONS[: args.functions]
    docs = [f"{name}\n\n{inspect.getdoc(resolve(name))}" for name in names]
    prompts = [
        tok.apply_chat_template(
            [{"role": "user", "content": f"What does `{n}` do in Python? Quote its documentation."}],
            add_generation_prompt=True, tokenize=True, return_dict=False)
        for n in names
    ]  # fmt: skip
    extra = ["--max-total-tokens", "16384", "--random-seed", "0", "--sleep-on-idle",
             "--speculative-algorithm", "SUFFIX", "--speculative-num-draft-tokens", str(WIDTH)]  # fmt: skip
    server = LaunchedServer(
        str(model), with_cpu_defaults(extra), env=cpu_serving_env(), name="suffix"
    )
    passes: dict[str, list[dict]] = {}
    corpus_tokens = 0
    t_start = time.perf_counter()
    try:
        server.start()
        for label in ("without corpus", "with corpus"):
            if label == "with corpus":
                r = requests.post(server.url + "/add_external_corpus",
                                  json={"corpus_id": "stdlib-docs", "documents": docs}, timeout=600)  # fmt: skip
                r.raise_for_status()
                corpus_tokens = r.json()["loaded_token_count"]
            rows = []
            for i, ids in enumerate(tqdm(prompts, desc=label, unit="req")):
                rows.append(generate(server.url, ids, f"{label}-{i}", args.max_new_tokens))
            passes[label] = rows
    finally:
        server.stop()
    base, corp = passes["without corpus"], passes["with corpus"]
    identical = all(a["output_ids"] == b["output_ids"] for a, b in zip(base, corp, strict=True))

    def accept(rows: list[dict]) -> float:
        return sum(r["tokens"] for r in rows) / max(1, sum(r["verify_steps"] for r in rows))

    per_request = [
        {"function": n, "tokens": a["tokens"], "steps_without": a["verify_steps"],
         "steps_with": b["verify_steps"]}
        for n, a, b in zip(names, base, corp, strict=True)
    ]  # fmt: skip
    result = {
        "what": "SUFFIX accept length (tokens committed per verify step, bonus included) on a "
        "docs-style trace, with and without the stdlib docstrings loaded as an external corpus",
        "machine": machine_info(),
        "parameters": {
            "model": "SmolLM2-135M-Instruct",
            "width": WIDTH,
            "max_new_tokens": args.max_new_tokens,
            "requests": len(names),
            "corpus_documents": len(docs),
            "corpus_tokens": corpus_tokens,
            "isolation": "scoped, one cache salt per request",
        },  # fmt: skip
        "accept_length": {"without_corpus": accept(base), "with_corpus": accept(corp)},
        "outputs_identical": identical,
        "wall_s": time.perf_counter() - t_start,
        "per_request": per_request,
    }
    Path(args.json).write_text(json.dumps(result, indent=2) + "\n")
    print(f"\nmachine: {result['machine'].get('cpu')}; {len(names)} requests, greedy, "
          f"{args.max_new_tokens} new tokens max, width {WIDTH}; corpus {corpus_tokens} tokens")  # fmt: skip
    print(f"outputs identical across passes: {identical}; JSON: {args.json}\n")
    print(f"{'pass':<16} {'tokens':>7} {'verify steps':>13} {'accept length':>14}")
    for label, rows in passes.items():
        print(f"{label:<16} {sum(r['tokens'] for r in rows):>7} "
              f"{sum(r['verify_steps'] for r in rows):>13} {accept(rows):>14.2f}")  # fmt: skip
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
