"""A nanoGPT-shaped model (same module tree: transformer.wte/wpe/drop/h.N/ln_f, lm_head; each
Block's ln_1, attn.c_attn/c_proj/attn_dropout/resid_dropout, ln_2, mlp.c_fc/gelu/c_proj/dropout),
written here at toy width, and a run whose `h.9.mlp.c_fc` weight grows 15 % a step."""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.attn_dropout = nn.Dropout(0.0)
        self.resid_dropout = nn.Dropout(0.0)
        self.n_head = n_head

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(C, dim=2)
        q, k, v = (t.view(B, T, self.n_head, C // self.n_head).transpose(1, 2) for t in (q, k, v))
        att = (q @ k.transpose(-2, -1)) / math.sqrt(k.size(-1))
        att = att.masked_fill(torch.ones(T, T).tril() == 0, float("-inf"))
        att = self.attn_dropout(F.softmax(att, dim=-1))
        y = (att @ v).transpose(1, 2).contiguous().view(B, T, C)
        return self.resid_dropout(self.c_proj(y))


class MLP(nn.Module):
    def __init__(self, n_embd: int):
        super().__init__()
        self.c_fc = nn.Linear(n_embd, 4 * n_embd)
        self.gelu = nn.GELU()
        self.c_proj = nn.Linear(4 * n_embd, n_embd)
        self.dropout = nn.Dropout(0.0)

    def forward(self, x):
        return self.dropout(self.c_proj(self.gelu(self.c_fc(x))))


class Block(nn.Module):
    def __init__(self, n_embd: int, n_head: int):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = MLP(n_embd)

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self, n_layer: int = 12, n_embd: int = 16, n_head: int = 2, vocab: int = 64,
                 block_size: int = 8):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab, n_embd), wpe=nn.Embedding(block_size, n_embd),
            drop=nn.Dropout(0.0),
            h=nn.ModuleList([Block(n_embd, n_head) for _ in range(n_layer)]),
            ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        self.vocab, self.block_size = vocab, block_size

    def forward(self, idx):
        t = self.transformer
        x = t.drop(t.wte(idx) + t.wpe(torch.arange(idx.size(1))))
        for block in t.h:
            x = block(x)
        return self.lm_head(t.ln_f(x))


def exploding_steps(model: GPT, steps: int, layer: int = 9, growth: float = 1.15,
                    between=None) -> None:
    """Run `steps` forward passes; before each, `h.<layer>.mlp.c_fc`'s weight grows by `growth`."""
    torch.manual_seed(1)
    fc = model.transformer.h[layer].mlp.c_fc
    for _ in range(steps):
        with torch.no_grad():
            fc.weight.mul_(growth)
        model(torch.randint(0, model.vocab, (2, model.block_size)))
        if between is not None:
            between()
