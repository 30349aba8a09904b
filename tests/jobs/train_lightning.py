"""A Lightning 2.x job as its users write it (LightningModule, Trainer with DDP on CPU over gloo,
Lightning's own ModelCheckpoint): started one process per rank (RANK, LOCAL_RANK, WORLD_SIZE set,
as scout-task or torchrun give them), so Lightning launches nothing itself. `--resume PATH` passes
PATH to `Trainer.fit(ckpt_path=...)`, which loads it through fsspec; without it, the checkpoint
scout chose for a requeued run (SCOUT_RESUME_CHECKPOINT, the resume contract of docs/USERS.md).
`--devices D --nodes N`: the ranks per node and nodes (on Slurm, Lightning reads its own SLURM_*
variables and checks them against SLURM_NNODES and SLURM_NTASKS_PER_NODE); without `--ckpt` no
checkpoint is saved; `--destroy`: destroy_process_group() after the fit, as a script that cleans
up itself; `--end-sleep RANK,S`: that rank sleeps S seconds as the fit ends (a last save that
takes long); `--raise-at STEP`: every rank's training step raises there."""

import argparse
import os
import time

import lightning as L
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset


class SleepAtEnd(L.Callback):
    def __init__(self, rank: int, seconds: float) -> None:
        self.rank, self.seconds = rank, seconds

    def on_train_end(self, trainer, _module) -> None:
        if trainer.global_rank == self.rank:
            time.sleep(self.seconds)


class Tiny(L.LightningModule):
    def __init__(self, raise_at: int = -1) -> None:
        super().__init__()
        self.raise_at = raise_at
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch, _):
        if self.global_step == self.raise_at:
            raise RuntimeError(f"the job's own error at step {self.global_step}")
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ckpt", default=None)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--resume", default=os.environ.get("SCOUT_RESUME_CHECKPOINT") or None)
    ap.add_argument("--devices", type=int, default=2)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--destroy", action="store_true")
    ap.add_argument("--end-sleep", default=None)
    ap.add_argument("--raise-at", type=int, default=-1)
    args = ap.parse_args()
    torch.manual_seed(0)
    callbacks: list[L.Callback] = []
    if args.ckpt is not None:
        callbacks.append(
            L.pytorch.callbacks.ModelCheckpoint(
                dirpath=args.ckpt, every_n_train_steps=args.every, save_top_k=-1
            )
        )
    if args.end_sleep:
        rank, seconds = args.end_sleep.split(",")
        callbacks.append(SleepAtEnd(int(rank), float(seconds)))
    data = TensorDataset(torch.randn(512, 8), torch.randn(512, 1))
    trainer = L.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.nodes,
        strategy="ddp",
        max_steps=args.steps,
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
        enable_checkpointing=args.ckpt is not None,
        callbacks=callbacks,
    )
    trainer.fit(Tiny(args.raise_at), DataLoader(data, batch_size=8), ckpt_path=args.resume)
    print(f"rank {trainer.global_rank}: done", flush=True)
    if args.destroy:
        dist.destroy_process_group()


if __name__ == "__main__":
    main()
