"""A word-level LSTM language model in the shape of pytorch/examples' word_language_model:
RNNModel (an Embedding encoder, dropout, an LSTM, a Linear decoder) initialised uniform(-0.1,
0.1) with the decoder's bias at zero, batchified data cut into bptt-long chunks, the hidden
state carried over and detached between chunks (repackage_hidden), cross-entropy, plain SGD at
the example's lr 20 with clip_grad_norm_ 0.25 (the example updates p.data by hand; this script
uses torch.optim.SGD, the same update). The corpus is made in the script: sentences of a tiny
grammar.

    python healthy_lstm_lm.py --steps 300
"""

import argparse

import torch
import torch.nn as nn
import torch.nn.functional as F


class RNNModel(nn.Module):
    def __init__(self, ntoken, ninp, nhid, nlayers, dropout=0.2):
        super().__init__()
        self.ntoken = ntoken
        self.drop = nn.Dropout(dropout)
        self.encoder = nn.Embedding(ntoken, ninp)
        self.rnn = nn.LSTM(ninp, nhid, nlayers, dropout=dropout)
        self.decoder = nn.Linear(nhid, ntoken)
        self.nlayers, self.nhid = nlayers, nhid
        self.init_weights()

    def init_weights(self):
        initrange = 0.1
        nn.init.uniform_(self.encoder.weight, -initrange, initrange)
        nn.init.zeros_(self.decoder.bias)
        nn.init.uniform_(self.decoder.weight, -initrange, initrange)

    def forward(self, input, hidden):
        emb = self.drop(self.encoder(input))
        output, hidden = self.rnn(emb, hidden)
        output = self.drop(output)
        decoded = self.decoder(output).view(-1, self.ntoken)
        return F.log_softmax(decoded, dim=1), hidden

    def init_hidden(self, bsz):
        weight = next(self.parameters())
        return (weight.new_zeros(self.nlayers, bsz, self.nhid),
                weight.new_zeros(self.nlayers, bsz, self.nhid))


def make_corpus(n_words, generator):
    """Token ids of sentences 'the <noun> <verb> the <noun> .' over a vocabulary of 20."""
    nouns, verbs = list(range(3, 11)), list(range(11, 19))
    ids = []
    while len(ids) < n_words:
        pick = lambda xs: xs[int(torch.randint(len(xs), (1,), generator=generator))]  # noqa: E731
        ids += [0, pick(nouns), pick(verbs), 0, pick(nouns), 1]
    return torch.tensor(ids[:n_words])


def batchify(data, bsz):
    nbatch = data.size(0) // bsz
    return data.narrow(0, 0, nbatch * bsz).view(bsz, -1).t().contiguous()


def repackage_hidden(h):
    if isinstance(h, torch.Tensor):
        return h.detach()
    return tuple(repackage_hidden(v) for v in h)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=20)
    parser.add_argument("--lr", type=float, default=20)
    parser.add_argument("--clip", type=float, default=0.25)
    parser.add_argument("--bptt", type=int, default=8)
    parser.add_argument("--batch_size", type=int, default=10)
    args = parser.parse_args()
    torch.manual_seed(1111)
    generator = torch.Generator().manual_seed(1111)
    train_data = batchify(make_corpus(6000, generator), args.batch_size)
    ntokens = 20
    model = RNNModel(ntokens, 32, 32, 2)
    criterion = nn.NLLLoss()
    optimizer = torch.optim.SGD(model.parameters(), lr=args.lr)
    model.train()
    hidden = model.init_hidden(args.batch_size)
    i, step = 0, 0
    while step < args.steps:
        if i >= train_data.size(0) - 1 - args.bptt:
            i, hidden = 0, model.init_hidden(args.batch_size)
        data, targets = train_data[i:i + args.bptt], train_data[i + 1:i + 1 + args.bptt].reshape(-1)
        model.zero_grad()
        hidden = repackage_hidden(hidden)
        output, hidden = model(data, hidden)
        loss = criterion(output, targets)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), args.clip)
        optimizer.step()
        if step % 100 == 0 or step == args.steps - 1:
            print(f"step {step}: loss {loss.item():.3f}")
        i += args.bptt
        step += 1


if __name__ == "__main__":
    main()
