"""A LightningModule trained by `Trainer.fit`, in the shape of Lightning's autoencoder example:
training_step calls the encoder and decoder directly, never the module's forward.

Positional args: max_steps (default 3). No sanity validation, no logger, no checkpoint.
"""

import sys

import lightning as L
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

max_steps = int(sys.argv[1]) if len(sys.argv) > 1 else 3


class LitAutoEncoder(L.LightningModule):
    def __init__(self):
        super().__init__()
        self.encoder = nn.Sequential(nn.Linear(12, 4), nn.ReLU())
        self.decoder = nn.Sequential(nn.Linear(4, 12))

    def training_step(self, batch, batch_idx):
        (x,) = batch
        return nn.functional.mse_loss(self.decoder(self.encoder(x)), x)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)


torch.manual_seed(0)
data = DataLoader(TensorDataset(torch.randn(64, 12)), batch_size=8)
autoencoder = LitAutoEncoder()
trainer = L.Trainer(max_steps=max_steps, accelerator="cpu", devices=1, logger=False,
                    enable_checkpointing=False, enable_progress_bar=False,
                    enable_model_summary=False, num_sanity_val_steps=0)
trainer.fit(autoencoder, data)
