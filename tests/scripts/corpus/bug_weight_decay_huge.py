"""A mixed-precision classifier (torch.autocast, bf16 on the CPU as on a GPU's AMP recipe) trained
with AdamW at weight_decay 50 (meant 0.05): decoupled decay alone takes lr × 50 = 5 % off every
weight at every step, the weights shrink towards 0 and the model forgets what it learns.

    python bug_weight_decay_huge.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(20, 64)
        self.fc2 = nn.Linear(64, 64)
        self.head = nn.Linear(64, 5)

    def forward(self, x):
        return self.head(F.relu(self.fc2(F.relu(self.fc1(x)))))


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--weight_decay", type=float, default=50.0)  # the bug: meant 0.05
    args = parser.parse_args()
    torch.manual_seed(0)
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    amp_dtype = torch.float16 if device_type == "cuda" else torch.bfloat16
    x_all = torch.randn(1024, 20)
    y_all = x_all[:, :5].argmax(1)
    model = Net()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3, weight_decay=args.weight_decay)
    for step in range(args.steps):
        index = torch.randint(len(x_all), (16,))
        optimizer.zero_grad(set_to_none=True)
        with torch.autocast(device_type, dtype=amp_dtype):
            logits = model(x_all[index])
        loss = F.cross_entropy(logits.float(), y_all[index])
        loss.backward()
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4f}")


if __name__ == "__main__":
    main()
