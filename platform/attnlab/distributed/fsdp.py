"""Fully sharded training on FSDP2 (`fully_shard`), one unit per transformer layer: LayerWiseFSDP.

Our own strategy because Lightning's ModelParallelStrategy leaves `fully_shard` to each module's
`configure_model`; this one shards every family unchanged, runs each step as the root unit's
forward, and keeps what a DDP run gives: single-file checkpoints in DDP's layout, clipping by the
global norm, float32 gradient reduction under bf16-mixed. Evaluation steps gather every unit once
(ranks generate different numbers of tokens, so a gather per forward would deadlock). On CPU
processes it runs over gloo, which is how the tests run it; it is never faster than DDP there.
"""
from __future__ import annotations

import functools
import shutil
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable, Literal

import torch
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from torch import nn

from attnlab.components.layers import TransformerLayer
from attnlab.errors import ConfigError

SHARDING = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]
_SHARDINGS = ("FULL_SHARD", "SHARD_GRAD_OP", "HYBRID_SHARD")


def layer_units(module: nn.Module) -> list[nn.Module]:
    """The submodules that become their own FSDP unit (and that activation checkpointing
    recomputes): every TransformerLayer. The rest of `module` forms the root unit."""
    return [m for m in module.modules() if isinstance(m, TransformerLayer)]


def recompute_in_backward(layer: nn.Module) -> None:
    """Activation checkpointing of one layer: with gradients enabled its forward keeps no
    activations and backward recomputes them (`torch.utils.checkpoint`, non-reentrant). The
    layer's own forward is wrapped on the instance, so parameter names and the class stay as
    they are and FSDP's hooks (which gather the weights before the recomputation) run outside."""
    if recomputes_in_backward(layer):
        return
    from torch.utils.checkpoint import checkpoint

    forward = layer.forward

    @functools.wraps(forward)
    def recomputed(*args, **kwargs):
        if not torch.is_grad_enabled():  # evaluation, generation: nothing to keep for backward
            return forward(*args, **kwargs)
        return checkpoint(forward, *args, use_reentrant=False, **kwargs)

    recomputed.recomputes_in_backward = True
    layer.forward = recomputed


def recomputes_in_backward(module: nn.Module) -> bool:
    return getattr(vars(module).get("forward"), "recomputes_in_backward", False)


class LayerWiseFSDP(ModelParallelStrategy):
    """FSDP2 with one unit per `TransformerLayer`, single-file checkpoints and clipping by norm.

    From a config (experiments/distributed/fsdp.yaml)::

        trainer:
          strategy:
            class_path: attnlab.distributed.LayerWiseFSDP
            init_args: {sharding_strategy: FULL_SHARD}

    Args:
        sharding_strategy: FULL_SHARD (weights, gradients and optimizer state sharded: least
            memory), SHARD_GRAD_OP (each layer's weights kept gathered from forward to backward:
            less communication) or HYBRID_SHARD (shard within a machine, replicate across
            machines: for multi-node runs). NO_SHARD raises a ConfigError: use DDP.
        state_dict_type: "full" (one checkpoint file, gathered on rank zero) or "sharded" (a
            folder of per-rank shards: faster to write for large models, only FSDP reads it).
        activation_checkpointing: recompute each TransformerLayer's activations in backward.
        cpu_offload: keep sharded weights, gradients and optimizer state in CPU memory, the
            optimizer step running there (GPU runs; nothing to offload on CPUs).
        reduce_in_float32: with bf16-mixed precision, reduce gradients in float32.
        process_group_backend: "nccl" or "gloo"; default: nccl on GPUs, gloo on CPUs.
        timeout_minutes: how long a rank waits for the others in a collective (default 30).
    """

    def __init__(
        self,
        sharding_strategy: SHARDING = "FULL_SHARD",
        state_dict_type: Literal["full", "sharded"] = "full",
        activation_checkpointing: bool = False,
        cpu_offload: bool = False,
        reduce_in_float32: bool = True,
        process_group_backend: str | None = None,
        timeout_minutes: float | None = None,
    ) -> None:
        if sharding_strategy == "NO_SHARD":
            raise ConfigError(
                "LayerWiseFSDP sharding_strategy NO_SHARD would keep the whole model on every rank: that is "
                "DDP; use --config experiments/distributed/ddp.yaml (trainer.strategy: ddp) instead")
        if sharding_strategy not in _SHARDINGS:
            raise ConfigError(f"LayerWiseFSDP sharding_strategy {sharding_strategy!r} is not one of {', '.join(_SHARDINGS)}")
        if state_dict_type not in ("full", "sharded"):
            raise ConfigError(f"LayerWiseFSDP state_dict_type {state_dict_type!r} must be 'full' or 'sharded'")
        timeout = {} if timeout_minutes is None else {"timeout": timedelta(minutes=timeout_minutes)}
        super().__init__(save_distributed_checkpoint=state_dict_type == "sharded",
                         process_group_backend=process_group_backend, **timeout)
        self.sharding_strategy = sharding_strategy
        self.state_dict_type = state_dict_type
        self.activation_checkpointing = activation_checkpointing
        self.cpu_offload = cpu_offload
        self.reduce_in_float32 = reduce_in_float32
        self.fsdp_mesh = None  # the mesh the units are sharded over, built with the process group
        self._fitting = True  # set by `setup`: a checkpoint's optimizer state is loaded when fitting

    # ---- what `fully_shard` is given -------------------------------------------------------------
    @property
    def reshard_after_forward(self) -> bool:
        """For the layer units; the root keeps its weights from forward to backward."""
        return self.sharding_strategy != "SHARD_GRAD_OP"

    @property
    def mixed_precision_policy(self):
        """Under bf16-mixed: gather and compute in bf16, reduce in float32 (`reduce_in_float32`).
        Inputs are not cast: Lightning's autocast decides each op's precision, as under DDP."""
        from torch.distributed.fsdp import MixedPrecisionPolicy

        precision = str(getattr(self.precision_plugin, "precision", ""))
        if not precision.endswith("-mixed"):
            return None  # 32-true; bf16-true has converted the weights themselves
        return MixedPrecisionPolicy(
            param_dtype=torch.bfloat16 if precision.startswith("bf16") else torch.float16,
            reduce_dtype=torch.float32 if self.reduce_in_float32 else None,
            cast_forward_inputs=False,
        )

    def _build_mesh(self):
        from torch.distributed.device_mesh import init_device_mesh

        world = torch.distributed.get_world_size()
        device = self.root_device.type
        if self.sharding_strategy != "HYBRID_SHARD":
            return init_device_mesh(device, (world,), mesh_dim_names=("shard",))
        if world % self.num_nodes:
            raise ConfigError(f"HYBRID_SHARD needs the same number of processes on each of the {self.num_nodes} nodes")
        return init_device_mesh(device, (self.num_nodes, world // self.num_nodes), mesh_dim_names=("replicate", "shard"))

    def shard(self, module: nn.Module) -> nn.Module:
        """Apply FSDP in place: each of `layer_units(module)`, then `module` itself as the root."""
        from torch.distributed.fsdp import CPUOffloadPolicy, fully_shard

        if self.fsdp_mesh is None:
            self.fsdp_mesh = self._build_mesh()
        options: dict[str, Any] = {"mesh": self.fsdp_mesh}
        if self.cpu_offload and self.root_device.type != "cpu":
            options["offload_policy"] = CPUOffloadPolicy()
        if (policy := self.mixed_precision_policy) is not None:
            options["mp_policy"] = policy
        for layer in layer_units(module):
            if self.activation_checkpointing:
                recompute_in_backward(layer)
            fully_shard(layer, reshard_after_forward=self.reshard_after_forward, **options)
        return fully_shard(module, reshard_after_forward=False, **options)

    # ---- set-up ----------------------------------------------------------------------------------
    def setup_environment(self) -> None:
        super().setup_environment()  # the process group (and Lightning's own mesh, unused here)
        self.fsdp_mesh = self._build_mesh()
        if self.process_group_backend == "gloo":
            _pause_at_exit_for_gloo()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.num_nodes * self.num_processes, "rank": self.global_rank}

    def setup(self, trainer) -> None:
        """ModelParallelStrategy.setup, with the sharding applied here instead of by the module.
        Sharded from where the module was built (the CPU): FSDP moves one unit at a time to the
        device, so no rank ever holds the whole model."""
        from torch.distributed.fsdp import FSDPModule

        assert self.model is not None and self.accelerator is not None
        self.accelerator.setup(trainer)
        if not any(isinstance(m, FSDPModule) for m in self.model.modules()):  # once (fit, then test)
            self.model = self.precision_plugin.convert_module(self.model)
            self.shard(self.model)
            _move_metrics(self.model, self.root_device)
        self.barrier()
        self._fitting = trainer.state.fn == TrainerFn.FITTING
        if self._fitting:
            self.setup_optimizers(trainer)
        self.setup_precision_plugin()

    # ---- steps: each runs as the root's forward --------------------------------------------------
    def _as_root_forward(self, step: Callable, *args: Any, **kwargs: Any):
        """Call `step` through the root module's `__call__`, so FSDP's root hooks run around it
        (gathering the root unit's weights, preparing backward), whatever the step calls inside."""
        from torch.distributed.fsdp import FSDPModule

        root = self.model
        if not isinstance(root, FSDPModule):
            return step(*args, **kwargs)
        own = vars(root).get("forward")

        def restore() -> None:
            if own is None:
                vars(root).pop("forward", None)
            else:
                vars(root)["forward"] = own

        def forward(*a: Any, **k: Any):
            restore()  # a step that calls the module itself reaches its own forward
            return step(*a, **k)

        vars(root)["forward"] = forward
        try:
            return root(*args, **kwargs)
        finally:
            restore()

    def _gathered_step(self, step: Callable, *args: Any, **kwargs: Any):
        """An evaluation step: every unit gathered once before it and freed after it, so the step
        makes no collective of FSDP's, however many forward passes it runs."""
        from lightning_utilities.core.apply_func import apply_to_collection
        from torch.distributed.fsdp import FSDPModule

        if torch.is_inference_mode_enabled():  # Lightning's evaluation context on GPUs
            with torch.inference_mode(False), torch.no_grad():
                args, kwargs = apply_to_collection((args, kwargs), torch.Tensor, torch.Tensor.clone)
                return self._gathered_step(step, *args, **kwargs)
        root = self.model
        if not isinstance(root, FSDPModule):
            return step(*args, **kwargs)
        units = [m for m in root.modules() if isinstance(m, FSDPModule) and m is not root]

        def gathered(*a: Any, **k: Any):  # inside the root's forward: the root is gathered
            for unit in units:
                unit.set_reshard_after_forward(False, recurse=False)
                unit.unshard()
            try:
                return step(*a, **k)
            finally:
                for unit in units:
                    unit.reshard()
                    unit.set_reshard_after_forward(self.reshard_after_forward, recurse=False)

        try:
            return self._as_root_forward(gathered, *args, **kwargs)
        finally:
            root.reshard()

    def training_step(self, *args: Any, **kwargs: Any):
        return self._as_root_forward(super().training_step, *args, **kwargs)

    def validation_step(self, *args: Any, **kwargs: Any):
        return self._gathered_step(super().validation_step, *args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any):
        return self._gathered_step(super().test_step, *args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any):
        return self._gathered_step(super().predict_step, *args, **kwargs)

    # ---- checkpoints: single files in the layout of a DDP run ------------------------------------
    # The weights: ModelParallelStrategy.lightning_module_state_dict (get_model_state_dict, full on
    # rank zero or sharded). The optimizer state and reading a single file are done here.
    def optimizer_state(self, optimizer) -> dict[str, Any]:
        """The full optimizer state on rank zero (empty elsewhere), numbered like torch's own
        `Optimizer.state_dict()` (parameters in param_groups order), as a DDP run writes it."""
        if self.state_dict_type != "full":
            return super().optimizer_state(optimizer)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            get_optimizer_state_dict,
        )

        optimizer = getattr(optimizer, "optimizer", optimizer)  # a LightningOptimizer's own
        state = get_optimizer_state_dict(self.model, optimizer, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
        return _numbered(state) if "param_groups" in state else state

    def save_checkpoint(self, checkpoint: dict[str, Any], filepath, storage_options: Any | None = None) -> None:
        """A sharded checkpoint goes to a step folder of its own, committed by a rename once every
        rank has written (attnlab.checkpoints.sharded_steps); a full one is a single file as before."""
        if self.state_dict_type != "sharded":
            return super().save_checkpoint(checkpoint, filepath, storage_options)
        from attnlab.checkpoints import sharded_steps

        folder, step = Path(self.broadcast(str(filepath))), int(checkpoint["global_step"])
        if self.is_global_zero:
            if folder.is_file():
                folder.unlink()
            shutil.rmtree(sharded_steps.pending(folder, step), ignore_errors=True)  # left by a killed save
        self.barrier("attnlab_sharded_save_start")
        super().save_checkpoint(checkpoint, sharded_steps.pending(folder, step), storage_options)
        self.barrier("attnlab_sharded_save_written")  # every rank's shards and rank zero's meta.pt are on disk
        if self.is_global_zero:
            sharded_steps.commit(folder, step)
        self.barrier("attnlab_sharded_save_committed")

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        """A single file (this strategy's, DDP's or one process's) into the shards; the optimizer
        state too when fitting. A sharded checkpoint (its newest complete step) is read by
        ModelParallelStrategy."""
        path = Path(self.broadcast(checkpoint_path))
        if path.is_dir():
            from attnlab.checkpoints import sharded_steps

            return super().load_checkpoint(sharded_steps.newest(path) or path, weights_only=weights_only)
        from torch.distributed.checkpoint.state_dict import (
            StateDictOptions,
            set_model_state_dict,
            set_optimizer_state_dict,
        )

        checkpoint = torch.load(path, map_location="cpu", mmap=True, weights_only=weights_only)
        strict = self.lightning_module.strict_loading
        set_model_state_dict(self.model, checkpoint.pop("state_dict"),
                             options=StateDictOptions(full_state_dict=True, strict=strict))
        if self._fitting and self.optimizers:  # a resume: Lightning leaves the optimizers to the strategy
            if "optimizer_states" not in checkpoint:
                raise KeyError("Trying to restore optimizer state but checkpoint contains only the model."
                               " This is probably due to `ModelCheckpoint.save_weights_only` being set to `True`.")
            for optimizer, state in zip(self.optimizers, checkpoint["optimizer_states"]):
                set_optimizer_state_dict(self.model, optimizer, _named(state, self.model, optimizer),
                                         options=StateDictOptions(full_state_dict=True, strict=strict))
        return checkpoint


def _numbered(state: dict) -> dict:
    """torch.distributed.checkpoint's optimizer state (keyed by parameter name) in torch's own
    layout: parameters numbered in the order of the optimizer's param_groups."""
    number: dict[str, int] = {}
    groups = [{**group, "params": [number.setdefault(name, len(number)) for name in group["params"]]}
              for group in state["param_groups"]]
    return {"state": {number[name]: value for name, value in state["state"].items()}, "param_groups": groups}


def _named(state: dict, model: nn.Module, optimizer) -> dict:
    """The inverse of `_numbered` for `optimizer`, whose parameters are `model`'s."""
    names = {id(p): name for name, p in model.named_parameters()}
    order = [names[id(p)] for group in optimizer.param_groups for p in group["params"]]
    saved = [len(group["params"]) for group in state["param_groups"]]
    if saved != [len(group["params"]) for group in optimizer.param_groups]:
        raise ValueError(f"the checkpoint's optimizer state has parameter groups of sizes {saved}, but the "
                         f"optimizer's are {[len(g['params']) for g in optimizer.param_groups]}")
    return {"state": {order[i]: value for i, value in state["state"].items()},
            "param_groups": [{**group, "params": [order[i] for i in group["params"]]} for group in state["param_groups"]]}


def _pause_at_exit_for_gloo() -> None:
    """The units hold their process groups, so gloo's worker threads outlive
    `destroy_process_group` until the interpreter ends. One still dropping a finished collective's
    tensors then needs the GIL as the interpreter finalizes, and the process aborts ("terminate
    called without an active exception", about 1 CPU run in 10). A short pause at exit (the GIL
    released) lets them finish first."""
    import atexit
    import time

    global _PAUSE_REGISTERED
    if not _PAUSE_REGISTERED:
        atexit.register(time.sleep, 0.1)
        _PAUSE_REGISTERED = True


_PAUSE_REGISTERED = False


def _move_metrics(module: nn.Module, device: torch.device) -> None:
    """FSDP moves parameters and buffers to the device; torchmetrics states are neither."""
    from torchmetrics import Metric

    for submodule in module.modules():
        if isinstance(submodule, Metric):
            submodule.to(device)
