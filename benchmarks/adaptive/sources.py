"""adaptive_replay.py: the acceptance tables (for benchmarks/results/adaptive_replay*.json).

Synthetic sets (``adaptive.synthetic``), and the recorded chain proposals of a model
draft or an MTP layer in the traces of ``benchmarks/traces/hybrid/``
(``replay.table.model_draft_table``).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

from sglang_spec_ext.adaptive.simulator import AcceptanceTable
from sglang_spec_ext.adaptive.synthetic import generate
from sglang_spec_ext.replay.table import model_draft_table
from sglang_spec_ext.replay.trace import read_trace

HYBRID_TRACES = Path(__file__).resolve().parents[1] / "traces" / "hybrid"
TRACE_DRAFT = "smollm2-l14+8"
#: The recorded MTP layer's proposals (``--mtp-drafts`` without a name).
MTP_DRAFT = "smollm2-mtp"
SYNTHETIC_SETS = ("repetitive", "chat", "mixed")


def synthetic_tables(
    n_requests: int, seed: int, sets: Sequence[str] = SYNTHETIC_SETS
) -> dict[str, AcceptanceTable]:
    return {
        s: AcceptanceTable.from_rows(
            generate(s, n_requests, seed=seed + SYNTHETIC_SETS.index(s)), s
        )
        for s in sets
    }


def recorded_draft_tables(
    draft: str, shape: str, trace_dir: Path = HYBRID_TRACES
) -> dict[str, AcceptanceTable]:
    """``shape:<file stem>`` -> the acceptance of the recorded chain proposals
    ``model_drafts[draft]`` of each trace file in ``trace_dir`` that has them (a set the
    draft was never recorded for is left out). ``ValueError`` naming the file where some
    records lack them, or where no trace of ``trace_dir`` has them."""
    paths = sorted(Path(trace_dir).glob("*.jsonl"))
    tables: dict[str, AcceptanceTable] = {}
    for path in paths:
        records = read_trace(path)
        if not any(draft in r.model_drafts for r in records):
            continue
        try:
            rows = [r.to_json() for r in model_draft_table(records, draft)]
        except ValueError as exc:
            raise ValueError(f"{path}: {exc}") from None
        name = f"{shape}:{path.stem}"
        tables[name] = AcceptanceTable.from_rows(rows, name)
    if not tables:
        raise ValueError(f"no *.jsonl trace in {trace_dir} has model drafts {draft!r}")
    return tables


def model_draft_tables(
    n_synthetic: int, seed: int, trace_dir: Path = HYBRID_TRACES
) -> tuple[dict[str, AcceptanceTable], dict[str, str]]:
    """STANDALONE-shaped tables per trace set (real draft proposals) and one
    EAGLE-shaped synthetic table; with the shape of each."""
    tables = recorded_draft_tables(TRACE_DRAFT, "standalone", trace_dir)
    shapes = dict.fromkeys(tables, "standalone")
    rows = generate("eagle-chain", n_synthetic, ks=range(1, 8), seed=seed)
    tables["eagle3:synthetic"] = AcceptanceTable.from_rows(rows, "eagle3:synthetic")
    shapes["eagle3:synthetic"] = "eagle3"
    return tables, shapes
