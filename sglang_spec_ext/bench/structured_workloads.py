"""The structured-output workload: agent-style tool calls under JSON schemas (several tools,
nested objects, enums, arrays), regex-constrained answers and JSON mode, beside
unconstrained chat. Each request is (kind, chat-template prompt ids, constraint), the
constraint being the host's sampling-parameter fields (``json_schema`` / ``regex``; empty for
chat). Used by ``bench --prompts structured``, ``benchmarks/grammar_smollm2.py`` and the
soak's ``structured`` kind.
"""

from __future__ import annotations

import json
import random
from typing import Any

TOOLS: dict[str, dict[str, Any]] = {
    "get_weather": {
        "type": "object",
        "properties": {
            "city": {"type": "string", "maxLength": 24},
            "unit": {"type": "string", "enum": ["celsius", "fahrenheit"]},
            "days": {"type": "integer", "minimum": 1, "maximum": 7},
        },
        "required": ["city", "unit", "days"],
    },
    "search_web": {
        "type": "object",
        "properties": {
            "query": {"type": "string", "maxLength": 40},
            "max_results": {"type": "integer", "minimum": 1, "maximum": 10},
            "filters": {
                "type": "object",
                "properties": {
                    "language": {"type": "string", "enum": ["en", "fr", "de"]},
                    "safe": {"type": "boolean"},
                },
                "required": ["language", "safe"],
            },
        },
        "required": ["query", "max_results", "filters"],
    },
    "send_email": {
        "type": "object",
        "properties": {
            "to": {
                "type": "array",
                "items": {"type": "string", "maxLength": 24},
                "minItems": 1,
                "maxItems": 2,
            },  # fmt: skip
            "subject": {"type": "string", "maxLength": 32},
            "priority": {"type": "string", "enum": ["low", "normal", "high"]},
        },
        "required": ["to", "subject", "priority"],
    },
}


def tool_call_schema() -> dict[str, Any]:
    """One call of any of :data:`TOOLS`: ``{"name": ..., "arguments": {...}}``."""
    return {
        "anyOf": [
            {
                "type": "object",
                "properties": {"name": {"const": name}, "arguments": args},
                "required": ["name", "arguments"],
            }
            for name, args in TOOLS.items()
        ]
    }


REGEXES = {
    "yes-no": r"(Yes|No)\. Reason: [A-Za-z ,]{1,60}\.",
    "date": r"[0-9]{4}-[0-9]{2}-[0-9]{2}",
    "rating": r"Rating: [1-5]/5\. Summary: [A-Za-z ,]{1,60}\.",
}

TASKS = {
    "tool": [
        "What's the weather in Paris for the next three days, in celsius?",
        "Search the web for recent news about solar panels, five results, in English.",
        "Email alice@example.com about the meeting tomorrow, high priority.",
        "I need the forecast for Tokyo this week in fahrenheit.",
        "Find French articles about bread baking, safe search on.",
        "Send bob@example.com and carol@example.com a note titled Lunch plans.",
    ],
    "regex": [
        ("yes-no", "Is water wet?"),
        ("date", "When did the first moon landing happen? Give the date."),
        ("rating", "Rate the movie Jaws."),
        ("yes-no", "Can penguins fly?"),
        ("rating", "Rate this restaurant: great pasta, slow service."),
        ("date", "What is the date of the French Bastille Day in 2024?"),
    ],
    "json": [
        "Describe a cat as a JSON object with name, age and color.",
        "Give me a JSON object describing a book: title, author, year.",
        "Return a JSON object for a user profile with username and email.",
    ],
    "chat": [
        "Tell me a short story about a robot.",
        "What is the capital of Italy?",
        "Explain photosynthesis in one sentence.",
    ],
}

#: The kinds in order (repeated): mostly tool calls, as agent traffic is.
STRUCTURED_KINDS = ("tool", "regex", "tool", "json", "tool", "chat", "tool", "regex")

SYSTEM = (
    "You are an assistant that calls tools. Tools: "
    + "; ".join(f"{n}({', '.join(s['properties'])})" for n, s in TOOLS.items())
    + '. Reply with a JSON tool call {"name": ..., "arguments": {...}} when a tool fits.'
)


def constraint_of(kind: str, i: int) -> dict[str, str]:
    """The sampling-parameter fields of request ``i`` of ``kind`` (empty for chat)."""
    if kind == "tool":
        return {"json_schema": json.dumps(tool_call_schema())}
    if kind == "regex":
        return {"regex": REGEXES[TASKS["regex"][i % len(TASKS["regex"])][0]]}
    if kind == "json":
        return {"json_schema": json.dumps({"type": "object"})}
    return {}


def structured_requests(tok: Any, n: int, seed: int = 0) -> list[tuple[str, list[int], dict]]:
    """``n`` (kind, prompt token ids, constraint) of the structured workload
    (:data:`STRUCTURED_KINDS`), as chat-template prompts of ``tok``."""
    rng = random.Random(seed)
    out = []
    for j in range(n):
        kind = STRUCTURED_KINDS[j % len(STRUCTURED_KINDS)]
        tasks = TASKS[kind]
        i = (j // len(STRUCTURED_KINDS) + rng.randrange(len(tasks))) % len(tasks)
        task = tasks[i]
        text = task[1] if kind == "regex" else task
        messages = [{"role": "user", "content": text}]
        if kind == "tool":
            messages.insert(0, {"role": "system", "content": SYSTEM})
        ids = tok.apply_chat_template(messages, add_generation_prompt=True, tokenize=True,
                                      return_dict=False)  # fmt: skip
        out.append((kind, list(ids), constraint_of(kind, i)))
    return out
