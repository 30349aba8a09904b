"""The `Incident`: one run of one job, as every stage of the pipeline sees it (the hook's context,
the site config, the job's evidence folder, the time budget with its clock, who handles it)."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from scout_slurm.config import SiteConfig
from scout_slurm.evidence.layout import JobFolder
from scout_slurm.incident.budget import Budget, Clock
from scout_slurm.jobenv import HookContext


@dataclass(frozen=True)
class Incident:
    ctx: HookContext
    cfg: SiteConfig
    folder: JobFolder
    budget: Budget
    holder: str = "controller"  # "controller" or "batch-host <node>"; "(completing)" added later
    env: Mapping[str, str] | None = field(default=None, compare=False)  # for Slurm's commands

    @classmethod
    def begin(
        cls,
        ctx: HookContext,
        cfg: SiteConfig,
        *,
        started: float,
        clock: Clock | None = None,
        holder: str = "controller",
        env: Mapping[str, str] | None = None,
    ) -> Incident:
        """`ctx`'s incident; its budget ([epilog] time_budget_s) counts from `started`."""
        return cls(
            ctx=ctx,
            cfg=cfg,
            folder=JobFolder(Path(cfg.evidence.root), ctx.cluster, ctx.job_id),
            budget=Budget(started, cfg.epilog.time_budget_s, clock or Clock()),
            holder=holder,
            env=env,
        )

    @property
    def restart(self) -> int:
        return self.ctx.restart

    @property
    def job_id(self) -> int:
        return self.ctx.job_id

    @property
    def clock(self) -> Clock:
        return self.budget.clock
