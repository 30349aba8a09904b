"""The hooks' site config is read the way sshd reads its own: only a file, directories and
Slurm commands that root alone (or the trusted SlurmUser) can change; anything else is refused
with safe defaults, never with a value from the refused file."""

from __future__ import annotations

import os
import stat
import time
from pathlib import Path

import pytest

from scout_slurm import config
from scout_slurm.config import (
    SAFE_CONFIG,
    HookConfig,
    RemediationConfig,
    SiteConfig,
    load_config,
    load_hook_config,
)
from scout_slurm.errors import UntrustedPath
from scout_slurm.trust import (
    command_problem,
    directory_problem,
    file_problem,
    link_problem,
    read_trusted_file,
    resolve_trusted,
)

USER = 1001  # a plain user; no passwd entry needed
ROOT_ONLY = {0}
needs_root = pytest.mark.skipif(os.geteuid() != 0, reason="chown to another uid needs root")

GOOD = """
[slurm]
retries = 7

[remediation]
min_confidence = 0.9
"""
# what a user who could write the config would put there
EVIL = """
[slurm]
bin_dir = "/home/mallory/bin"

[evidence]
root = "/home/mallory/evidence"

[remediation]
observe_only = false
"""


def st(mode: int, uid: int = 0, size: int = 100) -> os.stat_result:
    """A stat result as the pure rules see one: mode, ino, dev, nlink, uid, gid, size, times."""
    return os.stat_result((mode, 1, 1, 1, uid, 0, size, 0, 0, 0))


# --------------------------------------------------------------------------------------------
# The pure rules
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "mode, uid, size, words",
    [
        (stat.S_IFREG | 0o644, 0, 100, None),
        (stat.S_IFREG | 0o600, 0, 1 << 20, None),
        (stat.S_IFREG | 0o444, 64030, 100, None),  # the trusted SlurmUser
        (stat.S_IFREG | 0o666, 0, 100, "mode 0666) is writable by group or others"),
        (stat.S_IFREG | 0o664, 0, 100, "writable by group or others"),
        (stat.S_IFREG | 0o646, 0, 100, "writable by group or others"),
        (
            stat.S_IFREG | 0o644,
            USER,
            100,
            f"owned by uid {USER}, not by a trusted owner (uid 0, 64030)",
        ),
        (
            stat.S_IFREG | 0o666,
            USER,
            100,
            "not by a trusted owner (uid 0, 64030) and writable by group or others",
        ),
        (stat.S_IFREG | 0o644, 0, (1 << 20) + 1, "is 1048577 bytes, more than the 1048576 allowed"),
        (stat.S_IFIFO | 0o644, 0, 0, "is a FIFO (named pipe)"),
        (stat.S_IFLNK | 0o777, 0, 10, "is a symbolic link"),
        (stat.S_IFCHR | 0o644, 0, 0, "is a character device"),
        (stat.S_IFBLK | 0o644, 0, 0, "is a block device"),
        (stat.S_IFSOCK | 0o644, 0, 0, "is a socket"),
        (stat.S_IFDIR | 0o755, 0, 0, "is a directory"),
    ],
)
def test_file_rule(mode, uid, size, words):
    problem = file_problem(
        "/etc/scout/scout.toml", st(mode, uid, size), {0, 64030}, max_bytes=1 << 20
    )
    if words is None:
        assert problem is None
    else:
        assert problem.startswith("/etc/scout/scout.toml") and words in problem


def test_file_rule_says_what_to_do():
    problem = file_problem(
        "/etc/scout/scout.toml", st(stat.S_IFREG | 0o666, USER), ROOT_ONLY, max_bytes=1 << 20
    )
    assert f"owner uid {USER}, mode 0666" in problem
    assert problem.endswith(
        "fix: chown root:root /etc/scout/scout.toml && chmod 644 /etc/scout/scout.toml"
    )


@pytest.mark.parametrize(
    "mode, uid, sticky_ok, ok",
    [
        (stat.S_IFDIR | 0o755, 0, True, True),
        (stat.S_IFDIR | 0o700, 0, True, True),
        (stat.S_IFDIR | 0o1777, 0, True, True),  # /tmp: others cannot replace root's entries
        (stat.S_IFDIR | 0o1777, 0, False, False),  # ... but may add new ones
        (stat.S_IFDIR | 0o1777, USER, True, False),  # a user's sticky directory is the user's
        (stat.S_IFDIR | 0o777, 0, True, False),
        (stat.S_IFDIR | 0o775, 0, True, False),
        (stat.S_IFDIR | 0o757, 0, True, False),
        (stat.S_IFDIR | 0o755, USER, True, False),
        (stat.S_IFREG | 0o755, 0, True, False),
        (stat.S_IFLNK | 0o777, 0, True, False),
    ],
)
def test_directory_rule(mode, uid, sticky_ok, ok):
    problem = directory_problem("/opt/x", st(mode, uid), ROOT_ONLY, sticky_ok=sticky_ok)
    assert (problem is None) is ok
    if not ok and stat.S_ISDIR(mode):
        assert problem.endswith("fix: chown root:root /opt/x && chmod go-w /opt/x")


@pytest.mark.parametrize(
    "mode, uid, words",
    [
        (stat.S_IFREG | 0o755, 0, None),
        (stat.S_IFREG | 0o4755, 0, None),
        (stat.S_IFREG | 0o777, 0, "writable by group or others"),
        (stat.S_IFREG | 0o755, USER, f"owned by uid {USER}"),
        (stat.S_IFDIR | 0o755, 0, "is a directory"),
        (stat.S_IFIFO | 0o755, 0, "is a FIFO"),
    ],
)
def test_command_rule(mode, uid, words):
    problem = command_problem("/opt/slurm/bin/scontrol", st(mode, uid), ROOT_ONLY)
    assert problem is None if words is None else words in problem
    if problem and stat.S_ISREG(mode):
        assert "chmod 755 /opt/slurm/bin/scontrol" in problem


def test_link_rule():
    assert link_problem("/opt/slurm", st(stat.S_IFLNK | 0o777, 0), ROOT_ONLY) is None
    problem = link_problem("/tmp/x", st(stat.S_IFLNK | 0o777, USER), ROOT_ONLY)
    assert (
        f"/tmp/x is a symbolic link owned by uid {USER}" in problem
        and "chown -h root:root /tmp/x" in problem
    )


def test_safe_config():
    assert SAFE_CONFIG == SiteConfig(remediation=RemediationConfig(observe_only=True))
    assert (
        SAFE_CONFIG.evidence.root == "/var/lib/scout/evidence" and SAFE_CONFIG.slurm.bin_dir == ""
    )


# --------------------------------------------------------------------------------------------
# Real files, as root
# --------------------------------------------------------------------------------------------


@pytest.fixture(autouse=True)
def no_site_file(tmp_path, monkeypatch):
    """Never read this machine's /etc/scout/scout.toml."""
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", tmp_path / "absent" / "scout.toml")


@pytest.fixture
def site(tmp_path) -> Path:
    """A root-owned 0755 directory whose every ancestor passes the rule, so that a good case
    cannot fail for a reason outside the test (/tmp passes as a root-owned sticky directory)."""
    d = tmp_path / "site"
    d.mkdir()
    os.chown(d, 0, 0)
    os.chmod(d, 0o755)
    here = Path(os.path.realpath(d))
    for p in [here, *here.parents]:
        problem = directory_problem(str(p), os.lstat(p), ROOT_ONLY)
        assert problem is None, f"the test's own directory fails the rule: {problem}"
    return d


def put(where: Path, text: str, *, mode: int = 0o644, uid: int = 0) -> Path:
    where.write_text(text)
    os.chown(where, uid, 0)
    os.chmod(where, mode)
    return where


def mkdir(where: Path, *, mode: int = 0o755, uid: int = 0) -> Path:
    where.mkdir()
    os.chown(where, uid, 0)
    os.chmod(where, mode)  # after mkdir: the umask would drop bits asked of mkdir
    return where


def bin_dir(
    where: Path,
    *,
    mode: int = 0o755,
    uid: int = 0,
    scontrol_mode: int = 0o755,
    scontrol_uid: int = 0,
) -> Path:
    d = mkdir(where, mode=mode, uid=uid)
    put(d / "scontrol", "#!/bin/sh\nexit 0\n", mode=scontrol_mode, uid=scontrol_uid)
    put(d / "squeue", "#!/bin/sh\nexit 0\n", mode=0o755)
    return d


def refused(result: HookConfig, *words: str) -> str:
    """The refusal's text, after checking that nothing of the refused file was used."""
    assert result.refused is not None, result
    assert result.config == SAFE_CONFIG
    assert result.config.remediation.observe_only is True
    assert result.config.evidence.root == "/var/lib/scout/evidence"
    assert result.source.startswith("safe defaults (refused ")
    for w in words:
        assert w in result.refused, (w, result.refused)
    return result.refused


@needs_root
def test_good_root_owned_file(site):
    path = put(site / "scout.toml", GOOD)
    result = load_hook_config({}, path=path)
    assert result == HookConfig(
        config.parse_config({"slurm": {"retries": 7}, "remediation": {"min_confidence": 0.9}}),
        None,
        str(path),
    )
    assert load_hook_config({"SCOUT_CONFIG": str(path)}) == result


@needs_root
def test_default_path_read_when_present_and_defaults_when_absent(site, monkeypatch):
    result = load_hook_config({})
    assert result.refused is None and result.config == SiteConfig()
    assert result.source.startswith("defaults (") and "not present" in result.source
    monkeypatch.setattr(config, "DEFAULT_CONFIG_PATH", put(site / "scout.toml", GOOD))
    assert load_hook_config({}).config.slurm.retries == 7


@needs_root
def test_missing_named_file_is_refused(site):
    missing = site / "nope.toml"
    refused(
        load_hook_config({}, path=missing),
        f"{missing}: site config not found (named by the caller)",
    )
    refused(load_hook_config({"SCOUT_CONFIG": str(missing)}), "named by SCOUT_CONFIG")
    refused(load_hook_config({"SCOUT_CONFIG": str(site / "no" / "dir.toml")}), "not found")


@needs_root
def test_world_writable_file_is_refused(site):
    path = put(site / "scout.toml", EVIL, mode=0o666)
    refused(
        load_hook_config({}, path=path),
        str(path),
        "owner uid 0, mode 0666",
        "writable by group or others",
        f"chown root:root {path} && chmod 644 {path}",
    )


@needs_root
def test_group_writable_file_is_refused(site):
    refused(load_hook_config({}, path=put(site / "scout.toml", GOOD, mode=0o664)), "mode 0664")


@needs_root
def test_user_owned_file_is_refused(site):
    path = put(site / "scout.toml", EVIL, uid=USER)
    refused(
        load_hook_config({}, path=path),
        str(path),
        f"owner uid {USER}, mode 0644",
        f"owned by uid {USER}, not by a trusted owner (uid 0)",
    )


@needs_root
def test_the_trusted_slurm_user_may_own_it(site):
    # the controller Epilog runs as SlurmUser: its own files are as good as root's
    path = put(site / "scout.toml", GOOD, uid=USER)
    assert load_hook_config({}, path=path, trusted_uids={0, USER}).config.slurm.retries == 7


@needs_root
@pytest.mark.timeout(10)
def test_fifo_is_refused_without_blocking(site):
    fifo = site / "scout.toml"
    os.mkfifo(fifo, 0o644)
    t0 = time.monotonic()
    refused(load_hook_config({}, path=fifo), str(fifo), "is a FIFO (named pipe)")
    with pytest.raises(UntrustedPath, match="FIFO"):
        read_trusted_file(fifo, ROOT_ONLY, max_bytes=1 << 20)
    assert time.monotonic() - t0 < 5


@needs_root
@pytest.mark.timeout(10)
def test_fifo_opened_in_a_race_does_not_block(site, monkeypatch):
    # the lstat said "regular file" and a FIFO took its place before the open (only a trusted uid
    # could do that here, but the hook must still not hang): O_NONBLOCK and the fstat catch it
    from scout_slurm import trust

    fifo = site / "scout.toml"
    os.mkfifo(fifo, 0o644)
    calls = []

    def first_says_regular(path, st_, trusted, *, max_bytes):
        calls.append(path)
        if len(calls) == 1:
            return None
        return file_problem(path, st_, trusted, max_bytes=max_bytes)

    monkeypatch.setattr(trust, "file_problem", first_says_regular)
    with pytest.raises(UntrustedPath, match="FIFO"):
        read_trusted_file(fifo, ROOT_ONLY, max_bytes=1 << 20)
    assert len(calls) == 2


@needs_root
def test_symlink_to_a_good_file_is_refused(site):
    good = put(site / "real.toml", GOOD)
    link = site / "scout.toml"
    link.symlink_to(good)
    refused(load_hook_config({}, path=link), str(link), "is a symbolic link", "not a regular file")


@needs_root
def test_group_writable_parent_directory_is_refused(site):
    d = mkdir(site / "etc", mode=0o775)
    path = put(d / "scout.toml", GOOD)
    refused(
        load_hook_config({}, path=path),
        f"{d} (owner uid 0, mode 0775)",
        "writable by group or others",
        f"chown root:root {d} && chmod go-w {d}",
    )


@needs_root
def test_user_owned_parent_directory_is_refused(site):
    d = mkdir(site / "home", uid=USER)
    refused(load_hook_config({}, path=put(d / "scout.toml", GOOD)), str(d), f"owned by uid {USER}")


@needs_root
def test_user_owned_grandparent_is_refused(site):
    # a user who owns any directory on the way can rename what lies below it
    d = mkdir(mkdir(site / "home", uid=USER) / "etc")
    refused(
        load_hook_config({}, path=put(d / "scout.toml", GOOD)), f"{site / 'home'} (owner uid {USER}"
    )


@needs_root
def test_file_in_a_sticky_root_directory_is_allowed(site):
    d = mkdir(site / "tmp", mode=0o1777)
    assert load_hook_config({}, path=put(d / "scout.toml", GOOD)).config.slurm.retries == 7


@needs_root
def test_file_in_a_world_writable_directory_is_refused(site):
    d = mkdir(site / "tmp", mode=0o777)
    refused(load_hook_config({}, path=put(d / "scout.toml", GOOD)), f"{d} (owner uid 0, mode 0777)")


@needs_root
def test_file_in_a_user_owned_sticky_directory_is_refused(site):
    d = mkdir(site / "tmp", mode=0o1777, uid=USER)
    refused(
        load_hook_config({}, path=put(d / "scout.toml", GOOD)), f"{d} (owner uid {USER}, mode 1777)"
    )


@needs_root
def test_oversized_file_is_refused(site):
    path = put(site / "scout.toml", "# " + "x" * (1024 * 1024) + "\n")
    refused(load_hook_config({}, path=path), str(path), "bytes, more than the 1048576 allowed")


@needs_root
@pytest.mark.parametrize(
    "text, words",
    [
        ("[slurm\n", "cannot read the site config"),
        ("x = = 1", "cannot read the site config"),
        ("[slurmm]\nretries = 1\n", "unknown section(s) slurmm"),
        ("[slurm]\nretries = -1\n", "[slurm] retries must be a finite number >= 0"),
        (
            "[remediation]\nobserve_only = false\nmin_confidence = 7\n",
            "min_confidence must be within 0..1",
        ),
    ],
)
def test_parse_and_validation_errors_are_refusals(site, text, words):
    path = put(site / "scout.toml", text)
    refused(load_hook_config({}, path=path), str(path), words)


@needs_root
def test_not_utf8_is_a_refusal(site):
    path = site / "scout.toml"
    path.write_bytes(b"\xff\xfe")
    os.chmod(path, 0o644)
    refused(load_hook_config({}, path=path), "cannot read the site config")


@needs_root
def test_environment_applies_on_a_trusted_file(site):
    path = put(site / "scout.toml", GOOD)
    result = load_hook_config(
        {"SCOUT_SLURM_RETRIES": "2", "SCOUT_REMEDIATION_REQUEUE": "false"}, path=path
    )
    assert result.refused is None
    assert result.config.slurm.retries == 2 and result.config.remediation.requeue is False
    assert (
        result.config.remediation.min_confidence == 0.9
    )  # the file's, for what the environment leaves
    assert result.source == f"{path} < environment (SCOUT_SLURM_RETRIES, SCOUT_REMEDIATION_REQUEUE)"


@needs_root
def test_environment_is_ignored_on_refusal(site):
    path = put(site / "scout.toml", EVIL, mode=0o666)
    env = {
        "SCOUT_REMEDIATION_OBSERVE_ONLY": "false",
        "SCOUT_SLURM_RETRIES": "9",
        "SCOUT_EVIDENCE_ROOT": "/elsewhere",
    }
    result = load_hook_config(env, path=path)
    refused(result)
    assert result.config.slurm.retries == 3


@needs_root
def test_bad_environment_value_is_a_refusal(site):
    path = put(site / "scout.toml", GOOD)
    refused(
        load_hook_config({"SCOUT_SLURM_RETRIES": "2x"}, path=path),
        "environment (SCOUT_* variables): [slurm] retries: expected an integer, got '2x'",
    )


@needs_root
def test_good_bin_dir(site):
    b = bin_dir(site / "bin")
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{b}"\n')
    result = load_hook_config({}, path=path)
    assert result.refused is None and result.config.slurm.bin_dir == str(b)


@needs_root
def test_user_owned_bin_dir_is_refused(site):
    b = bin_dir(site / "bin", uid=USER)
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{b}"\n')
    refused(
        load_hook_config({}, path=path),
        f"{b} (owner uid {USER}, mode 0755)",
        f"chown root:root {b}",
    )


@needs_root
def test_bin_dir_under_a_user_owned_directory_is_refused(site):
    b = bin_dir(mkdir(site / "home", uid=USER) / "bin")
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{b}"\n')
    refused(load_hook_config({}, path=path), f"{site / 'home'} (owner uid {USER}")


@needs_root
def test_sticky_bin_dir_is_refused(site):
    # others could plant a command that is missing today
    b = bin_dir(site / "bin", mode=0o1777)
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{b}"\n')
    refused(
        load_hook_config({}, path=path),
        f"{b} (owner uid 0, mode 1777)",
        "writable by group or others",
    )


@needs_root
def test_user_owned_scontrol_is_refused(site):
    b = bin_dir(site / "bin", scontrol_uid=USER)
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{b}"\n')
    refused(
        load_hook_config({}, path=path),
        f"{b / 'scontrol'} (owner uid {USER}, mode 0755)",
        f"chown root:root {b / 'scontrol'} && chmod 755 {b / 'scontrol'}",
    )


@needs_root
def test_world_writable_scontrol_is_refused(site):
    b = bin_dir(site / "bin", scontrol_mode=0o777)
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{b}"\n')
    refused(load_hook_config({}, path=path), f"{b / 'scontrol'} (owner uid 0, mode 0777)")


@needs_root
def test_scontrol_that_is_a_directory_or_fifo_is_refused(site):
    b = bin_dir(site / "bin")
    os.mkfifo(b / "sinfo", 0o755)
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{b}"\n')
    refused(load_hook_config({}, path=path), f"{b / 'sinfo'} is a FIFO")


@needs_root
def test_bin_dir_from_the_environment_is_checked_too(site):
    b = bin_dir(site / "bin", uid=USER)
    path = put(site / "scout.toml", GOOD)
    refused(load_hook_config({"SCOUT_SLURM_BIN_DIR": str(b)}, path=path), f"owned by uid {USER}")


@needs_root
def test_missing_bin_dir_is_refused(site):
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{site / "nope"}"\n')
    refused(
        load_hook_config({}, path=path),
        f"[slurm] bin_dir {site / 'nope'} (from {path}) does not exist",
    )


@needs_root
def test_mode_666_config_naming_a_users_bin_dir(site):
    # the attack this guards against: a writable config that sends root to the user's scontrol
    home = mkdir(site / "home", uid=USER)
    b = bin_dir(home / "bin", uid=USER, scontrol_uid=USER)
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{b}"\n', mode=0o666)
    result = load_hook_config({}, path=path)
    refused(result, str(path))
    assert result.config.slurm.bin_dir == ""
    # and with the file fixed, the bin_dir itself is refused
    os.chmod(path, 0o644)
    refused(load_hook_config({}, path=path), f"{home} (owner uid {USER}")


# symlinked directories: resolved like sshd's secure_filename, the link itself judged too


@needs_root
def test_root_owned_link_to_a_good_directory_is_followed(site):
    real = mkdir(site / "slurm-23.11")
    b = bin_dir(real / "bin")
    (site / "slurm").symlink_to(real)  # /opt/slurm -> /opt/slurm-23.11
    etc = mkdir(site / "shared-etc")
    put(etc / "scout.toml", f'[slurm]\nbin_dir = "{site / "slurm" / "bin"}"\n')
    (site / "etc").symlink_to("shared-etc")  # a relative link
    result = load_hook_config({}, path=site / "etc" / "scout.toml")
    assert result.refused is None and result.config.slurm.bin_dir == str(site / "slurm" / "bin")
    real_path, _ = resolve_trusted(site / "slurm" / "bin" / "scontrol", ROOT_ONLY, follow_last=True)
    assert real_path == str(b / "scontrol")


@needs_root
def test_link_to_a_user_owned_directory_is_refused(site):
    home = mkdir(site / "home", uid=USER)
    put(home / "scout.toml", GOOD)
    (site / "etc").symlink_to(home)
    refused(load_hook_config({}, path=site / "etc" / "scout.toml"), f"{home} (owner uid {USER}")


@needs_root
def test_user_owned_link_in_a_sticky_directory_is_refused(site):
    tmp = mkdir(site / "tmp", mode=0o1777)
    good = mkdir(site / "etc")
    put(good / "scout.toml", GOOD)
    link = tmp / "etc"
    link.symlink_to(good)
    os.lchown(link, USER, 0)  # its owner could point it anywhere at any time
    refused(
        load_hook_config({}, path=link / "scout.toml"),
        f"{link} is a symbolic link owned by uid {USER}",
    )


@needs_root
def test_link_to_a_user_owned_scontrol_is_refused(site):
    home = mkdir(site / "home", uid=USER)
    put(home / "scontrol", "#!/bin/sh\n", mode=0o755, uid=USER)
    b = mkdir(site / "bin")
    (b / "scontrol").symlink_to(home / "scontrol")
    path = put(site / "scout.toml", f'[slurm]\nbin_dir = "{b}"\n')
    refused(load_hook_config({}, path=path), f"{home} (owner uid {USER}")


@needs_root
def test_link_loop_is_refused(site):
    (site / "a").symlink_to(site / "b")
    (site / "b").symlink_to(site / "a")
    refused(load_hook_config({}, path=site / "a" / "scout.toml"), "more than 40 symbolic links")


@needs_root
def test_dot_dot_and_relative_paths(site, monkeypatch):
    put(site / "scout.toml", GOOD)
    mkdir(site / "sub")
    assert load_hook_config({}, path=site / "sub" / ".." / "scout.toml").config.slurm.retries == 7
    monkeypatch.chdir(site / "sub")
    assert load_hook_config({}, path="../scout.toml").config.slurm.retries == 7


@needs_root
def test_load_config_still_trusts_any_file_for_unprivileged_callers(site):
    # the job's shim and the operator's CLI run as the user, with nothing more than the user's
    # rights
    path = put(site / "scout.toml", GOOD, mode=0o666, uid=USER)
    assert load_config({}, path=path).slurm.retries == 7
