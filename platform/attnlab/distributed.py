"""Fully sharded training with one FSDP unit per transformer layer: `attnlab.distributed.LayerWiseFSDP`.

Why a strategy of our own rather than `strategy: fsdp`:

- Lightning's FSDPStrategy without an `auto_wrap_policy` makes the whole LightningModule a single
  FSDP unit, so every step gathers the whole model on every rank (no memory saved), and a policy
  (a set of classes) cannot be written in YAML. Here each `TransformerLayer` is its own unit: only
  one layer's weights are gathered at a time; embeddings, positions and the final norm stay in the
  root unit (which also keeps tied embeddings in one unit).
- Checkpoints default to `state_dict_type="full"`: one ordinary `.ckpt` file gathered on rank zero,
  with the same keys as a DDP or single-device run, so `attnlab generate`, `validate --ckpt_path`,
  `average` and `torch.load(weights_only=True)` read it unchanged (`"sharded"` writes a folder of
  per-rank shards instead, which only FSDP can read).
- Clipping by norm (`trainer.gradient_clip_val`, set by most experiments) raises in Lightning's FSDP
  precision plugin; here it clips by the global norm over all shards
  (`FullyShardedDataParallel.clip_grad_norm_` on the root unit): what one process would compute.
- Generation in evaluation (val / test / predict) makes a data-dependent number of forward passes
  on each rank (each stops when its own batch is done). FULL_SHARD gathers a layer's weights in
  every forward, so ranks would wait forever on collectives the others never make. During an
  evaluation step each layer is therefore gathered once (by the loss forward, which every rank runs)
  and kept until the step ends: evaluation holds the whole model on every rank, as DDP does.
- Precision comes from `trainer.precision` as for any strategy (`32-true`, `bf16-mixed`,
  `bf16-true`); with mixed precision FSDP gathers and computes in bf16, and `reduce_in_float32`
  (default) keeps the gradient reduction in float32, as DDP's is.

Activation checkpointing (`activation_checkpointing: true`) recomputes each layer in the backward
pass: less memory for more compute, off by default.

CPUs: Lightning refuses `strategy="fsdp"` without a GPU ("The strategy `fsdp` requires a GPU
accelerator, but received `accelerator='cpu'` ...", a check on the exact class, which this subclass
passes); torch's FSDP refuses a CPU module unless given the device ("FSDP needs a non-CPU accelerator
device, but no accelerator device is detected."), and its `offload_to_cpu`, which Lightning always
asks for when it gathers a checkpoint, frees the gathered weights when they already are on the CPU
(a segfault). This strategy passes the CPU device and gathers checkpoints without the offload there,
so FSDP runs over gloo on CPU processes: that is how the tests run it. It is never faster than DDP
on CPUs; it is for tests and debugging.
"""
from __future__ import annotations

import contextlib
import dataclasses
from datetime import timedelta
from typing import Any, Literal

import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.plugins.precision.fsdp import FSDPPrecision
from lightning.pytorch.strategies import FSDPStrategy
from torch import nn

from attnlab.components.layers import TransformerLayer

SHARDING = Literal["FULL_SHARD", "SHARD_GRAD_OP", "NO_SHARD", "HYBRID_SHARD"]


def layer_wrap_policy(layer_classes: tuple[type[nn.Module], ...] = (TransformerLayer,)):
    """The FSDP auto-wrap policy: each module of `layer_classes` becomes its own FSDP unit."""
    from torch.distributed.fsdp.wrap import ModuleWrapPolicy

    return ModuleWrapPolicy(set(layer_classes))


class _NormClippingFSDPPrecision(FSDPPrecision):
    """FSDPPrecision that clips by the global gradient norm over the shards of the root unit."""

    def __init__(self, precision, root=None):
        # No scaler argument: FSDPPrecision refuses one even for 16-mixed (it checks before it
        # sets its precision), and makes its own ShardedGradScaler there.
        super().__init__(precision)
        self._root = root  # a callable returning the strategy's wrapped model

    def clip_grad_by_norm(self, optimizer, clip_val) -> None:
        from torch.distributed.fsdp import FullyShardedDataParallel

        root = self._root() if self._root is not None else None
        if not isinstance(root, FullyShardedDataParallel):
            return super().clip_grad_by_norm(optimizer, clip_val)  # Lightning's "not supported"
        root.clip_grad_norm_(clip_val)


class LayerWiseFSDP(FSDPStrategy):
    """FSDP with one unit per `TransformerLayer`, single-file checkpoints and clipping by norm.

    From a config (experiments/distributed/fsdp.yaml)::

        trainer:
          strategy:
            class_path: attnlab.distributed.LayerWiseFSDP
            init_args: {sharding_strategy: FULL_SHARD}

    Args:
        sharding_strategy: FULL_SHARD (weights, gradients and optimizer state sharded: least
            memory), SHARD_GRAD_OP (weights kept whole from forward to backward: less
            communication), NO_SHARD (like DDP) or HYBRID_SHARD (shard within a machine,
            replicate across machines, for multi-node runs; untested here).
        state_dict_type: "full" (one checkpoint file, gathered on rank zero) or "sharded"
            (a folder of per-rank shards: faster to write for large models, only FSDP reads it).
        activation_checkpointing: recompute each TransformerLayer's activations in backward.
        cpu_offload: keep sharded weights and gradients in CPU memory between uses (GPU runs).
        reduce_in_float32: with bf16 / 16 mixed precision, reduce gradients in float32.
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
        super().__init__(
            auto_wrap_policy=layer_wrap_policy(),
            activation_checkpointing_policy={TransformerLayer} if activation_checkpointing else None,
            sharding_strategy=sharding_strategy,
            state_dict_type=state_dict_type,
            cpu_offload=cpu_offload,
            process_group_backend=process_group_backend,
            timeout=timedelta(minutes=timeout_minutes) if timeout_minutes is not None else default_pg_timeout,
        )
        self.reduce_in_float32 = reduce_in_float32

    # ---- precision: clipping by norm, float32 gradient reduction ------------------------------
    @property
    def precision_plugin(self) -> FSDPPrecision:
        return FSDPStrategy.precision_plugin.fget(self)

    @precision_plugin.setter
    def precision_plugin(self, plugin: Precision | None) -> None:
        if isinstance(plugin, FSDPPrecision) and not isinstance(plugin, _NormClippingFSDPPrecision):
            plugin = _NormClippingFSDPPrecision(plugin.precision, root=lambda: self.model)
        FSDPStrategy.precision_plugin.fset(self, plugin)

    @property
    def mixed_precision_config(self):
        config = super().mixed_precision_config
        mixed = "mixed" in str(getattr(self.precision_plugin, "precision", ""))
        if config is not None and self.mixed_precision is None and self.reduce_in_float32 and mixed:
            config = dataclasses.replace(config, reduce_dtype=torch.float32)
        return config

    # ---- evaluation: gather each layer once per step (generation makes uneven forward counts) --
    @contextlib.contextmanager
    def _layers_gathered_until_step_end(self):
        from torch.distributed.fsdp import FullyShardedDataParallel
        from torch.distributed.fsdp._flat_param import HandleShardingStrategy
        from torch.distributed.fsdp._runtime_utils import _reshard

        regather_each_forward = (HandleShardingStrategy.FULL_SHARD, HandleShardingStrategy.HYBRID_SHARD)
        units = [
            (unit, unit._handle) for unit in (self.model.modules() if self.model is not None else [])
            if isinstance(unit, FullyShardedDataParallel) and unit is not self.model
            and unit._handle is not None and unit._handle._sharding_strategy in regather_each_forward
        ]
        if not units or torch.is_grad_enabled():
            yield
            return
        saved = [handle._sharding_strategy for _, handle in units]
        for _, handle in units:
            handle._sharding_strategy = HandleShardingStrategy.SHARD_GRAD_OP  # no reshard after forward
        try:
            yield
        finally:
            for (unit, handle), strategy in zip(units, saved):
                handle._sharding_strategy = strategy
                if not handle.needs_unshard():  # still gathered: free it, as FULL_SHARD would have
                    _reshard(unit, handle, free_unsharded_flat_param=True)

    def validation_step(self, *args: Any, **kwargs: Any):
        with self._layers_gathered_until_step_end():
            return super().validation_step(*args, **kwargs)

    def test_step(self, *args: Any, **kwargs: Any):
        with self._layers_gathered_until_step_end():
            return super().test_step(*args, **kwargs)

    def predict_step(self, *args: Any, **kwargs: Any):
        with self._layers_gathered_until_step_end():
            return super().predict_step(*args, **kwargs)

    # ---- CPU processes (tests): the device given to FSDP, checkpoints gathered without offload --
    def _setup_model(self, model: nn.Module) -> nn.Module:
        from torch.distributed.fsdp import FullyShardedDataParallel

        if self.root_device.type != "cpu" or any(isinstance(m, FullyShardedDataParallel) for m in model.modules()):
            return super()._setup_model(model)
        from lightning.fabric.strategies.fsdp import _move_torchmetrics_to_device, _setup_activation_checkpointing

        # Lightning passes device_id=root_device.index, which is None on a CPU: torch refuses it.
        model = FullyShardedDataParallel(
            module=model, cpu_offload=self.cpu_offload, mixed_precision=self.mixed_precision_config,
            sharding_strategy=self.sharding_strategy, device_id=self.root_device, **self.kwargs,
        )
        _move_torchmetrics_to_device(model, self.root_device)
        _setup_activation_checkpointing(model, self._activation_checkpointing_kwargs)
        return model

    @contextlib.contextmanager
    def _gather_without_cpu_offload_on_cpu(self):
        """Lightning's full state-dict context always sets offload_to_cpu=True; on a CPU device torch
        then frees the weights it has just gathered. Swap in the same context without the offload."""
        if self.root_device.type != "cpu":
            yield
            return
        import lightning.fabric.strategies.model_parallel as fabric_model_parallel
        import lightning.pytorch.strategies.fsdp as pytorch_fsdp

        modules = (pytorch_fsdp, fabric_model_parallel)
        saved = [module._get_full_state_dict_context for module in modules]
        for module in modules:
            module._get_full_state_dict_context = _full_state_dict_context_without_offload
        try:
            yield
        finally:
            for module, original in zip(modules, saved):
                module._get_full_state_dict_context = original

    def lightning_module_state_dict(self) -> dict[str, Any]:
        with self._gather_without_cpu_offload_on_cpu():
            return super().lightning_module_state_dict()

    def optimizer_state(self, optimizer) -> dict[str, Any]:
        with self._gather_without_cpu_offload_on_cpu():
            return super().optimizer_state(optimizer)

    def load_checkpoint(self, checkpoint_path, weights_only: bool | None = None) -> dict[str, Any]:
        with self._gather_without_cpu_offload_on_cpu():
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)


def _full_state_dict_context_without_offload(module: nn.Module, world_size: int, rank0_only: bool = True):
    from torch.distributed.fsdp import FullStateDictConfig, StateDictType
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp.api import FullOptimStateDictConfig

    return FSDP.state_dict_type(
        module=module,
        state_dict_type=StateDictType.FULL_STATE_DICT,
        state_dict_config=FullStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
        optim_state_dict_config=FullOptimStateDictConfig(offload_to_cpu=False, rank0_only=rank0_only),
    )
