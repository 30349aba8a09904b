"""`scout site check` (scout_slurm/site/check.py): a site laid out by `scout site install` and the
Prolog's own folder code in a tmp folder passes; each misconfiguration planted in it is found,
with its remedy. Slurm's side is the lab's recorded `scontrol show config` (22.05.8)."""

from __future__ import annotations

import dataclasses
import os
import stat
import sys
import sysconfig
from pathlib import Path

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from scout_slurm.cli import main
from scout_slurm.config import EvidenceConfig, SiteConfig, render_toml
from scout_slurm.errors import SlurmError
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.evidence.safeio import Owner
from scout_slurm.hooks.prolog import prepare_job_folder
from scout_slurm.log import get_logger
from scout_slurm.site import check
from scout_slurm.site.check import Severity
from scout_slurm.site.layout import site_layout, write_layout
from scout_slurm.slurm.parse import parse_show_config

FIXTURE = (
    Path(__file__).resolve().parents[1] / "fixtures" / "slurm-22.05" / "scontrol-show-config.txt"
)
NOBODY = 65534  # SlurmUser here: a user every Debian host has
JOB_USER = 1001

pytestmark = pytest.mark.skipif(os.geteuid() != 0, reason="plants files owned by other users")


def _text() -> str:
    # the lab's SlurmUser is `slurm`, made by the lab; a bare host has `nobody`
    return FIXTURE.read_text().replace("slurm(64030)", f"nobody({NOBODY})")


@dataclasses.dataclass
class Site:
    prefix: Path
    config: Path
    evidence: Path
    settings: object
    job: JobFolder

    def run(self, **kw) -> check.Report:
        settings = kw.pop("settings", self.settings)
        return check.run_checks(
            kw.pop("config", self.config),
            {},
            show_config=lambda cfg: settings,
            daemons=frozenset({"slurmctld", "slurmd"}),
        )


@pytest.fixture()
def site(tmp_path: Path) -> Site:
    """What an administrator has after `scout site install --prefix`, a site config naming the
    evidence root and SlurmUser, and one job's folders laid out by the Prolog's own code."""
    os.chmod(tmp_path, 0o755)
    layout = site_layout(
        tmp_path / "site",
        scripts_dir=Path(sysconfig.get_path("scripts")),
        python=Path(sys.executable),
        slurm_conf=Path("/etc/slurm/slurm.conf"),
    )
    write_layout(layout)
    evidence = tmp_path / "evidence"
    evidence.mkdir(mode=0o755)
    layout.config.write_text(
        render_toml(SiteConfig(evidence=EvidenceConfig(root=str(evidence), slurm_user="nobody")))
    )
    os.chmod(layout.config, 0o644)
    job = JobFolder(evidence, "scoutlab", 42)
    made = prepare_job_folder(
        job,
        "n1",
        0,
        Owner(JOB_USER, NOBODY, 0o2750),
        get_logger("test"),
        slurm_owner=Owner(NOBODY, NOBODY, 0o755),
    )
    assert made == job.node_dir("n1")
    settings = dataclasses.replace(
        parse_show_config(_text()),
        prolog=(layout.globs["Prolog"],),
        epilog=(layout.globs["Epilog"],),
        epilog_slurmctld=(str(layout.wrappers["EpilogSlurmctld"]),),
    )
    return Site(tmp_path / "site", layout.config, evidence, settings, job)


def _of(report: check.Report, name: str, severity: Severity) -> list[check.Finding]:
    return [f for f in report.findings if f.check == name and f.severity == severity]


HOST_BOUND = {"kernel-log"}  # /dev/kmsg is this host's (a container may lack it), not the site's


def _fails(report: check.Report) -> list[check.Finding]:
    return [f for f in report.findings if f.severity == Severity.FAIL and f.check not in HOST_BOUND]


def _one_fail(report: check.Report, name: str) -> check.Finding:
    fails = _fails(report)
    assert [f.check for f in fails] == [name], report.render()
    return fails[0]


def _tree(root: Path) -> dict[str, tuple]:
    out = {}
    for dirpath, dirs, files in os.walk(root):
        for name in [*dirs, *files]:
            st = os.lstat(os.path.join(dirpath, name))
            out[os.path.join(dirpath, name)] = (st.st_mode, st.st_uid, st.st_gid, st.st_mtime_ns)
    return out


# -- the parser, on recorded output ------------------------------------------------------------


def test_parse_show_config_reads_the_recorded_22_05_output():
    s = parse_show_config(FIXTURE.read_text())
    assert s.version == "22.05.8" and s.release == (22, 5)
    assert s.cluster_name == "scoutlab"
    assert (s.slurm_user, s.slurm_user_uid) == ("slurm", 64030)
    assert s.prolog == ("/tmp/scout-sitecheck-lab/hooks/prolog",)
    assert s.epilog == ("/tmp/scout-sitecheck-lab/hooks/epilog",)
    assert s.epilog_slurmctld == ("/tmp/scout-sitecheck-lab/hooks/epilog-slurmctld",)
    assert s.prolog_flags == ("Alloc",)
    assert s.prolog_timeout == s.epilog_timeout == ("PrologEpilogTimeout", 180)
    assert s.min_job_age_s == 300
    assert s.raw["PrologSlurmctld"] == "(null)"


@pytest.mark.parametrize("release", ["24.11", "26.05"])
def test_parse_show_config_reads_the_numbered_hook_lines_of_newer_releases(release):
    path = FIXTURE.parents[1] / f"slurm-{release}" / "scontrol-show-config.txt"
    s = parse_show_config(path.read_text())
    assert s.release == tuple(int(x) for x in release.split("."))
    lab = f"/tmp/scout-sitecheck-lab{release[:2]}/hooks"
    assert s.raw["Prolog[0]"] == f"{lab}/prolog"
    assert (s.prolog, s.epilog, s.epilog_slurmctld) == (
        (f"{lab}/prolog",),
        (f"{lab}/epilog",),
        (f"{lab}/epilog-slurmctld",),
    )
    assert s.prolog_flags == ("Alloc",) and s.prolog_timeout == ("PrologEpilogTimeout", 180)
    assert (s.slurm_user, s.cluster_name) == ("slurm", "scoutlab")


def test_parse_show_config_reads_several_numbered_programs_and_timeouts_of_their_own():
    path = FIXTURE.parents[1] / "slurm-26.05" / "scontrol-show-config.txt"
    text = path.read_text().replace(
        "PrologFlags             = Alloc",
        "Prolog[1]               = /etc/slurm/nhc.sh\n"
        "PrologFlags             = Alloc\n"
        "PrologTimeout           = 65534\n"
        "EpilogTimeout           = 90",
    )
    s = parse_show_config(text)
    assert s.prolog == ("/tmp/scout-sitecheck-lab26/hooks/prolog", "/etc/slurm/nhc.sh")
    assert s.prolog_timeout == ("PrologTimeout", None)
    assert s.epilog_timeout == ("EpilogTimeout", 90)


def test_parse_show_config_reads_unset_hooks_unlimited_timeout_and_several_programs():
    text = (
        FIXTURE.read_text()
        .replace("PrologEpilogTimeout     = 180", "PrologEpilogTimeout     = 65534")
        .replace("= /tmp/scout-sitecheck-lab/hooks/epilog-slurmctld", "= (null)")
        .replace("= /tmp/scout-sitecheck-lab/hooks/prolog", "= /etc/a,/etc/b")
        .replace("PrologFlags             = Alloc", "PrologFlags             = Contain,X11")
    )
    s = parse_show_config(text)
    assert s.prolog_timeout == ("PrologEpilogTimeout", None)
    assert s.epilog_slurmctld == ()
    assert s.prolog == ("/etc/a", "/etc/b")
    assert s.prolog_flags == ("Contain", "X11")


def test_parse_show_config_refuses_other_text():
    with pytest.raises(SlurmError, match="no SLURM_VERSION"):
        parse_show_config("slurm_load_ctl_conf error: Unable to contact slurm controller\n")


# -- a correct site ------------------------------------------------------------------------------


def test_a_correct_site_passes_and_nothing_is_changed(site: Site):
    before = _tree(site.prefix.parent)
    report = site.run()
    after = _tree(site.prefix.parent)
    assert before == after
    assert _fails(report) == [], report.render()
    for hook in ("Prolog", "Epilog", "EpilogSlurmctld"):
        (ok,) = _of(report, hook, Severity.OK)
        assert "scout's hook" in ok.message
    assert "executable by nobody" in _of(report, "EpilogSlurmctld", Severity.OK)[0].message
    (tree,) = [f for f in _of(report, "evidence", Severity.OK) if "job folder" in f.message]
    assert "1 job folder(s)" in tree.message
    assert [f.severity for f in report.findings if f.check == "config"] == [Severity.OK]
    if os.access("/dev/kmsg", os.R_OK):
        assert not report.failed, report.render()
        assert "ok    config" in report.render()
        assert report.as_json()["ok"] is True


# -- the site config -------------------------------------------------------------------------------


def test_a_world_writable_config_fails_with_its_fix(site: Site):
    os.chmod(site.config, 0o666)
    f = _one_fail(site.run(), "config")
    assert "writable by group or others" in f.message and "safe defaults" in f.message
    assert f.remedy == f"chown root:root {site.config} && chmod 644 {site.config}"


def test_a_config_owned_by_a_user_fails_and_observe_only_is_said(site: Site):
    os.chown(site.config, JOB_USER, JOB_USER)
    report = site.run()
    f = _one_fail(report, "config")
    assert f"owned by uid {JOB_USER}" in f.message
    assert f.remedy.startswith(f"chown root:root {site.config}")
    (obs,) = [x for x in report.findings if x.check == "observe-only"]
    assert obs.message.startswith("on (the hooks refuse the config")


def test_a_config_in_a_folder_others_may_write_fails(site: Site):
    os.chmod(site.config.parent, 0o777)
    report = site.run()
    fails = _fails(report)
    # prolog.d/ and epilog.d/ are in that folder too: root must not run what they hold either
    assert [f.check for f in fails] == ["config", "Prolog", "Epilog"], report.render()
    f = fails[0]
    assert str(site.config.parent) in f.message and "writable by group or others" in f.message
    assert f.remedy == f"chown root:root {site.config.parent} && chmod go-w {site.config.parent}"


def test_no_config_is_a_warning(site: Site):
    report = site.run(config=site.prefix / "absent.toml")
    (w,) = _of(report, "config", Severity.WARN)
    assert "no site config" in w.message and "--config" in w.remedy


# -- the evidence root ------------------------------------------------------------------------


def test_an_evidence_root_others_may_write_fails(site: Site):
    os.chmod(site.evidence, 0o777)
    f = _one_fail(site.run(), "evidence")
    assert "writable by group or others" in f.message
    assert f.remedy == f"chown root:root {site.evidence} && chmod go-w {site.evidence}"


def test_an_evidence_root_others_cannot_enter_fails(site: Site):
    os.chmod(site.evidence, 0o750)
    f = _one_fail(site.run(), "evidence")
    assert "cannot be entered by others" in f.message
    assert f.remedy == f"chmod 755 {site.evidence}"


def test_a_missing_evidence_root_fails(site: Site):
    os.rename(site.evidence, site.evidence.with_name("moved"))
    f = _one_fail(site.run(), "evidence")
    assert "does not exist" in f.message
    assert f.remedy.startswith(f"mkdir -p {site.evidence} && chown root:root {site.evidence}")


def test_pending_writable_by_others_fails(site: Site):
    os.chmod(site.job.pending_dir, 0o757)
    f = _one_fail(site.run(), "evidence")
    assert f"{site.job.pending_dir} writable by group or others (mode 0757)" in f.message
    assert f.remedy.startswith(
        f"chown nobody: {site.job.pending_dir} && chmod 750 {site.job.pending_dir}"
    )


def test_a_job_folder_others_cannot_enter_fails(site: Site):
    os.chmod(site.job.path, 0o750)
    f = _one_fail(site.run(), "evidence")
    assert f"{site.job.path} not readable and enterable by others (mode 0750)" in f.message
    assert f.remedy.startswith(f"chown root: {site.job.path} && chmod 755 {site.job.path}")


def test_results_owned_by_a_job_user_fails(site: Site):
    os.chown(site.job.results_dir, JOB_USER, JOB_USER)
    f = _one_fail(site.run(), "evidence")
    assert f"{site.job.results_dir} owned by uid {JOB_USER}" in f.message
    assert f.remedy.startswith(f"chown nobody: {site.job.results_dir} && chmod 755")


def test_a_nodes_folder_replaced_by_a_link_fails(site: Site):
    nodes = site.job.nodes_dir
    os.rename(nodes, nodes.with_name("real-nodes"))
    os.symlink(nodes.with_name("real-nodes"), nodes)
    f = _one_fail(site.run(), "evidence")
    assert f"{nodes} not a folder" in f.message


# -- the hooks ----------------------------------------------------------------------------------


def test_a_missing_hook_program_fails(site: Site):
    s = dataclasses.replace(site.settings, epilog=("/nonexistent/scout-epilog",))
    report = site.run(settings=s)
    fails = _fails(report)
    assert [f.check for f in fails] == ["Epilog", "Epilog"], report.render()
    assert "/nonexistent/scout-epilog does not exist" in fails[0].message
    assert "Slurm drains the node" in fails[0].message
    assert "scout site install" in fails[0].remedy
    assert "none of the 1 program(s) Epilog= names is scout's hook" in fails[1].message


def test_a_hook_root_cannot_execute_fails(site: Site):
    wrapper = site.prefix / "libexec" / "scout" / "scout-epilog"
    os.chmod(wrapper, 0o644)
    f = _fails(site.run())
    assert [x.check for x in f][:1] == ["Epilog"]
    assert "is not executable by root" in f[0].message
    assert f[0].remedy == f"chmod 755 {wrapper}"


def test_a_controller_hook_slurm_user_cannot_execute_fails(site: Site):
    wrapper = site.prefix / "libexec" / "scout" / "scout-epilog-slurmctld"
    os.chmod(wrapper, 0o700)
    f = _one_fail(site.run(), "EpilogSlurmctld")
    assert "is not executable by nobody" in f.message and "logged only" in f.message
    assert f.remedy == f"chmod 755 {wrapper}"


def test_a_hook_others_may_write_fails(site: Site):
    wrapper = site.prefix / "libexec" / "scout" / "scout-prolog"
    os.chmod(wrapper, 0o777)
    f = _fails(site.run())[0]
    assert f.check == "Prolog" and "writable by group or others" in f.message
    assert f.remedy == f"chown root:root {wrapper} && chmod 755 {wrapper}"


def test_a_wrapper_whose_hook_script_is_gone_fails(site: Site, tmp_path: Path):
    wrapper = site.prefix / "libexec" / "scout" / "scout-prolog"
    wrapper.write_text(
        wrapper.read_text().replace(sysconfig.get_path("scripts"), str(tmp_path / "gone"))
    )
    f = _one_fail(site.run(), "Prolog")
    assert f"runs {tmp_path / 'gone' / 'scout-prolog'} does not exist" in f.message


def test_only_other_programs_in_prolog_fails(site: Site, tmp_path: Path):
    other = tmp_path / "nhc.sh"
    other.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(other, 0o755)
    f = _one_fail(
        site.run(settings=dataclasses.replace(site.settings, prolog=(str(other),))), "Prolog"
    )
    assert "is scout's hook" in f.message and str(other) in f.message
    assert "slurm.conf.snippet" in f.remedy


def test_scout_beside_the_sites_own_program_passes(site: Site, tmp_path: Path):
    other = tmp_path / "nhc.sh"
    other.write_text("#!/bin/sh\nexit 0\n")
    os.chmod(other, 0o755)
    os.symlink(other, site.prefix / "etc" / "scout" / "prolog.d" / "50-nhc")
    (ok,) = _of(site.run(), "Prolog", Severity.OK)
    assert ok.message.endswith("beside 1 other program(s)")


def test_no_prolog_in_slurm_conf_fails(site: Site):
    f = _one_fail(site.run(settings=dataclasses.replace(site.settings, prolog=())), "Prolog")
    assert f.message == "slurm.conf names no Prolog: scout's Prolog never runs"
    assert "Prolog= line" in f.remedy


def test_slurm_not_answering_fails_and_the_rest_is_still_checked(site: Site):
    def no_slurm(cfg):
        raise SlurmError(
            "scontrol did not answer within 20 s; is slurmctld up?",
            argv=("/usr/bin/scontrol", "show", "config"),
        )

    report = check.run_checks(site.config, {}, show_config=no_slurm, daemons=frozenset())
    f = _one_fail(report, "slurm")
    assert "\n" not in f.message and "is slurmctld up?" in f.message
    assert "SLURM_CONF" in f.remedy
    assert {x.check for x in report.findings} >= {"config", "evidence", "nvml", "kernel-log"}


def test_a_hook_of_a_daemon_not_here_is_skipped(site: Site):
    report = check.run_checks(
        site.config, {}, show_config=lambda cfg: site.settings, daemons=frozenset({"slurmd"})
    )
    (skip,) = _of(report, "EpilogSlurmctld", Severity.SKIP)
    assert "run `scout site check` on the controller" in skip.message


# -- slurm.conf's parameters ----------------------------------------------------------------


def _slurm(site: Site, **changes) -> list[check.Finding]:
    return [
        f
        for f in site.run(settings=dataclasses.replace(site.settings, **changes)).findings
        if f.check == "slurm" and f.severity != Severity.OK
    ]


def test_prolog_flags_without_alloc_fails(site: Site):
    (f,) = _slurm(site, prolog_flags=("Contain",))
    assert f.severity == Severity.FAIL and "PrologFlags=Contain lacks Alloc" in f.message
    assert "PrologFlags=Alloc" in f.remedy


def test_an_untested_release_warns_and_an_older_one_fails(site: Site):
    (w,) = _slurm(site, version="23.02.7")
    assert (
        w.severity == Severity.WARN and "23.02.7 is not a release scout is tested on" in w.message
    )
    assert "22.05, 24.11, 26.05" in w.message and "scout acceptance" in w.remedy
    (f,) = _slurm(site, version="21.08.5")
    assert f.severity == Severity.FAIL and "older than every release" in f.message


def test_a_prolog_epilog_timeout_below_the_budgets_fails(site: Site):
    short = ("PrologEpilogTimeout", 30)
    (f,) = _slurm(site, prolog_timeout=short, epilog_timeout=short)
    assert f.severity == Severity.FAIL and "PrologEpilogTimeout=30 s is shorter" in f.message
    assert f.remedy.startswith("set PrologEpilogTimeout=65 or more")


def test_an_epilog_timeout_of_its_own_is_held_to_the_epilog_budget(site: Site):
    # 26.05: EpilogTimeout where set, PrologEpilogTimeout for the Prolog
    (f,) = _slurm(site, epilog_timeout=("EpilogTimeout", 40))
    assert f.severity == Severity.FAIL and f.message.startswith("EpilogTimeout=40 s is shorter")
    assert "(65 s)" in f.message and "[epilog] time_budget_s" in f.remedy


def test_a_slurm_user_other_than_the_configs_fails(site: Site):
    (f,) = _slurm(site, slurm_user="slurm2")
    assert f.severity == Severity.FAIL and "SlurmUser is slurm2" in f.message
    assert f.remedy == '[evidence] slurm_user = "slurm2"'.join(["set ", " in the site config"])


def test_a_short_min_job_age_warns(site: Site):
    (w,) = _slurm(site, min_job_age_s=60)
    assert w.severity == Severity.WARN and "MinJobAge=300" in w.remedy


# -- NVML, the kernel log, observe_only ------------------------------------------------------------


def test_nvml_on_a_host_without_a_driver_is_not_an_error():
    f = check.nvml_finding(
        {"status": "no-library", "gpus": 0, "driver": ""}, timed_out=False, error=""
    )
    assert (f.severity, f.message) == (
        Severity.OK,
        "no NVIDIA driver: GPU evidence off on this host",
    )
    hung = check.nvml_finding(None, timed_out=True, error="")
    assert hung.severity == Severity.FAIL and "did not answer" in hung.message
    broken = check.nvml_finding(
        {"status": "error: nvmlInit: Unknown Error", "gpus": 0, "driver": ""},
        timed_out=False,
        error="",
    )
    assert broken.severity == Severity.FAIL and "nvidia-smi" in broken.remedy


def test_nvml_is_asked_in_a_bounded_child_on_this_host():
    f = check.check_nvml()
    if os.path.exists("/dev/nvidiactl"):
        assert f.severity == Severity.OK and "GPU(s), driver" in f.message, f
    else:
        assert f == check.Finding(
            "nvml", Severity.OK, "no NVIDIA driver: GPU evidence off on this host"
        )


def test_nvml_library_without_a_loaded_driver_is_a_cpu_node():
    f = check.nvml_finding(
        {"status": "error: nvmlInit: Driver Not Loaded", "gpus": 0, "driver": ""},
        timed_out=False,
        error="",
    )
    assert f.severity == Severity.OK and f.message.startswith("no NVIDIA driver")


def test_a_missing_kernel_log_fails(tmp_path: Path):
    f = check.check_kernel_log(SiteConfig(), kmsg=str(tmp_path / "kmsg"))
    assert f.severity == Severity.FAIL and "records no Xid" in f.message
    assert "/dev/kmsg" in f.remedy


def test_observe_only_is_said_plainly():
    on = check.observe_only_finding(SiteConfig(), True)
    assert on.message.startswith("off: scout drains")
    from scout_slurm.config import SAFE_CONFIG

    off = check.observe_only_finding(SAFE_CONFIG, True)
    assert off.message.startswith("on: scout writes verdicts and plans, and drains and requeues")


def test_the_cli_help_says_what_it_does_with_an_example():
    out = CliRunner().invoke(main, ["site", "check", "--help"]).output
    assert "Example: scout site check --config /etc/scout/scout.toml" in out
    assert "--json" in out and "changing nothing" in out


def test_the_rendered_report_puts_the_remedy_under_its_line(site: Site):
    os.chmod(site.evidence, 0o777)
    text = site.run().render()
    lines = text.splitlines()
    i = next(i for i, line in enumerate(lines) if line.startswith("FAIL  evidence"))
    assert lines[i + 1].strip().startswith(f"-> chown root:root {site.evidence}")
    assert lines[-1].startswith("1 failed")
    assert stat.S_IMODE(os.stat(site.evidence).st_mode) == 0o777  # reported, not fixed


def test_the_daemons_running_here_are_read_from_proc(tmp_path: Path):
    for pid, comm in (("12", "slurmd\n"), ("34", "bash\n"), ("56", "slurmstepd\n")):
        (tmp_path / pid).mkdir()
        (tmp_path / pid / "comm").write_text(comm)
    (tmp_path / "self").mkdir()
    assert check.running_daemons(str(tmp_path)) == frozenset({"slurmd"})


_LINES = FIXTURE.read_text().splitlines()


@settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    keep=st.lists(st.booleans(), min_size=len(_LINES), max_size=len(_LINES)),
    values=st.dictionaries(st.integers(0, len(_LINES) - 1), st.text(max_size=40), max_size=20),
)
def test_parse_show_config_over_mutated_output_reads_it_or_says_why(keep, values):
    lines = []
    for i, line in enumerate(_LINES):
        if not keep[i]:
            continue
        key, sep, _ = line.partition("=")
        lines.append(f"{key}={values[i]}" if sep and i in values else line)
    try:
        s = parse_show_config("\n".join(lines))
    except SlurmError as exc:
        assert "SLURM_VERSION" in str(exc)
        return
    assert all(isinstance(p, str) and p.strip() == p and p for p in s.prolog + s.epilog)
    assert s.prolog_timeout[1] is None or s.prolog_timeout[1] >= 0
