"""A tiny GPT trained in the shape of nanoGPT's train.py: globals as config, overridden by an
exec'd configurator (`--max_iters=4 --compile=True`), `model = torch.compile(model)` after the
model exists, DDP when torchrun's RANK is set, an evaluation at iteration 0 (eval_iters calls on
train and val, in eval mode), then one forward per iteration.

nan_iter >= 0 plants a NaN in transformer.h.0.attn.c_proj's weight before that iteration's
forward: its output is the first with NaN, at step 2 * eval_iters + nan_iter.
"""

import math
import os

import torch
import torch.nn as nn
from torch.nn import functional as F

max_iters = 4
eval_iters = 2
batch_size = 4
block_size = 8
n_layer = 2
n_embd = 16
vocab_size = 32
learning_rate = 1e-2
compile = False
nan_iter = -1
device = "cpu"
exec(open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "configurator.py")).read())


class CausalSelfAttention(nn.Module):
    def __init__(self):
        super().__init__()
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(n_embd, dim=2)
        q, k, v = (t.view(B, T, 2, C // 2).transpose(1, 2) for t in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).contiguous().view(B, T, C))


class Block(nn.Module):
    def __init__(self):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention()
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(),
                                 nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class GPT(nn.Module):
    def __init__(self):
        super().__init__()
        self.transformer = nn.ModuleDict(dict(
            wte=nn.Embedding(vocab_size, n_embd), wpe=nn.Embedding(block_size, n_embd),
            h=nn.ModuleList([Block() for _ in range(n_layer)]), ln_f=nn.LayerNorm(n_embd)))
        self.lm_head = nn.Linear(n_embd, vocab_size, bias=False)

    def forward(self, idx, targets=None):
        pos = torch.arange(idx.size(1), device=idx.device)
        x = self.transformer.wte(idx) + self.transformer.wpe(pos)
        for block in self.transformer.h:
            x = block(x)
        logits = self.lm_head(self.transformer.ln_f(x))
        loss = None if targets is None else F.cross_entropy(
            logits.view(-1, logits.size(-1)), targets.view(-1))
        return logits, loss


ddp = int(os.environ.get("RANK", -1)) != -1
if ddp:
    from torch.distributed import destroy_process_group, init_process_group
    from torch.nn.parallel import DistributedDataParallel as DDP

    init_process_group(backend="gloo")
torch.manual_seed(1337)
data = torch.randint(vocab_size, (512,))


def get_batch(split):
    ix = torch.randint(len(data) - block_size - 1, (batch_size,))
    x = torch.stack([data[i:i + block_size] for i in ix])
    y = torch.stack([data[i + 1:i + 1 + block_size] for i in ix])
    return x.to(device), y.to(device)


model = GPT().to(device)
optimizer = torch.optim.AdamW(model.parameters(), lr=learning_rate)
if compile:
    model = torch.compile(model)
if ddp:
    model = DDP(model)
raw_model = model.module if ddp else model


@torch.no_grad()
def estimate_loss():
    out = {}
    model.eval()
    for split in ["train", "val"]:
        losses = torch.zeros(eval_iters)
        for k in range(eval_iters):
            X, Y = get_batch(split)
            logits, loss = model(X, Y)
            losses[k] = loss.item()
        out[split] = losses.mean()
    model.train()
    return out


losses = estimate_loss()
print(f"step 0: train loss {losses['train']:.4f}, val loss {losses['val']:.4f}")
for iter_num in range(max_iters):
    if iter_num == nan_iter:
        with torch.no_grad():
            getattr(raw_model, "_orig_mod", raw_model).transformer.h[0].attn.c_proj.weight[0, 0] = math.nan
    X, Y = get_batch("train")
    logits, loss = model(X, Y)
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    optimizer.step()
    print(f"iter {iter_num}: loss {loss.item():.4f}")
if ddp:
    destroy_process_group()
