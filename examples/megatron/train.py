"""A tiny Megatron-Core job on CPU (gloo): parallel_state with tensor/pipeline size 1, a
ColumnParallelLinear and a RowParallelLinear (both return `(output, bias)` tuples) wrapped in
torch's own DDP. Megatron's own DistributedDataParallel, `model_parallel_cuda_manual_seed` and
GPTModel need CUDA, so they are not used here."""

from __future__ import annotations

import argparse
import datetime
import time

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.transformer_config import TransformerConfig
from torch.nn.parallel import DistributedDataParallel as DDP


class Block(torch.nn.Module):
    def __init__(self, config: TransformerConfig, hidden: int) -> None:
        super().__init__()
        init = torch.nn.init.xavier_normal_
        self.fc1 = ColumnParallelLinear(
            hidden, 4 * hidden, config=config, init_method=init, bias=True, gather_output=True
        )
        self.fc2 = RowParallelLinear(
            4 * hidden,
            hidden,
            config=config,
            init_method=init,
            bias=True,
            input_is_parallel=False,
            skip_bias_add=False,
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h, _ = self.fc1(x)
        y, _ = self.fc2(torch.relu(h))
        return y


def main() -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--step-sleep", type=float, default=0.02)
    ap.add_argument("--timeout", type=float, default=600.0)
    args = ap.parse_args()
    torch.set_num_threads(1)
    torch.manual_seed(0)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=1, pipeline_model_parallel_size=1
    )
    rank = dist.get_rank()
    hidden = 32
    config = TransformerConfig(
        num_layers=1,
        hidden_size=hidden,
        num_attention_heads=4,
        use_cpu_initialization=True,
        perform_initialization=True,
    )
    model = Block(config, hidden)
    ddp = DDP(model)
    opt = torch.optim.Adam(ddp.parameters(), lr=1e-3)
    gen = torch.Generator().manual_seed(1000 + rank)
    for _step in range(1, args.steps + 1):
        x = torch.randn(8, hidden, generator=gen)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        time.sleep(args.step_sleep)
    print(f"rank {rank}: done", flush=True)
    del ddp, opt
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
