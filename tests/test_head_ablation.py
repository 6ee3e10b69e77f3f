"""Head ablation: evaluations are deterministic, masks change only what they mask, a module's
mask is its sub-layer adding nothing but the output bias, and `attnlab ablate-heads` runs end to end."""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from attnlab import BlockDiffusion, DecoderOnly, EncoderDecoder
from attnlab.probes.head_ablation import ablate, apply_mask, attention_modules, evaluate, make_batches
from conftest import MAPS_RUN, png_size
from data_modules.batch import Example

EXAMPLES = [Example([7, 8, 9], [20, 21, 22, 23, 24], "", ""), Example([11, 12], [25, 26], "", ""),
            Example([13, 14, 15, 16], [27, 28, 29], "", "")]


def tiny(cls):
    torch.manual_seed(0)
    backbone = dict(d_model=32, n_heads=2, n_layers=2, d_ff=64, dropout=0.0, positional="rope")
    extra = {"block_size": 2} if cls is BlockDiffusion else {}
    module = cls(backbone=backbone, vocab_size=40, **extra).eval()
    return module, make_batches(module, EXAMPLES, batch_size=2)


def all_heads_on(module) -> bool:
    return all(not m.heads_masked and bool((m.head_mask == 1).all()) for m in attention_modules(module).values())


@pytest.mark.parametrize("cls", (DecoderOnly, BlockDiffusion))
def test_evaluation_repeats_exactly_and_a_masked_head_changes_it(cls):
    module, batches = tiny(cls)
    base = evaluate(module, batches)
    assert evaluate(module, batches) == base  # BlockDiffusion too: its noise is redrawn identically
    modules = attention_modules(module)
    apply_mask(modules, [("decoder.1.self", 0)])
    masked = evaluate(module, batches)
    apply_mask(modules, [])
    assert masked != base
    assert evaluate(module, batches) == base


def test_modules_are_named_by_stack_layer_and_kind():
    module, _ = tiny(EncoderDecoder)
    assert list(attention_modules(module)) == [
        "encoder.0.self", "encoder.1.self", "decoder.0.self", "decoder.1.self", "decoder.0.cross", "decoder.1.cross",
    ]


@pytest.mark.parametrize("name", ("encoder.1.self", "decoder.0.self", "decoder.0.cross"))
def test_masking_every_head_of_a_module_leaves_only_its_output_bias(name):
    module, batches = tiny(EncoderDecoder)
    attention = attention_modules(module)[name]
    apply_mask(attention_modules(module), [(name, h) for h in range(attention.n_heads)])
    masked = evaluate(module, batches)
    apply_mask(attention_modules(module), [])
    bias_only = lambda m, args, out: (m.out_proj.bias.expand_as(out[0]), None)  # noqa: E731
    hook = attention.register_forward_hook(bias_only)
    replaced = evaluate(module, batches)
    hook.remove()
    assert masked == pytest.approx(replaced, rel=1e-6)
    assert masked != pytest.approx(evaluate(module, batches), rel=1e-6)


def test_pruning_curve_starts_at_the_unablated_value_with_one_point_per_head():
    module, batches = tiny(EncoderDecoder)
    result = ablate(module, batches)
    n_heads = 6 * 2
    assert all_heads_on(module)
    assert result["base"] == evaluate(module, batches)
    assert len(result["heads"]) == n_heads and len(result["modules"]) == 6
    curve = result["pruning"]
    assert [p["pruned"] for p in curve] == list(range(n_heads + 1))
    assert curve[0]["value"] == result["base"] and curve[0]["head"] is None
    deltas = {f"{r['module']}:{r['head']}": r["delta"] for r in result["heads"]}
    assert [deltas[p["head"]] for p in curve[1:]] == sorted(deltas.values())  # least damaging first
    assert curve[1]["value"] == pytest.approx(result["base"] + min(deltas.values()))


# ---- the command ---------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def checkpoint(trained_run):
    return trained_run(*MAPS_RUN)[1] / "checkpoints" / "last.ckpt"


def test_ablate_heads_writes_table_json_and_png(cli, checkpoint):
    result = cli("ablate-heads", checkpoint, "--max-examples", "4")
    assert result.code == 0, result.err[-3000:]
    out = checkpoint.parent.parent / "head_ablation"
    data = json.loads((out / "head_ablation.json").read_text())
    assert data["metric"] == "nll" and data["examples"] == 4
    assert [h["module"] for h in data["heads"]] == ["decoder.0.self"] * 2  # debug.yaml: 1 layer, 2 heads
    assert len(data["pruning"]) == 3 and data["pruning"][0]["value"] == data["base"]
    table = (out / "head_ablation.md").read_text()
    assert "| decoder.0.self |" in table and "| decoder.0.self |" in result.out
    assert min(png_size(out / "pruning_curve.png")) > 100


def test_ablate_heads_help_explains(cli):
    result = cli("ablate-heads", "--help")
    assert result.code == 0 and "Michel et al." in result.out and "--max-examples" in result.out


def test_missing_checkpoint_or_config_exits_2_with_one_line(cli, checkpoint, tmp_path):
    missing = cli("ablate-heads", tmp_path / "nope.ckpt")
    assert missing.code == 2 and "nope.ckpt does not exist" in missing.err
    assert len(missing.err.strip().splitlines()) == 1
    lone = tmp_path / "elsewhere" / "x.ckpt"
    lone.parent.mkdir()
    shutil.copy(checkpoint, lone)
    no_config = cli("ablate-heads", lone)
    assert no_config.code == 2 and "config.yaml" in no_config.err and "--config" in no_config.err
    assert len(no_config.err.strip().splitlines()) == 1
    bad_config = cli("ablate-heads", lone, "--config", tmp_path / "missing.yaml")
    assert bad_config.code == 2 and "missing.yaml does not exist" in bad_config.err
