"""Site config: defaults, the TOML file, validation, precedence default < file < env < flags."""

from __future__ import annotations

import dataclasses
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from scout_slurm import config
from scout_slurm.config import (
    ConfigError,
    EpilogConfig,
    RemediationConfig,
    SiteConfig,
    SlurmConfig,
    WatchdogConfig,
    env_overrides,
    load_config,
    merge,
    parse_config,
    render_toml,
)


@pytest.fixture(autouse=True)
def no_site_file(tmp_path, monkeypatch):
    """Never read this machine's /etc/scout/scout.toml."""
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", tmp_path / "absent" / "scout.toml")


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "scout.toml"
    path.write_text(text)
    return path


def test_defaults():
    cfg = load_config({})
    assert cfg == SiteConfig()
    assert cfg.slurm == SlurmConfig(bin_dir="", timeout_s=30.0, retries=3, retry_wait_s=2.0)
    assert cfg.evidence.root == "/var/lib/scout/evidence"
    assert cfg.remediation.min_confidence == 0.8 and cfg.remediation.requeue is True
    assert cfg.epilog.localise_on == "controller"
    assert parse_config({}) == SiteConfig()


def test_file(tmp_path):
    path = write(
        tmp_path,
        """
[slurm]
bin_dir = "/opt/slurm/bin"
timeout_s = 12
retries = 5

[remediation]
observe_only = true
min_confidence = 0.9

[epilog]
localise_on = "batch-host"
""",
    )
    cfg = load_config({}, path=path)
    assert cfg.slurm == SlurmConfig(
        bin_dir="/opt/slurm/bin", timeout_s=12.0, retries=5, retry_wait_s=2.0
    )
    assert isinstance(cfg.slurm.timeout_s, float)  # an int in TOML becomes the field's float
    assert cfg.remediation == RemediationConfig(observe_only=True, min_confidence=0.9)
    assert cfg.epilog == EpilogConfig(localise_on="batch-host")
    assert cfg.watchdog == WatchdogConfig()  # sections not in the file keep defaults
    assert load_config({"SCOUT_CONFIG": str(path)}) == cfg  # also found through SCOUT_CONFIG


def test_default_path_is_read_when_present(tmp_path, monkeypatch):
    path = write(tmp_path, "[slurm]\nretries = 7\n")
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", path)
    assert load_config({}).slurm.retries == 7


def test_unknown_section_lists_valid_ones(tmp_path):
    path = write(tmp_path, "[slurmm]\nretries = 1\n")
    with pytest.raises(ConfigError) as err:
        load_config({}, path=path)
    msg = str(err.value)
    assert str(path) in msg and "slurmm" in msg
    assert "valid sections: drain, epilog, evidence, prolog, remediation, slurm, watchdog" in msg


def test_unknown_key_lists_valid_ones(tmp_path):
    path = write(tmp_path, "[slurm]\ntimeout = 3\nretry = 1\n")
    with pytest.raises(ConfigError) as err:
        load_config({}, path=path)
    msg = str(err.value)
    assert "unknown key(s) retry, timeout in [slurm]" in msg
    assert "valid keys: bin_dir, retries, retry_wait_s, timeout_s" in msg


def test_env_overrides_reads_only_the_table():
    assert env_overrides(
        {
            "SCOUT_SLURM_RETRIES": "4",
            "SCOUT_CONFIG": "/x",
            "SCOUT_LAB_DIR": "/y",
            "SLURM_CONF": "/z",
            "scout_slurm_retries": "5",
        }
    ) == {"slurm": {"retries": "4"}}


def test_unknown_flag_section_and_key():
    with pytest.raises(ConfigError, match="unknown section nope; valid: drain, epilog, evidence"):
        load_config({}, flags={"nope": {"x": 1}})
    with pytest.raises(
        ConfigError, match="command-line flags: unknown key.* zap in \\[slurm\\]; valid keys"
    ):
        load_config({}, flags={"slurm": {"zap": 1}})


@pytest.mark.parametrize(
    "toml, words",
    [
        ('[slurm]\nretries = "three"', "[slurm] retries: expected an integer, got 'three'"),
        ("[slurm]\nretries = 2.5", "[slurm] retries: expected an integer, got 2.5"),
        ("[slurm]\nretries = true", "[slurm] retries: expected an integer, got True"),
        ('[slurm]\ntimeout_s = "soon"', "[slurm] timeout_s: expected a number, got 'soon'"),
        ("[slurm]\ntimeout_s = false", "[slurm] timeout_s: expected a number, got False"),
        ("[slurm]\nbin_dir = 3", "[slurm] bin_dir: expected a string, got 3"),
        (
            '[remediation]\nrequeue = "maybe"',
            "[remediation] requeue: expected true or false, got 'maybe'",
        ),
        ("[remediation]\nrequeue = 1", "[remediation] requeue: expected true or false, got 1"),
        ("slurm = 3", "[slurm] must be a table, got int"),
        ("[slurm]\ntimeout_s = [1]", "[slurm] timeout_s: expected a number, got [1]"),
    ],
)
def test_wrong_types(tmp_path, toml, words):
    with pytest.raises(ConfigError) as err:
        load_config({}, path=write(tmp_path, toml))
    assert words in str(err.value)


@pytest.mark.parametrize(
    "section, key, value, words",
    [
        ("remediation", "min_confidence", 1.5, "min_confidence must be within 0..1"),
        ("remediation", "min_confidence", -0.1, "min_confidence must be a finite number >= 0"),
        ("remediation", "max_drain_fraction", 2.0, "max_drain_fraction must be within 0..1"),
        ("epilog", "localise_on", "everywhere", "localise_on must be 'controller' or 'batch-host'"),
        ("watchdog", "stall_floor_s", 0.0, "must be positive"),
        ("watchdog", "poll_interval_s", 0.0, "must be positive"),
        ("slurm", "timeout_s", 0.0, "[slurm] timeout_s must be positive"),
        ("slurm", "timeout_s", -1.0, "[slurm] timeout_s must be a finite number >= 0, got -1.0"),
        ("slurm", "timeout_s", float("inf"), "timeout_s must be a finite number >= 0, got inf"),
        ("watchdog", "grace_s", float("nan"), "grace_s must be a finite number >= 0, got nan"),
        ("slurm", "retries", -1, "[slurm] retries must be a finite number >= 0, got -1"),
        ("remediation", "restart_limit", -2, "restart_limit must be a finite number >= 0"),
    ],
)
def test_ranges(section, key, value, words):
    with pytest.raises(ConfigError) as err:
        parse_config({section: {key: value}}, source="site.toml")
    assert str(err.value).startswith("site.toml: ") and words in str(err.value)


def test_range_edges_are_accepted():
    cfg = parse_config(
        {
            "remediation": {"min_confidence": 0.0, "max_drain_fraction": 1.0, "restart_limit": 0},
            "slurm": {"retries": 0, "retry_wait_s": 0},
        }
    )
    assert cfg.remediation.min_confidence == 0.0 and cfg.remediation.max_drain_fraction == 1.0
    assert cfg.slurm.retries == 0


def test_precedence_default_file_env_flags(tmp_path):
    path = write(tmp_path, "[slurm]\ntimeout_s = 11\nretries = 1\nretry_wait_s = 0.5\n")
    env = {"SCOUT_SLURM_RETRIES": "4", "SCOUT_SLURM_RETRY_WAIT_S": "1.5"}
    cfg = load_config(env, path=path, flags={"slurm": {"retry_wait_s": 9}})
    assert cfg.slurm.bin_dir == ""  # default
    assert cfg.slurm.timeout_s == 11.0  # file beats default
    assert cfg.slurm.retries == 4  # environment beats file
    assert cfg.slurm.retry_wait_s == 9.0  # flag beats environment
    assert load_config(env, path=path).slurm.retry_wait_s == 1.5
    assert load_config({}, path=path).slurm.retry_wait_s == 0.5


def test_env_values_are_coerced_and_checked():
    cfg = load_config(
        {
            "SCOUT_REMEDIATION_OBSERVE_ONLY": "yes",
            "SCOUT_PROLOG_FAIL_ON_BROKEN_GPU": "off",
            "SCOUT_EPILOG_LOCALISE_ON": "batch-host",
            "SCOUT_EVIDENCE_MAX_RECORD_BYTES": " 1024 ",
        }
    )
    assert cfg.remediation.observe_only is True and cfg.prolog.fail_on_broken_gpu is False
    assert cfg.epilog.localise_on == "batch-host" and cfg.evidence.max_record_bytes == 1024
    with pytest.raises(
        ConfigError,
        match=r"environment \(SCOUT_\* variables\): \[slurm\] retries: expected an integer, got "
        r"'2x'",
    ):
        load_config({"SCOUT_SLURM_RETRIES": "2x"})
    with pytest.raises(ConfigError, match="min_confidence must be within 0..1"):
        load_config({"SCOUT_REMEDIATION_MIN_CONFIDENCE": "7"})


def test_env_does_not_undo_the_file_for_other_keys(tmp_path):
    path = write(tmp_path, "[remediation]\nrestart_limit = 9\n")
    cfg = load_config({"SCOUT_REMEDIATION_REQUEUE": "false"}, path=path)
    assert cfg.remediation.restart_limit == 9 and cfg.remediation.requeue is False


def test_explicit_missing_file_is_an_error(tmp_path):
    missing = tmp_path / "nope.toml"
    with pytest.raises(
        ConfigError, match=f"{missing}: site config not found \\(named by --config\\)"
    ):
        load_config({}, path=missing)
    with pytest.raises(
        ConfigError, match=f"{missing}: site config not found \\(named by SCOUT_CONFIG\\)"
    ):
        load_config({"SCOUT_CONFIG": str(missing)})


@pytest.mark.parametrize("content", [b"[slurm\n", b"\xff\xfe", b"x = = 1"])
def test_unreadable_file(tmp_path, content):
    path = tmp_path / "bad.toml"
    path.write_bytes(content)
    with pytest.raises(ConfigError, match=f"{path}: cannot read the site config"):
        load_config({}, path=path)


def test_oversized_file(tmp_path):
    path = tmp_path / "big.toml"
    path.write_text("# " + "x" * (1024 * 1024) + "\n")
    with pytest.raises(ConfigError, match="larger than 1 MiB"):
        load_config({}, path=path)


def test_merge_keeps_base_and_checks():
    base = parse_config({"slurm": {"retries": 6}})
    cfg = merge(base, {"slurm": {"timeout_s": "3"}}, source="test")
    assert (cfg.slurm.retries, cfg.slurm.timeout_s) == (6, 3.0)
    assert base.slurm.timeout_s == 30.0


def test_render_toml_round_trip_of_defaults_and_lab_like_values():
    cfg = SiteConfig(
        slurm=SlurmConfig(bin_dir='C:\\odd "dir"\n\ttab', timeout_s=0.001, retries=0),
        watchdog=WatchdogConfig(stall_floor_s=8.0, poll_interval_s=1e-5),
        remediation=RemediationConfig(observe_only=True, min_confidence=1.0),
    )
    for c in (SiteConfig(), cfg):
        text = render_toml(c)
        assert parse_config(tomllib.loads(text), source="rendered") == c


def _section_values(cls):
    strategies = {}
    for f in dataclasses.fields(cls):
        kind = f.type if isinstance(f.type, str) else f.type.__name__
        strategies[f.name] = {
            "bool": st.booleans(),
            "int": st.integers(0, 2**40),
            "float": st.floats(0, 1e9, allow_nan=False, allow_infinity=False),
            "str": st.text(max_size=20),
        }[kind]
    return st.fixed_dictionaries({}, optional=strategies)


@settings(max_examples=200, deadline=None)
@given(
    st.fixed_dictionaries(
        {},
        optional={
            "slurm": _section_values(SlurmConfig),
            "watchdog": _section_values(WatchdogConfig),
            "remediation": _section_values(RemediationConfig),
        },
    )
)
def test_render_toml_round_trip_property(data):
    try:
        cfg = parse_config(data)
    except ConfigError:
        return  # out of range (e.g. min_confidence 5): not a config to render
    assert parse_config(tomllib.loads(render_toml(cfg))) == cfg
