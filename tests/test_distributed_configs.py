"""The distributed config fragments (experiments/distributed/*.yaml) and the per-layer FSDP strategy.

Each fragment is added with a second --config to a family's experiment; here each one is built
through the project's CLI (no training) and must give the strategy and node count it promises.
The FSDP wrap policy is checked on real attnlab models, and the evaluation gathering (generation
makes a different number of forward passes on each rank) on two real CPU processes over gloo.
The 2-process FSDP training run itself is in test_distributed.py.
"""
from __future__ import annotations

from datetime import timedelta

import pytest
import yaml

from conftest import EXPERIMENTS

FRAGMENTS = EXPERIMENTS / "distributed"
FAMILIES = ["decoder_only.yaml", "encoder_decoder.yaml", "block_diffusion.yaml"]
EXPECTED = {  # fragment: (strategy class name, num_nodes)
    "ddp.yaml": ("DDPStrategy", 1),
    "fsdp.yaml": ("LayerWiseFSDP", 1),
    "multinode.yaml": ("DDPStrategy", 2),
}


def test_every_fragment_is_listed():
    assert sorted(p.name for p in FRAGMENTS.glob("*.yaml")) == sorted(EXPECTED)


@pytest.mark.parametrize("fragment", sorted(EXPECTED))
def test_fragment_says_what_it_is_for_and_how_to_use_it(fragment):
    text = (FRAGMENTS / fragment).read_text(encoding="utf-8")
    assert text.startswith("# "), f"{fragment} should start with a comment saying what it is for"
    header = "\n".join(line for line in text.splitlines() if line.startswith("#"))
    assert f"--config experiments/distributed/{fragment}" in header
    assert set(yaml.safe_load(text)) == {"trainer"}, "a fragment sets trainer options only"


def _build(tmp_path, *configs, extra=()):
    """The CLI's model and trainer for `--config A --config B ...`, without running anything."""
    from attnlab.lightning_cli import AttnlabCLI

    args = [a for c in configs for a in ("--config", str(c))]
    return AttnlabCLI(args=[*args, "--run.root", str(tmp_path), "--run.wandb", "disabled", *extra], run=False)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fragment", sorted(EXPECTED))
def test_fragment_builds_with_a_family(fragment, family, tmp_path):
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    from attnlab.components.layers import TransformerLayer

    cli = _build(tmp_path, EXPERIMENTS / family, FRAGMENTS / fragment)
    trainer, model = cli.trainer, cli.model
    strategy_name, num_nodes = EXPECTED[fragment]
    assert type(trainer.strategy).__name__ == strategy_name
    assert trainer.num_nodes == num_nodes
    # The run keeps the experiment's name: runs/<family>/..., not runs/distributed/<fragment>/...
    assert [str(logger.log_dir).split("/")[-2] for logger in trainer.loggers] == [family.removesuffix(".yaml")]
    if fragment == "fsdp.yaml":
        strategy = trainer.strategy
        assert strategy._state_dict_type == "full"
        assert strategy._activation_checkpointing_kwargs == {}
        policy = strategy.kwargs["auto_wrap_policy"]
        assert isinstance(policy, ModuleWrapPolicy)
        # What FSDP wraps: exactly the model's transformer layers, each as its own unit.
        wrapped = set(policy._run_policy(model, set(), {}))
        layers = {m for m in model.modules() if isinstance(m, TransformerLayer)}
        backbone = model.backbone
        assert wrapped == layers and len(layers) == backbone.n_layers * (2 if family == "encoder_decoder.yaml" else 1)


def test_fsdp_options_reach_the_strategy(tmp_path):
    from lightning.pytorch.strategies import FSDPStrategy
    from torch.distributed.fsdp import ShardingStrategy

    from attnlab.components.layers import TransformerLayer

    cli = _build(tmp_path, EXPERIMENTS / "decoder_only.yaml", FRAGMENTS / "fsdp.yaml", extra=[
        "--trainer.strategy.init_args.sharding_strategy", "SHARD_GRAD_OP",
        "--trainer.strategy.init_args.activation_checkpointing", "true",
        "--trainer.strategy.init_args.state_dict_type", "sharded",
        "--trainer.precision", "bf16-mixed",
    ])
    strategy = cli.trainer.strategy
    assert isinstance(strategy, FSDPStrategy)
    assert strategy.sharding_strategy == ShardingStrategy.SHARD_GRAD_OP
    assert strategy._state_dict_type == "sharded"
    checkpointed = set(strategy._activation_checkpointing_kwargs["auto_wrap_policy"]._run_policy(cli.model, set(), {}))
    assert checkpointed == {m for m in cli.model.modules() if isinstance(m, TransformerLayer)}
    # bf16-mixed: weights gathered and used in bf16, gradients reduced in float32.
    import torch

    mixed = strategy.mixed_precision_config
    assert (mixed.param_dtype, mixed.reduce_dtype, mixed.buffer_dtype) == (torch.bfloat16, torch.float32, torch.bfloat16)


def test_a_misspelt_fsdp_option_fails_to_parse(tmp_path):
    with pytest.raises(Exception, match="sharding_stratgy"):
        _build(tmp_path, EXPERIMENTS / "decoder_only.yaml", FRAGMENTS / "fsdp.yaml",
               extra=["--trainer.strategy.init_args.sharding_stratgy", "FULL_SHARD"])


# ---- two CPU processes: wrapping and the evaluation gathering of a real model ---------------------

def _uneven_generation(rank: int, world_size: int, store_path: str, results_path: str) -> None:
    """One rank: wrap a real DecoderOnly model with LayerWiseFSDP and generate a rank-dependent
    number of tokens (as evaluation does: each rank stops when its own batch is done)."""
    import copy
    import json

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FullyShardedDataParallel
    from torch.distributed.fsdp._flat_param import HandleShardingStrategy

    import attnlab
    from attnlab.components.layers import TransformerLayer
    from attnlab.distributed import LayerWiseFSDP
    from attnlab.generation.decoder_only import generate

    # A short timeout turns a deadlock (ranks waiting on different collectives) into an error.
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        module = attnlab.DecoderOnly(backbone={"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64}, vocab_size=40)
        reference = copy.deepcopy(module.model).eval()
        strategy = LayerWiseFSDP()
        strategy.parallel_devices = [torch.device("cpu")] * world_size
        root = strategy._setup_model(module.model.eval())
        strategy.model = root
        units = [m for m in root.modules() if isinstance(m, FullyShardedDataParallel) and m is not root]
        assert {type(u.module) for u in units} == {TransformerLayer} and len(units) == 2
        assert all(u._handle._sharding_strategy == HandleShardingStrategy.FULL_SHARD for u in units)

        prompts = [[2, 7, 8, 9, 4], [2, 10, 4]]
        steps = 3 + 5 * rank  # rank 1 runs 5 more forward passes than rank 0 (eos -1: never stops early)
        with torch.no_grad():
            root(torch.tensor([[2, 7, 8, 9, 4]]))  # the loss forward every rank runs first
            with strategy._layers_gathered_until_step_end():
                sharded = generate(root, prompts, steps, eos_id=-1, pad_id=0)
            expected = generate(reference, prompts, steps, eos_id=-1, pad_id=0)
        resharded = all(u._handle.needs_unshard() for u in units)
        restored = all(u._handle._sharding_strategy == HandleShardingStrategy.FULL_SHARD for u in units)
        dist.barrier()
        with open(f"{results_path}.{rank}", "w") as f:
            json.dump({"sharded": sharded, "expected": expected, "resharded": resharded, "restored": restored}, f)
    finally:
        dist.destroy_process_group()


def test_evaluation_survives_uneven_forward_counts_across_ranks(tmp_path):
    """FULL_SHARD gathers a layer in every forward; when ranks make different numbers of forward
    passes they wait on each other forever. LayerWiseFSDP gathers each layer once per evaluation
    step and frees it after, so this completes, and generates what the unsharded model does."""
    import json

    import torch.multiprocessing as mp

    mp.spawn(_uneven_generation, args=(2, str(tmp_path / "store"), str(tmp_path / "result")), nprocs=2, join=True)
    for rank in range(2):
        result = json.loads((tmp_path / f"result.{rank}").read_text())
        assert result["sharded"] == result["expected"]
        assert [len(ids) for ids in result["expected"]] == [3 + 5 * rank] * 2
        assert result["resharded"], "the layers stay gathered after the evaluation step"
        assert result["restored"]
