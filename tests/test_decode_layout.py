"""Decoding's weight layout (components/linear.py, issues 33 and 45): weights are multiplied from
an (in, out) copy in thread blocks, or a few rows as weight @ xᵀ, while a decode runs. Checked
against `F.linear` on the original weights, eagerly and inside a compiled graph, and by decoding
with and without the copies. The copies live for one decode: whatever wrote the weights before
(in place, through `.data`, load_state_dict, an optimizer, Lightning's weight averaging after a
fit), a decode multiplies the weights as they are, and no table of copies exists to go stale."""
from __future__ import annotations

import ast
import contextlib
import gc
import weakref
from pathlib import Path

import lightning as L
import pytest
import torch
import torch.nn.functional as F

import attnlab
from attnlab import BackboneConfig
from attnlab.components.linear import Linear, decode_layout, decoding_copy, rows_times
from attnlab.generation import loop
from attnlab.generation.decoder_only import generate
from attnlab.models.decoder_only import DecoderOnlyModel
from conftest import DEBUG_DATA, DEBUG_YAML, FAST_TRAINER

PACKAGE = Path(attnlab.__file__).parent


@pytest.mark.parametrize("parts", [1, 2, 4])
@pytest.mark.parametrize("rows", [1, 2, 3, 4, 17])
def test_rows_times_is_f_linear_for_any_rows_and_thread_blocks(rows, parts):
    torch.manual_seed(rows * 10 + parts)
    weight, bias, x = torch.randn(96, 32), torch.randn(96), torch.randn(rows, 1, 32)
    blocks = decoding_copy(weight, parts)
    assert blocks.shape == (parts, 32 // parts, 96)
    torch.testing.assert_close(rows_times(x, weight, blocks, bias), F.linear(x, weight, bias))
    torch.testing.assert_close(rows_times(x, weight, blocks), F.linear(x, weight))


def test_a_width_the_threads_do_not_divide_is_one_block():
    assert decoding_copy(torch.randn(30, 15), parts=2).shape == (1, 15, 30)


def test_each_thread_count_gets_its_own_blocks():
    weight = torch.nn.Parameter(torch.randn(6, 4))
    assert decoding_copy(weight, 2).shape == (2, 2, 6)
    assert decoding_copy(weight, 4).shape == (4, 1, 6)


@pytest.mark.parametrize("rows", [1, 3])
def test_the_decoding_products_compile_into_one_graph(rows):
    """fullgraph: neither the thread count nor the one-row product nor the few-row one may break
    the graph."""
    torch.manual_seed(0)
    weight, bias, x = torch.randn(64, 32), torch.randn(64), torch.randn(rows, 1, 32)
    compiled = torch.compile(rows_times, backend="aot_eager", fullgraph=True)
    torch.testing.assert_close(compiled(x, weight, decoding_copy(weight, 2), bias), F.linear(x, weight, bias))


def model(tie: bool) -> DecoderOnlyModel:
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, tie_embeddings=tie)
    return DecoderOnlyModel(cfg, vocab_size=50).eval()


@pytest.mark.parametrize("tie", [True, False])
def test_every_weight_gets_a_copy_and_only_within_the_block(tie):
    net = model(tie)
    linears = [m for m in net.modules() if isinstance(m, Linear)]
    with decode_layout(net):
        copied = {m for m in net.modules() if m.__dict__.get("decode_weight") is not None}
        with decode_layout(net):  # re-entrant: the inner block neither replaces nor removes them
            assert {m for m in net.modules() if m.__dict__.get("decode_weight") is not None} == copied
        assert all(m.__dict__.get("decode_weight") is not None for m in copied)
        assert set(linears) <= copied  # q/k/v (96 x 32), out (32 x 32), up (64 x 32) and down (32 x 64)
        embedding = net.stack.embedding
        assert (embedding in copied) == tie  # an untied table is only looked up
        for module in copied:
            torch.testing.assert_close(module.decode_weight.reshape(-1, module.weight.shape[0]), module.weight.t())
    assert not any("decode_weight" in m.__dict__ for m in net.modules())


def test_the_copies_go_when_a_decode_fails():
    net = model(True)
    with pytest.raises(RuntimeError, match="stop"):
        with decode_layout(net):
            raise RuntimeError("stop")
    assert not any("decode_weight" in m.__dict__ for m in net.modules())


@pytest.mark.parametrize("tie", [True, False])
def test_decoding_with_the_copies_gives_the_logits_of_the_module_weights(tie, monkeypatch):
    """The same decode with `decode_layout` turned off (the weights as nn.Linear keeps them): the
    same tokens and, to rounding, the same logits, at one row (the thread split) and at several."""
    net = model(tie)
    prompts = [[1, 7, 9, 11], [1, 5], [1, 8, 8], [1, 20, 21, 22, 23]]
    kwargs = dict(max_new_tokens=6, eos_id=-1, pad_id=0, return_logits=True, compact=False)
    for batch in (prompts[:1], prompts):
        tokens, logits = generate(net, batch, **kwargs)
        with monkeypatch.context() as patch:
            patch.setattr(loop, "decode_layout", lambda *_: contextlib.nullcontext())
            plain_tokens, plain_logits = generate(net, batch, **kwargs)
        assert tokens == plain_tokens
        torch.testing.assert_close(logits, plain_logits)



def test_nothing_outlives_the_decode():
    """No table keeps a copy (or its weight) once the decode is over."""
    net = model(True)
    with decode_layout(net):
        copies = [weakref.ref(m.decode_weight) for m in net.modules() if m.__dict__.get("decode_weight") is not None]
    gc.collect()
    assert copies and all(copy() is None for copy in copies)
    weight = weakref.ref(net.stack.layers[0].ffn.inner.up.weight)
    generate(net, [[1, 7, 9]], max_new_tokens=3, eos_id=-1, pad_id=0)
    del net
    gc.collect()
    assert weight() is None


# ---- a decode multiplies the weights as they are now -----------------------------------------

PROMPTS = [[1, 7, 9, 11], [1, 5], [1, 8, 8]]


def _decodes(net, monkeypatch) -> dict:
    """Tokens and logits of greedy decoding at one row and at three: with the copies, and with
    `F.linear` on the module weights (`decode_layout` turned off), the eager reference."""
    out = {}
    kwargs = dict(max_new_tokens=6, eos_id=-1, pad_id=0, return_logits=True, compact=False)
    for batch in (PROMPTS[:1], PROMPTS):
        with monkeypatch.context() as patch:
            patch.setattr(loop, "decode_layout", lambda *_: contextlib.nullcontext())
            out[len(batch), "eager"] = generate(net, batch, **kwargs)
        out[len(batch), "laid out"] = generate(net, batch, **kwargs)
    return out


def _write_under_no_grad(net):
    with torch.no_grad():
        net.stack.layers[0].ffn.inner.up.weight.mul_(2)


def _optimizer_step(net):
    net.zero_grad()
    net(torch.tensor([[1, 2, 3]])).sum().backward()
    torch.optim.AdamW(net.parameters(), lr=0.1).step()


def _load_state_dict(net):
    net.load_state_dict({k: 0.9 * v + 0.01 for k, v in net.state_dict().items()})


def _new_data(net):
    up = net.stack.layers[0].ffn.inner.up
    up.weight.data = up.weight.detach() * 3


def _copy_through_data(net):
    """What Lightning's weight averaging does: neither the storage nor the version counter moves."""
    for weight in net.parameters():
        weight.data.copy_(torch.randn_like(weight))


@pytest.mark.parametrize("change", [_write_under_no_grad, _optimizer_step, _load_state_dict, _new_data,
                                    _copy_through_data])
def test_a_decode_after_a_change_of_the_weights_decodes_the_new_weights(change, monkeypatch):
    """Decoded once, changed, decoded again: the second decode equals `F.linear` on the changed
    weights (and differs from the first, so a copy of the old weights would be caught)."""
    net = model(True)
    before = _decodes(net, monkeypatch)
    change(net)
    after = _decodes(net, monkeypatch)
    for rows in (1, 3):
        tokens, logits = after[rows, "laid out"]
        eager_tokens, eager_logits = after[rows, "eager"]
        assert tokens == eager_tokens
        torch.testing.assert_close(logits, eager_logits)
        assert not torch.allclose(logits, before[rows, "laid out"][1], atol=1e-3), "the change changed nothing"


class DecodesAfterEachStep(L.Callback):
    """Records the weights after each optimizer step and decodes with them (as a callback logging
    samples would): a decode between the last step and the end of fit."""

    def __init__(self):
        self.seen: list[dict[str, torch.Tensor]] = []

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        self.seen.append({k: v.detach().clone() for k, v in pl_module.model.named_parameters()})
        generate(pl_module.model, PROMPTS, max_new_tokens=4, eos_id=-1, pad_id=pl_module.special.pad)


def _reference(module, weights) -> DecoderOnlyModel:
    net = DecoderOnlyModel(module.backbone, module.vocab_size, module.special.pad).eval()
    net.load_state_dict(weights, strict=False)  # parameters; the buffers are the model's own
    return net


@pytest.mark.parametrize("callback,options", [
    ("WeightAveraging", []),  # the mean of the weights after every step
    ("EMAWeightAveraging", ["--trainer.callbacks.decay", "0.5"]),
])
def test_a_model_that_averaged_its_weights_in_fit_decodes_the_average(callback, options, tmp_path):
    """Lightning's weight averaging writes the average into the weights at the end of fit, through
    `.data`. The model then decodes what a fresh model loaded with the averaged weights decodes,
    not the weights of the last step (which it decoded during fit)."""
    from attnlab.cli.lightning_cli import AttnlabCLI

    cli = AttnlabCLI(args=["--config", str(DEBUG_YAML), "--run.root", str(tmp_path / "runs"), "--run.wandb", "disabled",
                           *FAST_TRAINER, *DEBUG_DATA, "--trainer.max_steps", "4", "--trainer.max_epochs", "2",
                           "--trainer.limit_val_batches", "0", f"--trainer.callbacks+={callback}", *options],
                     run=False)
    recorder = DecodesAfterEachStep()
    cli.trainer.callbacks.append(recorder)
    cli.trainer.fit(cli.model, datamodule=cli.datamodule)
    module = cli.model.eval()
    assert len(recorder.seen) == 4
    if callback == "WeightAveraging":
        average = {k: torch.stack([w[k] for w in recorder.seen]).mean(0) for k in recorder.seen[0]}
    else:
        average = dict(recorder.seen[0])  # the first update copies the weights
        for weights in recorder.seen[1:]:
            average = {k: 0.5 * average[k] + 0.5 * weights[k] for k in average}
    final = dict(module.model.named_parameters())
    for name, expected in average.items():
        torch.testing.assert_close(final[name].detach(), expected, rtol=1e-5, atol=1e-6)

    kwargs = dict(max_new_tokens=6, eos_id=-1, pad_id=module.special.pad, return_logits=True, compact=False)
    tokens, logits = generate(module.model, PROMPTS, **kwargs)
    averaged = {k: v.detach().clone() for k, v in module.model.named_parameters()}
    reference_tokens, reference_logits = generate(_reference(module, averaged), PROMPTS, **kwargs)
    assert tokens == reference_tokens
    torch.testing.assert_close(logits, reference_logits, rtol=0, atol=0)
    _, last_logits = generate(_reference(module, recorder.seen[-1]), PROMPTS, **kwargs)
    assert not torch.allclose(last_logits, logits, atol=1e-4), "the average decodes as the last weights do"


# ---- no hidden state -------------------------------------------------------------------------

def test_no_tensor_version_counter_is_read_anywhere():
    """Whether a weight changed is never guessed from `Tensor._version` (a decode copies the
    weights as they are instead)."""
    offenders = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            attribute = (isinstance(node, ast.Attribute) and node.attr == "_version"  # not a CLI's own self._version
                         and not (isinstance(node.value, ast.Name) and node.value.id == "self"))
            literal = isinstance(node, ast.Constant) and node.value == "_version"
            if attribute or literal:
                offenders.append(f"{path.relative_to(PACKAGE)}:{node.lineno}")
    assert not offenders


def test_the_decoding_layout_keeps_no_table():
    """components/linear.py binds nothing at module level but constants, functions and classes,
    declares no global, and no module of the package keeps a weak table keyed by objects."""
    linear = PACKAGE / "components" / "linear.py"
    tree = ast.parse(linear.read_text(encoding="utf-8"))
    for node in tree.body:
        if isinstance(node, (ast.Assign, ast.AnnAssign)):
            assert isinstance(node.value, ast.Constant), f"linear.py:{node.lineno} binds a {type(node.value).__name__}"
        else:
            assert isinstance(node, (ast.Import, ast.ImportFrom, ast.FunctionDef, ast.ClassDef, ast.Expr)), node.lineno
    assert not [n for n in ast.walk(tree) if isinstance(n, (ast.Global, ast.Nonlocal))]
    weak_tables = [f"{p.relative_to(PACKAGE)}" for p in PACKAGE.rglob("*.py")
                   if any(name in p.read_text(encoding="utf-8")
                          for name in ("WeakIdKeyDictionary", "WeakKeyDictionary", "WeakValueDictionary"))]
    assert not weak_tables
