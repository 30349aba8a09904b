"""Scout's hook on Lightning's Trainer teardown (bootstrap.patches): installed on the Trainer
class, reversible, forwarding the call; a Lightning without the private method is said and left
alone, with the end-of-training check still on for destroy_process_group."""

from __future__ import annotations

import types

from scout_slurm.bootstrap.patches import InstalledHooks, _patch_lightning
from scout_slurm.bootstrap.runtime import Runtime
from scout_slurm.jobconfig import JobConfig


def _module(trainer: type) -> types.ModuleType:
    module = types.ModuleType("lightning.pytorch.trainer.trainer")
    module.Trainer = trainer
    return module


def _runtime() -> Runtime:
    return Runtime(JobConfig(), progress_dir=None, checkpoints_dir=None)


def test_the_teardown_hook_forwards_the_call_and_is_removed_with_the_handle():
    calls = []

    class Trainer:
        state = types.SimpleNamespace(fn="validate")  # not a fit: no vote

        def _teardown(self):
            calls.append(self)
            return "torn down"

    original = Trainer._teardown
    rt, handle = _runtime(), InstalledHooks()
    _patch_lightning(rt, handle, _module(Trainer))
    assert Trainer._teardown is not original and Trainer._teardown.__wrapped__ is original
    t = Trainer()
    assert t._teardown() == "torn down" and calls == [t]
    assert rt.final_vote == "" and rt.guard.on("end of training")
    handle.remove()
    assert Trainer._teardown is original


def test_a_lightning_without_the_private_teardown_is_said_and_left_alone(capsys):
    class Trainer:
        pass

    rt, handle = _runtime(), InstalledHooks()
    _patch_lightning(rt, handle, _module(Trainer))
    assert not hasattr(Trainer, "_teardown")
    assert "Trainer has no _teardown: no end-of-training vote when a fit ends" in (
        capsys.readouterr().err
    )
    assert rt.guard.on("end of training")  # destroy_process_group still makes its vote
    handle.remove()
