"""`singlecard_nb.explain`: a zoo of real mistakes inside realistic models, each explained where
it failed (module path, chain, inputs, parameters, hint), with the exception left untouched and
nothing kept alive."""

from __future__ import annotations

import gc
import math
import re
import sys
import traceback
import weakref

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from conftest import failure, linear_shape_error
from torch import nn

import singlecard_nb as scn
from singlecard_nb.diagnosis import explain as explain_module
from singlecard_nb.notices import Notices
from singlecard_nb.parallel import single_card

torch.manual_seed(0)


def explained(fn, *args, **kwargs) -> scn.Explanation:
    exp = scn.explain(failure(fn, *args, **kwargs))
    assert exp is not None
    return exp


def shapes(exp) -> list:
    return [shape for _, shape, _, _ in exp.inputs]


def has(hint: str | None, *words: str) -> None:
    assert hint is not None, "no hint"
    for word in words:
        assert word in hint, f"{word!r} not in hint: {hint}"


# --- the models -------------------------------------------------------------------------------


class SmallCNN(nn.Module):
    """CIFAR-style CNN whose classifier was sized for 16x16 inputs; fed 32x32 it breaks."""

    def __init__(self, classes=10):
        super().__init__()
        self.features = nn.Sequential(
            nn.Conv2d(3, 16, 3, padding=1), nn.BatchNorm2d(16), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(16, 32, 3, padding=1), nn.BatchNorm2d(32), nn.ReLU(), nn.MaxPool2d(2),
        )
        self.classifier = nn.Sequential(nn.Linear(32 * 4 * 4, 64), nn.ReLU(), nn.Linear(64, classes))

    def forward(self, x):
        x = self.features(x)
        x = torch.flatten(x, 1)
        return self.classifier(x)


class BasicBlock(nn.Module):
    def __init__(self, cin, cout, stride=1, bn_channels=None):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.bn1 = nn.BatchNorm2d(bn_channels or cout)
        self.conv2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.shortcut = (nn.Sequential() if stride == 1 and cin == cout else
                         nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False), nn.BatchNorm2d(cout)))

    def forward(self, x):
        out = F.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        return F.relu(out + self.shortcut(x))


class Head(nn.Module):
    def __init__(self, features, classes=10):
        super().__init__()
        self.pool = nn.AdaptiveAvgPool2d(1)
        self.fc = nn.Linear(features, classes)

    def forward(self, x):
        return self.fc(self.pool(x).flatten(1))


class ResNetish(nn.Module):
    """A small ResNet: stem, a ModuleList of stages (Sequentials of blocks), a head module."""

    def __init__(self, widths=(16, 32), head_features=None, in_channels=3, bn_channels=None):
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(in_channels, widths[0], 3, padding=1, bias=False),
                                  nn.BatchNorm2d(widths[0]), nn.ReLU())
        stages, cin = [], widths[0]
        for i, w in enumerate(widths):
            stages.append(nn.Sequential(
                BasicBlock(cin, w, 1 if i == 0 else 2, bn_channels if i == len(widths) - 1 else None),
                BasicBlock(w, w)))
            cin = w
        self.stages = nn.ModuleList(stages)
        self.head = Head(head_features or widths[-1])

    def forward(self, x):
        x = self.stem(x)
        for stage in self.stages:
            x = stage(x)
        return self.head(x)


class CausalSelfAttention(nn.Module):
    def __init__(self, n_embd, n_head, contiguous=True):
        super().__init__()
        self.n_head, self.n_embd = n_head, n_embd
        self.head_dim = n_embd // n_head  # the bug when n_head does not divide n_embd
        self.c_attn = nn.Linear(n_embd, 3 * n_embd)
        self.c_proj = nn.Linear(n_embd, n_embd)
        self.contiguous = contiguous

    def forward(self, x):
        B, T, C = x.size()
        q, k, v = self.c_attn(x).split(self.n_embd, dim=2)
        q = q.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        k = k.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        v = v.view(B, T, self.n_head, self.head_dim).transpose(1, 2)
        att = (q @ k.transpose(-2, -1)) / math.sqrt(self.head_dim)
        att = att.masked_fill(torch.ones(T, T, dtype=torch.bool).triu(1), float("-inf"))
        y = F.softmax(att, dim=-1) @ v
        if self.contiguous:
            y = y.transpose(1, 2).contiguous().view(B, T, C)
        else:
            y = y.transpose(1, 2).view(B, T, C)  # the bug: view of a transposed tensor
        return self.c_proj(y)


class GPTBlock(nn.Module):
    def __init__(self, n_embd, n_head, contiguous=True):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n_embd)
        self.attn = CausalSelfAttention(n_embd, n_head, contiguous)
        self.ln_2 = nn.LayerNorm(n_embd)
        self.mlp = nn.Sequential(nn.Linear(n_embd, 4 * n_embd), nn.GELU(), nn.Linear(4 * n_embd, n_embd))

    def forward(self, x):
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class TinyGPT(nn.Module):
    def __init__(self, vocab=100, n_embd=64, n_head=4, n_layer=2, block_size=16, ln_f=None,
                 contiguous=True, tie=False):
        super().__init__()
        self.wte = nn.Embedding(vocab, n_embd)
        self.wpe = nn.Embedding(block_size, n_embd)
        self.block_size = block_size
        self.blocks = nn.ModuleList(GPTBlock(n_embd, n_head, contiguous) for _ in range(n_layer))
        self.ln_f = nn.LayerNorm(ln_f or n_embd)
        self.lm_head = nn.Linear(n_embd, vocab, bias=False)
        if tie:
            self.lm_head.weight = self.wte.weight

    def forward(self, idx):
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))


class CharRNN(nn.Module):
    """The classic char-RNN: (seq, batch) LSTM by default, hidden state from init_hidden."""

    def __init__(self, vocab=50, hidden=32, layers=2, batch_first=False):
        super().__init__()
        self.layers, self.hidden = layers, hidden
        self.embed = nn.Embedding(vocab, 16)
        self.lstm = nn.LSTM(16, hidden, layers, batch_first=batch_first)
        self.fc = nn.Linear(hidden, vocab)

    def init_hidden(self, batch):
        return (torch.zeros(self.layers, batch, self.hidden),
                torch.zeros(self.layers, batch, self.hidden))

    def forward(self, x, hidden):
        out, hidden = self.lstm(self.embed(x), hidden)
        return self.fc(out), hidden


class SensorLSTM(nn.Module):
    def __init__(self, channels=6, hidden=32, classes=4):
        super().__init__()
        self.rnn = nn.GRU(channels, hidden, batch_first=True)
        self.out = nn.Linear(hidden, classes)

    def forward(self, x):
        y, _ = self.rnn(x)
        return self.out(y[:, -1])


class TextEncoderClassifier(nn.Module):
    """nn.TransformerEncoder as most tutorials build it (batch_first defaults to False)."""

    def __init__(self, vocab=100, d_model=32, batch_first=False):
        super().__init__()
        self.embed = nn.Embedding(vocab, d_model)
        layer = nn.TransformerEncoderLayer(d_model, 4, 64, dropout=0.0, batch_first=batch_first)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.fc = nn.Linear(d_model, 2)

    def forward(self, tokens, padding_mask=None):
        h = self.encoder(self.embed(tokens), src_key_padding_mask=padding_mask)
        return self.fc(h.mean(1))


class CrossAttentionBlock(nn.Module):
    def __init__(self, d_query, d_model, heads=4):
        super().__init__()
        self.norm = nn.LayerNorm(d_query)
        self.attn = nn.MultiheadAttention(d_model, heads, batch_first=True)

    def forward(self, x, memory):
        q = self.norm(x)
        out, _ = self.attn(q, memory, memory, need_weights=False)
        return x + out


class BagOfWords(nn.Module):
    def __init__(self, vocab=1000, dim=16, classes=3):
        super().__init__()
        self.embed = nn.Embedding(vocab, dim, padding_idx=0)
        self.fc = nn.Linear(dim, classes)

    def forward(self, tokens):
        return self.fc(self.embed(tokens).mean(1))


class AudioConv(nn.Module):
    def __init__(self, channels=40):
        super().__init__()
        self.net = nn.Sequential(nn.Conv1d(channels, 64, 5, padding=2), nn.ReLU(),
                                 nn.AdaptiveAvgPool1d(1), nn.Flatten(), nn.Linear(64, 8))

    def forward(self, x):
        return self.net(x)


class MultiModal(nn.Module):
    """Takes a dict batch (structured input) and keyword arguments."""

    def __init__(self, text_dim=32, image_dim=48, fused_in=80):
        super().__init__()
        self.image = nn.Sequential(nn.Flatten(), nn.LazyLinear(image_dim))
        self.text = nn.EmbeddingBag(100, text_dim)
        self.fusion = Fusion(fused_in)

    def forward(self, batch, *, dropout_mask=None):
        feats = {"image": self.image(batch["image"]), "text": self.text(batch["tokens"])}
        return self.fusion(feats, mask=dropout_mask)


class Fusion(nn.Module):
    def __init__(self, fused_in):
        super().__init__()
        self.proj = nn.Linear(fused_in, 2)

    def forward(self, feats, mask=None):
        joint = torch.cat([feats["image"], feats["text"]], dim=1)
        if mask is not None:
            joint = joint * mask
        return self.proj(joint)


class MultiTask(nn.Module):
    """A shared trunk, then one head per task in a ModuleDict."""

    def __init__(self):
        super().__init__()
        self.trunk = nn.Sequential(nn.Linear(20, 32), nn.ReLU())
        self.heads = nn.ModuleDict({"age": nn.Linear(32, 1), "species": nn.Linear(16, 5)})

    def forward(self, x):
        h = self.trunk(x)
        return {task: head(h) for task, head in self.heads.items()}


class Seq2Seq(nn.Module):
    """Encoder and decoder share one embedding (registered under both)."""

    def __init__(self, vocab=60, dim=16):
        super().__init__()
        shared = nn.Embedding(vocab, dim)
        self.encoder = nn.ModuleDict({"embed": shared, "rnn": nn.GRU(dim, dim, batch_first=True)})
        self.decoder = Decoder(shared, dim, vocab)

    def forward(self, src, tgt):
        _, h = self.encoder["rnn"](self.encoder["embed"](src))
        return self.decoder(tgt, h)


class Decoder(nn.Module):
    def __init__(self, embed, dim, vocab):
        super().__init__()
        self.embed = embed
        self.rnn = nn.GRU(dim, dim, batch_first=True)
        self.out = nn.Linear(dim, vocab)

    def forward(self, tgt, h):
        y, _ = self.rnn(self.embed(tgt), h)
        return self.out(y)


# --- the zoo ------------------------------------------------------------------------------------


def test_cnn_with_a_wrong_flatten_size():
    exp = explained(SmallCNN(), torch.randn(8, 3, 32, 32))
    assert exp.module == "classifier.0" and exp.module_type == "Linear"
    assert exp.chain == [("", "SmallCNN"), ("classifier", "Sequential"), ("classifier.0", "Linear")]
    assert exp.inputs == [("[0]", (8, 2048), "float32", "cpu")]
    assert exp.params == [("weight", (64, 512), "float32", "cpu"), ("bias", (64,), "float32", "cpu")]
    assert exp.hint == ("Linear 'classifier.0' expects the last dimension of its input to be 512 "
                        "(in_features); it got 2048")


def test_classifier_head_after_a_changed_backbone():
    # the backbone was widened to 64 channels; the head still expects 32 features
    model = ResNetish(widths=(16, 64), head_features=32)
    exp = explained(model, torch.randn(2, 3, 16, 16))
    assert exp.module == "head.fc"
    assert exp.chain == [("", "ResNetish"), ("head", "Head"), ("head.fc", "Linear")]
    assert shapes(exp) == [(2, 64)]
    assert exp.hint == ("Linear 'head.fc' expects the last dimension of its input to be 32 "
                        "(in_features); it got 64")
    assert exp.where is not None and "self.fc(self.pool(x).flatten(1))" in exp.where


def test_batch_norm_with_the_wrong_channel_count_deep_in_nested_containers():
    model = ResNetish(widths=(16, 32), bn_channels=64)
    exp = explained(model, torch.randn(2, 3, 16, 16))
    assert exp.module == "stages.1.0.bn1" and exp.module_type == "BatchNorm2d"
    assert exp.chain == [("", "ResNetish"), ("stages.1", "Sequential"), ("stages.1.0", "BasicBlock"),
                         ("stages.1.0.bn1", "BatchNorm2d")]
    assert shapes(exp) == [(2, 32, 8, 8)]
    assert ("running_mean", (64,), "float32", "cpu") in exp.params
    has(exp.hint, "BatchNorm2d 'stages.1.0.bn1' expects 64 channels (num_features)", "it got 32")


def test_grayscale_images_into_an_rgb_stem():
    exp = explained(ResNetish(), torch.randn(4, 1, 16, 16))
    assert exp.module == "stem.0" and shapes(exp) == [(4, 1, 16, 16)]
    assert exp.hint == ("Conv2d 'stem.0' expects 3 input channels (in_channels); it got 1 "
                        "(input (4, 1, 16, 16))")


def test_mnist_batch_without_a_channel_dimension():
    model = ResNetish(in_channels=1)
    exp = explained(model, torch.randn(16, 28, 28))
    assert exp.module == "stem.0" and shapes(exp) == [(16, 28, 28)]
    has(exp.hint, "got a 3-D input (16, 28, 28), which it reads as one unbatched sample with 16 "
                  "channels", "x.unsqueeze(1)")


def test_channels_last_images_from_numpy():
    images = torch.from_numpy(np.random.rand(4, 16, 16, 3).astype(np.float32))  # (N, H, W, C)
    exp = explained(ResNetish(), images)
    has(exp.hint, "expects 3 input channels", "looks channels-last", "x.permute(0, 3, 1, 2)")


def test_conv2d_given_a_single_image_with_no_dimensions_to_spare():
    exp = explained(ResNetish(in_channels=1), torch.randn(28, 28))
    assert exp.module == "stem.0"
    has(exp.hint, "expects a 4-D batch (N, C, H, W) or one 3-D sample (C, H, W); it got a 2-D "
                  "input (28, 28)", "x[None, None]")


def test_one_image_without_its_batch_dimension_reaches_batch_norm():
    # Conv2d accepts an unbatched (C, H, W) image; the BatchNorm2d after it does not
    exp = explained(ResNetish(), torch.randn(3, 16, 16))
    assert exp.module == "stem.1" and exp.module_type == "BatchNorm2d"
    has(exp.hint, "expects a 4-D (N, C, H, W) input; it got 3-D (16, 16, 16)",
        "batch dimension is probably missing (x.unsqueeze(0))")


def test_audio_features_in_time_major_layout_into_conv1d():
    exp = explained(AudioConv(40), torch.randn(8, 100, 40))  # (batch, frames, mel bins)
    assert exp.module == "net.0" and exp.chain[-1] == ("net.0", "Conv1d")
    has(exp.hint, "expects 40 input channels (in_channels); it got 100",
        "(batch, length, channels)", "x.transpose(1, 2)")


def test_transformer_with_a_wrong_head_dimension():
    model = TinyGPT(n_embd=64, n_head=6)  # 64 // 6 = 10: heads x head_dim = 60, not 64
    exp = explained(model, torch.randint(0, 100, (2, 16)))
    assert exp.module == "blocks.0.attn" and exp.module_type == "CausalSelfAttention"
    assert exp.chain == [("", "TinyGPT"), ("blocks.0", "GPTBlock"), ("blocks.0.attn", "CausalSelfAttention")]
    assert shapes(exp) == [(2, 16, 64)]
    assert {name for name, *_ in exp.params} == set()  # its Linears are submodules, not its own
    has(exp.hint, "In the forward of CausalSelfAttention 'blocks.0.attn'",
        "q.view(B, T, self.n_head, self.head_dim)", "asks for shape [2, 16, 6, 10] (1920 elements) "
        "from a tensor of 2048 elements", "n_head=6", "head_dim=10")


def test_view_on_a_transposed_tensor_in_a_custom_forward():
    exp = explained(TinyGPT(contiguous=False), torch.randint(0, 100, (2, 16)))
    assert exp.module == "blocks.0.attn"
    has(exp.hint, "y.transpose(1, 2).view(B, T, C)", "non-contiguous", ".reshape(...)")
    assert "test_explain.py" in exp.where


def test_final_layer_norm_sized_for_another_width():
    exp = explained(TinyGPT(n_embd=64, ln_f=128), torch.randint(0, 100, (2, 16)))
    assert exp.module == "ln_f" and shapes(exp) == [(2, 16, 64)]
    assert ("weight", (128,), "float32", "cpu") in exp.params
    assert exp.hint == ("LayerNorm 'ln_f' normalizes over the last 1 dimension(s) [128] "
                        "(normalized_shape); the input (2, 16, 64) ends in [64]")


def test_sequence_longer_than_the_position_table():
    exp = explained(TinyGPT(block_size=16), torch.randint(0, 100, (2, 20)))
    assert exp.module == "wpe" and exp.module_type == "Embedding"
    has(exp.hint, "has 16 rows (num_embeddings: ids 0..15); its input holds ids 0..19, positions: "
                  "the sequence (20) is longer than the 16 positions it holds", "crop the inputs")


def test_token_ids_beyond_the_vocabulary():
    tokens = torch.randint(0, 1000, (4, 12))
    tokens[1, 3] = 1003  # a tokenizer with a larger vocabulary
    exp = explained(BagOfWords(vocab=1000), tokens)
    assert exp.module == "embed" and shapes(exp) == [(4, 12)]
    assert exp.inputs[0][2] == "int64"
    has(exp.hint, "Embedding 'embed' has 1000 rows", "up to 1003")


def test_float_token_ids():
    tokens = torch.randint(0, 1000, (4, 12)).float()  # e.g. from a float TensorDataset
    exp = explained(BagOfWords(), tokens)
    assert exp.inputs == [("[0]", (4, 12), "float32", "cpu")]
    has(exp.hint, "looks up integer ids (int64 or int32); it got float32 (4, 12)", "x.long()")


def test_char_rnn_fed_batch_first_data():
    model = CharRNN(batch_first=False)
    x = torch.randint(0, 50, (8, 30))  # (batch, seq): what the DataLoader gives
    exp = explained(model, x, model.init_hidden(8))
    assert exp.module == "lstm" and exp.chain == [("", "CharRNN"), ("lstm", "LSTM")]
    assert shapes(exp) == [(8, 30, 16), (2, 8, 32), (2, 8, 32)]
    assert [i for i, *_ in exp.inputs] == ["[0]", "[1][0]", "[1][1]"]
    has(exp.hint, "batch_first=False", "reads its input (8, 30, 16) as (sequence=8, batch=30",
        "hidden state it was given has batch 8", "batch_first=True")


def test_lstm_built_batch_first_fed_sequence_first_data():
    model = CharRNN(batch_first=True)
    x = torch.randint(0, 50, (30, 8))  # (seq, batch) from a time-major loader
    exp = explained(model, x, model.init_hidden(8))
    has(exp.hint, "batch_first=True", "(batch=30, sequence=8", "sequence-first", "x.transpose(0, 1)")


def test_sensor_data_with_channels_before_time():
    exp = explained(SensorLSTM(channels=6), torch.randn(4, 6, 50))  # (batch, channels, time)
    assert exp.module == "rnn" and exp.module_type == "GRU"
    has(exp.hint, "expects 6 features in the last dimension of its input (input_size); it got 50",
        "dimension 1 is 6")


def test_transformer_encoder_fed_batch_first_with_a_padding_mask():
    model = TextEncoderClassifier(batch_first=False)
    tokens = torch.randint(0, 100, (4, 10))
    mask = torch.zeros(4, 10, dtype=torch.bool)
    exp = explained(model, tokens, padding_mask=mask)
    assert exp.module == "encoder.layers.0.self_attn"
    assert exp.chain == [("", "TextEncoderClassifier"), ("encoder", "TransformerEncoder"),
                         ("encoder.layers.0", "TransformerEncoderLayer"),
                         ("encoder.layers.0.self_attn", "MultiheadAttention")]
    # what the attention received: the encoder turned the bool mask into a float one
    assert ("['key_padding_mask']", (4, 10), "float32", "cpu") in exp.inputs
    has(exp.hint, "batch_first=False", "the query (4, 10, 32)", "key_padding_mask (4, 10) has batch 4",
        "batch_first=True")


def test_multihead_attention_with_the_wrong_embedding_size():
    block = CrossAttentionBlock(d_query=48, d_model=64)
    exp = explained(block, torch.randn(2, 5, 48), torch.randn(2, 7, 64))
    assert exp.module == "attn" and shapes(exp)[:3] == [(2, 5, 48), (2, 7, 64), (2, 7, 64)]
    assert ("['need_weights']" not in [i for i, *_ in exp.inputs])  # non-tensors are not listed
    has(exp.hint, "expects query vectors of size 64 (embed_dim)", "it got 48")


@pytest.mark.parametrize("target, words", [
    (torch.randint(0, 10, (16,)).float(), ["wants class indices as an int64 target", "float32",
                                           "target.long()"]),
    (torch.randint(0, 10, (16, 1)), ["a target of shape (16,)", "(16, 1)", "target.squeeze(1)"]),
    (F.one_hot(torch.randint(0, 10, (16,)), 10), ["class probabilities", "target.argmax(1)"]),
    (torch.randint(0, 10, (8,)), ["got 16 rows of scores", "but 8 targets"]),
    (torch.randint(1, 11, (16,)), ["scores for 10 classes (indices 0..9); the target holds 10",
                                   "1-based"]),
])
def test_cross_entropy_targets(target, words):
    logits = SmallCNN(classes=10).classifier[2](torch.randn(16, 64))
    target[0] = 10 if "1-based" in words else target[0]
    exp = explained(nn.CrossEntropyLoss(), logits, target)
    assert exp.module == "" and exp.chain == [("", "CrossEntropyLoss")]
    assert shapes(exp) == [(16, 10), tuple(target.shape)]
    has(exp.hint, *words)


def test_language_model_loss_with_classes_last():
    model = TinyGPT(vocab=100)
    idx = torch.randint(0, 100, (2, 16))
    logits = model(idx)  # (batch, seq, vocab)
    exp = explained(nn.CrossEntropyLoss(), logits, idx)
    has(exp.hint, "reads its input (2, 16, 100) as (batch, classes=16, ...)",
        "input.transpose(1, 2)", "input.reshape(-1, 100), target.reshape(-1)")


def test_nll_loss_with_one_based_labels():
    log_probs = F.log_softmax(torch.randn(6, 4), dim=1)
    exp = explained(nn.NLLLoss(), log_probs, torch.tensor([1, 2, 3, 4, 1, 2]))
    assert exp.module_type == "NLLLoss"
    has(exp.hint, "scores for 4 classes (indices 0..3); the target holds 4", "targets range 1..4")


def test_binary_losses():
    logits = torch.randn(16, 1)  # a Linear(…, 1) head
    labels = torch.randint(0, 2, (16,))
    has(explained(nn.BCEWithLogitsLoss(), logits, labels.float()).hint,
        "needs a target shaped like its input (16, 1); the target is (16,)", "input.squeeze(-1)")
    has(explained(nn.BCEWithLogitsLoss(), logits.squeeze(1), labels).hint,
        "needs a floating-point target", "int64", "target.float()")
    has(explained(nn.BCELoss(), logits.squeeze(1) * 3, labels.float()).hint,
        "expects probabilities in [0, 1]", "look like logits", "BCEWithLogitsLoss")


def test_half_precision_input_to_a_float32_model():
    model = SmallCNN()
    exp = explained(model, torch.randn(2, 3, 16, 16).half())
    assert exp.module == "features.0" and exp.inputs[0][2] == "float16"
    has(exp.hint, "Conv2d 'features.0' has float32 parameters; its input [0] is float16",
        "torch.autocast")


def test_float64_numpy_features_into_a_linear_model():
    features = torch.from_numpy(np.random.rand(32, 20))  # float64, numpy's default
    exp = explained(MultiTask(), features)
    assert exp.module == "trunk.0"
    has(exp.hint, "float32 parameters; its input [0] is float64", "x.float()")


def test_a_numpy_array_given_where_a_tensor_is_needed():
    exp = explained(nn.Sequential(nn.Linear(20, 4)), np.random.rand(8, 20))
    assert exp.module == "0" and exp.inputs == [("[0]", (8, 20), "numpy float64", "numpy")]
    has(exp.hint, "was given a numpy.ndarray", "torch.from_numpy")


def test_parameters_on_the_meta_device():
    with torch.device("meta"):
        model = MultiTask()  # built without memory (as for a large checkpoint), never materialised
    exp = explained(model, torch.randn(4, 20))
    assert exp.module == "trunk.0" and exp.params[0] == ("weight", (32, 20), "float32", "meta")
    has(exp.hint, "Linear 'trunk.0' has its parameters on the meta device", "to_empty")


def test_layers_in_a_plain_list_were_not_moved_by_to():
    class Net(nn.Module):
        def __init__(self):
            super().__init__()
            self.inp = nn.Linear(8, 16)
            self.blocks = [nn.Linear(16, 16) for _ in range(2)]  # the bug: not a ModuleList

        def forward(self, x):
            x = self.inp(x)
            for block in self.blocks:
                x = block(x)
            return x

    model = Net().to("meta")  # stands in for .cuda(): moves registered layers only
    exp = explained(model, torch.randn(2, 8, device="meta"))
    assert exp.module == "blocks[0]" and exp.chain == [("", "Net"), ("blocks[0]", "Linear")]
    has(exp.hint, "parameters on cpu while its input [0] is on meta", "not a registered submodule",
        "nn.ModuleList")


def test_a_head_in_a_module_dict():
    exp = explained(MultiTask(), torch.randn(4, 20))
    assert exp.module == "heads.species"
    assert exp.chain == [("", "MultiTask"), ("heads.species", "Linear")]
    has(exp.hint, "expects the last dimension of its input to be 16 (in_features); it got 32")


def test_structured_inputs_and_keyword_arguments():
    model = MultiModal(fused_in=80)
    batch = {"image": torch.randn(2, 3, 4, 4), "tokens": torch.randint(0, 100, (2, 6))}
    mask = torch.ones(2, 999)  # the bug: a mask for another width
    exp = explained(model, batch, dropout_mask=mask)
    assert exp.module == "fusion" and exp.chain == [("", "MultiModal"), ("fusion", "Fusion")]
    assert exp.inputs == [("[0]['image']", (2, 48), "float32", "cpu"),
                          ("[0]['text']", (2, 32), "float32", "cpu"),
                          ("['mask']", (2, 999), "float32", "cpu")]
    has(exp.hint, "joint = joint * mask", "dimension 1 differ (80 vs 999)")


def test_a_shared_module_is_named_by_the_path_on_the_stack():
    model = Seq2Seq(vocab=60)
    src, tgt = torch.randint(0, 60, (2, 5)), torch.randint(0, 60, (2, 4))
    tgt[0, 0] = 61
    exp = explained(model, src, tgt)
    assert exp.module == "decoder.embed"
    assert exp.chain == [("", "Seq2Seq"), ("decoder", "Decoder"), ("decoder.embed", "Embedding")]
    assert exp.aliases == ["encoder.embed"]
    assert "shared  also reachable as 'encoder.embed'" in str(exp)


def test_a_forward_called_directly():
    class Wrapper(nn.Module):
        def __init__(self):
            super().__init__()
            self.inner = nn.Linear(4, 2)

        def forward(self, x):
            return self.inner.forward(x)  # no Module.__call__ for the inner layer

    exp = explained(Wrapper(), torch.randn(3, 5))
    assert exp.module == "inner" and exp.chain == [("", "Wrapper"), ("inner", "Linear")]
    assert shapes(exp) == [(3, 5)]


def test_data_parallel_in_single_card_mode_names_the_path_as_the_inspector_does():
    single_card.enable(torch.device("cpu"))
    try:
        dp = nn.DataParallel(ResNetish(widths=(16, 64), head_features=32), device_ids=[0, 1])
        exp = explained(dp, torch.randn(2, 3, 16, 16))
    finally:
        single_card.disable()
    # the inspector's spelling (from the wrapped model), not DataParallel's "module.head.fc"
    assert exp.module == "head.fc"
    assert exp.chain == [("", "ResNetish"), ("head", "Head"), ("head.fc", "Linear")]
    has(exp.hint, "Linear 'head.fc' expects the last dimension of its input to be 32")


def test_ddp_in_single_card_mode_names_the_path_as_the_inspector_does():
    single_card.enable(torch.device("cpu"))
    try:
        ddp = nn.parallel.DistributedDataParallel(SmallCNN())
        exp = explained(ddp, torch.randn(2, 3, 32, 32))
    finally:
        single_card.disable()
    assert exp.module == "classifier.0"
    assert exp.chain[:2] == [("", "SmallCNN"), ("features", "Sequential")] or \
        exp.chain[0] == ("", "SmallCNN")


def test_an_error_of_the_users_own_is_still_located_without_a_hint():
    class Router(nn.Module):
        def __init__(self):
            super().__init__()
            self.experts = nn.ModuleList(nn.Linear(8, 8) for _ in range(2))
            self.register_buffer("usage", torch.zeros(2))

        def forward(self, x, mode="top1"):
            if mode not in ("top1", "top2"):
                raise ValueError(f"unknown routing mode {mode!r}")
            return self.experts[0](x)

    model = nn.Sequential(nn.Linear(8, 8), Router())
    exp = scn.explain(failure(lambda: model[1](model[0](torch.randn(3, 8)), mode="top3")))
    assert exp.module == "" and exp.module_type == "Router" and exp.hint is None
    assert exp.inputs == [("[0]", (3, 8), "float32", "cpu")]
    assert exp.params == [("usage", (2,), "float32", "cpu")]
    assert "ValueError: unknown routing mode 'top3'" in str(exp)


# --- the trap's NonFiniteError ----------------------------------------------------------------


def test_non_finite_output_from_a_corrupted_weight():
    model = SmallCNN()
    with torch.no_grad():
        model.classifier[0].weight[3, 7] = float("nan")
    with scn.inspect(model, trap=True):
        error = failure(model, torch.randn(2, 3, 16, 16))
    assert isinstance(error, scn.NonFiniteError)
    exp = scn.explain(error)
    assert exp.module == "classifier.0" and shapes(exp) == [(2, 512)]
    has(exp.hint, "Linear 'classifier.0' has 1 NaN in its own weight", "corrupted")


def test_non_finite_output_made_by_the_module_itself():
    class LogFeatures(nn.Module):
        def forward(self, x):
            return torch.log(x)  # negative inputs: NaN

    model = nn.Sequential(nn.Linear(4, 4), LogFeatures(), nn.Linear(4, 2))
    with scn.inspect(model, trap=True):
        exp = scn.explain(failure(model, torch.randn(8, 4)))
    assert exp.module == "1" and exp.module_type == "LogFeatures"
    has(exp.hint, "turned finite inputs", "NaN in its output", "log or sqrt")


def test_non_finite_output_from_a_float16_overflow():
    model = nn.Sequential(nn.Linear(64, 8), nn.Linear(8, 8)).half()
    with torch.no_grad():
        model[1].weight.fill_(60.0)
    x = torch.full((2, 64), 4.0, dtype=torch.float16)
    with torch.no_grad():
        model[1].bias.zero_()
        model[0].weight.fill_(1.0)
        model[0].bias.zero_()
    with scn.inspect(model, trap=True):
        exp = scn.explain(failure(model, x))  # layer 0 gives 256 per feature; 8 x 256 x 60 > 65504
    assert exp.module == "1" and exp.inputs == [("[0]", (2, 8), "float16", "cpu")]
    has(exp.hint, "computes in float16, whose largest value is 65504", "(absmax 256)",
        "overflowed to 16 Inf in its output")


def test_non_finite_inputs_are_traced_to_before_the_module():
    class Normalise(nn.Module):
        def __init__(self):
            super().__init__()
            self.fc = nn.Linear(4, 4)

        def forward(self, x):
            return self.fc(x / x.sum(1, keepdim=True))  # division by a zero sum: Inf/NaN

    model = Normalise()
    with scn.inspect(model, trap=True):
        exp = scn.explain(failure(model, torch.zeros(2, 4)))
    assert exp.module == "fc"
    has(exp.hint, "received", "NaN", "input [0]", "before this module")


def test_non_finite_gradient_from_backward_names_the_module():
    class Magnitude(nn.Module):
        def forward(self, x):
            return torch.sqrt((x * x).sum(1, keepdim=True))  # finite at 0, its gradient is not

    model = nn.Sequential(nn.Linear(4, 4, bias=False), Magnitude())
    with torch.no_grad():
        model[0].weight.zero_()
    with scn.inspect(model, trap=True, grads=True):
        out = model(torch.randn(2, 4))
        error = failure(out.sum().backward)
    assert isinstance(error, scn.NonFiniteError) and error.io == "grad"
    exp = scn.explain(error)
    assert exp.module == "0" and exp.module_type == "Linear" and exp.inputs == []
    has(exp.hint, "The gradient of the output of '0' (Linear) held 8 NaN", "in backward", "what comes after this module")


def our_frames(error: BaseException) -> list[str]:
    package = str(scn.__file__).rsplit("/", 1)[0]
    return [f"{f.name} ({f.filename.rsplit('/', 1)[-1]})" for f in
            traceback.extract_tb(error.__traceback__) if f.filename.startswith(package)]


def trapped_at_the_optimiser_step():
    model = nn.Sequential(nn.Linear(2, 2))
    optimizer = torch.optim.SGD(model.parameters(), lr=1.0)
    with scn.inspect(model, trap=True, params=True):
        model(torch.ones(1, 2)).sum().backward()
        model[0].weight.grad.fill_(float("nan"))
        return failure(optimizer.step)


def test_a_trapped_parameter_is_named_in_a_sentence_and_listed_in_the_explanation():
    error = trapped_at_the_optimiser_step()
    assert isinstance(error, scn.NonFiniteError) and error.io == "param"
    assert str(error).startswith("4 NaN and 0 Inf in param 'weight' of '0' (Linear) at step 0")
    exp = scn.explain(error)
    assert exp.params == [("weight", (2, 2), "float32", "cpu")]
    assert "params  weight (2, 2) float32 cpu nan!×4" in str(exp)


def test_the_traps_traceback_ends_at_the_hook_torch_called_on_every_path():
    # plain python prints every frame: none of ours, the last is torch's call of our hook
    optimiser = trapped_at_the_optimiser_step()
    assert our_frames(optimiser) == []
    assert "torch" in traceback.extract_tb(optimiser.__traceback__)[-1].filename
    model = nn.Sequential(nn.Linear(2, 2))
    with scn.inspect(model, trap=True, grads=True):
        with torch.no_grad():
            model[0].bias.fill_(float("inf"))
        forward = failure(model, torch.ones(1, 2))
        model[0].bias.data.zero_()
        out = model(torch.ones(1, 2))
        zeros = out - out.detach()  # a finite loss whose backward makes NaN: 0 × (1 / 0)
        loss = torch.where(torch.ones_like(zeros, dtype=torch.bool), zeros, zeros.log()).sum()
        backward = failure(loss.backward)
    assert our_frames(forward) == []
    assert traceback.extract_tb(forward.__traceback__)[-1].line.startswith("hook_result = hook(")
    assert isinstance(backward, scn.NonFiniteError) and backward.io == "grad"
    assert our_frames(backward) == []
    assert scn.explain(forward).module == "0"  # the module calls are still on the traceback
    assert "not on the stack" in str(scn.explain(backward))  # not "none of its own"


def test_an_error_of_the_users_forward_keeps_its_whole_traceback():
    class Broken(nn.Module):
        def forward(self, x):
            raise KeyError("the user's")

    model = nn.Sequential(Broken())
    with scn.inspect(model, trap=True):
        error = failure(model, torch.ones(1))
    assert type(error) is KeyError
    assert traceback.extract_tb(error.__traceback__)[-1].name == "forward"


# --- behaviour ---------------------------------------------------------------------------------


def test_not_raised_inside_a_module_returns_none_and_says_so(capsys):
    error = failure(lambda: torch.ones(2) @ torch.ones(3))
    assert scn.explain(error) is None
    assert "was not raised inside a module's forward" in capsys.readouterr().out


def test_no_argument_explains_sys_last_value(monkeypatch, capsys):
    error = failure(SmallCNN(), torch.randn(8, 3, 32, 32))
    monkeypatch.setattr(sys, "last_value", error, raising=False)
    assert scn.explain().module == "classifier.0"
    monkeypatch.setattr(sys, "last_value", None, raising=False)
    monkeypatch.delattr(sys, "last_exc", raising=False)
    assert scn.explain() is None
    assert "no exception has been raised" in capsys.readouterr().out


def test_an_error_re_raised_outside_the_model_is_explained_from_its_cause():
    def train_step(model, x):
        try:
            return model(x)
        except RuntimeError as e:
            raise RuntimeError("training step 12 failed") from e

    exp = explained(train_step, SmallCNN(), torch.randn(8, 3, 32, 32))
    assert exp.module == "classifier.0" and exp.exception.startswith("RuntimeError: training step")


def test_the_exception_is_left_exactly_as_torch_raised_it():
    error = failure(SmallCNN(), torch.randn(8, 3, 32, 32))
    tb = error.__traceback__
    before = (type(error), error.args, "".join(traceback.format_exception(error)),
              error.__cause__, error.__context__, error.__dict__.copy())
    scn.explain(error)
    str(scn.explain(error))
    after = (type(error), error.args, "".join(traceback.format_exception(error)),
             error.__cause__, error.__context__, error.__dict__)
    assert error.__traceback__ is tb and before == after


def test_nothing_is_kept_alive_by_the_explanation():
    model = SmallCNN()
    x = torch.randn(8, 3, 32, 32)
    refs = [weakref.ref(model), weakref.ref(x), weakref.ref(model.classifier[0].weight)]
    error = failure(model, x)
    exp = scn.explain(error)
    del model, x, error
    gc.collect()
    assert [r() for r in refs] == [None, None, None]
    # and what it describes is still there
    assert exp.module == "classifier.0" and shapes(exp) == [(8, 2048)] and exp.hint
    assert all(isinstance(v, (str, tuple, type(None))) for d in exp.inputs + exp.params for v in d)


def test_renders_as_text_and_compact_html():
    exp = explained(ResNetish(widths=(16, 64), head_features=32), torch.randn(2, 3, 16, 16))
    text = str(exp)
    assert text == repr(exp)
    assert text.splitlines()[0] == "singlecard_nb.explain: Linear 'head.fc' failed"
    for words in (f"error   RuntimeError: {linear_shape_error(2, 64, 32, 10)}",
                  "chain   ResNetish › head (Head) › head.fc (Linear)", "inputs  [0] (2, 64) float32 cpu",
                  "params  weight (10, 32) float32 cpu; bias (10,) float32 cpu",
                  "hint    Linear 'head.fc' expects"):
        assert words in text
    html = exp._repr_html_()
    assert html.startswith("<div class='singlecard-explain ") and html.count("<tr>") == 6
    assert "Linear &#x27;head.fc&#x27; expects" in html and "<script" not in html


def test_html_escapes_what_it_shows():
    class Evil(nn.Module):
        def forward(self, x):
            raise ValueError("<script>alert(1)</script>")

    html = explained(Evil(), torch.ones(1))._repr_html_()
    assert "<script>" not in html and "&lt;script&gt;" in html


def test_under_torchrun_the_text_names_the_rank(monkeypatch):
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("RANK", "3")
    exp = explained(SmallCNN(), torch.randn(8, 3, 32, 32))
    assert exp.rank == 3 and str(exp).startswith("[rank 3] singlecard_nb.explain")


def test_a_broken_hint_rule_is_warned_about_and_skipped(monkeypatch):
    def broken(failure):
        raise KeyError("oops")

    monkeypatch.setattr(explain_module.hints, "RULES", [broken, *explain_module.hints.RULES])
    monkeypatch.setattr(explain_module.hints, "_broken_rules", Notices())
    with pytest.warns(UserWarning, match="hint rule broken failed"):
        exp = explained(SmallCNN(), torch.randn(8, 3, 32, 32))
    assert exp.hint is not None and "in_features" in exp.hint  # the other rules still ran


def test_shapes_and_numbers_in_hints_are_the_real_ones():
    # the same mistake at another size gives other numbers: nothing is hard-coded
    for width in (24, 40):
        model = nn.Sequential(nn.Linear(width, 3))
        exp = explained(model, torch.randn(5, width + 1))
        assert exp.hint.endswith(f"to be {width} (in_features); it got {width + 1}")
        assert math.prod(exp.params[0][1]) == 3 * width


# --- more of the rules, each in the context where it happens ------------------------------------


class PositionalEncoding(nn.Module):
    """The sinusoidal table of the PyTorch tutorial: a buffer of max_len positions."""

    def __init__(self, d_model=8, max_len=16):
        super().__init__()
        self.max_len = max_len
        position = torch.arange(max_len).unsqueeze(1)
        div = torch.exp(torch.arange(0, d_model, 2) * (-math.log(10000.0) / d_model))
        pe = torch.zeros(1, max_len, d_model)
        pe[0, :, 0::2], pe[0, :, 1::2] = torch.sin(position * div), torch.cos(position * div)
        self.register_buffer("pe", pe)

    def forward(self, x):
        return x + self.pe[:, : x.size(1)]


class Patchify(nn.Module):
    def __init__(self, patch=4):
        super().__init__()
        self.patch = patch

    def forward(self, x):
        B = x.shape[0]
        return x.reshape(B, -1, self.patch * self.patch)  # assumes H*W divisible by patch²


def _causal_attention(x):
    attn = nn.MultiheadAttention(32, 4)  # batch_first=False by default
    mask = torch.ones(x.shape[1], x.shape[1], dtype=torch.bool).triu(1)  # sized from dim 1
    return attn(x, x, x, attn_mask=mask)


@pytest.mark.parametrize("call, module, words", [
    (lambda: nn.Sequential(nn.Conv2d(3, 32, 3, padding=1), nn.GroupNorm(8, 64))(torch.randn(2, 3, 8, 8)),
     "1", ["GroupNorm '1' expects 64 channels (num_channels)", "it got 32"]),
    (lambda: nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU())(torch.randn(1, 4)),
     "1", ["training mode", "it got (1, 8)", "model.eval()"]),
    (lambda: nn.Sequential(nn.Conv2d(3, 8, 3), nn.MaxPool2d(2), nn.Conv2d(8, 8, 5))(torch.randn(1, 3, 8, 8)),
     "2", ["got an input (1, 8, 3, 3) spatially smaller than its kernel_size=(5, 5)"]),
    (lambda: _causal_attention(torch.randn(2, 10, 32)),
     "", ["batch_first=False", "reads the query (2, 10, 32) as (sequence=2, batch=10",
          "attn_mask (10, 10) is sized for sequences of 10", "batch_first=True"]),
    (lambda: nn.LSTM(8, 16, batch_first=True)(torch.randn(4, 10, 8), (torch.zeros(4, 1, 16),) * 2),
     "", ["expects a hidden state of shape (1, 4, 16)", "even with batch_first=True", "got (4, 1, 16)"]),
    (lambda: nn.GRU(8, 16)(torch.randn(4, 10, 8, 1)),
     "", ["expects a 3-D input (sequence, batch, features)", "got 4-D (4, 10, 8, 1)"]),
    (lambda: PositionalEncoding(max_len=16)(torch.randn(2, 20, 8)),
     "", ["x + self.pe[:, : x.size(1)]", "dimension 1 differ (20 vs 16)",
          "the sequence (20) is longer than max_len=16"]),
    (lambda: Patchify(4)(torch.randn(2, 3, 10, 10)),
     "", ["x.reshape(B, -1, self.patch * self.patch)", "a tensor of 600 elements to [2, -1, 16], "
          "but 600 is not a multiple of 32"]),
    (lambda: nn.BCELoss()(torch.rand(4), torch.tensor([0.0, 1.0, 2.0, 1.0])),
     "", ["expects targets in [0, 1]; the target ranges from 0 to 2"]),
    (lambda: AudioConv(1)(torch.randn(16000)),  # one raw waveform
     "net.0", ["Conv1d 'net.0' expects a 3-D batch (N, C, L) or one 2-D sample (C, L); it got a "
               "1-D input (16000,)", "x[None, None]"]),
])
def test_more_mistakes(call, module, words):
    exp = explained(call)
    assert exp.module == module
    has(exp.hint, *words)


@pytest.mark.slow
def test_under_torchrun_each_rank_explains_its_own_failure(tmp_path):
    import subprocess

    script = tmp_path / "train.py"
    script.write_text(
        "import torch\n"
        "from torch import nn\n"
        "import singlecard_nb as scn\n"
        "model = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(32, 2))\n"
        "try:\n"
        "    model(torch.randn(4, 8))\n"
        "except Exception as e:\n"
        "    print(scn.explain(e), flush=True)\n"
    )
    done = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(script)], capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    for rank in (0, 1):
        assert f"[rank {rank}] singlecard_nb.explain: Linear '2' failed" in done.stdout
    assert done.stdout.count("hint    Linear '2' expects the last dimension of its input to be 32") == 2


# --- under torch.compile ------------------------------------------------------------------------


class TwoHeads(nn.Module):
    """Two Linear layers of one class: the one that fails is told apart by `self.<name>(`."""

    def __init__(self):
        super().__init__()
        self.up = nn.Linear(32, 64)
        self.down = nn.Linear(32, 10)  # sized for 32 features, gets the 64 of `up`

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


@pytest.fixture
def quiet_dynamo():
    import logging

    torch._logging.set_logs(dynamo=logging.CRITICAL)  # its own error log, not the test's
    yield
    torch._logging.set_logs()
    torch._dynamo.reset()


def test_a_compiled_model_is_explained_at_the_module_its_tracing_failed_in(quiet_dynamo):
    model = nn.Sequential(nn.Linear(16, 32), TwoHeads())
    compiled = torch.compile(model)
    error = failure(compiled, torch.randn(4, 16))
    message = str(error)
    exp = scn.explain(error)
    assert exp.module == "1.down" and exp.module_type == "Linear"
    assert [path for path, _ in exp.chain] == ["", "1", "1.down"]
    assert "forward" in exp.where and "self.down(" in exp.where  # the traced line, not the call
    assert exp.inputs == [] and "torch.compile was tracing" in dict(exp.rows())["inputs"]
    assert ("weight", (10, 32), "float32", "cpu") in exp.params
    has(exp.hint, "expects the last dimension of its input to be 32", "got 64")
    assert "reduction dim" in exp.exception  # the error tracing met, not only dynamo's headline
    assert str(error) == message and not exp.aliases  # untouched; no '_orig_mod.' alias


def test_a_compiled_model_is_explained_also_after_dynamo_saw_other_batch_sizes(quiet_dynamo):
    # A notebook that compiled before: dynamo marks the batch size dynamic ("s33" in its message).
    # Dynamo decides that, not the backend: the eager backend spares two inductor builds (~30 s).
    for batch in (3, 5):
        torch.compile(nn.Sequential(nn.Linear(8, 4), nn.ReLU()), backend="eager")(torch.randn(batch, 8))
    error = failure(torch.compile(nn.Sequential(nn.Linear(16, 32), TwoHeads())), torch.randn(4, 16))
    assert re.search(r"\[s\d+, 64\]", str(error)), str(error)  # the symbolic size this is about
    exp = scn.explain(error)
    assert exp.module == "1.down"
    has(exp.hint, "expects the last dimension of its input to be 32", "got 64")


def test_a_compiled_reshape_is_explained_in_the_module_that_does_it(quiet_dynamo):
    class Reshaper(nn.Module):
        def forward(self, x):
            return x.view(x.shape[0], 7, -1)  # 4 x 16 cannot be viewed with 7 rows

    model = nn.Sequential(nn.Linear(16, 16), Reshaper())
    exp = scn.explain(failure(torch.compile(model), torch.randn(4, 16)))
    assert (exp.module, exp.module_type) == ("1", "Reshaper")
    assert "x.view(x.shape[0], 7, -1)" in exp.where
    has(exp.hint, "64 elements", "[4, 7, -1]")


def test_compiled_siblings_of_one_class_are_told_apart_by_their_weights(quiet_dynamo):
    model = nn.Sequential(nn.Linear(16, 32), nn.ReLU(), nn.Linear(16, 8))  # `for m in self`
    exp = scn.explain(failure(torch.compile(model), torch.randn(4, 16)))
    assert (exp.module, exp.module_type) == ("2", "Linear")
    has(exp.hint, "to be 16 (in_features)", "got 32")


def test_a_compiled_failure_no_rule_explains_says_how_to_get_its_inputs(quiet_dynamo):
    class Gate(nn.Module):
        def forward(self, x):
            return torch.where(x > 0, x, torch.zeros(3))  # (4, 16) against (3,)

    exp = scn.explain(failure(torch.compile(nn.Sequential(nn.Linear(16, 16), Gate())),
                              torch.randn(4, 16)))
    assert (exp.module, exp.module_type) == ("1", "Gate")
    has(exp.hint, "torch.compile was tracing", "force_eager")


def test_a_gradients_trap_names_only_operations_the_loss_ran():
    model = nn.Sequential(nn.Linear(2, 2))
    with scn.inspect(model, trap=True, grads=True):
        out = model(torch.ones(1, 2))
        zeros = out - out.detach()  # a finite loss whose backward makes NaN: 0 × (1 / 0)
        loss = torch.where(torch.ones_like(zeros, dtype=torch.bool), zeros, zeros.log()).sum()
        error = failure(loss.backward)
    hint = scn.explain(error).hint
    assert "include a log" in hint and "Sum" in hint
    assert "sqrt or norm at 0" not in hint  # no guess of an operation that never ran
