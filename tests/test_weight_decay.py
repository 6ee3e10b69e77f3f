"""Weight decay by module type, not by parameter name (issue 30): every family and backbone choice
keeps its groups (and their order, which a resumed optimizer state depends on), while a renamed
norm or table and an untied output head are grouped by what they are."""
from __future__ import annotations

import itertools

import pytest
import torch
from torch import nn

from attnlab import BlockDiffusion, DecoderOnly, EncoderDecoder
from attnlab.families.optim import OptimizerConfig, build_optimizer

POSITIONAL = ("sinusoidal", "learned", "rope", "alibi", "none")


def groups(module: nn.Module) -> tuple[list[str], list[str]]:
    """(decayed, not decayed) parameter names, in the optimizer's order."""
    names = {id(p): name for name, p in module.named_parameters()}
    optimizer = build_optimizer(module, OptimizerConfig(weight_decay=0.1), lambda: 10, 16)["optimizer"]
    decay, no_decay = optimizer.param_groups
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    return [names[id(p)] for p in decay["params"]], [names[id(p)] for p in no_decay["params"]]


def by_old_rule(module: nn.Module) -> tuple[list[str], list[str]]:
    """The rule before issue 30: matrices decay unless their name says embedding or table."""
    decay, no_decay = [], []
    for name, param in module.named_parameters():
        if param.requires_grad:
            matrix = param.dim() >= 2 and "embedding" not in name and "table" not in name
            (decay if matrix else no_decay).append(name)
    return decay, no_decay


def backbones(**fixed):
    choices = dict(positional=POSITIONAL, norm=("layernorm", "rmsnorm"), norm_position=("post", "pre"),
                   activation=("relu", "gelu", "swiglu"), bias=(True, False), fused_qkv=(False, True))
    for values in itertools.product(*choices.values()):
        yield dict(d_model=16, n_heads=2, n_kv_heads=1, n_layers=1, d_ff=32, **dict(zip(choices, values)), **fixed)


@pytest.mark.parametrize("family, extra", [(DecoderOnly, {}), (BlockDiffusion, {}), (EncoderDecoder, {}),
                                           (EncoderDecoder, {"share_embeddings": False})],
                         ids=["decoder_only", "block_diffusion", "encoder_decoder", "encoder_decoder-unshared"])
def test_every_family_and_backbone_choice_keeps_its_groups(family, extra):
    for backbone in backbones():
        module = family(backbone=backbone, vocab_size=50, **extra)
        assert groups(module) == by_old_rule(module), backbone


def test_an_untied_output_projection_decays_as_the_matrix_it_is():
    """Its name (embedding.output) once kept it out: the one change for the shipped families."""
    module = DecoderOnly(backbone=dict(d_model=16, n_heads=2, n_layers=1, d_ff=32, tie_embeddings=False), vocab_size=50)
    decay, no_decay = groups(module)
    old_decay, old_no_decay = by_old_rule(module)
    assert "model.stack.embedding.output.weight" in decay
    assert "model.stack.embedding.weight" in no_decay
    assert [n for n in decay if n != "model.stack.embedding.output.weight"] == old_decay
    assert no_decay == [n for n in old_no_decay if n != "model.stack.embedding.output.weight"]


class ScaleNorm(nn.Module):
    """A normalization layer of the project's own kind, with a matrix parameter."""

    def __init__(self, d):
        super().__init__()
        self.gain = nn.Parameter(torch.ones(1, d))


class Custom(nn.Module):
    def __init__(self, d=8, vocab=20):
        super().__init__()
        self.tokens = nn.Embedding(vocab, d)  # no "embedding" in its name
        self.proj = nn.Linear(d, d)
        self.final = ScaleNorm(d)  # a norm named like anything else
        self.lm_head_table = nn.Linear(d, vocab, bias=False)  # untied output head, "table" in its name
        self.tied = nn.Linear(d, vocab, bias=False)
        self.tied.weight = self.tokens.weight  # tied to an embedding: the embedding's


def test_a_renamed_norm_a_renamed_table_and_an_untied_head_are_grouped_by_type():
    module = Custom()
    assert groups(module) == (["proj.weight", "lm_head_table.weight"],
                              ["tokens.weight", "proj.bias", "final.gain"])
