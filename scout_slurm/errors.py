"""The one error hierarchy. Every error that reaches a person says what happened, where, and
what to do next."""

from __future__ import annotations


class ScoutError(Exception):
    """Base of every error scout raises on purpose."""


class ConfigError(ScoutError):
    """A config file, flag or environment variable is missing or invalid."""


class UntrustedPath(ConfigError):
    """A file or directory root would read or run could be changed by someone root does not
    trust.
    """


class SlurmError(ScoutError):
    """A Slurm command failed or printed something we cannot read."""

    def __init__(
        self,
        message: str,
        *,
        argv: tuple[str, ...] = (),
        returncode: int | None = None,
        stderr: str = "",
    ) -> None:
        detail = message
        if argv:
            detail += f"\n  command: {' '.join(argv)}"
        if returncode is not None:
            detail += f"\n  exit code: {returncode}"
        if stderr:
            detail += f"\n  stderr: {stderr.strip()[:2000]}"
        super().__init__(detail)
        self.argv = argv
        self.returncode = returncode
        self.stderr = stderr


class SlurmNotInstalled(SlurmError):
    """A Slurm binary is not on this machine."""


class SlurmTimeout(SlurmError):
    """A Slurm command did not answer within its timeout."""


class EvidenceError(ScoutError):
    """An evidence file is missing, unsafe, oversized or malformed."""


class LabError(ScoutError):
    """The local lab cluster could not be started, stopped or inspected."""
