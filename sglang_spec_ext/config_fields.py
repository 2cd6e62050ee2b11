"""The plugin's configuration fields: one table, read by config.py, doctor and the docs."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

ENV_PREFIX = "SGLANG_SPEC_EXT_"


@dataclass(frozen=True)
class Field:
    """One configuration field: its type, default, accepted range and help."""

    name: str
    kind: type  # int, float, bool or str
    default: Any
    help: str
    lo: float | None = None
    hi: float | None = None
    choices: tuple[str, ...] | None = None

    @property
    def env(self) -> str:
        return ENV_PREFIX + self.name.upper()

    def describe_range(self) -> str:
        if self.kind is bool:
            return "a boolean (1/0, true/false, yes/no, on/off)"
        if self.choices:
            return "one of " + ", ".join(self.choices)
        if self.kind is str:
            return "a string"
        kind = "an integer" if self.kind is int else "a number"
        return f"{kind} in [{self.lo:g}, {self.hi:g}]"


# The single table of configuration fields. docs/configuration.md documents each one.
FIELDS: tuple[Field, ...] = (
    # Suffix drafter (SUFFIX algorithm).
    Field("max_depth", int, 64, "longest suffix matched and deepest draft path", 1, 1024),
    Field(
        "spec_factor",
        float,
        8.0,
        "draft budget = spec_factor x match length + spec_offset (capped by the verify width)",
        0.0,
        64.0,
    ),
    # spec_factor, spec_offset and min_token_prob defaults: chosen by `sglang-spec-ext
    # tune` on the committed traces (docs/suffix.md has the command).
    Field("spec_offset", float, 4.0, "see spec_factor", -64.0, 1024.0),
    Field(
        "min_token_prob",
        float,
        0.02,
        "drop draft continuations whose estimated path probability is below this",
        0.0,
        1.0,
    ),
    Field(
        "max_cached_requests",
        int,
        10000,
        "global tree bound: past requests kept (oldest evicted first); 0 disables it",
        0,
        10_000_000,
    ),
    Field(
        "max_cached_tokens",
        int,
        4_000_000,
        "global tree bound: tokens kept over all cached requests (oldest evicted first); "
        "at most 2**28 (the native core's 32-bit node ids)",
        0,
        1 << 28,
    ),
    Field(
        "max_request_tokens",
        int,
        65536,
        "per-request tree bound: it keeps the request's most recent tokens (>= max_depth)",
        1,
        1 << 28,
    ),
    Field(
        "global_prompt_cap",
        int,
        64,  # chosen by `tune` (docs/suffix.md): a repeated prompt's tail leads to its answer
        "only the last min(this, max_cached_tokens / 2) prompt tokens enter the global tree",
        0,
        1 << 28,
    ),
    Field(
        "step_insert_tokens",
        int,
        4096,
        "prompt tokens inserted into the trees per decode step (long prompts spread over steps)",
        1,
        1 << 30,
    ),
    Field("cache_prompts", bool, True, "insert prompts (not only outputs) into the global tree"),
    Field(
        "use_tree",
        bool,
        True,
        "draft trees (True) or single chains (False: what FA3 verifies ragged)",
    ),
    Field(
        "merge_drafts",
        bool,
        True,
        "merge the request's and the global tree's drafts into one tree by path probability "
        "(False: keep the higher-scoring draft, the behaviour before issue 14)",
    ),
    Field(
        "recycle_topk",
        int,
        0,
        "opt-in (0: off): draft from the target's own top-k too, per token its k most likely "
        "successors from the latest verify logits, merged with the suffix drafts by calibrated "
        "acceptance (SUFFIX and adaptive SUFFIX; 8 is the setting measured)",
        0,
        32,
    ),
    Field(
        "recycle_max_scopes",
        int,
        16,
        "top-k tables kept (one per tenant scope, least recently used evicted; each at most "
        "vocabulary x recycle_topk x 4 bytes)",
        1,
        4096,
    ),
    Field(
        "backend",
        str,
        "auto",
        "suffix drafter implementation: auto (native if built), native or python",
        choices=("auto", "native", "python"),
    ),
    # Host integration.
    Field(
        "cpu_fallbacks",
        bool,
        True,
        "install pure-torch versions of host kernels missing on CPU-only hosts",
    ),
    Field(
        "host_fixes",
        bool,
        True,
        "fix host bugs that break speculative serving (see sglang/host/fixes.py)",
    ),
    Field(
        "plain_steps",
        bool,
        True,
        "run a decode step with nothing to verify (zero draft steps; SUFFIX with no draft for "
        "any request of the batch) as the target's plain decode forward and sampling "
        "(sglang/workers/plain_step.py); False: the host's one-token verify",
    ),
    Field(
        "draft_gate",
        bool,
        True,
        "fixed-width SUFFIX: verify a step only where the batch's calibrated expected accepted "
        "draft tokens outweigh the verify's measured extra cost over a plain step; otherwise "
        "run it plain (sglang_spec_ext/suffix/gate.py). Not with SGLANG_SPEC_EXT_ADAPTIVE=1, "
        "whose controller picks the width",
    ),
    Field(
        "draft_gate_cost",
        float,
        0.1,
        "the draft gate's verify extra cost over a plain step (t_verify / t_plain - 1) until "
        "both kinds of step were timed at a batch size (ragged verify prices its first steps "
        "by the served model's roofline instead, where the model runner gives its sizes)",
        0.0,
        100.0,
    ),
    Field(
        "draft_gate_realised",
        bool,
        True,
        "ragged verify: weigh draft nodes' calibrated acceptance by what recently verified "
        "drafts accepted of what was expected of them (the batch's most probable nodes are "
        "the ones whose estimate erred high) (sglang_spec_ext/suffix/lengths.py: "
        "RealisedRatio); False: as calibrated",
    ),
    Field(
        "ragged_verify",
        bool,
        True,
        "SUFFIX and adaptive SUFFIX: the target verifies each request's own draft (root plus "
        "draft nodes), not the batch's width with padding, where the attention backend can "
        "(the CPU engine's torch_native, the host's triton, FA3 / trtllm_mha for chain drafts; "
        "others keep the padded verify and say so at start-up) (sglang/verify/ragged.py)",
    ),
    Field(
        "ragged_graphs",
        bool,
        True,
        "ragged verify under CUDA graphs: the target's verify graphs are keyed by the batch's "
        "total verify tokens (token buckets, the host's compact ragged mode) so a ragged step "
        "replays a graph; where the attention backend has a ragged verify in graphs (the CPU "
        "engine's emulation; FA3 / trtllm_mha with chain drafts). False: a ragged step runs "
        "its verify forward eagerly "
        "(sglang/verify/ragged_graphs.py)",
    ),
    Field(
        "ragged_eager",
        str,
        "auto",
        "ragged verify on a GPU where the attention backend has no token-bucket graphs "
        "(triton; trees): a ragged step runs its verify forward eagerly. auto: only where "
        "the padded verify would run eagerly too (a batch above the captured graph sizes, or "
        "graphs off), so a graph replay is never traded for an eager forward; always: every "
        "step with padding; the CPU engine decides as always (sglang/verify/ragged.py)",
        choices=("auto", "always"),
    ),
    Field(
        "verify_graph_widths",
        int,
        -1,
        "adaptive SUFFIX under CUDA graphs: how many of the controller's verify widths get "
        "target verify graphs of their own besides the startup width's (the narrowest ones: "
        "the widths large batches use, and the smallest graphs); a width without graphs "
        "verifies eagerly. Bounds the per-width graph memory the start-up check sizes. -1: "
        "every width the controller can choose",
        -1,
        64,
    ),
    Field(
        "grammar_drafts",
        bool,
        True,
        "SUFFIX, adaptive SUFFIX and HYBRID's suffix drafts, for requests with an xgrammar "
        "grammar (json_schema, regex, ebnf, structural tags): cut draft branches the grammar "
        "rejects and draft its forced continuation (sglang/workers/suffix_grammar.py)",
    ),
    Field(
        "grammar_draft_ms",
        float,
        20.0,
        "host milliseconds one decode step may spend shaping grammar requests' drafts; past it "
        "the remaining requests keep their plain suffix drafts",
        0.0,
        10000.0,
    ),
    Field(
        "grammar_overlap",
        bool,
        True,
        "grammar batches keep overlap scheduling under SUFFIX, adaptive SUFFIX and HYBRID: the "
        "host hands the worker its grammar barrier (supports_grammar_overlap) and the worker "
        "advances the grammar FSM over the previous step's tokens inside its step; off: the "
        "host runs every grammar batch synchronously, as for its NGRAM",
    ),
    Field(
        "stats_log_interval_s",
        float,
        30.0,
        "seconds between the SUFFIX worker's drafter-statistics log lines (0: every step)",
        0.0,
        86400.0,
    ),
    Field(
        "draft_kv_repair",
        bool,
        False,
        "STANDALONE drafts: skip the draft extend at zero draft steps and rebuild the skipped "
        "draft KV in one extend when a request drafts again (sglang/model_drafts/kv_repair.py)",
    ),
    Field(
        "draft_kv_repair_max_tokens",
        int,
        8192,
        "most tokens one draft-KV repair forward recomputes (split over the requests)",
        1,
        1_000_000,
    ),
    # Adaptive draft-width controller.
    Field("adaptive", bool, False, "choose the draft width per step from measured goodput"),
    Field(
        "adaptive_policy",
        str,
        "goodput",
        "who picks model-draft step counts under SGLANG_SPEC_EXT_ADAPTIVE=1: goodput (our "
        "controller) or host-ema (SGLang's own EMA policy, for comparisons on one build)",
        choices=("goodput", "host-ema"),
    ),
    # SUFFIX on shared servers (docs/shared-servers.md).
    Field(
        "isolation",
        str,
        "scoped",
        "whose outputs a request's suffix drafts may come from: scoped (requests with the same "
        "cache_salt, extra_key and LoRA adapter; unsalted requests share one scope), strict "
        "(salted or keyed requests: their own tokens only) or shared (every request, the "
        "behaviour before issue 28)",
        choices=("scoped", "strict", "shared"),
    ),
    Field(
        "max_scope_tokens",
        int,
        0,
        "global tree bound of one scope (a tenant), oldest evicted first; 0: max_cached_tokens",
        0,
        1 << 28,
    ),
    Field(
        "max_corpus_tokens",
        int,
        1_000_000,
        "tokens of all external corpora together (/add_external_corpus); 0 refuses corpora",
        0,
        1 << 28,
    ),
    Field(
        "snapshot_path",
        str,
        "",
        "file for warm restarts: the global trees are loaded from it at start-up and written "
        "to it periodically and at shutdown (empty: off)",
    ),
    Field(
        "snapshot_peers",
        str,
        "",
        "a directory replicas share, holding each replica's SNAPSHOT_PATH: at start-up a "
        "replica loads every peer's snapshot there before its own (empty: off; needs "
        "SNAPSHOT_PATH)",
    ),
    Field(
        "snapshot_interval_s",
        float,
        300.0,
        "seconds between snapshot writes (0: only at shutdown)",
        0.0,
        86400.0,
    ),
    # HYBRID (suffix drafts + the host's model draft).
    Field(
        "hybrid_draft",
        str,
        "auto",
        "HYBRID's model-draft path: auto (from the draft's architecture), standalone, eagle "
        "or eagle3",
        choices=("auto", "standalone", "eagle", "eagle3"),
    ),
    Field(
        "hybrid_policy",
        str,
        "learned",
        "HYBRID's choice per request and step: learned (larger expected accepted tokens), "
        "arctic (suffix when its score >= the model draft length), match (suffix when its "
        "match >= 4), suffix or model (one source only)",
        choices=("learned", "arctic", "match", "suffix", "model"),
    ),
    Field(
        "hybrid_skip_model_draft",
        bool,
        True,
        "HYBRID: skip the draft model's draft forwards in a step where the suffix draft wins "
        "for every request whatever the model would draft (one TP rank only)",
    ),
    Field(
        "hybrid_suffix_width",
        int,
        16,
        "HYBRID: verify width (root included) up to which a winning suffix draft keeps its "
        "own length beside the model's chains, in a wide step taken where it pays "
        "(hybrid/wide.py); at or below the model's verify width: suffix drafts are cut to it",
        1,
        64,
    ),
)
