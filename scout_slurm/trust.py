"""Whether root may trust a file it reads or a program it runs: sshd's StrictModes rule.

The rule is pure functions over stat results (`file_problem`, `command_problem`,
`directory_problem`, `link_problem`). Two functions reach outside: `resolve_trusted` (lstat and
readlink, from / down) and `read_trusted_file` (open, fstat, read); `check_bin_dir` uses the first.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Collection, Iterable

from scout_slurm.errors import UntrustedPath

# the kernel's own limit on symbolic links followed in one lookup
MAX_LINKS = 40
# O_NONBLOCK: a FIFO or a terminal put where the file should be must never block the hook
_READ_FLAGS = os.O_RDONLY | os.O_NONBLOCK | os.O_NOFOLLOW | os.O_CLOEXEC | os.O_NOCTTY

_TYPE_NAMES = (
    (stat.S_ISLNK, "is a symbolic link"),
    (stat.S_ISFIFO, "is a FIFO (named pipe)"),
    (stat.S_ISSOCK, "is a socket"),
    (stat.S_ISCHR, "is a character device"),
    (stat.S_ISBLK, "is a block device"),
    (stat.S_ISDIR, "is a directory"),
    (stat.S_ISREG, "is a regular file"),
)


def file_type_words(mode: int) -> str:
    """What kind of file `mode` is, in words ("is a FIFO (named pipe)"), for refusals."""
    for test, words in _TYPE_NAMES:
        if test(mode):
            return words
    return f"has file type {stat.S_IFMT(mode):o}"


def _found(st: os.stat_result) -> str:
    return f"owner uid {st.st_uid}, mode {stat.S_IMODE(st.st_mode):04o}"


def _uids(trusted_uids: Collection[int]) -> str:
    return ", ".join(str(u) for u in sorted(trusted_uids))


def _mode_problem(
    path: str,
    st: os.stat_result,
    trusted_uids: Collection[int],
    *,
    fix_mode: str,
    sticky_ok: bool = False,
) -> str | None:
    wrong = []
    if st.st_uid not in trusted_uids:
        wrong.append(
            f"owned by uid {st.st_uid}, not by a trusted owner (uid {_uids(trusted_uids)})"
        )
    # a root-owned sticky directory (/tmp): others may add entries but not replace root's
    if st.st_mode & 0o022 and not (sticky_ok and st.st_uid == 0 and st.st_mode & stat.S_ISVTX):
        wrong.append("writable by group or others")
    if not wrong:
        return None
    return (
        f"{path} ({_found(st)}) is {' and '.join(wrong)}, so someone other than root could change "
        f"what root runs with; fix: chown root:root {path} && chmod {fix_mode} {path}"
    )


def file_problem(
    path: str, st: os.stat_result, trusted_uids: Collection[int], *, max_bytes: int
) -> str | None:
    """Why root must not read the file at `path` that has this stat, or None (pure)."""
    if not stat.S_ISREG(st.st_mode):
        what = (
            "name the file itself: a link is not followed"
            if stat.S_ISLNK(st.st_mode)
            else "put the file itself there"
        )
        return f"{path} {file_type_words(st.st_mode)} ({_found(st)}), not a regular file; {what}"
    if problem := _mode_problem(path, st, trusted_uids, fix_mode="644"):
        return problem
    if st.st_size > max_bytes:
        return (
            f"{path} is {st.st_size} bytes, more than the {max_bytes} allowed; is this the right "
            "file?"
        )
    return None


def command_problem(path: str, st: os.stat_result, trusted_uids: Collection[int]) -> str | None:
    """Why root must not run the program at `path` that has this stat, or None (pure)."""
    if not stat.S_ISREG(st.st_mode):
        return (
            f"{path} {file_type_words(st.st_mode)} ({_found(st)}), not a regular file; reinstall it"
        )
    return _mode_problem(path, st, trusted_uids, fix_mode="755")


def directory_problem(
    path: str, st: os.stat_result, trusted_uids: Collection[int], *, sticky_ok: bool = True
) -> str | None:
    """Why root must not trust what lies in directory `path` that has this stat, or None (pure).

    `sticky_ok`: a root-owned directory with the sticky bit passes although others may write it
    (they cannot replace root's entries); not for a directory where a missing name matters.
    """
    if not stat.S_ISDIR(st.st_mode):
        return f"{path} {file_type_words(st.st_mode)} ({_found(st)}), not a directory"
    return _mode_problem(path, st, trusted_uids, fix_mode="go-w", sticky_ok=sticky_ok)


def link_problem(path: str, st: os.stat_result, trusted_uids: Collection[int]) -> str | None:
    """Why root must not follow the symbolic link `path` that has this lstat, or None (pure)."""
    if st.st_uid in trusted_uids:
        return None
    # in a sticky directory (/tmp) the link's owner may replace it at will
    return (
        f"{path} is a symbolic link owned by uid {st.st_uid}, not by a trusted owner "
        f"(uid {_uids(trusted_uids)}); fix: chown -h root:root {path}, or name the real path"
    )


def _parts(path: str) -> list[str]:
    return [p for p in path.split("/") if p not in ("", ".")]


def resolve_trusted(
    path: str | os.PathLike[str], trusted_uids: Collection[int], *, follow_last: bool
) -> tuple[str, os.stat_result]:
    """The real path of `path` and the lstat of its last component, once every directory on the
    way from / has passed `directory_problem` (checked with lstat, top down).

    The last component itself is not judged: that is the caller's rule. Raises FileNotFoundError
    when a component does not exist, UntrustedPath when one fails the rule.
    """
    # A symlinked component is resolved, as sshd's secure_filename does (it judges realpath()),
    # rather than refused: sites point /opt/slurm at a versioned install and /etc at shared
    # storage. Unlike realpath() the link itself is judged too: it must be owned by a trusted uid
    # and lie in a directory already judged, so only a trusted uid can have made or can change
    # it; its target is then walked by the same rule. Every directory judged here can be changed
    # by trusted uids only, so what open() later finds along the same path is what was judged.
    text = os.fspath(path)
    todo = _parts(text if text.startswith("/") else os.path.join(os.getcwd(), text))
    done: list[str] = []
    links = 0
    st = _lstat("/")
    if problem := directory_problem("/", st, trusted_uids):
        raise UntrustedPath(problem)
    while todo:
        name = todo.pop(0)
        if name == "..":
            if done:  # `done` holds no link, so its parent is the lexical one
                done.pop()
            continue
        current = "/" + "/".join([*done, name])
        st = _lstat(current)
        if stat.S_ISLNK(st.st_mode) and (todo or follow_last):
            if problem := link_problem(current, st, trusted_uids):
                raise UntrustedPath(problem)
            links += 1
            if links > MAX_LINKS:
                raise UntrustedPath(
                    f"{text}: more than {MAX_LINKS} symbolic links on the way; is there a loop?"
                )
            target = _readlink(current)
            if target.startswith("/"):
                done = []
            todo = _parts(target) + todo
            continue
        if not todo:
            return current, st
        if problem := directory_problem(current, st, trusted_uids):
            raise UntrustedPath(problem)
        done.append(name)
    real = "/" + "/".join(done)
    return real, _lstat(real)


def _lstat(path: str) -> os.stat_result:
    try:
        return os.lstat(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UntrustedPath(f"{path}: cannot be examined: {e.strerror or e}") from None


def _readlink(path: str) -> str:
    try:
        return os.readlink(path)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UntrustedPath(f"{path}: cannot read the symbolic link: {e.strerror or e}") from None


def read_trusted_file(
    path: str | os.PathLike[str], trusted_uids: Collection[int], *, max_bytes: int
) -> bytes:
    """The bytes of `path`, read only if root can trust them (see `file_problem`).

    Raises FileNotFoundError when it (or a directory on the way) does not exist, UntrustedPath
    when any part fails the rule.
    """
    real, st = resolve_trusted(path, trusted_uids, follow_last=False)
    shown = real if real == os.fspath(path) else f"{os.fspath(path)} (really {real})"
    # lstat first, so that a device is never opened (opening some has effects); the fstat of the
    # descriptor is the check that counts
    if problem := file_problem(shown, st, trusted_uids, max_bytes=max_bytes):
        raise UntrustedPath(problem)
    try:
        fd = os.open(real, _READ_FLAGS)
    except FileNotFoundError:
        raise
    except OSError as e:
        raise UntrustedPath(f"{shown}: cannot be opened: {e.strerror or e}") from None
    try:
        if problem := file_problem(shown, os.fstat(fd), trusted_uids, max_bytes=max_bytes):
            raise UntrustedPath(problem)
        chunks, total = [], 0
        while total <= max_bytes:
            chunk = os.read(fd, max_bytes + 1 - total)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
    except OSError as e:
        raise UntrustedPath(f"{shown}: cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise UntrustedPath(
            f"{shown} grew past {max_bytes} bytes while being read; is this the right file?"
        )
    return b"".join(chunks)


def check_bin_dir(bin_dir: str, trusted_uids: Collection[int], commands: Iterable[str]) -> None:
    """Raise UntrustedPath unless root can trust `bin_dir`, its ancestors and each of `commands`
    present in it; FileNotFoundError when `bin_dir` does not exist."""
    real, st = resolve_trusted(bin_dir, trusted_uids, follow_last=True)
    # no sticky pass for bin_dir itself: anyone may add a name to /tmp, so a command missing
    # today could be planted tomorrow and run by root
    if problem := directory_problem(real, st, trusted_uids, sticky_ok=False):
        raise UntrustedPath(problem)
    for name in sorted(commands):
        # a command that is a link is resolved by the same rule as a directory: exec follows it
        try:
            cmd_real, cst = resolve_trusted(
                os.path.join(real, name), trusted_uids, follow_last=True
            )
        except FileNotFoundError:
            continue  # not installed here: the door says so if it is ever needed
        if problem := command_problem(cmd_real, cst, trusted_uids):
            raise UntrustedPath(problem)
