"""A GAN in the shape of pytorch/examples' dcgan main.py, with MLPs for a 2-d target: a Generator
and a Discriminator (BatchNorm, LeakyReLU 0.2), weights_init normal(0, 0.02), BCELoss on the
Discriminator's Sigmoid, two Adam optimizers at lr 2e-4 with betas (0.5, 0.999); each step
updates D on a real and a fake batch, then G. The real data is a ring of 8 Gaussians.

    python healthy_gan.py --steps 300
"""

import argparse
import math

import torch
import torch.nn as nn

nz = 8


class Generator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(nz, 64), nn.BatchNorm1d(64), nn.ReLU(True),
            nn.Linear(64, 64), nn.BatchNorm1d(64), nn.ReLU(True),
            nn.Linear(64, 2))

    def forward(self, input):
        return self.main(input)


class Discriminator(nn.Module):
    def __init__(self):
        super().__init__()
        self.main = nn.Sequential(
            nn.Linear(2, 64), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 64), nn.LeakyReLU(0.2, inplace=True),
            nn.Linear(64, 1), nn.Sigmoid())

    def forward(self, input):
        return self.main(input).view(-1)


def weights_init(m):
    if isinstance(m, nn.Linear):
        nn.init.normal_(m.weight, 0.0, 0.02)
        nn.init.zeros_(m.bias)
    elif isinstance(m, nn.BatchNorm1d):
        nn.init.normal_(m.weight, 1.0, 0.02)
        nn.init.zeros_(m.bias)


def real_batch(n, generator):
    angle = torch.randint(8, (n,), generator=generator).float() * (2 * math.pi / 8)
    centers = torch.stack([angle.cos(), angle.sin()], 1) * 2
    return centers + 0.05 * torch.randn(n, 2, generator=generator)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--batchSize", type=int, default=16)
    parser.add_argument("--lr", type=float, default=0.0002)
    parser.add_argument("--beta1", type=float, default=0.5)
    args = parser.parse_args()
    torch.manual_seed(999)
    generator = torch.Generator().manual_seed(999)
    netG, netD = Generator(), Discriminator()
    netG.apply(weights_init)
    netD.apply(weights_init)
    criterion = nn.BCELoss()
    optimizerD = torch.optim.Adam(netD.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    optimizerG = torch.optim.Adam(netG.parameters(), lr=args.lr, betas=(args.beta1, 0.999))
    real_label, fake_label = 1.0, 0.0
    for step in range(args.steps):
        # (1) Update D: maximize log(D(x)) + log(1 - D(G(z)))
        netD.zero_grad()
        real = real_batch(args.batchSize, generator)
        label = torch.full((args.batchSize,), real_label)
        errD_real = criterion(netD(real), label)
        errD_real.backward()
        noise = torch.randn(args.batchSize, nz, generator=generator)
        fake = netG(noise)
        label.fill_(fake_label)
        errD_fake = criterion(netD(fake.detach()), label)
        errD_fake.backward()
        optimizerD.step()
        # (2) Update G: maximize log(D(G(z)))
        netG.zero_grad()
        label.fill_(real_label)
        errG = criterion(netD(fake), label)
        errG.backward()
        optimizerG.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"[{step}] Loss_D: {(errD_real + errD_fake).item():.4f} Loss_G: {errG.item():.4f}")


if __name__ == "__main__":
    main()
