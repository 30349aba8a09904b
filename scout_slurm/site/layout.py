"""The files `scout site install --prefix DIR` lays out for slurm.conf: `site_layout()` computes
them (pure: paths, text, modes), `write_layout()` is the one function here that touches the disk.

The hooks are named in slurm.conf through small wrappers, not the console scripts alone: Slurm
gives hooks no PATH (and controller hooks no SLURM_CONF), slurm.conf cannot set SCOUT_CONFIG, and
slurmd keeps no hook's output, so each wrapper sets those and appends its output to a log.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from importlib import resources
from pathlib import Path

from scout_slurm import __version__
from scout_slurm.errors import ConfigError

HOOK_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


@dataclass(frozen=True)
class Hook:
    """One of scout's hooks as slurm.conf names it."""

    parameter: str  # slurm.conf's parameter
    script: str  # the console script pip installs beside the interpreter
    runs_as: str
    controller: bool = False


HOOKS = (
    Hook("Prolog", "scout-prolog", "root, on every allocated node"),
    Hook("Epilog", "scout-epilog", "root, on every node of the job"),
    Hook(
        "EpilogSlurmctld",
        "scout-epilog-slurmctld",
        "SlurmUser, once per job on the controller",
        controller=True,
    ),
)


@dataclass(frozen=True)
class SiteFile:
    """A file of the layout: where, what, its mode, and whether an existing one is kept."""

    path: Path
    text: str
    mode: int
    keep_existing: bool = False
    link_to: Path | None = None  # a symbolic link to this path instead of a file


@dataclass(frozen=True)
class SiteLayout:
    prefix: Path
    config: Path
    snippet: Path
    wrappers: dict[str, Path]  # slurm.conf parameter -> wrapper path
    globs: dict[str, str]  # Prolog/Epilog -> the folder glob slurm.conf names
    logs: Path
    files: tuple[SiteFile, ...]


def package_text(name: str) -> str:
    """A file shipped in the wheel (scout_slurm/site/NAME)."""
    return resources.files("scout_slurm.site").joinpath(name).read_text(encoding="utf-8")


def _shell_quoted(path: Path) -> str:
    text = str(path)
    if "'" in text or "\n" in text:
        raise ConfigError(
            f"{text!r}: a path with a quote or a newline cannot be written into a hook script; "
            "choose another --prefix"
        )
    return f"'{text}'"


def render_wrapper(hook: Hook, *, script: Path, config: Path, log: Path, slurm_conf: Path) -> str:
    """The sh wrapper slurm.conf names for `hook` (pure)."""
    lines = [
        "#!/bin/sh",
        f"# slurm.conf: {hook.parameter}=<this file>. Runs as {hook.runs_as}.",
        f"# Laid out by `scout site install` (scout-slurm {__version__}): runs {script}.",
        "# Output appends to the log below; where it cannot be opened, the hook still runs (its",
        "# output then goes where slurmd sends it: nowhere). The exit status is the hook's own.",
        f"export PATH={HOOK_PATH}",
        f"export SCOUT_CONFIG={_shell_quoted(config)}",
    ]
    if hook.controller:
        lines.append(f"export SLURM_CONF={_shell_quoted(slurm_conf)}")
    lines += [
        f"log={_shell_quoted(log)}",
        f'if (: >>"$log") 2>/dev/null; then exec {_shell_quoted(script)} >>"$log" 2>&1; fi',
        f"exec {_shell_quoted(script)}",
        "",
    ]
    return "\n".join(lines)


def site_layout(prefix: Path, *, scripts_dir: Path, python: Path, slurm_conf: Path) -> SiteLayout:
    """What `scout site install --prefix` writes (pure but for reading the package's own files).

    `scripts_dir` is where pip put this interpreter's console scripts; `python` the interpreter."""
    prefix = Path(os.path.abspath(prefix))
    etc = prefix / "etc" / "scout"
    libexec = prefix / "libexec" / "scout"
    logs = prefix / "var" / "log" / "scout"
    config = etc / "scout.toml"
    wrappers = {h.parameter: libexec / h.script for h in HOOKS}
    files = [SiteFile(config, package_text("scout.toml.example"), 0o644, keep_existing=True)]
    for hook in HOOKS:
        text = render_wrapper(
            hook,
            script=scripts_dir / hook.script,
            config=config,
            log=logs / f"{hook.script}.log",
            slurm_conf=slurm_conf,
        )
        files.append(SiteFile(wrappers[hook.parameter], text, 0o755))
    snippet = (
        package_text("slurm.conf.snippet.in")
        .replace("@PREFIX@", str(prefix))
        .replace("@PYTHON@", str(python))
        .replace("@VERSION@", __version__)
        .replace("@PROLOG@", str(wrappers["Prolog"]))
        .replace("@EPILOG_SLURMCTLD@", str(wrappers["EpilogSlurmctld"]))
        .replace("@EPILOG@", str(wrappers["Epilog"]))
    )
    globs = {}
    for hook in HOOKS:
        if hook.controller:
            continue
        folder = etc / f"{hook.parameter.lower()}.d"
        globs[hook.parameter] = f"{folder}/*"
        files.append(SiteFile(folder / hook.script, "", 0o755, link_to=wrappers[hook.parameter]))
    snippet = snippet.replace("@PROLOG_DIR@", globs["Prolog"][:-2]).replace(
        "@EPILOG_DIR@", globs["Epilog"][:-2]
    )
    files.append(SiteFile(etc / "slurm.conf.snippet", snippet, 0o644))
    doc = prefix / "share" / "doc" / "scout" / "THREAT-MODEL.md"
    files.append(SiteFile(doc, package_text("THREAT-MODEL.md"), 0o644))
    return SiteLayout(
        prefix, config, etc / "slurm.conf.snippet", wrappers, globs, logs, tuple(files)
    )


def missing_scripts(layout: SiteLayout, scripts_dir: Path) -> list[Path]:
    """The hooks' console scripts that are not installed beside the interpreter."""
    return [scripts_dir / h.script for h in HOOKS if not (scripts_dir / h.script).is_file()]


def write_layout(layout: SiteLayout) -> list[tuple[Path, str]]:
    """Writes the layout (atomically, file by file) and the log folder; returns (path, what was
    done) for each file: `wrote`, or `kept` for a site config that already exists."""
    done: list[tuple[Path, str]] = []
    for f in layout.files:
        if f.keep_existing and (f.path.exists() or f.path.is_symlink()):
            done.append((f.path, "kept (exists)"))
            continue
        f.path.parent.mkdir(parents=True, exist_ok=True)
        tmp = f.path.with_name(f".{f.path.name}.tmp{os.getpid()}")
        if f.link_to is not None:
            tmp.unlink(missing_ok=True)
            os.symlink(f.link_to, tmp)
            os.replace(tmp, f.path)
            done.append((f.path, "linked"))
            continue
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, f.mode)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as out:
                out.write(f.text)
                out.flush()
                os.fsync(out.fileno())
            os.chmod(tmp, f.mode)  # the umask must not narrow a hook's mode
            os.replace(tmp, f.path)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise
        done.append((f.path, "wrote"))
    layout.logs.mkdir(parents=True, exist_ok=True)
    return done


def install_summary(layout: SiteLayout, done: list[tuple[Path, str]]) -> str:
    """What `scout site install` prints: what it wrote, and what to add to slurm.conf (pure)."""
    out = [f"{what:>14}  {path}" for path, what in done]
    out += [
        "",
        (
            f"Add to slurm.conf (the whole snippet, with how to keep the site's own hooks beside "
            f"scout's, is {layout.snippet}):"
        ),
        "  PrologFlags=Alloc",
    ]
    out += [f"  {param}={glob}" for param, glob in layout.globs.items()]
    out += [f"  EpilogSlurmctld={layout.wrappers['EpilogSlurmctld']}", "  MinJobAge=300"]
    out += [
        "",
        "Slurm runs every program in each folder: link the site's present Prolog and Epilog",
        (
            f"programs (NHC, a DCGM epilog) into {layout.globs['Prolog'][:-2]} and "
            f"{layout.globs['Epilog'][:-2]}"
        ),
        "instead of naming them in slurm.conf. On 22.05 EpilogSlurmctld takes one program: where",
        "the site has one, chain both from one script (see the snippet).",
    ]
    out += [
        "",
        "Then:",
        f"  - the hooks read {layout.config} only when it and every folder above it are root's",
        (
            f"    and writable by no one else: chown root:root {layout.config} && chmod 644 "
            f"{layout.config}"
        ),
        "  - set [evidence] root and slurm_user there; keep [remediation] observe_only = true",
        "    until the plans it writes look right",
        f"  - hook logs: {layout.logs}/<hook>.log; the controller's must be writable by SlurmUser:",
        (
            f"    touch {layout.logs}/scout-epilog-slurmctld.log && chown slurm "
            f"{layout.logs}/scout-epilog-slurmctld.log"
        ),
        "  - restart slurmctld (EpilogSlurmctld), `scontrol reconfigure` for the nodes",
    ]
    return "\n".join(out) + "\n"
