"""Typed, validated plugin configuration.

Read from environment variables with the prefix ``SGLANG_SPEC_EXT_`` and an
optional JSON file named by ``SGLANG_SPEC_EXT_CONFIG`` (keys are the field names
below, lower case, without the prefix). Precedence: environment variable >
JSON file > default. Every invalid value raises :class:`ConfigError` naming the
variable (or file key), the value and the accepted range.

SGLang cannot be given new command-line flags by a plugin, so everything that
has no fitting ServerArgs field is configured here. The verify width reuses
``--speculative-num-draft-tokens``.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from sglang_spec_ext.config_fields import ENV_PREFIX, FIELDS, Field

__all__ = ["FIELDS", "ConfigError", "Field", "PluginConfig", "load_config"]

CONFIG_FILE_ENV = ENV_PREFIX + "CONFIG"
#: Controller options: SGLANG_SPEC_EXT_ADAPTIVE_<FIELD> / JSON key adaptive_<field>,
#: one per field of sglang_spec_ext.adaptive.AdaptiveConfig, validated by it.
ADAPTIVE_PREFIX = "adaptive_"
#: Variables read at build/install time (setup.py), not by the plugin at run time:
#: accepted in the environment of a running server and ignored.
BUILD_TIME_ENV = frozenset({ENV_PREFIX + "NO_NATIVE"})
#: Test-bed switches read where they act (sglang/cpu/overlap.py, cpu/graphs.py), not
#: config fields.
TEST_BED_ENV = frozenset({ENV_PREFIX + "CPU_OVERLAP", ENV_PREFIX + "CPU_GRAPHS"})


class ConfigError(ValueError):
    """A configuration value (env var or JSON key) is invalid."""


_FIELD_BY_NAME: dict[str, Field] = {f.name: f for f in FIELDS}

_TRUE = {"1", "true", "yes", "on"}
_FALSE = {"0", "false", "no", "off"}


def _coerce(field: Field, raw: Any, source: str) -> Any:
    """Convert ``raw`` (a string from the environment or a JSON value) and check range."""

    def bad() -> ConfigError:
        return ConfigError(
            f"{source}={raw!r} is invalid: expected {field.describe_range()} ({field.help})"
        )

    if field.kind is bool:
        if isinstance(raw, bool):
            return raw
        if isinstance(raw, str) and raw.strip().lower() in _TRUE | _FALSE:
            return raw.strip().lower() in _TRUE
        raise bad()
    if field.kind is str:
        if not isinstance(raw, str) or (field.choices and raw.strip() not in field.choices):
            raise bad()
        return raw.strip()
    # Numbers: JSON booleans are not numbers.
    if isinstance(raw, bool):
        raise bad()
    try:
        if field.kind is int:
            if isinstance(raw, float) and not raw.is_integer():
                raise bad()
            value: float = int(raw.strip()) if isinstance(raw, str) else int(raw)
        else:
            value = float(raw.strip()) if isinstance(raw, str) else float(raw)
    except (TypeError, ValueError):
        raise bad() from None
    if math.isnan(value) or not (field.lo <= value <= field.hi):
        raise bad()
    return value


def _read_json(path_str: str) -> dict[str, Any]:
    path = Path(path_str).expanduser()
    where = f"{CONFIG_FILE_ENV}={path_str!r}"
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as e:
        raise ConfigError(f"{where}: cannot read the config file: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(
            f"{where}: not valid JSON at line {e.lineno}, column {e.colno}: {e.msg}"
        ) from None
    if not isinstance(data, dict):
        raise ConfigError(
            f"{where}: the top level must be a JSON object, got {type(data).__name__}"
        )
    unknown = sorted(
        set(data) - set(_FIELD_BY_NAME) - {ADAPTIVE_PREFIX + n for n in _adaptive_fields()}
    )
    if unknown:
        raise ConfigError(
            f"{where}: unknown key(s) {', '.join(map(repr, unknown))}; "
            f"accepted keys: {', '.join(sorted(_FIELD_BY_NAME))}"
        )
    return data


@dataclass(frozen=True)
class PluginConfig:
    """The effective configuration. Build it with :func:`load_config`."""

    max_depth: int = 64
    spec_factor: float = 8.0
    spec_offset: float = 4.0
    min_token_prob: float = 0.02
    max_cached_requests: int = 10000
    max_cached_tokens: int = 4_000_000
    max_request_tokens: int = 65536
    global_prompt_cap: int = 64
    step_insert_tokens: int = 4096
    cache_prompts: bool = True
    use_tree: bool = True
    merge_drafts: bool = True
    recycle_topk: int = 0
    recycle_max_scopes: int = 16
    backend: str = "auto"
    cpu_fallbacks: bool = True
    host_fixes: bool = True
    plain_steps: bool = True
    draft_gate: bool = True
    draft_gate_cost: float = 0.1
    draft_gate_realised: bool = True
    ragged_verify: bool = True
    ragged_graphs: bool = True
    ragged_eager: str = "auto"
    verify_graph_widths: int = -1
    grammar_drafts: bool = True
    grammar_draft_ms: float = 20.0
    grammar_overlap: bool = True
    draft_kv_repair: bool = False
    draft_kv_repair_max_tokens: int = 8192
    stats_log_interval_s: float = 30.0
    adaptive: bool = False
    adaptive_policy: str = "goodput"
    isolation: str = "scoped"
    max_scope_tokens: int = 0
    max_corpus_tokens: int = 1_000_000
    snapshot_path: str = ""
    snapshot_peers: str = ""
    snapshot_interval_s: float = 300.0
    hybrid_draft: str = "auto"
    hybrid_policy: str = "learned"
    hybrid_skip_model_draft: bool = True
    hybrid_suffix_width: int = 16
    # Where each value came from: field name -> "default" | "file" | "env".
    sources: Mapping[str, str] = dataclasses.field(default_factory=dict, compare=False)
    # Adaptive-controller options that differ from AdaptiveConfig's defaults.
    adaptive_options: Mapping[str, Any] = dataclasses.field(default_factory=dict)

    def as_dict(self) -> dict[str, Any]:
        return {f.name: getattr(self, f.name) for f in FIELDS}

    def suffix_config(self) -> Any:
        """The suffix drafter's ``SuffixConfig`` for these settings (the one mapping)."""
        from sglang_spec_ext.suffix.config import SuffixConfig, suffix_config_kwargs

        return SuffixConfig(**suffix_config_kwargs(self.as_dict()))

    def recycle_config(self) -> Any:
        """The recycled draft source's ``RecycleConfig`` (``suffix/recycler.py``)."""
        from sglang_spec_ext.suffix.recycler import RecycleConfig

        return RecycleConfig(
            k=self.recycle_topk,
            max_scopes=self.recycle_max_scopes,
            min_prob=self.min_token_prob,
        )

    def suffix_memory(self, max_running_requests: int = 256) -> Any:
        """The suffix drafter's worst-case memory (``suffix.memory.MemoryEstimate``) for
        these settings: tenant scopes unless isolation is ``shared``, the corpora's bound."""
        from sglang_spec_ext.suffix.memory import estimate_bytes

        return estimate_bytes(
            self.suffix_config(),
            max_running_requests,
            scoped=self.isolation != "shared",
            corpus_tokens=self.max_corpus_tokens,
        )


def _check_fields_match() -> None:
    declared = {f.name for f in dataclasses.fields(PluginConfig)} - {"sources", "adaptive_options"}
    if declared != set(_FIELD_BY_NAME):  # pragma: no cover - a programming error
        raise AssertionError(f"FIELDS and PluginConfig disagree: {declared ^ set(_FIELD_BY_NAME)}")
    for f in FIELDS:
        default = next(d.default for d in dataclasses.fields(PluginConfig) if d.name == f.name)
        if default != f.default:  # pragma: no cover
            raise AssertionError(f"default of {f.name} differs between FIELDS and PluginConfig")


_check_fields_match()


def load_config(environ: Mapping[str, str] | None = None) -> PluginConfig:
    """Read and validate the configuration from ``environ`` (default ``os.environ``)."""
    env = os.environ if environ is None else environ
    known = set(_FIELD_BY_NAME) | {ADAPTIVE_PREFIX + n for n in _adaptive_fields()}
    unknown_env = sorted(
        k
        for k in env
        if k.startswith(ENV_PREFIX)
        and k != CONFIG_FILE_ENV
        and k not in BUILD_TIME_ENV
        and k not in TEST_BED_ENV
        and k[len(ENV_PREFIX) :].lower() not in known
    )
    if unknown_env:
        raise ConfigError(
            f"unknown variable(s) {', '.join(unknown_env)}; accepted: "
            + ", ".join(f.env for f in FIELDS)
            + f", {CONFIG_FILE_ENV}, and {ENV_PREFIX}ADAPTIVE_<FIELD> for the adaptive "
            "controller's fields (docs/adaptive.md)"
        )
    file_values: dict[str, Any] = {}
    if env.get(CONFIG_FILE_ENV):
        file_values = _read_json(env[CONFIG_FILE_ENV])
    values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    for f in FIELDS:
        if f.env in env:
            values[f.name] = _coerce(f, env[f.env], f.env)
            sources[f.name] = "env"
        elif f.name in file_values:
            values[f.name] = _coerce(
                f, file_values[f.name], f"{env[CONFIG_FILE_ENV]}: key {f.name!r}"
            )
            sources[f.name] = "file"
        else:
            values[f.name] = f.default
            sources[f.name] = "default"
    if values["max_cached_requests"] > 0 and values["max_cached_tokens"] == 0:
        raise ConfigError(
            f"{_FIELD_BY_NAME['max_cached_tokens'].env}=0 with "
            f"{_FIELD_BY_NAME['max_cached_requests'].env}={values['max_cached_requests']}: "
            "the global tree cannot hold requests without tokens; set both to 0 to disable it"
        )
    if values["max_request_tokens"] < values["max_depth"]:
        raise ConfigError(
            f"{_FIELD_BY_NAME['max_request_tokens'].env}={values['max_request_tokens']} is "
            f"invalid: expected at least {_FIELD_BY_NAME['max_depth'].env}="
            f"{values['max_depth']} (the per-request tree must hold one full match)"
        )
    if values["draft_kv_repair"] and not values["adaptive"]:
        raise ConfigError(
            f"{_FIELD_BY_NAME['draft_kv_repair'].env}=1 needs "
            f"{_FIELD_BY_NAME['adaptive'].env}=1 (only the adaptive controller chooses zero "
            "draft steps, the only steps the repair changes)"
        )
    if values["snapshot_peers"] and not values["snapshot_path"]:
        raise ConfigError(
            f"{_FIELD_BY_NAME['snapshot_peers'].env}={values['snapshot_peers']!r} needs "
            f"{_FIELD_BY_NAME['snapshot_path'].env} (this replica's own snapshot, e.g. a file "
            "in that directory): the peers' files are checked against it and loaded with it"
        )
    if values["snapshot_peers"] and not os.path.isdir(values["snapshot_peers"]):
        raise ConfigError(
            f"{_FIELD_BY_NAME['snapshot_peers'].env}={values['snapshot_peers']!r} is not a "
            "directory: name the directory the replicas' snapshot files are in"
        )
    options = _adaptive_options(env, file_values)
    return PluginConfig(**values, sources=sources, adaptive_options=options)


def _adaptive_fields() -> dict[str, Any]:
    """AdaptiveConfig field name -> default (imported lazily: numpy)."""
    from sglang_spec_ext.adaptive.config import AdaptiveConfig

    return {f.name: f.default for f in dataclasses.fields(AdaptiveConfig)}


#: Controller options whose default is None and whose value is a tuple of integers.
_OPTIONAL_TUPLES = frozenset({"verify_widths", "pinned_ks"})


def _parse_adaptive(name: str, default: Any, raw: Any, source: str) -> Any:
    def bad(expected: str) -> ConfigError:
        return ConfigError(f"{source}={raw!r} is invalid: expected {expected}")

    if name in _OPTIONAL_TUPLES:  # default None, a tuple when given
        default = ()
    if not isinstance(raw, str):  # from JSON: typed already, AdaptiveConfig checks it
        return tuple(raw) if isinstance(default, tuple) and isinstance(raw, list) else raw
    text = raw.strip()
    if isinstance(default, bool):
        if text.lower() not in _TRUE | _FALSE:
            raise bad("a boolean (1/0, true/false, yes/no, on/off)")
        return text.lower() in _TRUE
    try:
        if isinstance(default, tuple):
            return tuple(int(x) for x in text.split(",") if x.strip())
        if isinstance(default, int):
            return int(text)
        if isinstance(default, str):
            return text
        return float(text)  # floats, and cost overrides whose default is None
    except ValueError:
        kind = "comma-separated integers" if isinstance(default, tuple) else "a number"
        raise bad(kind) from None


def _adaptive_options(env: Mapping[str, str], file_values: Mapping[str, Any]) -> dict[str, Any]:
    fields = _adaptive_fields()
    options: dict[str, Any] = {}
    names: dict[str, str] = {}
    for name, default in fields.items():
        env_name = f"{ENV_PREFIX}{ADAPTIVE_PREFIX.upper()}{name.upper()}"
        key = ADAPTIVE_PREFIX + name
        if env_name in env:
            options[name] = _parse_adaptive(name, default, env[env_name], env_name)
            names[name] = env_name
        elif key in file_values:
            where = f"{env.get(CONFIG_FILE_ENV)}: key {key!r}"
            options[name] = _parse_adaptive(name, default, file_values[key], where)
            names[name] = where
    if options:
        from sglang_spec_ext.adaptive.config import AdaptiveConfig

        try:
            AdaptiveConfig(**options)
        except ValueError as e:
            given = ", ".join(f"{names[n]}={options[n]!r}" for n in options)
            raise ConfigError(f"adaptive controller options ({given}): {e}") from None
    return options


def adaptive_config(config: PluginConfig, max_k: int) -> Any:
    """The controller's ``AdaptiveConfig``, its largest budget capped at ``max_k``."""
    from sglang_spec_ext.adaptive.config import AdaptiveConfig

    options = dict(config.adaptive_options)
    options["max_k"] = min(max_k, options.get("max_k", max_k))
    return AdaptiveConfig(**options)


def field_table() -> list[tuple[str, str, str, str]]:
    """(env var, default, accepted range, help) rows, for docs and ``doctor``."""
    return [(f.env, repr(f.default), f.describe_range(), f.help) for f in FIELDS]
