"""`singlecard_nb.explain` on Hugging Face models built from tiny random-weight configs (offline)."""

from __future__ import annotations

import pytest
import torch
from conftest import failure
from torch import nn

import singlecard_nb as scn


@pytest.fixture(scope="module")
def transformers():
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("HF_HUB_OFFLINE", "1")  # configs only: nothing may be downloaded
        yield pytest.importorskip("transformers", reason="transformers is in the test extra")


def bert_config(transformers, hidden=32, **overrides):
    return transformers.BertConfig(vocab_size=100, hidden_size=hidden, num_hidden_layers=2,
                                   num_attention_heads=4, intermediate_size=2 * hidden,
                                   max_position_embeddings=32, **overrides)


def test_a_head_sized_from_another_config_than_its_encoder(transformers):
    class ReviewClassifier(nn.Module):
        def __init__(self, encoder_config, head_config):
            super().__init__()
            self.encoder = transformers.BertModel(encoder_config)
            self.head = nn.Sequential(nn.Dropout(0.1), nn.Linear(head_config.hidden_size, 2))

        def forward(self, input_ids, attention_mask):
            out = self.encoder(input_ids=input_ids, attention_mask=attention_mask)
            return self.head(out.pooler_output)

    model = ReviewClassifier(bert_config(transformers, hidden=32), bert_config(transformers, hidden=64))
    ids = torch.randint(0, 100, (2, 8))
    exp = scn.explain(failure(model, input_ids=ids, attention_mask=torch.ones_like(ids)))
    assert exp.module == "head.1"
    assert exp.chain == [("", "ReviewClassifier"), ("head", "Sequential"), ("head.1", "Linear")]
    assert exp.inputs == [("[0]", (2, 32), "float32", "cpu")]
    assert exp.hint == ("Linear 'head.1' expects the last dimension of its input to be 64 "
                        "(in_features); it got 32")


def test_a_replaced_classifier_inside_a_hugging_face_model(transformers):
    model = transformers.BertForSequenceClassification(bert_config(transformers))
    model.classifier = nn.Linear(768, 3)  # sized for bert-base, on a 32-wide model
    ids = torch.randint(0, 100, (2, 8))
    exp = scn.explain(failure(model, input_ids=ids, attention_mask=torch.ones_like(ids)))
    assert exp.module == "classifier"
    assert exp.chain == [("", "BertForSequenceClassification"), ("classifier", "Linear")]
    assert "modeling_bert.py" in exp.where and "self.classifier(" in exp.where
    assert exp.hint.startswith("Linear 'classifier' expects the last dimension of its input to be 768")


def test_token_ids_from_a_larger_tokenizer(transformers):
    model = transformers.BertModel(bert_config(transformers))
    ids = torch.randint(0, 100, (2, 8))
    ids[1, 2] = 30521  # bert-base-uncased's vocabulary on a 100-token model
    exp = scn.explain(failure(model, input_ids=ids))
    assert exp.module == "embeddings.word_embeddings"
    assert exp.chain == [("", "BertModel"), ("embeddings", "BertEmbeddings"),
                         ("embeddings.word_embeddings", "Embedding")]
    assert exp.inputs == [("[0]", (2, 8), "int64", "cpu")]
    assert "has 100 rows" in exp.hint and "up to 30521" in exp.hint


def test_labels_outside_num_labels_reach_the_loss_made_in_forward(transformers):
    model = transformers.BertForSequenceClassification(bert_config(transformers, num_labels=2))
    ids = torch.randint(0, 100, (2, 8))
    exp = scn.explain(failure(model, input_ids=ids, labels=torch.tensor([0, 2])))
    if exp.module == "<CrossEntropyLoss>":  # modeling_bert makes CrossEntropyLoss() in forward
        assert exp.chain == [("", "BertForSequenceClassification"),
                             ("<CrossEntropyLoss>", "CrossEntropyLoss")]
        assert exp.inputs == [("[0]", (2, 2), "float32", "cpu"), ("[1]", (2,), "int64", "cpu")]
        assert exp.hint.startswith("CrossEntropyLoss got scores for 2 classes (indices 0..1); "
                                   "the target holds 2")
    else:  # versions that call a functional loss: the model itself is the innermost module
        assert exp.module == "" and exp.module_type == "BertForSequenceClassification"
        assert "got the class index 2 in its target" in exp.hint


def test_a_prompt_longer_than_the_position_table(transformers):
    config = transformers.GPT2Config(vocab_size=100, n_positions=16, n_embd=32, n_layer=2,
                                     n_head=4, bos_token_id=0, eos_token_id=0)
    model = transformers.GPT2LMHeadModel(config)
    exp = scn.explain(failure(model, torch.randint(0, 100, (1, 20))))
    assert exp.module == "transformer.wpe"
    assert exp.chain == [("", "GPT2LMHeadModel"), ("transformer", "GPT2Model"),
                         ("transformer.wpe", "Embedding")]
    assert "the sequence (20) is longer than the 16 positions" in exp.hint
