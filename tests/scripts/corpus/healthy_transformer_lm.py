"""A Transformer language model in the shape of word_language_model's TransformerModel: an
Embedding scaled by sqrt(d_model), sinusoidal PositionalEncoding with dropout, an
nn.TransformerEncoder with a causal mask, a Linear decoder (uniform(-0.1, 0.1), bias zero),
log_softmax and NLLLoss, trained with Adam and gradient clipping. The token stream is made in
the script (a noisy counting sequence), so the next token is mostly predictable.

    python healthy_transformer_lm.py --steps 300
"""

import argparse
import math

import torch
import torch.nn as nn
import torch.nn.functional as F


class PositionalEncoding(nn.Module):
    def __init__(self, d_model, dropout=0.1, max_len=64):
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        pe = torch.zeros(max_len, d_model)
        position = torch.arange(0, max_len, dtype=torch.float).unsqueeze(1)
        div_term = torch.exp(torch.arange(0, d_model, 2).float() * (-math.log(10000.0) / d_model))
        pe[:, 0::2] = torch.sin(position * div_term)
        pe[:, 1::2] = torch.cos(position * div_term)
        self.register_buffer("pe", pe.unsqueeze(0).transpose(0, 1))

    def forward(self, x):
        return self.dropout(x + self.pe[:x.size(0), :])


class TransformerModel(nn.Module):
    def __init__(self, ntoken, ninp, nhead, nhid, nlayers, dropout=0.1):
        super().__init__()
        self.src_mask = None
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        layer = nn.TransformerEncoderLayer(ninp, nhead, nhid, dropout)
        self.transformer_encoder = nn.TransformerEncoder(layer, nlayers, enable_nested_tensor=False)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.ninp = ninp
        self.decoder = nn.Linear(ninp, ntoken)
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, src):
        if self.src_mask is None or self.src_mask.size(0) != len(src):
            self.src_mask = nn.Transformer.generate_square_subsequent_mask(len(src))
        src = self.pos_encoder(self.encoder(src) * math.sqrt(self.ninp))
        output = self.transformer_encoder(src, self.src_mask)
        return F.log_softmax(self.decoder(output), dim=-1)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--bptt", type=int, default=12)
    parser.add_argument("--batch_size", type=int, default=8)
    args = parser.parse_args()
    torch.manual_seed(1111)
    generator = torch.Generator().manual_seed(1111)
    ntokens = 24
    stream = (torch.arange(8000) + torch.randint(0, 2, (8000,), generator=generator).cumsum(0)) % ntokens
    data = stream[: (len(stream) // args.batch_size) * args.batch_size].view(args.batch_size, -1).t()
    model = TransformerModel(ntokens, 32, 2, 64, 2)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-3)
    model.train()
    i = 0
    for step in range(args.steps):
        if i + args.bptt + 1 >= data.size(0):
            i = 0
        src, target = data[i:i + args.bptt], data[i + 1:i + 1 + args.bptt]
        optimizer.zero_grad()
        output = model(src)
        loss = criterion(output.view(-1, ntokens), target.reshape(-1))
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 0.5)
        optimizer.step()
        i += args.bptt
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.3f}")


if __name__ == "__main__":
    main()
