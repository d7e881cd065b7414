"""tests/scripts/corpus/healthy_accelerate_loop.py with the real `accelerate.Accelerator` in
place of its stand-in: the model, an AdamW optimizer, a DataLoader and a LambdaLR scheduler
handed to `accelerator.prepare`, `accelerator.backward(loss)`, `optimizer.step()`,
`lr_scheduler.step()`, `optimizer.zero_grad()`, on a 4-module MLP (Linear, GELU, LayerNorm,
Linear) and regression data made in the script. What accelerate adds to a step (its wrapped
optimizer, scheduler and data loader, the device placement of each batch) is what issue 40's
"accelerate loop" row measured; the corpus's stand-in leaves it out. Here, not in the corpus,
because the tests run every corpus script and accelerate is only in the test extra.

    python accelerate_mlp_loop.py --steps 300

Without accelerate it prints why and exits 0 (benchmarks/real_scripts.py leaves the row out).
"""

import argparse
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

try:
    from accelerate import Accelerator
except ImportError as error:  # the row is optional: say why it did not run
    Accelerator = None
    MISSING = f"{type(error).__name__}: {error}"


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batch_size", type=int, default=16)
    parser.add_argument("--lr", type=float, default=1e-3)
    args = parser.parse_args()
    if Accelerator is None:
        print(f"skipped: accelerate is not importable ({MISSING}); pip install accelerate")
        return
    torch.manual_seed(42)
    accelerator = Accelerator()
    x = torch.randn(2048, 16)
    y = torch.sin(x[:, :4].sum(1, keepdim=True)) + 0.1 * torch.randn(2048, 1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, shuffle=True)
    model = nn.Sequential(nn.Linear(16, 64), nn.GELU(), nn.LayerNorm(64), nn.Linear(64, 1))
    optimizer = torch.optim.AdamW(model.parameters(), lr=args.lr)
    lr_scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda s: 1.0 - s / (args.steps + 1))
    model, optimizer, loader, lr_scheduler = accelerator.prepare(model, optimizer, loader,
                                                                 lr_scheduler)
    model.train()
    step = 0
    while step < args.steps:
        for inputs, targets in loader:
            outputs = model(inputs)
            loss = nn.functional.mse_loss(outputs, targets)
            accelerator.backward(loss)
            optimizer.step()
            lr_scheduler.step()
            optimizer.zero_grad()
            if step % 100 == 0 or step == args.steps - 1:
                accelerator.print(f"step {step}: loss {loss.item():.4f}")
            step += 1
            if step == args.steps:
                break


if __name__ == "__main__":
    sys.exit(main())
