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
    from attnlab.cli.lightning_cli import AttnlabCLI

    args = [a for c in configs for a in ("--config", str(c))]
    return AttnlabCLI(args=[*args, "--run.root", str(tmp_path), "--run.wandb", "disabled", *extra], run=False)


@pytest.mark.parametrize("family", FAMILIES)
@pytest.mark.parametrize("fragment", sorted(EXPECTED))
def test_fragment_builds_with_a_family(fragment, family, tmp_path):
    from attnlab.components.layers import TransformerLayer
    from attnlab.distributed.fsdp import layer_units

    cli = _build(tmp_path, EXPERIMENTS / family, FRAGMENTS / fragment)
    trainer, model = cli.trainer, cli.model
    strategy_name, num_nodes = EXPECTED[fragment]
    assert type(trainer.strategy).__name__ == strategy_name
    assert trainer.num_nodes == num_nodes
    # The run keeps the experiment's name: runs/<family>/..., not runs/distributed/<fragment>/...
    assert [str(logger.log_dir).split("/")[-2] for logger in trainer.loggers] == [family.removesuffix(".yaml")]
    if fragment == "fsdp.yaml":
        strategy = trainer.strategy
        assert strategy.state_dict_type == "full"
        assert strategy.activation_checkpointing is False
        # What the strategy shards as units of their own: exactly the model's transformer layers
        # (the rest is the root unit; the 2-process test below checks the units fully_shard made).
        wrapped = set(layer_units(model))
        layers = {m for m in model.modules() if isinstance(m, TransformerLayer)}
        backbone = model.backbone
        assert wrapped == layers and len(layers) == backbone.n_layers * (2 if family == "encoder_decoder.yaml" else 1)


def test_fsdp_options_reach_the_strategy(tmp_path):
    from lightning.pytorch.strategies import ModelParallelStrategy

    from attnlab.distributed.fsdp import LayerWiseFSDP

    cli = _build(tmp_path, EXPERIMENTS / "decoder_only.yaml", FRAGMENTS / "fsdp.yaml", extra=[
        "--trainer.strategy.init_args.sharding_strategy", "SHARD_GRAD_OP",
        "--trainer.strategy.init_args.activation_checkpointing", "true",
        "--trainer.strategy.init_args.state_dict_type", "sharded",
        "--trainer.precision", "bf16-mixed",
    ])
    strategy = cli.trainer.strategy
    assert isinstance(strategy, LayerWiseFSDP) and isinstance(strategy, ModelParallelStrategy)
    # SHARD_GRAD_OP: the layers keep their weights gathered from forward to backward.
    assert strategy.sharding_strategy == "SHARD_GRAD_OP" and strategy.reshard_after_forward is False
    assert strategy.state_dict_type == "sharded"
    # Which modules are recomputed: checked on the sharded model in the 2-process test below.
    assert strategy.activation_checkpointing is True
    # bf16-mixed: weights gathered and used in bf16, gradients reduced in float32 (FSDP2 has no
    # buffer dtype: buffers stay float32 and autocast casts where an op needs it).
    import torch
    from torch.distributed.fsdp import MixedPrecisionPolicy

    mixed = strategy.mixed_precision_policy
    assert isinstance(mixed, MixedPrecisionPolicy)
    assert (mixed.param_dtype, mixed.reduce_dtype, mixed.output_dtype) == (torch.bfloat16, torch.float32, None)


def test_fsdp_refuses_no_shard_and_names_ddp(tmp_path):
    """NO_SHARD keeps the whole model on every rank: that is DDP, and the error says so."""
    with pytest.raises(Exception, match="experiments/distributed/ddp.yaml"):
        _build(tmp_path, EXPERIMENTS / "decoder_only.yaml", FRAGMENTS / "fsdp.yaml",
               extra=["--trainer.strategy.init_args.sharding_strategy", "NO_SHARD"])


def test_a_misspelt_fsdp_option_fails_to_parse(tmp_path):
    with pytest.raises(Exception, match="sharding_stratgy"):
        _build(tmp_path, EXPERIMENTS / "decoder_only.yaml", FRAGMENTS / "fsdp.yaml",
               extra=["--trainer.strategy.init_args.sharding_stratgy", "FULL_SHARD"])


# ---- two CPU processes: wrapping and the evaluation gathering of a real model ---------------------

def _units(module):
    """The FSDP units inside `module` (not `module` itself)."""
    from torch.distributed.fsdp import FSDPModule

    return [m for m in module.modules() if isinstance(m, FSDPModule) and m is not module]


def _sharded(unit) -> bool:
    """FSDP2 registers DTensor shards while a unit is not gathered, plain tensors while it is."""
    from torch.distributed.tensor import DTensor

    inner = {id(p) for child in _units(unit) for p in child.parameters()}
    own = [p for p in unit.parameters() if id(p) not in inner]
    return bool(own) and all(isinstance(p, DTensor) for p in own)


def _uneven_generation(rank: int, world_size: int, store_path: str, results_path: str) -> None:
    """One rank: shard a real DecoderOnly model with LayerWiseFSDP and generate a rank-dependent
    number of tokens (as evaluation does: each rank stops when its own batch is done)."""
    import copy
    import json

    import torch
    import torch.distributed as dist
    from torch.distributed.fsdp import FSDPModule

    import attnlab
    from attnlab.components.layers import TransformerLayer
    from attnlab.distributed.fsdp import LayerWiseFSDP, layer_units
    from attnlab.generation.decoder_only import generate

    # A short timeout turns a deadlock (ranks waiting on different collectives) into an error.
    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    try:
        torch.manual_seed(0)
        module = attnlab.DecoderOnly(backbone={"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64}, vocab_size=40)
        module.eval()
        reference = copy.deepcopy(module.model).eval()
        strategy = LayerWiseFSDP()
        strategy.parallel_devices = [torch.device("cpu")] * world_size
        strategy.connect(module)
        strategy.shard(module)
        # The units fully_shard made: the LightningModule (root) and each TransformerLayer.
        units = _units(module)
        assert isinstance(module, FSDPModule)
        assert all(isinstance(u, TransformerLayer) for u in units) and len(units) == 2
        assert set(units) == set(layer_units(module))
        tokens = torch.tensor([[2, 7, 8, 9, 4]])
        with torch.no_grad():  # a forward outside evaluation: FULL_SHARD frees each layer after it
            strategy._as_root_forward(module.model, tokens)
        full_shard = all(_sharded(u) for u in units)

        prompts = [[2, 7, 8, 9, 4], [2, 10, 4]]
        steps = 3 + 5 * rank  # rank 1 runs 5 more forward passes than rank 0 (eos -1: never stops early)

        def evaluation_step():
            module.model(tokens)  # the loss forward every rank runs first
            gathered = not any(_sharded(u) for u in [module, *units])
            return generate(module.model, prompts, max_new_tokens=steps, eos_id=-1, pad_id=0), gathered

        with torch.inference_mode():  # Lightning's evaluation context on GPUs
            sharded, gathered = strategy._gathered_step(evaluation_step)
        with torch.no_grad():
            expected = generate(reference, prompts, max_new_tokens=steps, eos_id=-1, pad_id=0)
        resharded = all(_sharded(u) for u in [module, *units])
        with torch.no_grad():  # FULL_SHARD again outside evaluation: each layer freed after its forward
            strategy._as_root_forward(module.model, tokens)
        restored = all(_sharded(u) for u in units)
        dist.barrier()
        with open(f"{results_path}.{rank}", "w") as f:
            json.dump({"sharded": sharded, "expected": expected, "full_shard": full_shard, "gathered": gathered,
                       "resharded": resharded, "restored": restored}, f)
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
        assert result["full_shard"], "FULL_SHARD left a layer gathered after its forward"
        assert result["gathered"], "a unit was not gathered for the evaluation step"
        assert result["sharded"] == result["expected"]
        assert [len(ids) for ids in result["expected"]] == [3 + 5 * rank] * 2
        assert result["resharded"], "the layers stay gathered after the evaluation step"
        assert result["restored"]


def _sharded_training(rank: int, world_size: int, store_path: str, results_path: str) -> None:
    """One rank: a training step of a sharded DecoderOnly model (activation checkpointing on)
    against the same step of one unsharded copy on both ranks' examples; then clipping, the
    optimizer step and the checkpoint state (what a .ckpt file holds) against the copy's."""
    import copy
    import json

    import torch
    import torch.distributed as dist
    from lightning.pytorch.plugins.precision import Precision

    import attnlab
    from attnlab.distributed.fsdp import LayerWiseFSDP, layer_units, recomputes_in_backward

    dist.init_process_group("gloo", init_method=f"file://{store_path}", rank=rank, world_size=world_size,
                            timeout=timedelta(seconds=60))
    checks = {}
    try:
        def build():
            torch.manual_seed(0)
            module = attnlab.DecoderOnly(backbone={"d_model": 32, "n_heads": 2, "n_layers": 2, "d_ff": 64}, vocab_size=40)
            return module.eval()  # no dropout: the sharded and the unsharded runs can agree exactly

        def sharded_copy(module):
            strategy = LayerWiseFSDP(activation_checkpointing=True)
            strategy.parallel_devices = [torch.device("cpu")] * world_size
            strategy.connect(module)
            strategy.shard(module)
            optimizer = torch.optim.AdamW(module.parameters(), lr=1e-2)
            strategy.optimizers = [optimizer]
            return strategy, optimizer

        def loss_of(module, tokens):
            return module.model(tokens).float().logsumexp(-1).mean()

        module = build()
        reference = copy.deepcopy(module)
        strategy, optimizer = sharded_copy(module)
        checks["recomputed"] = {m for m in module.modules() if recomputes_in_backward(m)} == set(layer_units(module))

        tokens = torch.tensor([[2, 7, 8, 9, 4, 5], [2, 10, 4, 6, 7, 3]])
        with torch.inference_mode():  # an evaluation step first, as Lightning's sanity check runs one
            strategy._gathered_step(module.model, tokens)
        strategy._as_root_forward(loss_of, module, tokens[rank:rank + 1]).backward()
        (sum(loss_of(reference, tokens[r:r + 1]) for r in range(world_size)) / world_size).backward()
        theirs = dict(reference.named_parameters())

        def close(grads: bool) -> bool:
            ours = {n: (p.grad if grads else p).full_tensor() for n, p in module.named_parameters()}
            return all(torch.allclose(ours[n], p.grad if grads else p, rtol=1e-5, atol=1e-7) for n, p in theirs.items())

        checks["gradients"] = close(grads=True)
        # What Trainer(gradient_clip_val=0.01) calls; far below the norm, so it clips: by the
        # global norm, or the result differs from the unsharded copy's.
        Precision().clip_grad_by_norm(optimizer, 0.01)
        torch.nn.utils.clip_grad_norm_(reference.parameters(), 0.01)
        checks["clipped"] = close(grads=True)
        ref_optimizer = torch.optim.AdamW(reference.parameters(), lr=1e-2)
        optimizer.step()
        ref_optimizer.step()
        checks["stepped"] = close(grads=False)

        weights = strategy.lightning_module_state_dict()  # full on rank zero, empty elsewhere
        state = strategy.optimizer_state(optimizer)
        if rank == 0:
            ref_weights, ref_state = reference.state_dict(), ref_optimizer.state_dict()
            checks["weights"] = weights.keys() == ref_weights.keys() and all(
                torch.allclose(weights[k], v, rtol=1e-5, atol=1e-7) for k, v in ref_weights.items())
            checks["optimizer layout"] = (
                [g["params"] for g in state["param_groups"]] == [g["params"] for g in ref_state["param_groups"]]
                and state["state"].keys() == ref_state["state"].keys())
            checks["optimizer state"] = all(
                torch.allclose(torch.as_tensor(state["state"][i][k]).float(), torch.as_tensor(v).float(), rtol=1e-5, atol=1e-7)
                for i, values in ref_state["state"].items() for k, v in values.items())
            torch.save({"state_dict": weights, "optimizer_states": [state]}, f"{results_path}.ckpt")
        else:
            checks["rank zero only"] = weights == {} and not state.get("state")
        dist.barrier()

        # Reading the file back (a resume): a fresh sharded model and optimizer hold the same state.
        fresh = build()
        fresh_strategy, fresh_optimizer = sharded_copy(fresh)
        fresh_strategy.load_checkpoint(f"{results_path}.ckpt")
        ours = {n: p.full_tensor() for n, p in fresh.named_parameters()}
        mine = {n: p.full_tensor() for n, p in module.named_parameters()}
        checks["loaded weights"] = all(torch.equal(ours[n], mine[n]) for n in mine)
        reloaded = fresh_strategy.optimizer_state(fresh_optimizer)
        if rank == 0:
            checks["loaded optimizer"] = all(
                torch.equal(torch.as_tensor(reloaded["state"][i][k]), torch.as_tensor(v))
                for i, values in state["state"].items() for k, v in values.items())
        dist.barrier()
        with open(f"{results_path}.{rank}", "w") as f:
            json.dump(checks, f)
    finally:
        dist.destroy_process_group()


def test_fsdp_training_step_follows_one_process(tmp_path):
    """Sharded gradients (recomputed in backward), clipping by the global norm, the optimizer step
    and the single-file checkpoint state equal one unsharded process's; the state loads back."""
    import json

    import torch.multiprocessing as mp

    mp.spawn(_sharded_training, args=(2, str(tmp_path / "store"), str(tmp_path / "result")), nprocs=2, join=True)
    for rank in range(2):
        checks = json.loads((tmp_path / f"result.{rank}").read_text())
        expected = ["recomputed", "gradients", "clipped", "stepped", "loaded weights"]
        expected += ["weights", "optimizer layout", "optimizer state", "loaded optimizer"] if rank == 0 else ["rank zero only"]
        assert sorted(checks) == sorted(expected)
        assert [name for name, ok in checks.items() if not ok] == [], f"rank {rank}"
