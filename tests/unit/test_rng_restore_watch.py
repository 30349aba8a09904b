"""The resume check compares torch's generators as the job's own code restored them before its
first resumed step (the Hugging Face Trainer and Lightning restore them from the checkpoint, then
the first forward's dropout draws from them before the optimizer step where the resume is
checked). Real torch, scout's real guard and patch handle; the watch is a plain recorder."""

from __future__ import annotations

import torch

from scout_slurm.bootstrap.ckptstate import _watch_rng_restores, rng_signature
from scout_slurm.bootstrap.guard import Guard
from scout_slurm.bootstrap.patches import InstalledHooks


class Watch:
    def __init__(self, fail: bool = False) -> None:
        self.resume_done = False
        self.seen: list[tuple[str, str]] = []
        self.fail = fail

    def rng_set(self, component: str) -> None:
        if self.fail:
            raise OSError("scout's own failure")
        self.seen.append((component, rng_signature(component)))


def _installed(watch: Watch, said: list[str]) -> InstalledHooks:
    handle = InstalledHooks()
    _watch_rng_restores(handle, Guard(say=said.append), watch)
    return handle


def test_the_jobs_restore_is_noted_with_the_state_it_set():
    torch.manual_seed(3)
    saved = torch.get_rng_state()
    torch.rand(100)  # the generator moves on past the saved state
    watch, said = Watch(), []
    handle = _installed(watch, said)
    try:
        torch.random.set_rng_state(saved)  # as the HF Trainer restores it
        restored = rng_signature("rng_cpu")
        torch.rand(10)  # the first forward's dropout draws from it
        assert watch.seen == [("rng_cpu", restored)] and restored != rng_signature("rng_cpu")
        torch.set_rng_state(saved)  # the other name, as Lightning and scripts call it
        assert len(watch.seen) == 2
        watch.resume_done = True  # after the first resumed step: nothing is noted
        torch.set_rng_state(saved)
        assert len(watch.seen) == 2
    finally:
        handle.remove()
    assert said == []


def test_fork_rng_putting_its_state_back_is_not_a_restore():
    watch, said = Watch(), []
    handle = _installed(watch, said)
    try:
        before = torch.get_rng_state()
        with torch.random.fork_rng():
            torch.manual_seed(123)
            torch.rand(5)
        assert torch.equal(torch.get_rng_state(), before)  # fork_rng did set it back
        assert watch.seen == []
    finally:
        handle.remove()


def test_a_failure_of_scouts_note_leaves_the_jobs_call_done_and_is_said_once():
    watch, said = Watch(fail=True), []
    handle = _installed(watch, said)
    try:
        torch.manual_seed(5)
        saved = torch.get_rng_state()
        torch.rand(50)
        torch.set_rng_state(saved)
        assert torch.equal(torch.get_rng_state(), saved)
        torch.set_rng_state(saved)
    finally:
        handle.remove()
    assert len(said) == 1 and "checkpoint watch" in said[0], said
    assert torch.set_rng_state is torch.random.set_rng_state  # the originals are back
    assert getattr(torch.set_rng_state, "__wrapped__", None) is None
