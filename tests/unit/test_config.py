"""Configuration: env vars + JSON file, every invalid value named with its range."""

from __future__ import annotations

import json

import pytest

from sglang_spec_ext.config import FIELDS, ConfigError, PluginConfig, field_table, load_config


def test_defaults_without_environment():
    cfg = load_config({})
    assert cfg == PluginConfig()
    assert set(cfg.sources.values()) == {"default"}


def test_env_values_are_parsed_and_typed():
    cfg = load_config(
        {
            "SGLANG_SPEC_EXT_MAX_DEPTH": "32",
            "SGLANG_SPEC_EXT_SPEC_FACTOR": "2.5",
            "SGLANG_SPEC_EXT_USE_TREE": "off",
            "SGLANG_SPEC_EXT_BACKEND": "python",
        }
    )
    assert (cfg.max_depth, cfg.spec_factor, cfg.use_tree, cfg.backend) == (32, 2.5, False, "python")
    assert cfg.sources["max_depth"] == "env"


@pytest.mark.parametrize(
    "var, value, fragment",
    [
        ("SGLANG_SPEC_EXT_MAX_DEPTH", "0", "an integer in [1, 1024]"),
        ("SGLANG_SPEC_EXT_MAX_DEPTH", "10000000", "an integer in [1, 1024]"),
        ("SGLANG_SPEC_EXT_MAX_DEPTH", "3.5", "an integer"),
        ("SGLANG_SPEC_EXT_MIN_TOKEN_PROB", "nan", "a number in [0, 1]"),
        ("SGLANG_SPEC_EXT_MIN_TOKEN_PROB", "-0.1", "a number in [0, 1]"),
        ("SGLANG_SPEC_EXT_MAX_CACHED_TOKENS", "1e12", "an integer"),
        ("SGLANG_SPEC_EXT_USE_TREE", "maybe", "a boolean"),
        ("SGLANG_SPEC_EXT_BACKEND", "gpu", "one of auto, native, python"),
    ],
)
def test_invalid_env_value_names_variable_value_and_range(var, value, fragment):
    with pytest.raises(ConfigError) as err:
        load_config({var: value})
    msg = str(err.value)
    assert var in msg and repr(value) in msg and fragment in msg


def test_unknown_prefixed_variable_is_rejected():
    with pytest.raises(ConfigError, match="unknown variable.*SGLANG_SPEC_EXT_MAX_DEPHT"):
        load_config({"SGLANG_SPEC_EXT_MAX_DEPHT": "3"})


def test_json_file_then_env_precedence(tmp_path):
    f = tmp_path / "spec.json"
    f.write_text(json.dumps({"max_depth": 20, "min_token_prob": 0.3}))
    cfg = load_config({"SGLANG_SPEC_EXT_CONFIG": str(f), "SGLANG_SPEC_EXT_MAX_DEPTH": "40"})
    assert cfg.max_depth == 40 and cfg.sources["max_depth"] == "env"
    assert cfg.min_token_prob == 0.3 and cfg.sources["min_token_prob"] == "file"


@pytest.mark.parametrize(
    "content, fragment",
    [
        ("{not json", "not valid JSON at line 1, column 2"),
        ("[1, 2]", "top level must be a JSON object"),
        ('{"max_depht": 3}', "unknown key(s) 'max_depht'"),
        ('{"max_depth": "deep"}', "key 'max_depth'"),
        ('{"max_depth": true}', "an integer in [1, 1024]"),
    ],
)
def test_corrupt_json_file_is_reported_with_file_and_position(tmp_path, content, fragment):
    f = tmp_path / "bad.json"
    f.write_text(content)
    with pytest.raises(ConfigError) as err:
        load_config({"SGLANG_SPEC_EXT_CONFIG": str(f)})
    assert fragment in str(err.value) and str(f) in str(err.value)


def test_missing_json_file(tmp_path):
    with pytest.raises(ConfigError, match="cannot read the config file"):
        load_config({"SGLANG_SPEC_EXT_CONFIG": str(tmp_path / "nope.json")})


def test_inconsistent_cache_bounds():
    with pytest.raises(ConfigError, match="set both to 0"):
        load_config({"SGLANG_SPEC_EXT_MAX_CACHED_TOKENS": "0"})
    cfg = load_config(
        {"SGLANG_SPEC_EXT_MAX_CACHED_TOKENS": "0", "SGLANG_SPEC_EXT_MAX_CACHED_REQUESTS": "0"}
    )
    assert cfg.max_cached_requests == 0


def test_every_field_is_documented():
    from pathlib import Path

    page = (Path(__file__).resolve().parents[2] / "docs" / "configuration.md").read_text()
    missing = [f.env for f in FIELDS if f.env not in page]
    assert not missing, f"docs/configuration.md does not document {missing}"
    assert len(field_table()) == len(FIELDS)


def test_adaptive_options_are_parsed_and_validated_by_the_controller_config():
    from sglang_spec_ext.config import adaptive_config

    cfg = load_config(
        {
            "SGLANG_SPEC_EXT_ADAPTIVE": "1",
            "SGLANG_SPEC_EXT_ADAPTIVE_CANDIDATE_KS": "0,1,3,7,15",
            "SGLANG_SPEC_EXT_ADAPTIVE_SWITCH_PATIENCE": "4",
            "SGLANG_SPEC_EXT_ADAPTIVE_CALIBRATE": "off",
        }
    )
    assert cfg.adaptive and cfg.adaptive_options["candidate_ks"] == (0, 1, 3, 7, 15)
    ac = adaptive_config(cfg, max_k=7)
    assert ac.max_k == 7 and ac.switch_patience == 4 and ac.calibrate is False


@pytest.mark.parametrize(
    "env, fragment",
    [
        ({"SGLANG_SPEC_EXT_ADAPTIVE_DECAY": "2"}, "SGLANG_SPEC_EXT_ADAPTIVE_DECAY=2.0"),
        ({"SGLANG_SPEC_EXT_ADAPTIVE_CANDIDATE_KS": "a,b"}, "comma-separated integers"),
        ({"SGLANG_SPEC_EXT_ADAPTIVE_CALIBRATE": "perhaps"}, "a boolean"),
        ({"SGLANG_SPEC_EXT_ADAPTIVE_PROBE_BUDGET": "0"}, "SGLANG_SPEC_EXT_ADAPTIVE_PROBE_BUDGET=0"),
        (
            {"SGLANG_SPEC_EXT_ADAPTIVE_NOPE": "1"},
            "unknown variable(s) SGLANG_SPEC_EXT_ADAPTIVE_NOPE",
        ),
    ],
)
def test_bad_adaptive_options_name_the_variable(env, fragment):
    with pytest.raises(ConfigError) as err:
        load_config(env)
    assert fragment in str(err.value)


def test_adaptive_options_in_json(tmp_path):
    f = tmp_path / "c.json"
    f.write_text(json.dumps({"adaptive": True, "adaptive_tiers": [1, 8, 64]}))
    cfg = load_config({"SGLANG_SPEC_EXT_CONFIG": str(f)})
    assert cfg.adaptive_options == {"tiers": (1, 8, 64)}


def test_adaptive_variables_named_in_the_docs_exist():
    import dataclasses
    import re
    from pathlib import Path

    from sglang_spec_ext.adaptive.config import AdaptiveConfig

    root = Path(__file__).resolve().parents[2]
    readme = "\n".join(p.read_text() for p in [root / "README.md", *sorted(root.glob("docs/*.md"))])
    from sglang_spec_ext.config import FIELDS

    names = {f.name for f in dataclasses.fields(AdaptiveConfig)}
    # plugin fields named adaptive_* (e.g. ADAPTIVE_POLICY) have the same prefix
    names |= {f.name.removeprefix("adaptive_") for f in FIELDS if f.name.startswith("adaptive_")}
    cited = set(re.findall(r"SGLANG_SPEC_EXT_ADAPTIVE_([A-Z][A-Z_]*[A-Z])", readme)) - {"FIELD"}
    assert cited, "the docs cite no adaptive option"
    assert {c.lower() for c in cited} <= names, {c.lower() for c in cited} - names


def test_pinned_ks_from_env():
    """SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS: one k per tier, -1 left to the controller;
    a pinned k is a candidate by that; bad values name the variable."""
    from sglang_spec_ext.config import adaptive_config, load_config

    env = {
        "SGLANG_SPEC_EXT_ADAPTIVE_TIERS": "1,2,4",
        "SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS": "5,-1,0",
    }
    ac = adaptive_config(load_config(env), max_k=5)
    assert ac.pinned() == {1: 5, 4: 0} and 5 in ac.ks
    for bad in ("5,0", "1,x,0", "64,0,0", "-2,0,0"):
        with pytest.raises(ConfigError, match="SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS"):
            load_config({**env, "SGLANG_SPEC_EXT_ADAPTIVE_PINNED_KS": bad})
    with pytest.raises(ValueError, match="max_k=3"):  # above the server's step count
        adaptive_config(load_config(env), max_k=3)


def test_draft_kv_repair_needs_the_adaptive_controller_and_a_sane_budget():
    on = {"SGLANG_SPEC_EXT_DRAFT_KV_REPAIR": "1"}
    with pytest.raises(ConfigError, match="DRAFT_KV_REPAIR=1 needs SGLANG_SPEC_EXT_ADAPTIVE=1"):
        load_config(on)
    cfg = load_config({**on, "SGLANG_SPEC_EXT_ADAPTIVE": "1"})
    assert cfg.draft_kv_repair and cfg.draft_kv_repair_max_tokens == 8192
    with pytest.raises(ConfigError, match="DRAFT_KV_REPAIR_MAX_TOKENS.*an integer in"):
        load_config(
            {
                **on,
                "SGLANG_SPEC_EXT_ADAPTIVE": "1",
                "SGLANG_SPEC_EXT_DRAFT_KV_REPAIR_MAX_TOKENS": "0",
            }
        )
