"""Runs a patch right after a module executes, before user code sees it (the bootstrap patches
torch.distributed and torch.distributed.checkpoint this way when the job imports them)."""

from __future__ import annotations

import importlib.abc
import importlib.machinery
import sys
from collections.abc import Callable
from typing import Any


class PatchAfterImport(importlib.abc.MetaPathFinder):
    """A finder for the named modules that runs `targets[name](module)` once the module executed;
    a patch that fails is said and the import goes on."""

    def __init__(self, targets: dict[str, Callable[[Any], None]]) -> None:
        self.targets = targets

    def find_spec(self, fullname, path, target=None):
        if fullname not in self.targets:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        loader = spec.loader
        patch = self.targets.pop(fullname)
        original_exec = loader.exec_module

        def exec_module(module):
            original_exec(module)
            try:
                patch(module)
            except Exception as exc:
                sys.stderr.write(f"scout: cannot hook {fullname}: {exc!r}\n")

        loader.exec_module = exec_module
        return spec
