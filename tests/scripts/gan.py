"""A two-model GAN loop in the shape of pytorch/examples' dcgan: netD on real, netD on fake
(netG's output), netG through netD; BCELoss (a parameterless module) between them.

Positional args: iterations (default 3). Each iteration calls netG once and netD three times.
"""

import sys

import torch
import torch.nn as nn

iterations = int(sys.argv[1]) if len(sys.argv) > 1 else 3
nz = 8


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(nz, 32), nn.ReLU(True), nn.Linear(32, 16), nn.Tanh())

    def forward(self, z):
        return self.main(z)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(nn.Linear(16, 32), nn.LeakyReLU(0.2, True), nn.Linear(32, 1),
                                  nn.Sigmoid())

    def forward(self, x):
        return self.main(x).view(-1)


torch.manual_seed(0)
netG, netD = Generator(), Discriminator()
criterion = nn.BCELoss()
optD = torch.optim.Adam(netD.parameters(), lr=2e-4)
optG = torch.optim.Adam(netG.parameters(), lr=2e-4)
for i in range(iterations):
    real = torch.randn(8, 16)
    netD.zero_grad()
    errD_real = criterion(netD(real), torch.ones(8))
    errD_real.backward()
    fake = netG(torch.randn(8, nz))
    errD_fake = criterion(netD(fake.detach()), torch.zeros(8))
    errD_fake.backward()
    optD.step()
    netG.zero_grad()
    errG = criterion(netD(fake), torch.ones(8))
    errG.backward()
    optG.step()
    print(f"[{i}/{iterations}] Loss_D: {(errD_real + errD_fake).item():.4f} Loss_G: {errG.item():.4f}")
