"""Evidence records on disk: `read_record`, `write_record`, `list_records` and their kin,
composed of the codec (evidence/codec.py: records <-> JSON, no I/O) and safe I/O
(evidence/safeio.py: no-follow, bounded, atomic). The names below that come from those two
modules stay importable from here for the many callers that know this module."""

from __future__ import annotations

import fnmatch
import operator
import os
import re
import typing
from pathlib import Path
from typing import Any

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.codec import (
    KIND_KEY,
    MAX_JSON_DEPTH,
    R,
    decode_record,
    record_from_obj,
    record_to_bytes,
    record_to_obj,
)
from scout_slurm.evidence.safeio import (
    DIR_LIST,
    MAX_RECORD_BYTES,
    PLANTED_ADVICE,
    EvidenceMissing,
    atomic_write_bytes,
    create_exclusive,
    open_below,
    read_at,
    safe_read_bytes,
)

__all__ = [
    "KIND_KEY",
    "MAX_JSON_DEPTH",
    "MAX_RECORD_BYTES",
    "EvidenceMissing",
    "atomic_write_bytes",
    "create_record_exclusive",
    "decode_record",
    "list_named_records",
    "list_records",
    "read_record",
    "record_from_obj",
    "record_to_bytes",
    "record_to_obj",
    "safe_read_bytes",
    "write_record",
]


def read_record(
    path: Path,
    cls: type[R],
    *,
    max_bytes: int = MAX_RECORD_BYTES,
    root: Path | None = None,
    owner: int | None = None,
) -> R:
    data = safe_read_bytes(path, max_bytes=max_bytes, root=root, owner=owner)
    return decode_record(data, cls, source=os.fspath(path))


def write_record(path: Path, record: Any, *, mode: int = 0o644) -> None:
    atomic_write_bytes(path, record_to_bytes(record), mode=mode)


def create_record_exclusive(path: Path, record: Any, *, mode: int = 0o644) -> bool:
    """Make `path` appear, complete, only if it does not exist yet. False: someone else's record
    (or anything else) is already there."""
    return create_exclusive(path, record_to_bytes(record), mode=mode)


_DIGIT_RUNS = re.compile(r"(\d+)")


def natural_key(name: str) -> list[Any]:
    """The sort key that puts rank-2 before rank-10."""
    # the split's odd parts are the digit runs; str.isdigit() would also take a run of "²", which
    # int() refuses: a job could name a file so that the listing raised
    return [(0, int(p), "") if i % 2 else (1, 0, p) for i, p in enumerate(_DIGIT_RUNS.split(name))]


_ONE_NUMBER = re.compile(r"(\D*)(\d+)(\D*)")


def sorted_natural(names: list[str]) -> list[str]:
    """`sorted(names, key=natural_key)`, without building `natural_key`'s key for every name when
    all
    of them are one number between the same two digit-free texts (rank-17.json): then the
    number alone orders them the same way (equal numbers, "01" and "1", keep the listing's order
    in both). The key costs ~10 us a name: 2.4 s for the 200k files of a 100k-rank job."""
    matches = list(map(_ONE_NUMBER.fullmatch, names))
    if not names or None in matches:
        return sorted(names, key=natural_key)
    get_outer = operator.methodcaller("group", 1, 3)
    if len(set(map(get_outer, matches))) != 1:
        return sorted(names, key=natural_key)
    numbers = list(map(int, map(operator.methodcaller("group", 2), matches)))
    order = sorted(range(len(names)), key=numbers.__getitem__)
    return [names[i] for i in order]


def list_records(
    directory: Path,
    pattern: str,
    cls: type[R],
    *,
    root: Path | None = None,
    max_files: int = 100_000,
    max_bytes: int = MAX_RECORD_BYTES,
    exclude: typing.Container[str] = frozenset(),
) -> tuple[list[R], list[str]]:
    """Every record in `directory` (not below) whose name matches the glob `pattern`, in
    natural name order (rank-2 before rank-10), and one error line per file that could not be
    used. Names starting with "." (temporary files of writers) match only a pattern that
    does; names in `exclude` are not read. Raises EvidenceError only when the directory itself
    is missing or unsafe."""
    named, errors = list_named_records(
        directory,
        pattern,
        cls,
        root=root,
        max_files=max_files,
        max_bytes=max_bytes,
        exclude=exclude,
    )
    return [record for _, record in named], errors


def list_named_records(
    directory: Path,
    pattern: str,
    cls: type[R],
    *,
    root: Path | None = None,
    max_files: int = 100_000,
    max_bytes: int = MAX_RECORD_BYTES,
    exclude: typing.Container[str] = frozenset(),
) -> tuple[list[tuple[str, R]], list[str]]:
    """`list_records`, each record with its file name (a result recorded about a file names it)."""
    shown_dir = os.fspath(directory)
    if root is None:
        head, name = os.path.split(os.path.normpath(shown_dir))
        base, parts = (head or "."), ([name] if name not in ("", ".", "..") else [])
        if not parts:
            base = shown_dir
    else:
        root_n = os.path.normpath(os.path.abspath(os.fspath(root)))
        dir_n = os.path.normpath(os.path.abspath(shown_dir))
        if os.path.commonpath([root_n, dir_n]) != root_n:
            raise EvidenceError(
                f"{shown_dir}: is outside the evidence root {root_n}; {PLANTED_ADVICE}"
            )
        rel = os.path.relpath(dir_n, root_n)
        base, parts = root_n, ([] if rel == "." else rel.split(os.sep))
    dir_fd = open_below(base, parts, shown_dir, DIR_LIST)
    records: list[tuple[str, R]] = []
    errors: list[str] = []
    try:
        hidden_ok = pattern.startswith(".")
        names: list[str] = []
        regular: set[str] = set()
        matches = re.compile(fnmatch.translate(pattern)).match
        try:
            with os.scandir(dir_fd) as entries:
                for entry in entries:
                    name = entry.name
                    if name.startswith(".") and not hidden_ok or name in exclude:
                        continue
                    if matches(name):
                        if len(names) == max_files:
                            errors.append(
                                f"{shown_dir}: more than {max_files} files match "
                                f"{pattern!r}; only {max_files} were read"
                            )
                            break
                        names.append(name)
                        try:
                            if entry.is_file(follow_symlinks=False):  # d_type: no syscall
                                regular.add(name)
                        except OSError:
                            pass  # read_at's own lstat decides and says why
        except OSError as e:
            raise EvidenceError(f"{shown_dir}: cannot list: {e.strerror or e}") from None
        prefix = os.path.join(shown_dir, "")
        for name in sorted_natural(names):
            shown = prefix + name
            try:
                records.append(
                    (
                        name,
                        decode_record(
                            read_at(dir_fd, name, shown, max_bytes, listed_regular=name in regular),
                            cls,
                            source=shown,
                        ),
                    )
                )
            except EvidenceError as e:
                errors.append(str(e))
    finally:
        os.close(dir_fd)
    return records, errors
