"""What the benchmark sends: scenarios (input/output lengths), prompts and arrivals.

Prompts are token ids of exactly the requested length wherever a tokenizer or the
vocabulary size is known (random token ids, or random words tokenized and cut), so
the server sees the lengths the scenario names. Without a tokenizer, random-word
prompts are sent as text of about that many words. Dataset prompts (JSONL with
``prompt_ids`` or ``prompt``) are used as they are; the scenario then sets only the
output length.
"""

from __future__ import annotations

import json
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# name -> (input tokens, output tokens)
PRESET_SCENARIOS: dict[str, tuple[int, int]] = {
    "translation": (2048, 2048),
    "generation": (256, 2048),
    "summarization": (2048, 256),
}

# A plain word list for random-word prompts (our own; any words would do).
WORDS = (
    "time person year way day thing man world life hand part child eye woman place work "
    "week case point government company number group problem fact water room mother area "
    "money story month lot right study book job word business issue side kind head house "
    "service friend father power hour game line end member law car city community name "
    "president team minute idea kid body information back parent face others level office "
    "door health art war history party result change morning reason research girl guy "
    "moment air teacher force education river stone garden market table light music "
    "window paper field course energy north south east west green blue red yellow"
).split()


@dataclass(frozen=True)
class Scenario:
    name: str
    input_len: int
    output_len: int

    def scaled(self, scale: float) -> Scenario:
        """Lengths times ``scale`` (at least 1 token each), for quick smoke runs."""
        if scale == 1.0:
            return self
        return Scenario(
            self.name,
            max(1, round(self.input_len * scale)),
            max(1, round(self.output_len * scale)),
        )


def parse_scenario(text: str) -> Scenario:
    """``NAME`` (a preset) or ``NAME:IN:OUT``."""
    parts = text.split(":")
    if len(parts) == 1:
        if text not in PRESET_SCENARIOS:
            raise ValueError(
                f"unknown scenario {text!r}: use one of {', '.join(PRESET_SCENARIOS)} "
                "or NAME:INPUT_LEN:OUTPUT_LEN"
            )
        return Scenario(text, *PRESET_SCENARIOS[text])
    if len(parts) != 3 or not parts[0]:
        raise ValueError(f"scenario {text!r}: expected NAME:INPUT_LEN:OUTPUT_LEN")
    try:
        inp, out = int(parts[1]), int(parts[2])
    except ValueError:
        raise ValueError(f"scenario {text!r}: lengths must be integers") from None
    if inp < 1 or out < 1:
        raise ValueError(f"scenario {text!r}: lengths must be at least 1")
    return Scenario(parts[0], inp, out)


@dataclass(frozen=True)
class Load:
    """How requests arrive: Poisson at ``value`` req/s (``inf``: all at once), or a
    closed loop of ``value`` concurrent clients."""

    kind: str  # "rate" or "concurrency"
    value: float

    @property
    def label(self) -> str:
        if self.kind == "rate":
            return "rate=inf" if math.isinf(self.value) else f"rate={self.value:g}"
        return f"conc={int(self.value)}"

    def to_json(self) -> dict[str, Any]:
        return {"kind": self.kind, "value": "inf" if math.isinf(self.value) else self.value}


def parse_rates(text: str) -> list[float]:
    out = []
    for part in text.split(","):
        part = part.strip().lower()
        if not part:
            continue
        value = math.inf if part in ("inf", "infinity") else float(part)
        if not value > 0:
            raise ValueError(f"request rate must be > 0 (or inf), got {part!r}")
        out.append(value)
    return out


def parse_ints(text: str) -> list[int]:
    out = [int(p) for p in text.split(",") if p.strip()]
    if any(v < 1 for v in out):
        raise ValueError(f"expected positive integers, got {text!r}")
    return out


def loads_from(rates: Sequence[float], concurrencies: Sequence[int]) -> list[Load]:
    return [Load("rate", r) for r in rates] + [Load("concurrency", c) for c in concurrencies]


@dataclass(frozen=True)
class Request:
    """One request: token ids (exact length) or text, and the tokens to generate."""

    output_len: int
    prompt_ids: tuple[int, ...] | None = None
    prompt_text: str | None = None
    #: structured-output sampling fields (``json_schema`` / ``regex``), sent as they are
    constraint: tuple[tuple[str, str], ...] = ()

    @property
    def input_len(self) -> int | None:
        return len(self.prompt_ids) if self.prompt_ids is not None else None


def poisson_arrivals(n: int, rate: float, seed: int) -> list[float]:
    """Send offsets (seconds from the start) of ``n`` requests, Poisson at ``rate``/s."""
    if math.isinf(rate):
        return [0.0] * n
    rng = random.Random(seed)
    t, out = 0.0, []
    for _ in range(n):
        out.append(t)
        t += rng.expovariate(rate)
    return out


class PromptSource:
    """Builds prompts of a given length: ``random`` (token ids), ``random-words`` or a
    ``dataset``; ``structured``: tool calls under JSON schemas, regex answers, JSON mode and
    chat (``structured_workloads.structured_requests``; each request carries its
    constraint); or ``mixed``: the embedded mixed workload (``demo_workloads.mixed_prompts``:
    code edits, agent loops and a repeated question beside chat and random-token prompts,
    their own lengths; needs a tokenizer with a chat template). ``tokenizer`` (optional
    otherwise, a Hugging Face tokenizer) makes text exact."""

    def __init__(
        self,
        kind: str = "random",
        vocab: Sequence[int] | None = None,
        tokenizer: Any = None,
        dataset: Sequence[Request] | None = None,
    ) -> None:
        if kind not in ("random", "random-words", "dataset", "mixed", "structured"):
            raise ValueError(f"unknown prompt kind {kind!r}")
        if kind in ("mixed", "structured") and tokenizer is None:
            raise ValueError(f"{kind} prompts need a tokenizer (--tokenizer DIR or --model-path)")
        if kind == "random" and not vocab:
            raise ValueError("random token prompts need the vocabulary (--vocab-size)")
        if kind == "dataset" and not dataset:
            raise ValueError("dataset prompts need a non-empty dataset")
        self.kind = kind
        self.vocab = list(vocab or [])
        self.tokenizer = tokenizer
        self.dataset = list(dataset or [])

    def build(self, scenario: Scenario, n: int, seed: int) -> list[Request]:
        """``n`` requests for ``scenario``; the same seed gives the same requests."""
        rng = random.Random(seed)
        if self.kind == "dataset":
            start = rng.randrange(len(self.dataset))
            picked = [self.dataset[(start + i) % len(self.dataset)] for i in range(n)]
            return [Request(scenario.output_len, r.prompt_ids, r.prompt_text) for r in picked]
        if self.kind == "mixed":
            from sglang_spec_ext.bench.demo_workloads import mixed_prompts

            return [Request(scenario.output_len, tuple(ids))
                    for _, ids in mixed_prompts(self.tokenizer, n, seed=seed)]  # fmt: skip
        if self.kind == "structured":
            from sglang_spec_ext.bench.structured_workloads import structured_requests

            return [Request(scenario.output_len, tuple(ids), constraint=tuple(c.items()))
                    for _, ids, c in structured_requests(self.tokenizer, n, seed=seed)]  # fmt: skip
        if self.kind == "random":
            return [
                Request(
                    scenario.output_len,
                    tuple(rng.choice(self.vocab) for _ in range(scenario.input_len)),
                )
                for _ in range(n)
            ]
        return [self._words(scenario, rng) for _ in range(n)]

    def _words(self, scenario: Scenario, rng: random.Random) -> Request:
        n = scenario.input_len
        if self.tokenizer is None:
            return Request(scenario.output_len, prompt_text=" ".join(rng.choices(WORDS, k=n)))
        ids: list[int] = []
        while len(ids) < n:
            chunk = " " + " ".join(rng.choices(WORDS, k=max(8, n - len(ids))))
            ids.extend(self.tokenizer.encode(chunk, add_special_tokens=False))
        return Request(scenario.output_len, tuple(ids[:n]))


def read_dataset(path: Path | str, tokenizer: Any = None) -> list[Request]:
    """Prompts of a JSONL file: ``prompt_ids`` (token ids) or ``prompt`` (text) per line.

    Text is tokenized when a tokenizer is given (exact input lengths), else sent as
    text. Output lengths come from the scenario (0 here).
    """
    path = Path(path)
    out: list[Request] = []
    with path.open(encoding="utf-8") as fh:
        for lineno, line in enumerate(fh, start=1):
            if not line.strip():
                continue
            try:
                obj = json.loads(line)
            except json.JSONDecodeError as exc:
                raise ValueError(f"{path}:{lineno}: invalid JSON: {exc.msg}") from None
            if isinstance(obj, dict) and isinstance(obj.get("prompt_ids"), list):
                ids = obj["prompt_ids"]
                if not ids or not all(isinstance(t, int) and t >= 0 for t in ids):
                    raise ValueError(f"{path}:{lineno}: prompt_ids must be token ids")
                out.append(Request(0, tuple(ids)))
            elif isinstance(obj, dict) and isinstance(obj.get("prompt"), str):
                text = obj["prompt"]
                if tokenizer is not None:
                    out.append(Request(0, tuple(tokenizer.encode(text))))
                else:
                    out.append(Request(0, prompt_text=text))
            else:
                raise ValueError(f'{path}:{lineno}: expected "prompt_ids" or "prompt"')
    if not out:
        raise ValueError(f"{path}: no prompts")
    return out


def load_tokenizer(path: str | None) -> Any:
    """A Hugging Face tokenizer from a local model directory, or ``None``."""
    if not path:
        return None
    try:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(path)
    except Exception:
        return None


def vocab_ids(tokenizer: Any = None, model_path: str | None = None, size: int | None = None):
    """Token ids random prompts may use: the tokenizer's ids without special tokens,
    else ``range(size)``, else ``range(vocab_size)`` of ``model_path/config.json``."""
    if size:
        return list(range(size))
    if tokenizer is not None:
        special = set(getattr(tokenizer, "all_special_ids", []) or [])
        return [i for i in range(len(tokenizer)) if i not in special]
    if model_path:
        cfg = Path(model_path) / "config.json"
        try:
            data = json.loads(cfg.read_text())
            vs = data.get("vocab_size") or data.get("text_config", {}).get("vocab_size")
            if vs:
                return list(range(int(vs)))
        except (OSError, ValueError):
            pass
    return None
