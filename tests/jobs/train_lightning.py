"""A Lightning 2.x job as its users write it (LightningModule, Trainer with DDP on CPU over gloo,
Lightning's own ModelCheckpoint): started one process per rank (RANK, LOCAL_RANK, WORLD_SIZE set,
as scout-task or torchrun give them), so Lightning launches nothing itself. `--resume PATH` passes
PATH to `Trainer.fit(ckpt_path=...)`, which loads it through fsspec; without it, the checkpoint
scout chose for a requeued run (SCOUT_RESUME_CHECKPOINT, the resume contract of docs/USERS.md).
Under Slurm, Lightning checks `--nodes` and `--devices` against SLURM_NNODES and
SLURM_NTASKS_PER_NODE."""

import argparse
import os

import lightning as L
import torch
from torch.utils.data import DataLoader, TensorDataset


class Tiny(L.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)
        )

    def training_step(self, batch, _):
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=12)
    ap.add_argument("--ckpt", required=True)
    ap.add_argument("--every", type=int, default=4)
    ap.add_argument("--resume", default=os.environ.get("SCOUT_RESUME_CHECKPOINT") or None)
    ap.add_argument("--nodes", type=int, default=1)
    ap.add_argument("--devices", type=int, default=2)
    args = ap.parse_args()
    torch.manual_seed(0)
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
        callbacks=[
            L.pytorch.callbacks.ModelCheckpoint(
                dirpath=args.ckpt, every_n_train_steps=args.every, save_top_k=-1
            )
        ],
    )
    trainer.fit(Tiny(), DataLoader(data, batch_size=8), ckpt_path=args.resume)


if __name__ == "__main__":
    main()
