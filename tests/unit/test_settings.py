"""The one configuration engine (scout_slurm/settings.py): one declaration per setting, one reading
path for the site config, the in-job settings and the timing rules; the references generated from
the declarations; the names scout-task and the bootstrap use come from them."""

from __future__ import annotations

import ast
import math
import re
import tomllib
from pathlib import Path

import pytest

from scout_slurm import config, jobconfig, reference
from scout_slurm.config import parse_config
from scout_slurm.errors import ConfigError
from scout_slurm.localise import straggler
from scout_slurm.settings import Kind, Owner, Refused, Setting, parse

ROOT = Path(__file__).resolve().parents[2]
SITE_SETTINGS = [s for group in config.SECTIONS.values() for s in group]
EVERY_SETTING = SITE_SETTINGS + list(jobconfig.SETTINGS)


def _s(kind: Kind, **kw: object) -> Setting:
    return Setting("X", "x", kind, kw.pop("default", None), "help", **kw)  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "setting, value, expected",
    [
        (_s(Kind.BOOL), True, True),
        (_s(Kind.BOOL), " Yes ", True),
        (_s(Kind.BOOL), "off", False),
        (_s(Kind.INT, minimum=0), " 12 ", 12),
        (_s(Kind.INT, minimum=0), 7, 7),
        (_s(Kind.FLOAT, minimum=0), "2.5", 2.5),
        (_s(Kind.FLOAT, minimum=0), 3, 3.0),
        (_s(Kind.DURATION, minimum=0, positive=True), "0.5", 0.5),
        (_s(Kind.FLOAT, minimum=0, maximum=1), 1, 1.0),
        (_s(Kind.STR), " kept as given ", " kept as given "),
        (_s(Kind.CHOICE, choices=("warn", "fatal")), " Fatal", "fatal"),
        (_s(Kind.CHOICE, choices=("auto", "on", "off")), "1", "on"),
        (_s(Kind.PATH), "/ev/run-0", Path("/ev/run-0")),
    ],
)
def test_one_reading_path_takes_text_and_typed_values(setting, value, expected):
    got = parse(setting, value)
    assert got == expected and type(got) is type(expected)


@pytest.mark.parametrize(
    "setting, value, reason, broken",
    [
        (_s(Kind.BOOL), "maybe", "not a boolean", ""),
        (_s(Kind.BOOL), 1, "not a boolean", ""),
        (_s(Kind.INT, minimum=0), 2.5, "not an integer", ""),
        (_s(Kind.INT, minimum=0), True, "not an integer", ""),
        (_s(Kind.INT, minimum=0), "ten", "not an integer", ""),
        (_s(Kind.FLOAT, minimum=0), False, "not a number", ""),
        (_s(Kind.FLOAT, minimum=0), "nan", "out of range", "a finite number >= 0"),
        (_s(Kind.FLOAT, minimum=0), "-inf", "out of range", "a finite number >= 0"),
        (_s(Kind.FLOAT, minimum=0, maximum=1), -0.1, "out of range", "a finite number >= 0"),
        (_s(Kind.FLOAT, minimum=0, maximum=1), 1.5, "out of range", "within 0..1"),
        (_s(Kind.DURATION, minimum=0, positive=True), 0, "out of range", "positive"),
        (_s(Kind.INT, minimum=2, why="one is not enough"), 1, "out of range", "at least 2 (one"),
        (_s(Kind.INT, minimum=1, maximum=8), 9, "out of range", "within 1..8"),
        (_s(Kind.STR), 3, "not text", ""),
        (_s(Kind.CHOICE, choices=("warn", "fatal")), "1", "not a valid choice", "'warn' or"),
        (_s(Kind.CHOICE, choices=("a", "b", "c")), "d", "not a valid choice", "one of 'a', 'b'"),
        (_s(Kind.PATH), "relative", "not an absolute path", ""),
    ],
)
def test_a_refusal_says_how_and_which_rule(setting, value, reason, broken):
    with pytest.raises(Refused) as exc:
        parse(setting, value)
    assert exc.value.reason == reason and exc.value.broken.startswith(broken)


def test_a_site_refusal_names_the_key_the_value_the_rule_and_the_fix():
    with pytest.raises(ConfigError) as exc:
        parse_config({"drain": {"min_users": 1}}, source="site.toml")
    assert str(exc.value) == (
        "site.toml: [drain] min_users must be at least 2 (one user's jobs are one word), got 1; "
        "use an integer >= 2, or remove the key for its default (2)"
    )
    with pytest.raises(ConfigError) as exc:
        parse_config({"epilog": {"localise_on": "both"}}, source="site.toml")
    assert "[epilog] localise_on must be 'controller' or 'batch-host', got 'both'" in str(exc.value)
    assert (
        "use one of controller, batch-host, or remove the key for its default ('controller')"
        in (str(exc.value))
    )
    with pytest.raises(ConfigError) as exc:
        parse_config({"evidence": {"root": 3}}, source="site.toml")
    assert str(exc.value) == (
        "site.toml: [evidence] root: expected a string, got 3; use a string, or remove the key for "
        "its default ('/var/lib/scout/evidence')"
    )


def test_the_site_config_and_the_job_read_a_choice_alike():
    # the same declaration engine: case and spaces do not matter to either
    assert parse_config({"remediation": {"on_resume_mismatch": " Fatal"}}).remediation == (
        config.RemediationConfig(on_resume_mismatch="fatal")
    )
    job = jobconfig.JobConfig.from_environment({"SCOUT_RESUME_MISMATCH": " Fatal"})
    assert job.resume_mismatch is jobconfig.ResumeMismatch.FATAL
    # and a timing boolean takes every word the table documents (on/off included)
    assert straggler.rules_from_environment({"SCOUT_TIMING_PROBE": "off"}).probe is False


@pytest.mark.parametrize("setting", EVERY_SETTING, ids=lambda s: s.name)
def test_every_default_passes_its_own_declaration(setting):
    if setting.default is None or setting.kind in (Kind.PATH, Kind.CUSTOM):
        return  # unset by default
    if setting.default == "" and setting.kind is Kind.CHOICE:
        return  # SCOUT_LOG_LEVEL: empty is the default (scout's own level)
    value = setting.default.value if hasattr(setting.default, "value") else setting.default
    assert parse(setting, value) == value


@pytest.mark.parametrize("setting", EVERY_SETTING, ids=lambda s: s.name)
def test_every_declaration_is_documented(setting):
    assert setting.help.strip() and setting.accepts()
    if setting.owner is Owner.SITE:
        assert setting.readers or "nothing reads it" in setting.help, setting.name
    else:
        assert setting.owner in (Owner.USER, Owner.SHIM, Owner.SLURM)


def test_the_site_config_is_its_declarations():
    for section, settings in config.SECTIONS.items():
        cls = type(getattr(config.SiteConfig(), section))
        assert [s.name for s in settings] == list(cls.__dataclass_fields__), section
        for s in settings:
            assert s.default == getattr(cls(), s.name) and s.owner is Owner.SITE
            numeric = s.kind in (Kind.INT, Kind.FLOAT, Kind.DURATION)
            assert not numeric or (s.minimum is not None and s.minimum >= 0), s.name
    assert set(config.site_override_names()) == {
        f"SCOUT_{sec.upper()}_{s.name.upper()}" for sec, g in config.SECTIONS.items() for s in g
    }


def test_the_timing_rules_are_declared_where_they_live():
    assert jobconfig.TIMING_SETTINGS == straggler.SETTINGS
    assert {s.field for s in straggler.SETTINGS} == {
        "timing." + n for n in straggler.TimingRules.__dataclass_fields__ if n != "schema_version"
    }


def test_the_example_site_config_is_declared_and_valid():
    path = ROOT / "epilog" / "scout.toml.example"
    data = tomllib.loads(path.read_text())
    for section, values in data.items():
        assert section in config.SECTIONS, f"{path}: [{section}] is not a declared section"
        names = {s.name for s in config.SECTIONS[section]}
        assert set(values) <= names, f"{path}: [{section}] {sorted(set(values) - names)}"
    cfg = parse_config(data, source=str(path))
    # the README's site quickstart tells a site to start observing only: the example it copies
    # must say so
    assert cfg.remediation.observe_only is True, f"{path}: ship observe_only = true"


def test_the_references_are_generated_from_the_declarations():
    users = (ROOT / reference.USERS_REFERENCE).read_text()
    assert reference.with_knobs(users) == users, (
        f"{reference.USERS_REFERENCE}'s knobs block is stale: run `python -m scout_slurm.reference`"
    )
    site = (ROOT / reference.SITE_REFERENCE).read_text()
    assert site == reference.render_site_markdown(), (
        f"{reference.SITE_REFERENCE} is stale: run `python -m scout_slurm.reference`"
    )
    for section, settings in config.SECTIONS.items():
        assert f"## [{section}]" in site
        for s in settings:
            assert f"| `{s.name}` |" in site
    for s in jobconfig.SETTINGS:
        assert f"| `{s.name}` |" in users


def test_as_environment_writes_what_the_job_reads_back():
    finite = jobconfig.BY_NAME["SCOUT_FINITE_CHECK"]
    env = jobconfig.as_environment(
        {jobconfig.RUN_DIR: Path("/ev/run-1"), jobconfig.STEP_OFFSET: 40, finite: False}
    )
    assert env == {"SCOUT_RUN_DIR": "/ev/run-1", "SCOUT_STEP_OFFSET": "40", finite.name: "0"}
    job = jobconfig.JobConfig.from_environment(env)
    assert (job.run_dir, job.step_offset, job.finite_check) == (Path("/ev/run-1"), 40, False)
    with pytest.raises(ConfigError, match="SCOUT_RUN_DIR='relative': not an absolute path"):
        jobconfig.as_environment({jobconfig.RUN_DIR: "relative"})


def _literal_names(path: Path) -> list[str]:
    """SCOUT_* names written as string constants in a module (docstrings aside)."""
    tree = ast.parse(path.read_text())
    docs = {
        id(node.body[0].value)
        for node in ast.walk(tree)
        if isinstance(node, (ast.Module, ast.FunctionDef, ast.ClassDef))
        and node.body
        and isinstance(node.body[0], ast.Expr)
        and isinstance(node.body[0].value, ast.Constant)
    }
    return [
        name
        for node in ast.walk(tree)
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
        for name in re.findall(r"SCOUT_[A-Z][A-Z_]*", node.value)
    ]


def test_the_shim_names_no_setting_itself():
    assert _literal_names(ROOT / "scout_slurm" / "task" / "shim.py") == []


def test_the_bootstrap_names_only_what_it_needs_before_scout_imports_and_as_the_table_does():
    path = ROOT / "scout_slurm" / "bootstrap" / "site" / "sitecustomize.py"
    assert sorted(_literal_names(path)) == sorted(
        [jobconfig.PROGRESS_DIR.name, jobconfig.PACKAGE_DIR.name]
    )
    text = path.read_text()
    assert f'_PROGRESS_DIR = "{jobconfig.PROGRESS_DIR.name}"' in text
    assert f'_PACKAGE_DIR = "{jobconfig.PACKAGE_DIR.name}"' in text
    # it imports nothing but the standard library before it has found scout_slurm
    head = text.split("def _scout_install", 1)[0]
    assert re.findall(r"^(?:import|from) (\S+)", head, re.M) == ["os", "sys"]


def test_no_number_is_nan_or_negative_anywhere():
    for s in SITE_SETTINGS:
        if s.kind in (Kind.INT, Kind.FLOAT, Kind.DURATION):
            assert math.isfinite(s.default) and s.default >= 0  # type: ignore[arg-type]
