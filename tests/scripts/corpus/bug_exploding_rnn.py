"""A sequence regressor on an Elman RNN (tanh) whose recurrent weights are initialised large
(normal std 0.5 for 32 hidden units: spectral radius ~3) and trained with no gradient clipping:
backpropagation through 40 time steps multiplies the gradient at every step, it explodes.

    python bug_exploding_rnn.py --steps 100
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class SeqRegressor(nn.Module):
    def __init__(self):
        super().__init__()
        self.rnn = nn.RNN(4, 32, batch_first=True)
        self.head = nn.Linear(32, 1)
        nn.init.normal_(self.rnn.weight_hh_l0, std=0.5)  # the bug: meant orthogonal / std 1/sqrt(32)

    def forward(self, x):
        out, _ = self.rnn(x)
        return self.head(out[:, -1])


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    args = parser.parse_args()
    torch.manual_seed(0)
    model = SeqRegressor()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    for step in range(args.steps):
        x = torch.randn(8, 40, 4)
        y = x[:, :, 0].mean(1, keepdim=True)
        optimizer.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()  # no clip_grad_norm_
        optimizer.step()
        if step % 20 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.4g}")


if __name__ == "__main__":
    main()
