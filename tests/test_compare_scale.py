"""compare() on what real runs differ in: the training flag, a dtype (fp32 against bf16 autocast,
named where it first changes), and a plot of 1 000 modules that stays legible."""

from __future__ import annotations

import copy

import matplotlib

matplotlib.use("Agg")

import torch  # noqa: E402
from matplotlib.backends.backend_agg import FigureCanvasAgg  # noqa: E402
from torch import nn  # noqa: E402

import singlecard_nb as scn  # noqa: E402


class Block(nn.Module):
    """nanoGPT's shape: LayerNorm, c_attn, GELU MLP, with dropout on the residual branches."""

    def __init__(self, n: int = 16):
        super().__init__()
        self.ln_1 = nn.LayerNorm(n)
        self.c_attn = nn.Linear(n, 3 * n)
        self.c_proj = nn.Linear(n, n)
        self.drop = nn.Dropout(0.2)
        self.ln_2 = nn.LayerNorm(n)
        self.mlp = nn.Sequential(nn.Linear(n, 4 * n), nn.GELU(), nn.Linear(4 * n, n))

    def forward(self, x):
        q, k, v = self.c_attn(self.ln_1(x)).chunk(3, dim=-1)
        att = torch.softmax(q @ k.transpose(-1, -2) / 4, dim=-1)
        x = x + self.drop(self.c_proj(att @ v))
        return x + self.drop(self.mlp(self.ln_2(x)))


class TinyGPT(nn.Module):
    def __init__(self, layers: int = 3):
        super().__init__()
        self.wte = nn.Embedding(50, 16)
        self.h = nn.ModuleList(Block() for _ in range(layers))
        self.ln_f = nn.LayerNorm(16)
        self.lm_head = nn.Linear(16, 50)

    def forward(self, idx):
        x = self.wte(idx)
        for block in self.h:
            x = block(x)
        return self.lm_head(self.ln_f(x))


def record(model: nn.Module, autocast: bool = False, train: bool = False) -> scn.Inspector:
    model.train(train)
    idx = torch.randint(0, 50, (2, 12), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)  # the same dropout masks where both runs are in training mode
    with scn.inspect(model, grads=True) as insp:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
            logits = model(idx)
        logits.float().logsumexp(-1).mean().backward()
    return insp


def gpt() -> TinyGPT:
    torch.manual_seed(0)
    return TinyGPT()


def test_dropout_left_on_in_one_run_is_a_structural_difference():
    cmp = scn.compare(record(gpt()), record(gpt(), train=True))
    note = next(n for n in cmp.notes if n.startswith("training mode differs"))
    assert "first: step 0, '' input [0]: a in eval mode, b in training mode" in note
    assert ("the first that computes differently in training: step 0, 'h.0.drop' output "
            "(Dropout)") in note
    assert "call model.eval() (or .train()) the same way in both runs" in note
    # where they first diverge, the headline says why
    assert cmp.first.module == "h.0.drop"
    assert repr(cmp).splitlines()[0].endswith("(training False vs True)")
    row = cmp.frame().query("module == 'h.0.drop' and io == 'output'").iloc[0]
    assert "training False vs True" in row["note"]


def test_fp32_against_bf16_names_the_first_layer_that_changes_dtype():
    fp32, bf16 = record(gpt()), record(gpt(), autocast=True)
    cmp = scn.compare(fp32, bf16)  # the defaults: rtol=1e-3
    # wte (Embedding) and ln_1 (LayerNorm) stay float32 under autocast: c_attn is the first
    assert cmp.dtype_change == "step 0, 'h.0.c_attn' (Linear) output: float32 vs bfloat16"
    assert any(n.startswith("dtype first differs at step 0, 'h.0.c_attn' (Linear) output")
               for n in cmp.notes)
    # bfloat16 rounding is within a tolerance sized for bfloat16: nothing is named "first"
    assert cmp.rtol == 4 * 2.0 ** -7 and cmp.first is None
    assert repr(cmp).startswith("a and b agree within rtol=0.03125")
    # ... and a real difference still is: one weight 10% off
    changed = gpt()
    with torch.no_grad():
        changed.h[1].mlp[0].weight.mul_(1.1)
    assert scn.compare(fp32, record(changed, autocast=True)).first.module.startswith("h.1.mlp")
    # same dtypes: the tolerance asked for
    assert scn.compare(fp32, fp32).rtol == 1e-3


def test_the_plot_of_a_thousand_modules_stays_legible():
    torch.manual_seed(0)
    a_model = nn.Sequential(*[m for _ in range(500) for m in (nn.Linear(4, 4), nn.Tanh())])
    b_model = copy.deepcopy(a_model)
    with torch.no_grad():
        b_model[700].weight.mul_(1.5)
    x = torch.randn(3, 4)
    runs = []
    for model in (a_model, b_model):
        with scn.inspect(model) as insp:
            model(x)
        runs.append(insp)
    cmp = scn.compare(*runs)
    assert cmp.first.module == "700"
    fig = cmp.plot()
    ax = fig.axes[0]
    canvas = FigureCanvasAgg(fig)
    canvas.draw()
    renderer = canvas.get_renderer()
    # dots, not piled symbols
    assert all(line.get_markersize() <= 2 for line in ax.get_lines() if line.get_marker() != "None")
    # as many names as fit, none over another, the first divergence's among them, in red
    labels = [t for t in ax.get_xticklabels() if t.get_text()]
    assert 20 <= len(labels) <= 41
    boxes = sorted((t.get_window_extent(renderer) for t in labels), key=lambda b: b.x0)
    assert all(left.x1 <= right.x0 + 1 for left, right in zip(boxes, boxes[1:]))
    first = next(t for t in labels if t.get_text() == "700")
    assert first.get_color() == "#d62728"
    assert "of 1001 modules named" in ax.get_xlabel()
    # the "first" label sits above the axes: it covers no marker
    text = next(t for t in ax.texts if t.get_text().startswith("first: step 0 output of 700"))
    assert text.get_window_extent(renderer).y0 >= ax.get_window_extent(renderer).y1
