"""Small embedded chat workloads for the real small model (SmolLM2-135M-Instruct).

Used by the README demo (scripts/demo.py) and the SmolLM2 end-to-end tests. The
texts are written for this project. Each workload is a list of chat turns;
``repeat`` workloads ask an earlier question again in a later conversation,
which is where a global suffix tree pays off.
"""

from __future__ import annotations

from dataclasses import dataclass

FUNCTIONS = [
    """def moving_average(values, window):
    result = []
    total = 0.0
    for i, value in enumerate(values):
        total += value
        if i >= window:
            total -= values[i - window]
        if i >= window - 1:
            result.append(total / window)
    return result
""",
    """def count_words(text):
    counts = {}
    for word in text.lower().split():
        word = word.strip(".,!?")
        if word:
            counts[word] = counts.get(word, 0) + 1
    return counts
""",
    """def merge_sorted(left, right):
    merged = []
    i = j = 0
    while i < len(left) and j < len(right):
        if left[i] <= right[j]:
            merged.append(left[i])
            i += 1
        else:
            merged.append(right[j])
            j += 1
    merged.extend(left[i:])
    merged.extend(right[j:])
    return merged
""",
    """def parse_config(lines):
    config = {}
    for line in lines:
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        config[key.strip()] = value.strip()
    return config
""",
]

EDITS = [
    "Rename the function to `{new}` and keep everything else exactly the same. "
    "Reply with the full code only.",
    "Add a one-line docstring to this function and keep the code exactly the same. "
    "Reply with the full code only.",
]
NEW_NAMES = ["rolling_mean", "word_histogram", "merge_two", "read_settings"]

QUESTIONS = [
    "What is the capital of France? Answer in one sentence.",
    "List three primary colors.",
]


@dataclass(frozen=True)
class ChatCase:
    label: str
    kind: str  # "code-edit" | "question" | "repeat"
    messages: tuple[tuple[str, str], ...]


def code_edit_cases(n: int = 4) -> list[ChatCase]:
    cases = []
    for i, (fn, new) in enumerate(zip(FUNCTIONS, NEW_NAMES, strict=True)):
        edit = EDITS[i % len(EDITS)].format(new=new)
        cases.append(ChatCase(f"edit-{i}", "code-edit", (("user", f"{edit}\n\n{fn}"),)))
    return cases[:n]


def repeated_question_cases() -> list[ChatCase]:
    """Each question asked once, then again after an unrelated first turn."""
    first = [ChatCase(f"ask-{i}", "question", (("user", q),)) for i, q in enumerate(QUESTIONS)]
    again = [
        ChatCase(
            f"ask-again-{i}",
            "repeat",
            (("user", "Hello!"), ("assistant", "Hello! How can I help?"), ("user", q)),
        )
        for i, q in enumerate(QUESTIONS)
    ]
    return first + again


def demo_cases() -> list[ChatCase]:
    edits = code_edit_cases()
    # The last edit sent twice: a later request repeats an earlier answer.
    return (
        edits
        + [ChatCase(edits[0].label + "-again", "repeat", edits[0].messages)]
        + repeated_question_cases()
    )


CHAT = [
    "Explain in two sentences why the sky looks blue.",
    "Give me three tips for writing clear emails.",
    "What is the difference between a list and a tuple in Python?",
    "Write a haiku about autumn rain.",
    "Summarise the plot of a detective story you invent, in four sentences.",
    "How do I keep basil fresh for a week?",
    "Name two benefits of regular walking.",
    "Describe a quiet harbour town at dawn.",
]

AGENT_SYSTEM = (
    "You are an agent. Reply with exactly one tool call as JSON: "
    '{"tool": "<name>", "arguments": {...}}. Tools: search(query), read_file(path), '
    "write_file(path, content)."
)


def agent_loop_case(i: int) -> ChatCase:
    """An agent loop several tool calls in: the next call repeats the earlier ones' shape."""
    turns: list[tuple[str, str]] = [("system", AGENT_SYSTEM),
                                    ("user", f"Collect the README files of projects {i} to {i + 3}.")]  # fmt: skip
    for j in range(3):
        path = f"projects/p{i + j}/README.md"
        turns.append(("assistant", '{"tool": "read_file", "arguments": {"path": "' + path + '"}}'))
        turns.append(("user", f"Tool result: the README of project {i + j} (120 lines)."))
    return ChatCase(f"agent-{i}", "agent", tuple(turns))


#: The mixed workload's kinds in order (repeated): a few requests repeat long text
#: (code edits, agent loops, an earlier question asked again), most do not (chat,
#: random-token prompts).
MIXED_KINDS = ("code-edit", "chat", "random", "agent", "chat", "random", "repeat", "chat")


def mixed_prompts(tok, n: int, seed: int = 0, random_len: int = 48) -> list[tuple[str, list[int]]]:
    """``n`` (kind, prompt token ids) of the mixed workload (:data:`MIXED_KINDS`), chat
    turns through ``tok``'s chat template; random-token prompts drawn from its vocabulary."""
    import random

    rng = random.Random(seed)
    vocab = len(tok)
    edits = code_edit_cases(len(FUNCTIONS))
    asked = repeated_question_cases()

    def chat(messages) -> list[int]:
        return list(tok.apply_chat_template([{"role": r, "content": c} for r, c in messages],
                                            add_generation_prompt=True, tokenize=True,
                                            return_dict=False))  # fmt: skip

    out: list[tuple[str, list[int]]] = []
    for i in range(n):
        kind = MIXED_KINDS[i % len(MIXED_KINDS)]
        k = i // len(MIXED_KINDS)
        if kind == "code-edit":
            ids = chat(edits[k % len(edits)].messages)
        elif kind == "agent":
            ids = chat(agent_loop_case(k).messages)
        elif kind == "repeat":
            ids = chat(asked[k % len(asked)].messages)
        elif kind == "chat":
            ids = chat((("user", CHAT[(3 * k + i) % len(CHAT)]),))
        else:
            ids = [rng.randrange(100, vocab) for _ in range(random_len)]
        out.append((kind, ids))
    return out
