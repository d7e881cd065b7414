"""The benchmark models and their inputs: the three of issue 4 ("Speed — benchmarks/"), four
of issue 13 and two of issue 40, models the engine was never tuned on (``UNSEEN`` names the four
shapes issue 40 holds the forward against the floor on: a GPT, a VGG, a MobileNetV2, an LSTM LM).

* ``resnet``      — a ResNet-18-like CNN written here (no torchvision): BasicBlocks that call
  ``self.relu`` twice per block as torchvision does, so the same module is called twice per step.
* ``transformer`` — ``nn.TransformerEncoder`` of 6 ``nn.TransformerEncoderLayer`` (d_model 256,
  4 heads, batch_first, dropout 0).  Run with grad enabled, the fused fast path is off.
* ``mlp5000``     — ``nn.Sequential`` of 2 500 × (Linear(16, 16) + ReLU): 5 000 tiny leaf modules,
  which measures the fixed per-module-call cost of an inspector.
* ``vgg``         — a VGG-11-style CNN with BatchNorm and in-place ReLU (``Conv → BN → ReLU(inplace)``,
  as torchvision's ``vgg11_bn``), 64×64 images: every BatchNorm output is overwritten by the
  next module, so its statistics must be taken before the ReLU runs.
* ``gpt``         — a GPT-style decoder written here: token + position embeddings, 4 pre-norm
  blocks (d 192, 6 heads, causal ``F.scaled_dot_product_attention``, GELU MLP), tied LM head.
* ``mobilenetv2`` — a MobileNetV2 written here (no torchvision): inverted residual blocks of a 1×1
  expanding conv, a 3×3 depthwise conv (``groups`` = channels) and a 1×1 projecting conv, each
  followed by BatchNorm (ReLU6 after the first two), the residual added where the shapes match;
  many small modules on small feature maps, and depthwise convs cheap for their output size.
* ``lstm_lm``     — a word-level LSTM language model in the shape of pytorch/examples'
  word_language_model (embedding, dropout, a 2-layer ``nn.LSTM``, dropout, a linear decoder,
  log-softmax), sequence-first input of 35 × 20 token ids: few modules, one of them (the LSTM)
  returning a tuple with the hidden state.
* ``hf_gpt2``, ``hf_bert`` — Hugging Face ``GPT2Model`` and ``BertModel`` from small configs
  (4 layers, hidden 256, 4 heads), random weights, nothing downloaded (``HF_HUB_OFFLINE=1``);
  need ``transformers`` (the ``bench`` extra), imported only when these models are built.
"""

from __future__ import annotations

import os
from typing import Callable

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    expansion = 1

    def __init__(self, inplanes: int, planes: int, stride: int = 1) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inplanes, planes, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(planes)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(planes, planes, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(planes)
        self.downsample: nn.Module | None = None
        if stride != 1 or inplanes != planes:
            self.downsample = nn.Sequential(
                nn.Conv2d(inplanes, planes, 1, stride, bias=False), nn.BatchNorm2d(planes)
            )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        identity = x
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        if self.downsample is not None:
            identity = self.downsample(x)
        out += identity
        return self.relu(out)  # the same ReLU module, second call in this block


class ResNet18(nn.Module):
    def __init__(self, num_classes: int = 1000) -> None:
        super().__init__()
        self.inplanes = 64
        self.conv1 = nn.Conv2d(3, 64, 7, 2, 3, bias=False)
        self.bn1 = nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, 2, 1)
        self.layer1 = self._layer(64, 2, 1)
        self.layer2 = self._layer(128, 2, 2)
        self.layer3 = self._layer(256, 2, 2)
        self.layer4 = self._layer(512, 2, 2)
        self.avgpool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(512, num_classes)

    def _layer(self, planes: int, blocks: int, stride: int) -> nn.Sequential:
        layers = [BasicBlock(self.inplanes, planes, stride)]
        self.inplanes = planes
        layers += [BasicBlock(planes, planes) for _ in range(1, blocks)]
        return nn.Sequential(*layers)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        x = self.layer4(self.layer3(self.layer2(self.layer1(x))))
        return self.fc(torch.flatten(self.avgpool(x), 1))


def resnet() -> tuple[nn.Module, torch.Tensor]:
    return ResNet18(), torch.randn(16, 3, 64, 64)


def transformer() -> tuple[nn.Module, torch.Tensor]:
    layer = nn.TransformerEncoderLayer(
        d_model=256, nhead=4, dim_feedforward=1024, dropout=0.0, batch_first=True
    )
    # enable_nested_tensor=False: avoids a warning; with grad enabled no fast path is taken anyway
    model = nn.TransformerEncoder(layer, num_layers=6, enable_nested_tensor=False)
    return model, torch.randn(16, 128, 256)


def mlp5000() -> tuple[nn.Module, torch.Tensor]:
    mods: list[nn.Module] = []
    for _ in range(2500):
        mods += [nn.Linear(16, 16), nn.ReLU()]
    return nn.Sequential(*mods), torch.randn(16, 16)


VGG11 = (64, "M", 128, "M", 256, 256, "M", 512, 512, "M", 512, 512, "M")


class VGG(nn.Module):
    """torchvision's vgg11_bn layout (features, avgpool, classifier), sized for 64×64 inputs."""

    def __init__(self, cfg=VGG11, num_classes: int = 1000) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        channels = 3
        for v in cfg:
            if v == "M":
                layers.append(nn.MaxPool2d(2, 2))
            else:
                layers += [nn.Conv2d(channels, v, 3, padding=1), nn.BatchNorm2d(v),
                           nn.ReLU(inplace=True)]
                channels = v
        self.features = nn.Sequential(*layers)
        self.avgpool = nn.AdaptiveAvgPool2d(2)
        self.classifier = nn.Sequential(
            nn.Linear(512 * 4, 1024), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(1024, 1024), nn.ReLU(inplace=True), nn.Dropout(0.5),
            nn.Linear(1024, num_classes),
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.avgpool(self.features(x)), 1))


class CausalSelfAttention(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.heads = heads
        self.qkv = nn.Linear(d, 3 * d)
        self.proj = nn.Linear(d, d)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(x).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.proj(y.transpose(1, 2).reshape(b, t, d))


class Block(nn.Module):
    def __init__(self, d: int, heads: int) -> None:
        super().__init__()
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = CausalSelfAttention(d, heads)
        self.mlp = nn.Sequential(nn.Linear(d, 4 * d), nn.GELU(), nn.Linear(4 * d, d))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln1(x))
        return x + self.mlp(self.ln2(x))


class GPT(nn.Module):
    def __init__(self, vocab: int = 4096, context: int = 256, d: int = 192, heads: int = 6,
                 layers: int = 4) -> None:
        super().__init__()
        self.tok, self.pos = nn.Embedding(vocab, d), nn.Embedding(context, d)
        self.blocks = nn.Sequential(*(Block(d, heads) for _ in range(layers)))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Linear(d, vocab, bias=False)
        self.head.weight = self.tok.weight  # tied, as in GPT-2

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(idx.shape[1], device=idx.device)
        x = self.tok(idx) + self.pos(positions)
        return self.head(self.ln_f(self.blocks(x)))


class InvertedResidual(nn.Module):
    """MobileNetV2's block: expand (1×1), depthwise (3×3, one filter per channel), project (1×1)."""

    def __init__(self, cin: int, cout: int, stride: int, expand: int) -> None:
        super().__init__()
        hidden = cin * expand
        layers: list[nn.Module] = []
        if expand != 1:  # the first block has no expansion, as in the paper
            layers += [nn.Conv2d(cin, hidden, 1, bias=False), nn.BatchNorm2d(hidden),
                       nn.ReLU6(inplace=True)]
        layers += [nn.Conv2d(hidden, hidden, 3, stride, 1, groups=hidden, bias=False),
                   nn.BatchNorm2d(hidden), nn.ReLU6(inplace=True),
                   nn.Conv2d(hidden, cout, 1, bias=False), nn.BatchNorm2d(cout)]  # linear bottleneck
        self.conv = nn.Sequential(*layers)
        self.residual = stride == 1 and cin == cout

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x + self.conv(x) if self.residual else self.conv(x)


# MobileNetV2's stages (Sandler et al. 2018, table 2): expansion, channels, blocks, first stride
MOBILENETV2 = ((1, 16, 1, 1), (6, 24, 2, 2), (6, 32, 3, 2), (6, 64, 4, 2), (6, 96, 3, 1),
               (6, 160, 3, 2), (6, 320, 1, 1))


class MobileNetV2(nn.Module):
    def __init__(self, num_classes: int = 1000, stages=MOBILENETV2) -> None:
        super().__init__()
        layers: list[nn.Module] = [nn.Conv2d(3, 32, 3, 2, 1, bias=False), nn.BatchNorm2d(32),
                                   nn.ReLU6(inplace=True)]
        channels = 32
        for expand, cout, blocks, stride in stages:
            for i in range(blocks):
                layers.append(InvertedResidual(channels, cout, stride if i == 0 else 1, expand))
                channels = cout
        layers += [nn.Conv2d(channels, 1280, 1, bias=False), nn.BatchNorm2d(1280),
                   nn.ReLU6(inplace=True)]
        self.features = nn.Sequential(*layers)
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.classifier = nn.Sequential(nn.Dropout(0.2), nn.Linear(1280, num_classes))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.classifier(torch.flatten(self.pool(self.features(x)), 1))


class LSTMLanguageModel(nn.Module):
    """word_language_model's RNNModel with an LSTM: returns (log-probabilities, hidden)."""

    def __init__(self, vocab: int, width: int, layers: int = 2, dropout: float = 0.2) -> None:
        super().__init__()
        self.vocab = vocab
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(vocab, width)
        self.rnn = nn.LSTM(width, width, layers, dropout=dropout)
        self.decoder = nn.Linear(width, vocab)
        nn.init.uniform_(self.encoder.weight, -0.1, 0.1)
        nn.init.uniform_(self.decoder.weight, -0.1, 0.1)
        nn.init.zeros_(self.decoder.bias)

    def forward(self, tokens: torch.Tensor, hidden=None):
        output, hidden = self.rnn(self.drop(self.encoder(tokens)), hidden)  # None: zeros
        decoded = self.decoder(self.drop(output)).view(-1, self.vocab)
        return F.log_softmax(decoded, dim=1), hidden


def vgg() -> tuple[nn.Module, torch.Tensor]:
    return VGG(), torch.randn(8, 3, 64, 64)


def gpt() -> tuple[nn.Module, torch.Tensor]:
    return GPT(), torch.randint(0, 4096, (8, 256))


def mobilenetv2() -> tuple[nn.Module, torch.Tensor]:
    return MobileNetV2(), torch.randn(16, 3, 96, 96)


def lstm_lm() -> tuple[nn.Module, torch.Tensor]:
    # word_language_model's defaults (bptt 35, batch 20, 2 layers) at width 256, a PTB-sized
    # vocabulary of 10 000: the decoder and the LSTM take about equal time
    return LSTMLanguageModel(10_000, 256), torch.randint(0, 10_000, (35, 20))


def _hf_small(kind: str) -> tuple[nn.Module, torch.Tensor]:
    os.environ.setdefault("HF_HUB_OFFLINE", "1")  # random weights: nothing to download
    import transformers

    transformers.logging.set_verbosity_error()
    if kind == "gpt2":
        config = transformers.GPT2Config(n_embd=256, n_layer=4, n_head=4, n_positions=256,
                                         vocab_size=4096, bos_token_id=0, eos_token_id=0)
        model = transformers.GPT2Model(config)
    else:
        config = transformers.BertConfig(hidden_size=256, num_hidden_layers=4,
                                         num_attention_heads=4, intermediate_size=1024,
                                         vocab_size=4096, max_position_embeddings=256)
        model = transformers.BertModel(config)
    return model, torch.randint(0, 4096, (8, 128))


def hf_gpt2() -> tuple[nn.Module, torch.Tensor]:
    return _hf_small("gpt2")


def hf_bert() -> tuple[nn.Module, torch.Tensor]:
    return _hf_small("bert")


MODELS: dict[str, Callable[[], tuple[nn.Module, torch.Tensor]]] = {
    "resnet": resnet,
    "transformer": transformer,
    "mlp5000": mlp5000,
    "vgg": vgg,
    "gpt": gpt,
    "mobilenetv2": mobilenetv2,
    "lstm_lm": lstm_lm,
    "hf_gpt2": hf_gpt2,
    "hf_bert": hf_bert,
}

# not tuned on: issue 40 holds full statistics' forward to 1.10 × the floor on these four
UNSEEN = ("gpt", "vgg", "mobilenetv2", "lstm_lm")

NEEDS_TRANSFORMERS = ("hf_gpt2", "hf_bert")

LABELS = {
    "resnet": "ResNet-18-like CNN, 16×3×64×64",
    "transformer": "Transformer encoder 6×256, 16×128",
    "mlp5000": "2 500×(Linear16+ReLU), 16×16",
    "vgg": "VGG-11-BN CNN (in-place ReLU), 8×3×64×64",
    "gpt": "GPT decoder 4×192 (SDPA), 8×256 tokens",
    "mobilenetv2": "MobileNetV2 (depthwise), 16×3×96×96",
    "lstm_lm": "LSTM LM 2×256, vocabulary 10 000, 35×20 tokens",
    "hf_gpt2": "HF GPT2Model 4×256, 8×128 tokens",
    "hf_bert": "HF BertModel 4×256, 8×128 tokens",
}
