"""The mistakes real code makes, reproduced in the shape of the issue threads they come from, each
with the hint that names the module and what to change (before: none, vague or wrong)."""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from conftest import failure
from torch import nn

import singlecard_nb as scn
from singlecard_nb.diagnosis.described import values_text


@pytest.fixture(scope="module")
def transformers():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # configs only: nothing may be downloaded
        yield pytest.importorskip("transformers", reason="transformers is in the test extra")


@pytest.fixture(scope="module")
def bert(transformers):
    config = transformers.BertConfig(vocab_size=100, hidden_size=32, num_hidden_layers=1,
                                     num_attention_heads=4, intermediate_size=64,
                                     max_position_embeddings=32)
    return transformers.BertModel(config).eval()


def test_bert_input_longer_than_max_position_embeddings(bert):
    # before: no hint ("The expanded size of the tensor (40) must match the existing size (32)")
    ids = torch.randint(0, 100, (2, 40))
    exp = scn.explain(failure(bert, input_ids=ids))
    assert exp.module == "embeddings"
    assert exp.hint.startswith("BertEmbeddings 'embeddings' holds 32 positions "
                               "(max_position_embeddings=32); its input ['input_ids'] (2, 40) "
                               "is token ids for sequences of 40: truncate the inputs to 32 tokens")


def test_a_4d_attention_mask_of_the_wrong_length(bert):
    # before: "combines tensors whose dimension 3 differ (8 vs 10)", inside sdpa
    ids = torch.randint(0, 100, (2, 8))
    exp = scn.explain(failure(bert, input_ids=ids, attention_mask=torch.ones(2, 1, 1, 10)))
    assert exp.module == "encoder.layer.0.attention.self"
    assert exp.hint.startswith(
        "BertSelfAttention 'encoder.layer.0.attention.self' got hidden states (2, 8, 32) for "
        "sequences of 8 tokens and a 4-D attention mask (2, 1, 1, 10) for keys of length 10 "
        "(the attention_mask given to BertModel is (2, 1, 1, 10))")
    assert "pass the tokenizer's 2-D (batch, 8) attention_mask" in exp.hint


class Up(nn.Module):
    def __init__(self, channels):
        super().__init__()
        self.up = nn.ConvTranspose2d(2 * channels, channels, 2, stride=2)
        self.conv = nn.Conv2d(2 * channels, channels, 3, padding=1)

    def forward(self, x, skip):
        x = self.up(x)
        x = torch.cat([x, skip], dim=1)
        return self.conv(x)


class UNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.down = nn.Conv2d(3, 4, 3, padding=1)
        self.pool = nn.MaxPool2d(2)
        self.mid = nn.Conv2d(4, 8, 3, padding=1)
        self.up1 = Up(4)

    def forward(self, x):
        skip = self.down(x)
        return self.up1(self.mid(self.pool(skip)), skip)


def test_a_unet_skip_connection_off_by_one():
    # before: no hint ("Sizes of tensors must match except in dimension 1")
    exp = scn.explain(failure(UNet(), torch.randn(2, 3, 25, 25)))  # 25 -> 12 -> 24
    assert exp.module == "up1"
    assert exp.hint.startswith("In the forward of Up 'up1', `x = torch.cat([x, skip], dim=1)`")
    assert ("tensor 1 in the list has size 25 where the first has 24: off by one, as when an odd "
            "size (25) is halved by pooling or a stride-2 layer and doubled back (its up, "
            "ConvTranspose2d, makes the doubled size): pad or crop") in exp.hint


class Features(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 5)
        self.fc = nn.Linear(144, 10)  # sized for the folded rows, as the thread's author did

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)  # (N, 6, 12, 12)
        x = x.view(-1, 144)
        return self.fc(x)


def test_view_minus_one_folds_features_into_the_batch():
    # before: "got 60 rows of scores but 10 targets" and nothing on why
    model, criterion = Features(), nn.CrossEntropyLoss()

    def train_step(x, y):
        return criterion(model(x), y)  # the loss alone is on the stack: the model is a neighbour

    exp = scn.explain(failure(train_step, torch.randn(10, 1, 28, 28), torch.randint(0, 10, (10,))))
    assert exp.module == "" and exp.module_type == "CrossEntropyLoss"
    assert exp.hint == (
        "CrossEntropyLoss got 60 rows of scores (input (60, 10)) but 10 targets (target (10,)): "
        "60 is 6 × 10, as when a reshape with -1 in the batch position folds each sample's "
        "features into the batch; `x = x.view(-1, 144)` in the forward of Features 'model' does "
        "that; keep the batch dimension with x.view(x.size(0), -1) (or x.flatten(1)) and size "
        "the Linear after it for the features of one sample")


class Classifier(nn.Module):
    def __init__(self):
        super().__init__()
        self.conv = nn.Conv2d(1, 6, 5)
        self.fc = nn.Linear(6 * 12 * 12, 10)

    def forward(self, x):
        x = F.max_pool2d(F.relu(self.conv(x)), 2)
        return self.fc(x.flatten(1))


def test_one_image_without_its_batch_dimension():
    # before: "expects the last dimension of its input to be 864 (in_features); it got 144" only,
    # which sends people to resize fc
    exp = scn.explain(failure(Classifier(), torch.randn(1, 28, 28)))
    assert exp.module == "fc"
    assert exp.hint == (
        "Linear 'fc' expects the last dimension of its input to be 864 (in_features); it got "
        "144, but its input (6, 144) holds exactly 864 values, one sample's: Classifier was "
        "called with (1, 28, 28), one sample without its batch dimension, which Conv2d reads as "
        "unbatched, so the flatten before Linear 'fc' spread its 6 channels over the batch; add "
        "the batch dimension: x.unsqueeze(0) (or x[None])")
    batched = scn.explain(failure(Classifier(), torch.randn(2, 1, 32, 32)))  # a real size error
    assert "batch dimension" not in batched.hint


class ListNet(nn.Module):
    def __init__(self):
        super().__init__()
        self.embed = nn.Linear(4, 8)
        self.layers = [nn.Linear(8, 8), nn.Linear(8, 2)]  # a plain list: not submodules

    def forward(self, x):
        x = self.embed(x)
        for layer in self.layers:
            x = layer(x)
        return x


def test_layers_in_a_plain_list_after_double():
    # before: "numpy arrays are float64 by default: use x.float()"
    model = ListNet().double()
    exp = scn.explain(failure(model, torch.randn(3, 4, dtype=torch.float64)))
    assert exp.module == "layers[0]"
    assert exp.hint == (
        "Linear 'layers[0]' has float32 parameters; its input [0] is float64: 'layers' is a "
        "plain Python list of ListNet, not a registered submodule, so model.double() converted "
        "the rest of the model but not layers[0] (nor does .to() move it, or the optimizer see "
        "it); hold the layers in nn.ModuleList (or nn.ModuleDict)")
    assert "numpy" not in exp.hint


def test_multihead_attention_keywords_with_batch_first_tensors():
    # before: "reshapes a tensor of 384 elements to [2, 40, 4]" (torch's own view inside MHA)
    attention = nn.MultiheadAttention(16, 4)  # batch_first=False
    queries, memory = torch.randn(2, 10, 16), torch.randn(2, 12, 16)  # (batch, length, E)
    exp = scn.explain(failure(attention, query=queries, key=memory, value=memory))
    assert exp.hint == (
        "MultiheadAttention has batch_first=False, so it reads the query (2, 10, 16) as "
        "(sequence=2, batch=10, ...) and the key (2, 12, 16) as batch 12, but their dimension 0 "
        "agrees (2): the data look batch-first, so build the MultiheadAttention with "
        "batch_first=True (or pass x.transpose(0, 1))")
    # the other way round: sequence-first data into a batch_first=True layer
    attention = nn.MultiheadAttention(16, 4, batch_first=True)
    exp = scn.explain(failure(attention, query=queries.transpose(0, 1),
                              key=memory.transpose(0, 1), value=memory.transpose(0, 1)))
    assert exp.hint.startswith("MultiheadAttention has batch_first=True, so it reads the query "
                               "(10, 2, 16) as (batch=10, sequence=2, ...)")


def test_inputs_show_their_values_lovely_tensors_style():
    x = torch.tensor([[-2.0, 0.5, float("nan")], [3.0, float("inf"), float("nan")]])
    exp = scn.explain(failure(nn.Linear(4, 2), x))
    assert exp.values == {"[0]": "x∈[-2, 3] nan!×2 inf!"}
    assert "[0] (2, 3) float32 cpu x∈[-2, 3] nan!×2 inf!" in repr(exp)
    assert values_text(torch.tensor([3, 7, 5])) == "x∈[3, 7]"
    assert values_text(torch.full((4,), float("nan"))) == "nan!×4"
    assert values_text(torch.tensor([True, False, True])) == "2 True"
    assert values_text(torch.empty(0)) is None
    assert values_text(torch.empty(2, device="meta")) is None


def test_no_values_are_read_after_a_cuda_error_or_out_of_memory():
    class Failing(nn.Module):
        def __init__(self, message):
            super().__init__()
            self.message = message

        def forward(self, x):
            raise RuntimeError(self.message)

    for message in ("CUDA error: device-side assert triggered", "CUDA out of memory. Tried"):
        exp = scn.explain(failure(Failing(message), torch.ones(2)))
        assert exp.inputs == [("[0]", (2,), "float32", "cpu")] and exp.values == {}
