"""Checkpoint evidence inside the training process (runs in the job's Python, as root-trusted code
writing only into scout's evidence folder).

- A save (torch.save of a file, torch.distributed.checkpoint's save of a folder, or the explicit
  `note()`) is recorded with the digests of every written file, the saving rank's state signatures
  at that moment, the software versions, and the vote/replay coverage since the previous record.
- The replicas' agreement: every rank signs its state and the signatures are exchanged on scout's
  gloo side group. A DCP save is collective, so this happens inside it. A torch.save is usually
  made by one rank that the others do not wait for, so the exchange is made once every K steps
  (K: the state votes' interval; EXCHANGE_EVERY when votes are off), at the optimizer step after
  each vote step (before it changes anything), not every step: there every rank contributes one
  int64 ("did I save since the last exchange?"); only when one did is the full exchange made. The
  replicas' signatures are those of that moment: for a save made right after a vote step (the usual
  checkpoint interval, a multiple of K) that is the saved state, and the record says
  "agreed"/"disagreed" at the save as before; for a save the training has moved on from since, an
  agreement is "agreed at step N, after the save" (the replicas agreed at a step >= the save's:
  eligible, as a clean vote there would make it) and a disagreement is not blamed on the save
  ("not exchanged at the save": the vote's verdict and first suspect step decide). A save after the
  last step is exchanged in destroy_process_group, else recorded "not exchanged".
- The resume: a run told SCOUT_RESUME_CHECKPOINT that loads it (torch.load / dcp.load of that
  path) has its restored state signed at its first optimizer step and compared with the record:
  a `resume verified` finding, or a loud mismatch finding (stderr and evidence; fatal when
  SCOUT_RESUME_MISMATCH=fatal).

What the signatures cover: model = every parameter the optimizers update (frozen parameters and
buffers are not seen); optimizer = its tensor state and hyperparameters; scheduler = the state of
every LR scheduler created; RNG = torch CPU, CUDA (only if the job initialised CUDA), Python
`random`, NumPy (only if the job imported it); data = scout's global optimizer step and the epoch
last given to a DistributedSampler. The data loader's own position is not visible to scout.

- Renames: a checkpoint written under one name and renamed (the atomic save: NAME.tmp, then
  os.replace to NAME; a DCP folder step-10.tmp/ renamed to step-10/; a folder of checkpoints
  renamed) keeps its record under the name it ends up with (`moved`, called by the hooks'
  os.rename, os.replace and shutil.move). A hidden temporary name is recorded once it is renamed
  to a visible one. The rank that renames follows it: the saving rank, or for a DCP save any rank
  (the lowest one records it).
"""

from __future__ import annotations

import functools
import hashlib
import logging
import os
import re
import stat
import sys
import threading
import time
import weakref
from collections.abc import Callable
from pathlib import Path
from typing import Any

from scout_slurm.bootstrap.exitpolicy import Ending, end, ends
from scout_slurm.bootstrap.signing import byte_view, optimizer_tensors, state_signature

# signing.py signs for every bootstrap module; its helpers keep their old names here
from scout_slurm.bootstrap.signing import bytes_sig as _bytes_sig
from scout_slurm.bootstrap.signing import sig_hex as _sig_hex
from scout_slurm.evidence.layout import RunFolder, checkpoint_note_path
from scout_slurm.remediation.signatures import COMPONENTS

# what the bootstrap swallows to keep the job running, for a debugging session (stdlib logging: the
# job's Python may lack structlog, and configuring it here would change the job's own logging)
_log = logging.getLogger("scout.bootstrap")
DATA_POSITION = (
    "scout's global optimizer step; the DistributedSampler epoch when the script sets one"
)
EXCHANGE_EVERY = 50  # steps between checkpoint exchanges when the state votes are off
# recorded checkpoints whose renames are followed (the newest); older ones keep their names
FOLLOWED_MAX = 4096


IN_MEMORY_S = 600.0  # how long an in-memory save waits for its file to be moved into place


def signatures_now(
    optimizers: list[Any], schedulers: list[Any], step: int, sampler_epoch: int | None
) -> dict[str, str]:
    """This rank's state now, one hex signature per component ("" where there is none)."""
    import random

    import torch

    out = dict.fromkeys(COMPONENTS, "")
    if optimizers:
        params = [
            (f"o{oi}.g{gi}.p{pi}", p)
            for oi, o in enumerate(optimizers)
            for gi, g in enumerate(o.param_groups)
            for pi, p in enumerate(g["params"])
        ]
        out["model"] = _sig_hex(state_signature(params))
        tensors = [
            (f"o{oi}.{n}", t) for oi, o in enumerate(optimizers) for n, t in optimizer_tensors(o)
        ]
        hyper = [
            [(k, v) for k, v in sorted(g.items()) if k != "params"]
            for o in optimizers
            for g in o.param_groups
        ]
        scalars = [
            sorted((k, v) for k, v in o.state.get(p, {}).items() if not torch.is_tensor(v))
            for o in optimizers
            for g in o.param_groups
            for p in g["params"]
        ]
        out["optimizer"] = _bytes_sig([_sig_hex(state_signature(tensors)), hyper, scalars])
    if schedulers:
        out["scheduler"] = _bytes_sig(
            [sorted((k, v) for k, v in s.state_dict().items()) for s in schedulers]
        )
    out["rng_cpu"] = rng_signature("rng_cpu")  # no numpy: the job may lack it
    out["rng_cuda"] = rng_signature("rng_cuda")
    out["rng_python"] = _bytes_sig([random.getstate()])
    np = sys.modules.get("numpy")
    if np is not None:
        st = np.random.get_state()
        out["rng_numpy"] = _bytes_sig([st[0], st[1].tobytes(), st[2:]])
    out["data"] = _bytes_sig([f"step={step}", f"epoch={sampler_epoch}"])
    return out


def rng_signature(component: str) -> str:
    """The signature of torch's CPU ("rng_cpu") or CUDA ("rng_cuda") generator now; "" for CUDA
    before the job initialised it (reading it would initialise CUDA)."""
    import torch

    if component == "rng_cpu":
        return _bytes_sig([byte_view(torch.get_rng_state())])
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        return _bytes_sig([byte_view(s) for s in torch.cuda.get_rng_state_all()])
    return ""


def software_versions():
    import platform

    import torch

    import scout_slurm
    from scout_slurm.evidence.records import SoftwareVersions

    nccl = None
    try:
        if torch.cuda.is_available():
            v = torch.cuda.nccl.version()
            nccl = ".".join(map(str, v)) if isinstance(v, tuple) else str(v)
    except Exception as exc:
        _log.debug("no NCCL version (a build without NCCL?): %r", exc)
        nccl = None
    return SoftwareVersions(
        python=platform.python_version(),
        torch=torch.__version__,
        cuda=torch.version.cuda,
        nccl=nccl,
        scout=getattr(scout_slurm, "__version__", "?"),
    )


def digest_from_storage(path: str) -> tuple[int, str]:
    """(size, sha256) of a file as storage gives it back after fsync (not what we meant to
    write).
    """
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        h = hashlib.sha256()
        size = 0
        while True:
            chunk = os.read(fd, 1 << 20)
            if not chunk:
                break
            size += len(chunk)
            h.update(chunk)
    finally:
        os.close(fd)
    return size, h.hexdigest()


def files_of(path: str):
    """Every file of a checkpoint (a file, or a DCP folder walked without following links),
    digested from storage; with the checkpoint's total size and its one sha256."""
    from scout_slurm.evidence.records import CheckpointFile

    if os.path.isdir(path):
        files = []
        for dirpath, dirnames, names in os.walk(path, followlinks=False):
            dirnames.sort()
            for n in sorted(names):
                full = os.path.join(dirpath, n)
                if os.path.islink(full) or not os.path.isfile(full):
                    continue
                size, sha = digest_from_storage(full)
                files.append(
                    CheckpointFile(name=os.path.relpath(full, path), size_bytes=size, sha256=sha)
                )
    else:
        size, sha = digest_from_storage(path)
        files = [CheckpointFile(name="", size_bytes=size, sha256=sha)]
    return tuple(files), sum(f.size_bytes for f in files), combined_sha(files)


def canonical(path: Any) -> str:
    """The directory entry a path names: its folder resolved (links followed), its last name kept
    (a rename moves a link itself, not what it points to)."""
    head, tail = os.path.split(os.path.abspath(os.fsdecode(path)))
    return os.path.join(os.path.realpath(head), tail)


def _components(path: str) -> set[str]:
    return {c for c in path.split(os.sep) if c}


def combined_sha(files) -> str:
    if len(files) == 1 and files[0].name == "":
        return files[0].sha256
    h = hashlib.sha256()
    for f in files:
        h.update(f"{f.name}\0{f.size_bytes}\0{f.sha256}\n".encode())
    return h.hexdigest()


class CheckpointWatch:
    def __init__(
        self,
        *,
        rank: int,
        world: int,
        side: Any,
        notes_dir: Path | None,
        run_dir: Path | None,
        restart: int,
        offset: int,
        all_gather: Callable,
        all_reduce: Callable,
        groups: Callable[[], Any],
        completed_steps: Callable[[], int],
        resume: str = "",
        resume_mismatch: str = "warn",
        node: str = "",
        exchange_every: int = EXCHANGE_EVERY,
    ) -> None:
        self.rank, self.world, self.side = rank, world, side
        self.notes_dir, self.run_dir, self.restart, self.offset = (
            notes_dir,
            run_dir,
            restart,
            offset,
        )
        self.all_gather, self.all_reduce = all_gather, all_reduce
        self.groups, self.completed_steps = groups, completed_steps
        self.exchange_every = max(
            1, exchange_every
        )  # the votes' K: the exchange rides on the vote steps
        self.optimizers: list[weakref.ref] = []
        self.schedulers: list[weakref.ref] = []  # creation order: the same on every rank
        self.sampler_epoch: int | None = None
        self.pending: list[tuple[Path, Any]] = []
        self.prev_votes = 0
        self.prev_replay = 0
        self.resume = resume  # SCOUT_RESUME_CHECKPOINT
        self.resume_mismatch = (
            resume_mismatch  # SCOUT_RESUME_MISMATCH: "fatal" ends the rank (bootstrap.exitpolicy)
        )
        self.node = node
        self.resume_loaded = False
        self.resume_done = not self.resume
        # torch's generators as the job's own code set them before its first resumed step (the
        # HF Trainer and Lightning restore them from the checkpoint; a forward's dropout then
        # draws from them before the first optimizer step, where the resume is checked)
        self.rng_restored: dict[str, str] = {}
        # a rerun: the checkpoints the controller rejected that are still on storage (read at the
        # first load), those this rank loaded, and the paths it saved itself in this run
        self.rejected: dict[str, Any] | None = None
        self.recovery_point = ""
        self.tainted: list[Any] = []
        self.saved_here: set[str] = set()
        self.exchanges = 0
        self.init_steps = 0  # optimizer steps DCP's get_state_dict makes to create the state (lr 0)
        # renames followed: canonical path of a checkpoint this rank recorded in this run -> its
        # note
        # files; `names` holds every component of those paths (and of hidden saves), so that a
        # rename
        # of anything else ends at one set lookup
        self.lock = (
            threading.Lock()
        )  # pending and the followed paths: a rename may come from another thread
        self.followed: dict[str, list[Path]] = {}
        self.hidden: dict[
            str, tuple[str, int, str]
        ] = {}  # canonical hidden name -> (saver, step, name written)
        self.names: set[str] = set()
        # step -> (the folder, {part path: its digest}) of the checkpoint this rank is writing as
        # several files at one step (HF Trainer: model, optimizer, scheduler, RNG files)
        self.step_parts: dict[int, tuple[str, dict[str, Any]]] = {}
        # a torch.save into memory (Lightning, fsspec): (its size, step, when); recorded under the
        # name a rename of a file of exactly that size gives it (the write-then-move of the bytes)
        self.in_memory: tuple[int, int, float] | None = None

    # -- what the job has ------------------------------------------------------------------------
    def see_optimizer(self, opt: Any) -> None:
        if all(r() is not opt for r in self.optimizers):
            self.optimizers.append(weakref.ref(opt))

    def see_scheduler(self, sched: Any) -> None:
        if all(r() is not sched for r in self.schedulers):
            self.schedulers.append(weakref.ref(sched))

    def _sharded(self) -> bool:
        return any(
            hasattr(p, "placements")
            for o in (r() for r in self.optimizers)
            if o is not None
            for g in o.param_groups
            for p in g["params"]
        )

    def global_step(self) -> int:
        return self.completed_steps() - self.init_steps + self.offset

    def now(self) -> dict[str, str]:
        opts = [o for o in (r() for r in self.optimizers) if o is not None]
        scheds = [s for s in (r() for r in self.schedulers) if s is not None]
        return signatures_now(opts, scheds, self.global_step(), self.sampler_epoch)

    # -- saves ------------------------------------------------------------------------------------
    def saved(
        self,
        path: str,
        *,
        saver: str,
        step: int | None,
        ranks_saved: tuple[int, ...] | None = None,
        per_rank: list[dict[str, str]] | None = None,
        saved_as: str = "",
    ) -> None:
        """Record a checkpoint this rank wrote. per_rank: every rank's signatures when the save was
        collective (DCP); else the exchange follows at the next step. saved_as: the name it was
        written under, when that was a hidden one since renamed to `path`."""
        self.saved_here.add(canonical(path))
        if self.notes_dir is None:
            return
        from scout_slurm.bootstrap.evidencewrites import mkdir, write_record
        from scout_slurm.evidence.records import CheckpointNote

        target = os.path.abspath(os.fspath(path))
        try:
            files, size, sha = files_of(target)
        except OSError as exc:
            sys.stderr.write(
                f"scout: checkpoint {target} not recorded: cannot re-read it ({exc.strerror})\n"
            )
            return
        step = self.global_step() if step is None else int(step)
        target, files, size, sha = self._with_step_parts(target, files, step)
        mine = self.now()
        note = CheckpointNote(
            path=target,
            step=step,
            rank=self.rank,
            restart=self.restart,
            saved_at=time.time(),
            size_bytes=size,
            sha256=sha,
            versions=_versions_text(),
            saver=saver,
            files=files,
            world=self.world,
            ranks_saved=ranks_saved or (self.rank,),
            agreement="not exchanged: the replicas' signatures follow at the step after the next "
            "state vote",
            data_position=DATA_POSITION,
            software=software_versions(),
            coverage=self._coverage(),
            saved_as=saved_as,
        )
        if per_rank is not None:
            note = self._with_exchange(note, mine, per_rank, at_save=True)
        elif self.world < 2 or self.side is None:
            note = self._with_exchange(
                note, mine, [mine], at_save=False, why="one rank: nothing to compare"
            )
        else:
            note = self._with_exchange(note, mine, None, at_save=False)
        dest = checkpoint_note_path(self.notes_dir, self.restart, step, self.rank)
        with self.lock:
            try:
                mkdir(self.notes_dir)
                write_record(dest, note)
            except Exception as exc:
                sys.stderr.write(f"scout: checkpoint note not written: {exc!r}\n")
                return
            if per_rank is None and self.world >= 2 and self.side is not None:
                # a later part of the same step's checkpoint replaces the earlier note
                self.pending = [(d, n) for d, n in self.pending if d != dest]
                self.pending.append((dest, note))
            self._follow(canonical(target), dest)

    def _with_step_parts(self, target: str, files, step: int):
        """A file saved at the same step as another of this rank's, in a folder named for that
        step (`checkpoint-20/`): one checkpoint of several parts, recorded as that folder with
        each part (the note of the step holds them all, not the last file written). Otherwise
        the file alone. Returns (path, files, size, sha) for the note."""
        from scout_slurm.evidence.records import CheckpointFile

        folder = os.path.dirname(target)
        if os.path.isdir(target) or str(step) not in re.findall(r"\d+", os.path.basename(folder)):
            self.step_parts.pop(step, None)
            return target, files, sum(f.size_bytes for f in files), combined_sha(files)
        known = self.step_parts.get(step)
        if known is None or known[0] != folder:
            known = (folder, {})
            self.step_parts = {step: known}  # the newest step only: bounded
        parts = known[1]
        parts[target] = files[0]
        if len(parts) == 1:
            return target, files, files[0].size_bytes, combined_sha(files)
        merged = tuple(
            CheckpointFile(
                name=os.path.relpath(p, folder), size_bytes=f.size_bytes, sha256=f.sha256
            )
            for p, f in sorted(parts.items())
        )
        return folder, merged, sum(f.size_bytes for f in merged), combined_sha(merged)

    def saved_collective(self, path: str, *, saver: str) -> None:
        """A save every rank made together (DCP): sign and exchange now; the lowest rank records
        it.
        """
        self.saved_here.add(canonical(path))
        import torch

        mine = self.now()
        if self.side is not None and self.world >= 2:
            vec = torch.tensor(
                [int(mine[c], 16) if mine[c] else -1 for c in COMPONENTS], dtype=torch.int64
            )
            got = [torch.zeros_like(vec) for _ in range(self.world)]
            self.all_gather(got, vec, group=self.side)
            per_rank = [
                {
                    c: (_sig_hex(int(g[i])) if int(g[i]) >= 0 else "")
                    for i, c in enumerate(COMPONENTS)
                }
                for g in got
            ]
        else:
            per_rank = [mine]
        if self.rank == 0:
            self.saved(
                path,
                saver=saver,
                step=None,
                ranks_saved=tuple(range(self.world)),
                per_rank=per_rank,
            )
        elif self.notes_dir is not None:
            # the lowest rank records it; when the script has another rank rename the folder (after
            # its
            # barrier: the record is written by then), that rank follows it in the lowest rank's
            # note
            dest = checkpoint_note_path(self.notes_dir, self.restart, self.global_step(), 0)
            with self.lock:
                self._follow(canonical(path), dest)

    def _with_exchange(
        self,
        note,
        mine: dict[str, str],
        per_rank: list[dict[str, str]] | None,
        *,
        at_save: bool,
        why: str = "",
        later: int = -1,
    ):
        """`later`: the step the signatures in `per_rank` are of, when training moved on since the
        save
        (-1: they are the save's own state)."""
        import dataclasses

        from scout_slurm.evidence.records import StateSignature
        from scout_slurm.remediation.signatures import agree, agreement_text

        groups = self.groups()
        if per_rank is not None and groups is None and not why and self._sharded():
            # FSDP/HSDP ranks hold different shards: comparing them as replicas would reject every
            # save
            why = (
                "sharded parameters (DTensor) and the replica groups are not known yet (no state "
                "vote so far)"
            )
        sigs = []
        for c in COMPONENTS:
            values = tuple(p.get(c, "") for p in per_rank) if per_rank is not None else ()
            if per_rank is not None:
                majority, agreed, _ = agree(values, groups)
            else:
                majority, agreed = mine[c], False
            if not mine[c] and not any(values):
                continue
            sigs.append(
                StateSignature(
                    component=c, saved=mine[c], per_rank=values, majority=majority, agreed=agreed
                )
            )
        sigs = tuple(sigs)
        if per_rank is not None and not why and groups and not any(len(g) >= 2 for g in groups):
            why = "no replicas to compare (every rank holds a state of its own)"
        if per_rank is None:
            agreement = note.agreement
        elif why:
            agreement = f"not exchanged: {why}"
        else:
            agreement = _at_step(agreement_text(sigs, groups), note.step, later)
        return dataclasses.replace(
            note, signatures=sigs, agreement=agreement, exchanged_at_save=at_save
        )

    def _coverage(self):
        from scout_slurm.evidence.records import CoverageSince

        cov = None
        votes = RunFolder(self.run_dir).coverage_path if self.run_dir is not None else None
        if votes is not None and votes.exists():
            try:
                from scout_slurm.evidence.records import VoteCoverage
                from scout_slurm.evidence.store import read_record

                cov = read_record(votes, VoteCoverage)
            except Exception as exc:
                sys.stderr.write(
                    f"scout: the run's coverage record {votes} is unreadable "
                    f"({exc!r}); the checkpoint record says no coverage\n"
                )
                cov = None
        if cov is None:
            return CoverageSince(
                votes=0,
                replay_rounds=0,
                last_clean_step=-1,
                last_vote_step=-1,
                verdicts="no state votes recorded in this run; no replay coverage recorded",
            )
        votes = cov.votes - self.prev_votes
        self.prev_votes = cov.votes
        replay = getattr(cov, "replay_rounds", None)  # cumulative in the run; None: replay off
        replay_since = (replay - self.prev_replay) if replay is not None else 0
        self.prev_replay = replay if replay is not None else self.prev_replay
        clean = (
            "clean"
            if cov.last_clean_step == cov.last_vote_step
            else (
                f"not clean: the last vote at step {cov.last_vote_step}, the last clean one "
                f"at step {cov.last_clean_step}"
            )
        )
        if votes == 0:
            clean = f"no vote since the previous record ({clean} before)"
        return CoverageSince(
            votes=votes,
            replay_rounds=int(replay_since),
            last_clean_step=cov.last_clean_step,
            last_vote_step=cov.last_vote_step,
            verdicts=clean + ("" if replay is not None else "; replay off: no replay coverage"),
        )

    def exchange(self) -> None:
        """Collective on the side group (every rank, same point): finish the records of saves made
        since the last exchange. When nobody saved (nearly every step) that is one all_reduce of one
        int64, whatever the world size (an all_gather would move 8 bytes per rank per step: 800 KB
        at 100k ranks); who saved and the signatures travel only when someone did."""
        if self.side is None or self.world < 2:
            return
        import torch

        saved = 1 if self.pending else 0
        count = torch.tensor([saved], dtype=torch.int64)
        self.all_reduce(count, group=self.side)  # SUM: how many ranks saved
        if not int(count[0]):
            return
        mine = self.now()
        vec = torch.tensor(
            [saved] + [int(mine[c], 16) if mine[c] else -1 for c in COMPONENTS], dtype=torch.int64
        )
        got = [torch.zeros_like(vec) for _ in range(self.world)]
        self.all_gather(got, vec, group=self.side)
        self.exchanges += 1
        savers = tuple(r for r, g in enumerate(got) if int(g[0]))
        per_rank = [
            {
                c: (_sig_hex(int(g[i + 1])) if int(g[i + 1]) >= 0 else "")
                for i, c in enumerate(COMPONENTS)
            }
            for g in got
        ]
        import dataclasses

        from scout_slurm.bootstrap.evidencewrites import write_record

        step = self.global_step()
        with (
            self.lock
        ):  # a rename meanwhile has updated the pending note: it is written with its new name
            for dest, note in self.pending:
                saved_values = {s.component: s.saved for s in note.signatures}
                done = self._with_exchange(
                    dataclasses.replace(note, ranks_saved=savers),
                    {c: saved_values.get(c, "") for c in COMPONENTS},
                    per_rank,
                    at_save=False,
                    later=step if step > note.step else -1,
                )
                try:
                    write_record(dest, done)
                except Exception as exc:
                    sys.stderr.write(f"scout: checkpoint record not completed: {exc!r}\n")
            self.pending.clear()

    # -- renames ----------------------------------------------------------------------------------
    def _follow(self, key: str, dest: Path) -> None:
        """Follow renames of the checkpoint at `key` (canonical), recorded in `dest`. Under the
        lock.
        """
        files = self.followed.pop(key, [])
        if dest not in files:
            files.append(dest)
        self.followed[key] = files  # newest last
        self.names |= _components(key)
        if (
            len(self.followed) > FOLLOWED_MAX
        ):  # the oldest quarter forgotten at once: the filter is rebuilt rarely
            for old in list(self.followed)[: len(self.followed) - FOLLOWED_MAX * 3 // 4]:
                del self.followed[old]
            self._rename_filter()

    def _rename_filter(self) -> None:
        names: set[str] = set()
        for key in (*self.followed, *self.hidden):
            names |= _components(key)
        self.names = names

    def saved_hidden(self, path: Any, *, saver: str) -> None:
        """A save to a hidden name (".NAME"): not a checkpoint yet; recorded if renamed to a
        visible name.
        """
        key = canonical(path)
        with self.lock:
            self.hidden.pop(key, None)
            self.hidden[key] = (saver, self.global_step(), os.path.abspath(os.fspath(path)))
            self.names |= _components(key)
            if len(self.hidden) > FOLLOWED_MAX:
                for old in list(self.hidden)[: len(self.hidden) - FOLLOWED_MAX * 3 // 4]:
                    del self.hidden[old]
                self._rename_filter()

    def saved_in_memory(self, size: int) -> None:
        """torch.save wrote `size` bytes into a buffer of the job's: a checkpoint once the job
        moves a file of that size into place (`moved`)."""
        if size > 0:
            self.in_memory = (size, self.global_step(), time.monotonic())

    def _written_from_memory(self, dst: Any) -> bool:
        """Whether `dst`, just moved into place, holds the bytes of the last in-memory save (same
        size, within IN_MEMORY_S): then it is recorded as the checkpoint of that step."""
        held, self.in_memory = self.in_memory, None
        if held is None:
            return False
        size, step, at = held
        shown = os.path.abspath(os.fsdecode(dst))
        if time.monotonic() - at > IN_MEMORY_S or os.path.basename(shown).startswith("."):
            return False
        try:
            st = os.stat(shown)
        except OSError:
            return False
        if not stat.S_ISREG(st.st_mode) or st.st_size != size:
            self.in_memory = held  # another file moved meanwhile: the checkpoint may follow
            return False
        self.saved(shown, saver="torch.save (into memory, then written)", step=step)
        return True

    def moved(self, src: Any, dst: Any) -> None:
        """The job renamed `src` to `dst` (it succeeded). When `src` is a checkpoint this rank
        recorded
        in this run, or a folder holding some, their records now name where they are: the same
        bytes,
        so the digests hold. Anything else costs a set lookup."""
        if self.in_memory is not None and self._written_from_memory(dst):
            return
        if os.fsdecode(src).rstrip(os.sep).rpartition(os.sep)[2] not in self.names:
            return
        old, new = canonical(src), canonical(dst)
        if old == new:
            return
        shown = os.path.abspath(os.fsdecode(dst))
        hidden = None
        with self.lock:
            inside = old + os.sep
            hits = [
                (k, new + k[len(old) :], shown + k[len(old) :])
                for k in self.followed
                if k == old or k.startswith(inside)
            ]
            for key, new_key, new_path in hits:
                files = self.followed.pop(key)
                self.followed.pop(
                    new_key, None
                )  # a checkpoint replaced at that name: its record no longer holds
                for dest in files:
                    self._renamed(dest, key, new_path)
                self.followed[new_key] = files
                self.names |= _components(new_key)
            if old in self.hidden:
                hidden = self.hidden.pop(old)
                if os.path.basename(new).startswith("."):  # still a temporary name: followed on
                    self.hidden[new] = hidden
                    self.names |= _components(new)
                    hidden = None
        if hidden is not None:
            saver, step, written = hidden
            self.saved(shown, saver=saver, step=step, saved_as=written)

    def _renamed(self, dest: Path, key: str, new_path: str) -> None:
        """The note in `dest` (and a pending copy) names `new_path` when it still describes `key`
        (another save at the same step may have written `dest` since). Under the lock."""
        import dataclasses

        from scout_slurm.bootstrap import evidencewrites
        from scout_slurm.bootstrap.evidencewrites import write_record
        from scout_slurm.evidence.records import CheckpointNote
        from scout_slurm.evidence.store import read_record

        def moved_note(note):
            if canonical(note.path) != key:
                return None
            return dataclasses.replace(note, path=new_path, saved_as=note.saved_as or note.path)

        for i, (d, note) in enumerate(self.pending):
            if d == dest and (done := moved_note(note)) is not None:
                self.pending[i] = (d, done)
        if not evidencewrites.answering() or not evidencewrites.flush():
            # the note is read back below: not from a root that does not answer (the training
            # thread would wait on it); the note keeps the checkpoint's first name
            sys.stderr.write(f"scout: the record {dest.name} keeps the checkpoint's old name\n")
            return
        try:
            done = moved_note(read_record(dest, CheckpointNote))
            if done is not None:
                write_record(dest, done)
        except Exception as exc:
            sys.stderr.write(
                f"scout: the record {dest.name} still names the checkpoint's old name: {exc!r}\n"
            )

    # -- the resume -------------------------------------------------------------------------------
    def rng_set(self, component: str) -> None:
        """The job set torch's `component` generator ("rng_cpu", "rng_cuda") before its first
        resumed step: the state it restored, compared with the record instead of the state at
        that step."""
        if not self.resume_done:
            sig = rng_signature(component)
            if sig:
                self.rng_restored[component] = sig

    def loaded(self, path: Any) -> None:
        """torch.load / dcp.load of `path` was called."""
        self._check_rejected(path)
        if self.resume_done or self.resume_loaded:
            return
        try:
            loaded, resume = os.path.realpath(os.fspath(path)), os.path.realpath(self.resume)
        except (TypeError, ValueError):
            return
        # the checkpoint itself, or a part of it (a file of the folder the resume names)
        if loaded == resume or loaded.startswith(resume.rstrip(os.sep) + os.sep):
            self.resume_loaded = True

    def _rerun_checkpoints(self) -> dict[str, Any]:
        """canonical path -> RejectedCheckpoint, from the controller's record for this run ({}
        when there is none: a first run, or a rerun the controller told nothing)."""
        if self.rejected is not None:
            return self.rejected
        self.rejected = {}
        if self.restart <= 0 or self.run_dir is None:
            return self.rejected
        from scout_slurm.errors import ScoutError
        from scout_slurm.evidence.layout import JobFolder
        from scout_slurm.evidence.store import read_record
        from scout_slurm.remediation.records import RerunCheckpoints

        try:  # a run folder of the evidence tree; any other (a test's, a hand-run job's) has none
            folder, restart = JobFolder.of_run_dir(self.run_dir)
        except ScoutError:
            return self.rejected
        path = folder.rerun_checkpoints_path(restart)
        if not path.exists():
            return self.rejected
        try:
            told = read_record(path, RerunCheckpoints)
        except (ScoutError, OSError) as exc:
            sys.stderr.write(
                f"scout: WARNING: the controller's record of rejected checkpoints {path} is "
                f"unreadable ({exc}); this run's loads are not checked against it\n"
            )
            return self.rejected
        self.recovery_point = told.recovery_point
        self.rejected = {canonical(r.path): r for r in told.rejected}
        return self.rejected

    def _check_rejected(self, path: Any) -> None:
        """A load of a checkpoint the controller rejected, whose file this run has not written
        since: said loudly (rank 0), recorded as a `tainted` finding (every rank that loads it)."""
        if not isinstance(path, (str, os.PathLike)):
            return
        key = canonical(path)
        hit = self._rerun_checkpoints().get(key)
        if hit is None or key in self.saved_here or any(t.path == hit.path for t in self.tainted):
            return
        self.tainted.append(hit)
        chosen = (
            f"scout's recovery point was {self.recovery_point}"
            if self.recovery_point
            else "scout found no checkpoint it could vouch for"
        )
        summary = (
            f"TAINTED: rank {self.rank} loaded {hit.path} (step {hit.step} of run {hit.restart}), "
            f"a checkpoint scout rejected: {hit.why}; {chosen}"
        )
        fatal = ends(Ending.RESUME_MISMATCH, self.resume_mismatch)
        if self.rank == 0:
            bar = "!" * 78
            sys.stderr.write(
                f"{bar}\nscout: {summary}\n"
                "scout: this run's results are suspect: its verdict will say `tainted`, not clean\n"
                + (
                    "scout: SCOUT_RESUME_MISMATCH=fatal: the ranks end before their first step "
                    f"(exit {Ending.RESUME_MISMATCH.code})\n"
                    if fatal
                    else "scout: the job continues (SCOUT_RESUME_MISMATCH=fatal would stop it)\n"
                )
                + f"{bar}\n"
            )
            sys.stderr.flush()
        self._write_finding(
            f"tainted-rank-{self.rank}",
            "tainted",
            summary,
            (f"rejected: {hit.why}", chosen),
        )

    def before_step(self, optimizer: Any) -> None:
        """The optimizer pre-step hook (every rank, same point)."""
        if _state_init_step(optimizer):
            # torch.distributed.checkpoint.state_dict steps a fresh optimizer once with lr 0 to
            # create
            # its state before a load: not training, not the resumed run's first step
            self.init_steps += 1
            return
        self.see_optimizer(optimizer)
        if self.tainted and ends(Ending.RESUME_MISMATCH, self.resume_mismatch):
            end(
                Ending.RESUME_MISMATCH,
                f"rank {self.rank} will not train from {self.tainted[0].path}, a checkpoint scout "
                f"rejected ({self.tainted[0].why}); SCOUT_RESUME_MISMATCH=fatal",
            )
        if not self.resume_done:
            self.resume_done = True
            try:
                self._verify()
            except SystemExit:
                raise
            except Exception as exc:
                sys.stderr.write(f"scout: resume not verified: {exc!r}\n")
        done = self.completed_steps()
        if (
            done > 0 and done % self.exchange_every == 0
        ):  # the step after a vote step, the same on every rank
            self.exchange()

    def _verify(self) -> None:
        from scout_slurm.remediation.signatures import compare

        if not self.resume_loaded:
            self._finding(
                False,
                f"this rank did not load the resume checkpoint {self.resume} before its first "
                f"optimizer step (no torch.load / dcp.load of that path was seen)",
                (),
                info=True,
            )
            return
        note = self._record_of(self.resume)
        if note is None:
            self._finding(
                False,
                f"no checkpoint record for {self.resume}: the restored state cannot be checked",
                (),
                info=True,
            )
            return
        if not note.signatures:
            self._finding(
                False,
                f"the record of {self.resume} (schema version {note.schema_version}) holds no "
                f"state signatures: the restored state cannot be checked",
                (),
                info=True,
            )
            return
        same, bad, unchecked = compare(note, self.rank, {**self.now(), **self.rng_restored})
        details = tuple(
            [f"matches: {', '.join(same) or 'nothing'}"]
            + ([f"not recorded for this rank: {', '.join(unchecked)}"] if unchecked else [])
            + bad
        )
        # the replicated state (model, optimizer, scheduler, data position) must come back exactly;
        # an
        # RNG stream the script does not save and restore differs too, and matters only if it draws
        # from it
        state_bad = [b.split(":")[0] for b in bad if not b.startswith("rng_")]
        rng_bad = [b.split(":")[0] for b in bad if b.startswith("rng_")]
        if state_bad:
            self._finding(
                False,
                f"RESUME MISMATCH: rank {self.rank}'s state restored from {note.path} (step "
                f"{note.step}) differs from its record in {len(bad)} component(s): "
                + ", ".join(state_bad + rng_bad),
                details,
            )
        elif rng_bad:
            self._finding(
                True,
                f"resume verified: rank {self.rank} restored {note.path} (step {note.step}); "
                f"{', '.join(same)} equal the record; RNG streams differ from the record: "
                f"{', '.join(rng_bad)} (not restored by the script: the run is not bit-exact if it "
                f"draws from them)",
                details,
            )
            sys.stderr.write(
                f"scout: resumed rank {self.rank}: RNG streams differ from the checkpoint record: "
                f"{', '.join(rng_bad)}\n"
            )
        elif not same:
            # nothing of this rank's was recorded (it did not save, or saved other components):
            # nothing was compared, so nothing is called verified
            self._finding(
                False,
                f"resume not checked: rank {self.rank} restored {note.path} (step {note.step}), "
                f"whose record holds no signature of this rank's state"
                + (f" (not recorded: {', '.join(unchecked)})" if unchecked else ""),
                details,
                info=True,
            )
        else:
            self._finding(
                True,
                f"resume verified: rank {self.rank} restored {note.path} (step {note.step}); "
                f"{', '.join(same)} equal the record",
                details,
            )

    def _record_of(self, path: str):
        if self.notes_dir is None or not self.notes_dir.is_dir():
            return None
        from scout_slurm.evidence.records import CheckpointNote
        from scout_slurm.evidence.store import list_records

        target = os.path.realpath(path)
        try:
            notes, _ = list_records(self.notes_dir, "*.json", CheckpointNote)
        except Exception as exc:
            sys.stderr.write(
                f"scout: the checkpoint records in {self.notes_dir} are unreadable ({exc!r}); "
                f"the resume from {path} is not checked against its record\n"
            )
            return None
        mine = [n for n in notes if os.path.realpath(n.path) == target]
        return max(mine, key=lambda n: n.saved_at) if mine else None

    def _finding(
        self, ok: bool, summary: str, details: tuple[str, ...], *, info: bool = False
    ) -> None:
        fatal = not ok and not info and ends(Ending.RESUME_MISMATCH, self.resume_mismatch)
        if not ok and not info:
            bar = "!" * 78
            sys.stderr.write(
                f"{bar}\nscout: {summary}\n"
                + "".join(f"scout:   {d}\n" for d in details)
                + (
                    "scout: SCOUT_RESUME_MISMATCH=fatal: ending this rank (exit "
                    f"{Ending.RESUME_MISMATCH.code})\n"
                    if fatal
                    else "scout: the job continues (SCOUT_RESUME_MISMATCH=fatal would end it)\n"
                )
                + f"{bar}\n"
            )
        elif not ok:
            sys.stderr.write(f"scout: {summary}\n")
        sys.stderr.flush()
        name = "resume-verified" if ok else ("resume-unchecked" if info else "resume-mismatch")
        self._write_finding(f"{name}-rank-{self.rank}", "info", summary, details)
        if fatal:
            end(Ending.RESUME_MISMATCH)

    def _write_finding(self, name: str, kind: str, summary: str, details: tuple[str, ...]) -> None:
        """One finding about the resume in this run's findings (a failure to write it is said)."""
        if self.run_dir is None:
            return
        try:
            from scout_slurm.bootstrap.evidencewrites import write_record
            from scout_slurm.evidence.records import Finding, FindingKind

            write_record(
                RunFolder(self.run_dir).finding_path(name),
                Finding(
                    rank=self.rank,
                    node=self.node,
                    kind=FindingKind(kind),
                    at=time.time(),
                    summary=summary,
                    details=details,
                    step=self.global_step(),
                    component="resume",
                ),
            )
        except Exception as exc:
            sys.stderr.write(f"scout: resume finding not written: {exc!r}\n")


def _at_step(text: str, saved_step: int, later: int) -> str:
    """The agreement of signatures taken at step `later` (> the save's), in the eligibility rule's
    words: replicas agreeing at a step >= the save's make it eligible; replicas differing there may
    have diverged after the save, which is the vote's verdict's to say, not the save's to carry."""
    if later < 0:
        return text
    if text.startswith("agreed"):
        return (
            f"agreed at step {later}, the first exchange after the save at step {saved_step}"
            + text[len("agreed") :]
        )
    return (
        f"not exchanged at the save: the replicas' signatures at step {later}, the first "
        "exchange after the "
        f"save at step {saved_step}, {text}"
    )


def _state_init_step(optimizer: Any) -> bool:
    try:
        return not optimizer.state and all(
            float(g["lr"]) == 0.0 for g in optimizer.param_groups if "lr" in g
        )
    except (
        AttributeError,
        KeyError,
        TypeError,
        ValueError,
    ) as exc:  # an optimizer of unusual shape
        _log.debug("optimizer %s: the step is taken as real (%r)", type(optimizer).__name__, exc)
        return False


def _versions_text() -> str:
    v = software_versions()
    return f"python {v.python}, torch {v.torch}, scout {v.scout}"


def dcp_path(args: tuple, kwargs: dict, io_key: str) -> str | None:
    """The folder a torch.distributed.checkpoint save/load uses: checkpoint_id, or the storage
    writer's/reader's path."""
    cid = kwargs.get("checkpoint_id")
    if isinstance(cid, (str, os.PathLike)):
        return os.fspath(cid)
    io = kwargs.get(io_key)
    if io is None and len(args) > 1:
        io = args[1]
    for attr in ("path", "checkpoint_id"):
        p = getattr(io, attr, None)
        if isinstance(p, (str, os.PathLike)):
            return os.fspath(p)
    return None


WATCH: CheckpointWatch | None = None


# callers whose setting of a generator is not the job restoring its checkpoint: scout's replay,
# and torch's fork_rng putting back the state it forked from
_NOT_A_RESTORE = ("scout_slurm.", "torch.random", "torch.cuda.random")


def _watch_rng_restores(handle: Any, guard: Any, watch: CheckpointWatch) -> None:
    """Until the first resumed step, note the state the job's own code gives torch's generators
    (torch.set_rng_state, torch.cuda.set_rng_state[_all], under each name the job may call)."""
    import torch

    def noted(caller: Any, component: str) -> None:
        if not str(caller.f_globals.get("__name__", "")).startswith(_NOT_A_RESTORE):
            watch.rng_set(component)

    def wrap(original: Any, component: str) -> Any:
        @functools.wraps(original)
        def scout_set_rng_state(*args, **kwargs):
            result = original(*args, **kwargs)  # the job's call first, whatever scout does
            if not watch.resume_done:
                guard.run("checkpoint watch", noted, sys._getframe(1), component)
            return result

        return scout_set_rng_state

    cpu = wrap(torch.random.set_rng_state, "rng_cpu")
    handle.patch(torch.random, "set_rng_state", cpu)
    handle.patch(torch, "set_rng_state", cpu)
    cuda_random = getattr(torch.cuda, "random", None)
    for name in ("set_rng_state", "set_rng_state_all"):
        original = getattr(torch.cuda, name, None)
        if original is None:
            continue
        cuda = wrap(original, "rng_cuda")
        handle.patch(torch.cuda, name, cuda)
        if cuda_random is not None and getattr(cuda_random, name, None) is original:
            handle.patch(cuda_random, name, cuda)


def install(handle: Any, state: Any) -> None:
    """Called once from the hooks at init_process_group (every rank): the watch, its side group,
    and the patches it needs (torch.load, DCP save/load, LR schedulers, DistributedSampler epochs,
    its
    witness before each optimizer step, and destroy_process_group for a save after the last
    step)."""
    global WATCH
    import torch
    import torch.distributed as dist

    if state.checkpoints_dir is None or WATCH is not None:
        return
    side = None
    cfg = state.config
    if state.world >= 2 and cfg.checkpoint_agreement:
        # the votes' side group when there is one; else scout's own (never the training
        # communicators)
        side = (
            state.consensus.side if state.consensus is not None else dist.new_group(backend="gloo")
        )
    run_dir = cfg.run_dir

    def groups():
        c = state.consensus
        return getattr(c, "groups", None) if c is not None else None

    watch = CheckpointWatch(
        rank=state.rank,
        world=state.world,
        side=side,
        notes_dir=state.checkpoints_dir,
        run_dir=run_dir,
        restart=state.restart,
        offset=cfg.step_offset,
        resume=cfg.resume_checkpoint,
        resume_mismatch=cfg.resume_mismatch.value,
        node=cfg.node,
        all_gather=state.originals["all_gather"],
        all_reduce=state.originals["all_reduce"],
        groups=groups,
        completed_steps=lambda: state.writer.steps if state.writer is not None else 0,
        exchange_every=cfg.consensus_every if cfg.consensus_every > 0 else EXCHANGE_EVERY,
    )
    WATCH = watch
    handle.on_remove(_forget)

    original_load = torch.load

    guard = state.guard  # bootstrap.guard: a failure of the watch never reaches the job's call

    def scout_load(f, *args, **kwargs):
        if isinstance(f, (str, os.PathLike)):
            guard.run("checkpoint watch", watch.loaded, f)
        elif isinstance(getattr(f, "name", None), str) and os.path.isabs(f.name):
            # a file object the job opened (Lightning, fsspec, `with open(...)`): its name
            guard.run("checkpoint watch", watch.loaded, f.name)
        return original_load(f, *args, **kwargs)

    scout_load.__wrapped__ = original_load
    handle.patch(torch, "load", scout_load)
    if watch.resume:
        _watch_rng_restores(handle, guard, watch)

    from torch.optim import lr_scheduler

    base = getattr(lr_scheduler, "LRScheduler", None) or lr_scheduler._LRScheduler
    original_sched_init = base.__init__

    def scout_sched_init(self, *args, **kwargs):
        original_sched_init(self, *args, **kwargs)
        guard.run("checkpoint watch", watch.see_scheduler, self)

    handle.patch(base, "__init__", scout_sched_init)

    from torch.utils.data.distributed import DistributedSampler

    original_set_epoch = DistributedSampler.set_epoch

    def scout_set_epoch(self, epoch):
        watch.sampler_epoch = int(epoch)
        return original_set_epoch(self, epoch)

    handle.patch(DistributedSampler, "set_epoch", scout_set_epoch)

    # before each step, the exchange of a save since the last one: a witness of the runtime's, last
    state.checkpoint_watch = watch
    state.order_witnesses()

    c10d = dist.distributed_c10d
    current_destroy = c10d.destroy_process_group

    def scout_destroy(*args, **kwargs):
        if (not args or args[0] is None) and kwargs.get("group") is None:
            guard.run("checkpoint watch", watch.exchange)  # a save after the last optimizer step
        return current_destroy(*args, **kwargs)

    for owner in (dist, c10d):
        if getattr(owner, "destroy_process_group", None) is current_destroy:
            handle.patch(owner, "destroy_process_group", scout_destroy)

    if "torch.distributed.checkpoint" in sys.modules:
        _patch_dcp(handle, sys.modules["torch.distributed.checkpoint"], guard)
    else:
        from scout_slurm.bootstrap.importhook import PatchAfterImport

        finder = PatchAfterImport(
            {"torch.distributed.checkpoint": lambda m: _patch_dcp(handle, m, guard)}
        )
        sys.meta_path.insert(0, finder)
        handle.on_remove(lambda: finder in sys.meta_path and sys.meta_path.remove(finder))


def _forget() -> None:
    global WATCH
    WATCH = None


def _patch_dcp(handle: Any, dcp: Any, guard: Any) -> None:
    for name, io_key in (("save", "storage_writer"), ("save_state_dict", "storage_writer")):
        fn = getattr(dcp, name, None)
        if fn is not None:
            handle.patch(dcp, name, _wrap_dcp_save(fn, io_key, f"dcp.{name}", guard))
    for name in ("load", "load_state_dict"):
        fn = getattr(dcp, name, None)
        if fn is not None:
            handle.patch(dcp, name, _wrap_dcp_load(fn, guard))


def _wrap_dcp_save(fn: Callable, io_key: str, label: str, guard: Any) -> Callable:
    import functools

    @functools.wraps(fn)
    def scout_dcp_save(*args, **kwargs):
        result = fn(*args, **kwargs)
        w = WATCH
        path = dcp_path(args, kwargs, io_key)
        if w is not None and path is not None and not kwargs.get("no_dist"):
            guard.run("checkpoint watch", w.saved_collective, path, saver=label)
        return result

    return scout_dcp_save


def _wrap_dcp_load(fn: Callable, guard: Any) -> Callable:
    import functools

    @functools.wraps(fn)
    def scout_dcp_load(*args, **kwargs):
        w = WATCH
        path = dcp_path(args, kwargs, "storage_reader")
        if w is not None and path is not None:
            guard.run("checkpoint watch", w.loaded, path)
        return fn(*args, **kwargs)

    return scout_dcp_load
