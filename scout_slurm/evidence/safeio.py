"""Safe file I/O below an evidence root: atomic writes (temp file, fsync, rename), exclusive
creation, and bounded reads that a root hook can aim at a folder the job wrote without following
a planted link, blocking on a FIFO or reading without a size bound. Bytes only; what the bytes
mean is evidence/codec.py."""

from __future__ import annotations

import ctypes
import errno
import functools
import os
import pwd
import secrets
import stat
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from scout_slurm.errors import EvidenceError
from scout_slurm.evidence.codec import CORRUPT_ADVICE as _CORRUPT
from scout_slurm.trust import file_type_words

MAX_RECORD_BYTES = 4 * 1024 * 1024

PLANTED_ADVICE = "the job may have planted it; the record is ignored"
_PLANTED = PLANTED_ADVICE


class EvidenceMissing(EvidenceError):
    """The evidence file or folder does not exist (not written yet, or removed)."""


# --------------------------------------------------------------------------------------------
# Writing
# --------------------------------------------------------------------------------------------

_WRITE_STEPS = ("open", "write", "chmod", "fsync", "replace", "fsync_dir")


def _fault(fail_at: str | None, step: str) -> None:
    """Test seam: raise the OSError a failing disk would at `step`."""
    if fail_at == step:
        raise OSError(errno.EIO, f"injected failure at {step}")


def atomic_write_bytes(
    path: Path, data: bytes, *, mode: int = 0o644, _fail_at: str | None = None
) -> None:
    """Replace `path` by `data` so that a reader sees the old or the new content, never a part:
    temp file in the same directory, fsync, rename over, fsync the directory."""
    if _fail_at is not None and _fail_at not in _WRITE_STEPS:
        raise ValueError(f"_fail_at must be one of {', '.join(_WRITE_STEPS)}")
    shown = os.fspath(path)
    dir_fd, name = _open_parent_for_write(shown)
    try:
        _refuse_symlink_target(dir_fd, name, shown)
        tmp = _write_temp(dir_fd, name, data, mode, _fail_at)
        try:
            _fault(_fail_at, "replace")
            os.replace(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd)
        except BaseException:
            _unlink_quietly(dir_fd, tmp)
            raise
        try:
            _fault(_fail_at, "fsync_dir")
            os.fsync(dir_fd)
        except OSError as e:
            raise EvidenceError(
                f"wrote {shown} but could not make the rename durable: {e.strerror or e}{_hint(e)}"
            ) from e
    except OSError as e:
        raise _write_error(shown, e) from e
    finally:
        os.close(dir_fd)


def create_exclusive(path: Path, data: bytes, *, mode: int = 0o644) -> bool:
    """Make `path` appear with `data`, complete, only if it does not exist yet. False: something
    is already there."""
    shown = os.fspath(path)
    dir_fd, name = _open_parent_for_write(shown)
    try:
        tmp = _write_temp(dir_fd, name, data, mode, None)
        try:
            created = publish_exclusive(dir_fd, tmp, name)
        finally:
            _unlink_quietly(dir_fd, tmp)
        if created:
            os.fsync(dir_fd)
        return created
    except OSError as e:
        raise _write_error(shown, e) from e
    finally:
        os.close(dir_fd)


def _open_parent_for_write(shown: str) -> tuple[int, str]:
    head, name = os.path.split(shown)
    if not name or name in (".", ".."):
        raise EvidenceError(f"cannot write {shown}: not a file path")
    try:
        return os.open(head or ".", os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC), name
    except FileNotFoundError:
        raise EvidenceMissing(
            f"cannot write {shown}: directory {head or '.'} does not exist; "
            "create the evidence folder first"
        ) from None
    except OSError as e:
        raise _write_error(shown, e) from e


def _refuse_symlink_target(dir_fd: int, name: str, shown: str) -> None:
    try:
        st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return
    if stat.S_ISLNK(st.st_mode):
        raise EvidenceError(f"cannot write {shown}: it is a symbolic link; {_PLANTED}: remove it")
    if stat.S_ISDIR(st.st_mode):
        raise EvidenceError(f"cannot write {shown}: it is a directory; remove it")


def _write_temp(dir_fd: int, name: str, data: bytes, mode: int, fail_at: str | None) -> str:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    for _ in range(8):
        tmp = f".{name[:100]}.{secrets.token_hex(8)}.tmp"
        _fault(fail_at, "open")
        try:
            fd = os.open(tmp, flags, 0o600, dir_fd=dir_fd)
            break
        except FileExistsError:
            continue
    else:
        raise OSError(errno.EEXIST, "could not create a unique temporary file")
    try:
        try:
            view = memoryview(data)
            if fail_at == "write":
                os.write(fd, view[: len(view) // 2])
                _fault(fail_at, "write")
            while view:
                view = view[os.write(fd, view) :]
            _fault(fail_at, "chmod")
            os.fchmod(fd, mode)
            _fault(fail_at, "fsync")
            os.fsync(fd)
        finally:
            os.close(fd)
    except BaseException:
        _unlink_quietly(dir_fd, tmp)
        raise
    return tmp


@functools.cache
def _renameat2() -> Any:
    try:
        fn = ctypes.CDLL(None, use_errno=True).renameat2
    except (OSError, AttributeError):
        return None
    fn.argtypes = [ctypes.c_int, ctypes.c_char_p, ctypes.c_int, ctypes.c_char_p, ctypes.c_uint]
    fn.restype = ctypes.c_int
    return fn


_RENAME_NOREPLACE = 1


def publish_exclusive(dir_fd: int, tmp: str, name: str, *, use_renameat2: bool = True) -> bool:
    """Give the complete file `tmp` the name `name` in `dir_fd` unless `name` exists: True when
    it did. `use_renameat2=False` takes the link()+unlink() fallback (tested on its own)."""
    # rename(RENAME_NOREPLACE) publishes the file with one link. link()+unlink() (the fallback,
    # for file systems without the flag) leaves a moment where the file has two links, which
    # safe_read_bytes refuses; a loser of the race reading right away could see that.
    fn = _renameat2() if use_renameat2 else None
    if fn is not None:
        if fn(dir_fd, os.fsencode(tmp), dir_fd, os.fsencode(name), _RENAME_NOREPLACE) == 0:
            return True
        err = ctypes.get_errno()
        if err == errno.EEXIST:
            return False
        if err not in (errno.EINVAL, errno.ENOSYS, errno.EOPNOTSUPP):
            raise OSError(err, os.strerror(err))
    try:
        os.link(tmp, name, src_dir_fd=dir_fd, dst_dir_fd=dir_fd, follow_symlinks=False)
    except FileExistsError:
        return False
    return True


def _unlink_quietly(dir_fd: int, name: str) -> None:
    try:
        os.unlink(name, dir_fd=dir_fd)
    except OSError:
        pass


def _hint(e: OSError) -> str:
    if e.errno == errno.ENOSPC:
        return " (disk full? free space on the evidence file system and retry)"
    if e.errno == errno.EDQUOT:
        return " (quota exceeded? free space or raise the quota of the evidence file system)"
    if e.errno == errno.EROFS:
        return " (the evidence file system is mounted read-only)"
    if e.errno in (errno.EACCES, errno.EPERM):
        return " (check the owner and mode of the evidence folder)"
    return ""


def _write_error(shown: str, e: OSError) -> EvidenceError:
    return EvidenceError(f"cannot write {shown}: {e.strerror or e}{_hint(e)}")


# --------------------------------------------------------------------------------------------
# Reading what a job may have written
# --------------------------------------------------------------------------------------------

DIR_PATH = os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC
DIR_LIST = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC
FILE_READ = os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC | os.O_NOCTTY


def split_under(path: str, root: str | os.PathLike | None, shown: str) -> tuple[str, list[str]]:
    """(trusted base directory, components below it) for `path`. With a root, every component
    below the root is untrusted; without, only the last."""
    if root is None:
        head, name = os.path.split(path)
        if not name:
            raise EvidenceError(f"{shown}: not a file path")
        return head or ".", [name]
    root_n = os.path.normpath(os.path.abspath(os.fspath(root)))
    path_n = os.path.normpath(os.path.abspath(path))
    if path_n == root_n or os.path.commonpath([root_n, path_n]) != root_n:
        raise EvidenceError(f"{shown}: is outside the evidence root {root_n}; {_PLANTED}")
    return root_n, os.path.relpath(path_n, root_n).split(os.sep)


def open_below(base: str, parts: list[str], shown: str, final_flags: int) -> int:
    """A descriptor of base/parts..., opening every part without following a link."""
    try:
        fd = os.open(base, final_flags if not parts else DIR_PATH)
    except FileNotFoundError:
        raise EvidenceMissing(f"{shown}: directory {base} does not exist") from None
    except OSError as e:
        raise EvidenceError(f"{shown}: cannot open directory {base}: {e.strerror or e}") from None
    try:
        for i, part in enumerate(parts):
            flags = (final_flags if i == len(parts) - 1 else DIR_PATH) | os.O_NOFOLLOW
            try:
                next_fd = os.open(part, flags, dir_fd=fd)
            except OSError as e:
                where = os.path.join(base, *parts[: i + 1])
                raise _refusal(e, fd, part, shown, where, want_dir=True) from None
            os.close(fd)
            fd = next_fd
    except BaseException:
        os.close(fd)
        raise
    return fd


def _refusal(
    e: OSError, dir_fd: int, name: str, shown: str, where: str, *, want_dir: bool
) -> EvidenceError:
    subject = f"{shown}:" if where == shown else f"{shown}: component {where}"
    if isinstance(e, FileNotFoundError):
        return EvidenceMissing(f"{subject} does not exist")
    if e.errno in (errno.ELOOP, errno.ENOTDIR):
        try:
            mode = os.stat(name, dir_fd=dir_fd, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            return EvidenceError(f"{subject} is a symbolic link; {_PLANTED}")
        if want_dir and mode and not stat.S_ISDIR(mode):
            return EvidenceError(f"{subject} is not a directory; {_PLANTED}")
    return EvidenceError(f"{subject} cannot be opened: {e.strerror or e}")


def _check_file(st: os.stat_result, shown: str, max_bytes: int) -> None:
    if not stat.S_ISREG(st.st_mode):
        raise EvidenceError(
            f"{shown}: {file_type_words(st.st_mode)}, not a regular file; {_PLANTED}"
        )
    if st.st_nlink != 1:
        # A job could hard-link a file it may not read into its own folder for root to read.
        raise EvidenceError(f"{shown}: has {st.st_nlink} hard links; {_PLANTED}")
    if st.st_size > max_bytes:
        raise EvidenceError(f"{shown}: is {st.st_size} bytes, limit {max_bytes}; {_CORRUPT}")


def read_at(
    dir_fd: int,
    name: str,
    shown: str,
    max_bytes: int,
    *,
    listed_regular: bool = False,
    owner: int | None = None,
) -> bytes:
    """The bytes of regular, singly linked file `name` in `dir_fd`, at most `max_bytes`, without
    following a link or blocking on a FIFO; `shown` names it in errors."""
    # lstat first so that a device node or FIFO is never even opened (opening some devices has
    # effects); the fstat after opening is the check that counts. `listed_regular`: the directory
    # listing's own type field (d_type, no syscall) already said "regular file", which is the same
    # pre-check with the same window before the open; at 100k ranks it saves 300k lstat calls.
    try:
        if not listed_regular:
            _check_file(os.stat(name, dir_fd=dir_fd, follow_symlinks=False), shown, max_bytes)
        fd = os.open(name, FILE_READ, dir_fd=dir_fd)
    except EvidenceError:
        raise
    except OSError as e:
        raise _refusal(e, dir_fd, name, shown, shown, want_dir=False) from None
    try:
        st = os.fstat(fd)
        _check_file(st, shown, max_bytes)
        if owner is not None and st.st_uid != owner:
            # only root writes what this caller asks for: a file owned by anyone else was planted
            raise EvidenceError(f"{shown}: is owned by uid {st.st_uid}, not {owner}; {_PLANTED}")
        chunks, total = [], 0
        # One read asking for a byte more than fstat's size: getting exactly the size back is the
        # end of the file without a second read (half the read calls of a job-end gather).
        want = min(max_bytes + 1, st.st_size + 1, 1 << 20)
        while total <= max_bytes:
            chunk = os.read(fd, want)
            if not chunk:
                break
            chunks.append(chunk)
            total += len(chunk)
            if total == st.st_size and len(chunk) < want:
                break
            want = min(max_bytes + 1 - total, 1 << 20)
    except OSError as e:
        raise EvidenceError(f"{shown}: cannot be read: {e.strerror or e}") from None
    finally:
        os.close(fd)
    if total > max_bytes:
        raise EvidenceError(
            f"{shown}: grew past the limit of {max_bytes} bytes while being read; {_CORRUPT}"
        )
    return b"".join(chunks)


def safe_read_bytes(
    path: Path,
    *,
    max_bytes: int = MAX_RECORD_BYTES,
    root: Path | None = None,
    owner: int | None = None,
) -> bytes:
    """The bytes of a regular, singly linked file of at most `max_bytes`. With `root`, no
    component from `root` down to the file may be a symbolic link; without, only the file's
    own name is checked (its directories are trusted). With `owner`, the file must belong to
    that uid (what only root writes: a job cannot make a file root's)."""
    shown = os.fspath(path)
    base, parts = split_under(shown, root, shown)
    dir_fd = open_below(base, parts[:-1], shown, DIR_PATH)
    try:
        return read_at(dir_fd, parts[-1], shown, max_bytes, owner=owner)
    finally:
        os.close(dir_fd)


# --------------------------------------------------------------------------------------------
# Creating the evidence tree's folders (the root hooks)
# --------------------------------------------------------------------------------------------

_DIR_CREATE_OPEN = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


class UnsafeFolder(EvidenceError):
    """A folder of the evidence tree is a link, not a directory, or has an unexpected owner."""


@dataclass(frozen=True)
class Owner:
    uid: int
    gid: int
    mode: int


def _describe_owner(uid: int) -> str:
    try:
        return f"uid {uid} ({pwd.getpwuid(uid).pw_name})"
    except KeyError:
        return f"uid {uid}"


def ensure_dir(parent_fd: int, name: str, owner: Owner, shown: Path) -> int:
    """An O_NOFOLLOW descriptor of directory `name` under `parent_fd`, created if missing.

    Several nodes run this at once on shared storage: mkdir may lose the race, which is fine.
    An existing entry is used only if it is a real directory owned by `owner.uid`, or by root
    (a root hook on another node that has not yet handed it over; only root can create entries
    in the root-owned folders above); then it is (re)owned through the descriptor, never a path.
    """
    created = True
    try:
        os.mkdir(name, owner.mode, dir_fd=parent_fd)
    except FileExistsError:
        created = False
    try:
        fd = os.open(name, _DIR_CREATE_OPEN, dir_fd=parent_fd)
    except OSError as exc:
        try:
            mode = os.stat(name, dir_fd=parent_fd, follow_symlinks=False).st_mode
        except OSError:
            mode = 0
        if stat.S_ISLNK(mode):
            raise UnsafeFolder(
                f"{shown} is a symbolic link; refusing to follow it (who planted it?); remove it"
            ) from None
        if mode and not stat.S_ISDIR(mode):
            raise UnsafeFolder(f"{shown} exists and is not a directory; remove it") from None
        raise UnsafeFolder(f"{shown}: cannot open: {exc.strerror or exc}") from None
    try:
        st = os.fstat(fd)
        if st.st_uid not in (owner.uid, 0):
            raise UnsafeFolder(
                f"{shown} is owned by {_describe_owner(st.st_uid)}, expected "
                f"{_describe_owner(owner.uid)}; refusing to use it (root-squashed NFS? "
                f"export the evidence root with no_root_squash)"
            )
        handed = st.st_uid == 0 and (st.st_uid, st.st_gid) != (owner.uid, owner.gid)
        if handed:
            os.fchown(fd, owner.uid, owner.gid)
        # mkdir's mode went through the umask; a root-owned folder others may write is unsafe.
        # A folder the job already owns keeps whatever mode the job gave it.
        if created or handed or (st.st_uid == 0 and st.st_mode & 0o022):
            os.fchmod(fd, owner.mode)
    except BaseException:
        os.close(fd)
        raise
    return fd


def list_names_below(path: Path, root: Path) -> list[str]:
    """The names in the directory `path` under `root`, opened without following a link anywhere
    below `root` ([] when it does not exist): what a privileged reader lists of a job's folders."""
    shown = os.fspath(path)
    base, parts = split_under(shown, root, shown)
    try:
        fd = open_below(base, parts, shown, DIR_LIST)
    except EvidenceMissing:
        return []
    try:
        return os.listdir(fd)
    finally:
        os.close(fd)
