"""The Hugging Face Trainer as researchers run it, one process per rank (started by scout-srun,
torchrun or the tests' launcher: RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR/PORT in the
environment), on CPU with gloo: a small GPT-2 built from its config (tied `wte`/`lm_head`, no
download), random tokens, AdamW, a checkpoint folder every `--save-every` steps
(`checkpoint-N/`: model.safetensors, optimizer.pt, scheduler.pt, rng_state_R.pth, trainer_state
.json, training_args.bin). `--resume` (or scout's SCOUT_RESUME_CHECKPOINT when it names a
checkpoint folder) resumes through the Trainer's own `resume_from_checkpoint`."""

import argparse
import os

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments


class Tokens(torch.utils.data.Dataset):
    def __init__(self, n: int, length: int, vocab: int) -> None:
        g = torch.Generator().manual_seed(0)
        self.data = torch.randint(0, vocab, (n, length), generator=g)

    def __len__(self) -> int:
        return len(self.data)

    def __getitem__(self, i: int) -> dict:
        return {"input_ids": self.data[i], "labels": self.data[i]}


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=30)
    ap.add_argument("--save-every", type=int, default=10)
    ap.add_argument("--out", required=True)
    ap.add_argument("--resume", default="")
    args = ap.parse_args()
    resume = args.resume or os.environ.get("SCOUT_RESUME_CHECKPOINT", "")
    if resume and not os.path.isdir(resume):
        resume = ""  # the HF Trainer resumes from a checkpoint folder only
    cfg = GPT2Config(n_layer=2, n_head=2, n_embd=32, vocab_size=128, n_positions=32)
    torch.manual_seed(0)
    model = GPT2LMHeadModel(cfg)
    targs = TrainingArguments(
        output_dir=args.out,
        max_steps=args.steps,
        per_device_train_batch_size=4,
        learning_rate=1e-3,
        save_strategy="steps",
        save_steps=args.save_every,
        logging_steps=10,
        report_to=[],
        use_cpu=True,
        ddp_backend="gloo",
        dataloader_num_workers=0,
        seed=0,
        disable_tqdm=True,
    )
    trainer = Trainer(model=model, args=targs, train_dataset=Tokens(512, 16, cfg.vocab_size))
    trainer.train(resume_from_checkpoint=resume or None)
    if int(os.environ.get("RANK", "0")) == 0:
        print(f"rank 0: done at step {trainer.state.global_step}", flush=True)


if __name__ == "__main__":
    main()
