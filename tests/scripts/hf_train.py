"""A Hugging Face model trained by `Trainer.train`, in the shape of the run_clm examples: a tiny
GPT-2 built from its config (nothing downloaded), a dataset of token ids, labels = inputs.

Positional args: output folder, max_steps (default 3).
"""

import sys

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainingArguments

output_dir = sys.argv[1]
max_steps = int(sys.argv[2]) if len(sys.argv) > 2 else 3


class Tokens(torch.utils.data.Dataset):
    def __init__(self):
        self.ids = torch.randint(64, (32, 8), generator=torch.Generator().manual_seed(0))

    def __len__(self):
        return len(self.ids)

    def __getitem__(self, i):
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


config = GPT2Config(vocab_size=64, n_positions=16, n_embd=16, n_layer=2, n_head=2)
model = GPT2LMHeadModel(config)
args = TrainingArguments(output_dir=output_dir, max_steps=max_steps, per_device_train_batch_size=4,
                         report_to=[], save_strategy="no", logging_strategy="no", use_cpu=True,
                         disable_tqdm=True, dataloader_num_workers=0)
Trainer(model=model, args=args, train_dataset=Tokens()).train()
