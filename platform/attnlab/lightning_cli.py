"""LightningCLI for fit / validate / test / predict, in subclass mode over families and data modules."""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_only

from attnlab.averaging import CheckpointAveraging
from attnlab.modules.base import FamilyModule
from attnlab.run_logging import RunOptions, build_loggers, describe_run
from attnlab.run_summary import RunSummary
from data_modules.base import TokenizedDataModule


class AttnlabCLI(LightningCLI):
    def __init__(self, args=None, run=True):
        super().__init__(
            FamilyModule,
            TokenizedDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"callbacks": [
                ModelCheckpoint(monitor="val/nll", mode="min", save_last=True, filename="best-{epoch}-{step}"),
                RunSummary(),
            ]},
            auto_configure_optimizers=False,
            load_from_checkpoint_support=False,
            seed_everything_default=0,
            # Raise instead of printing the whole usage: main() prints the message alone.
            parser_kwargs={"exit_on_error": False},
            args=args,
            run=run,
        )

    def add_arguments_to_parser(self, parser) -> None:
        parser.add_class_arguments(RunOptions, "run")
        parser.link_arguments("data.vocab_size", "model.init_args.vocab_size", apply_on="instantiate")
        parser.link_arguments("data.special_ids", "model.init_args.special_ids", apply_on="instantiate")

    def _parse_ckpt_path(self) -> None:
        """The model is built from --config; --ckpt_path only restores its state.

        (Lightning would re-parse the checkpoint's hparams as the model config, which loses the
        family's class; FamilyModule.on_load_checkpoint checks the family instead.)
        """

    def _prepare_subcommand_kwargs(self, subcommand: str) -> dict:
        """Checkpoints given with --ckpt_path load with weights_only=True unless asked otherwise:
        a checkpoint from elsewhere must not be able to run code."""
        kwargs = super()._prepare_subcommand_kwargs(subcommand)
        if "weights_only" in self._subcommand_method_arguments[subcommand] and kwargs.get("weights_only") is None:
            kwargs["weights_only"] = True
        return kwargs

    def _experiment_name(self) -> str:
        """run.name, else the config's path under experiments/ without .yaml (multi30k/decoder_only).

        The config is the last one that sets `model`: a trainer fragment added after it
        (experiments/distributed/fsdp.yaml) does not rename the run.
        """
        options = self._get(self.config, "run")
        if options.name:
            return options.name
        configs = self._get(self.config, "config") or []
        if not configs:
            return type(self.model).family
        experiments = [c for c in configs if _sets_model(c)] or configs
        path = Path(str(experiments[-1])).resolve().with_suffix("")
        parts = path.parts
        if "experiments" in parts:
            return "/".join(parts[len(parts) - parts[::-1].index("experiments"):])
        return path.name

    def instantiate_trainer(self, **kwargs):
        trainer_config = self._get(self.config_init, "trainer", default={})
        if trainer_config.get("logger") in (None, True):
            self._dump_config()
            kwargs["logger"] = build_loggers(
                self._get(self.config_init, "run"), self._experiment_name(), config=self.config_dump
            )
        return super().instantiate_trainer(**kwargs)

    @rank_zero_only
    def _summarise(self, stage: str) -> None:
        metrics = {k: float(v) for k, v in self.trainer.callback_metrics.items() if "/" in k}
        model = self.model
        if model.examples:
            print("\nexamples (source | reference | output):")
            for source, reference, output in model.examples[: model.num_examples]:
                print(f"  {source}\n    ref: {reference}\n    out: {output}")
        if metrics:
            print(f"\nfinal {stage} metrics:")
            for key in sorted(metrics):
                print(f"  {key:<24} {metrics[key]:.4f}")
        checkpoint = self.trainer.checkpoint_callback
        if stage == "fit" and checkpoint is not None and checkpoint.best_model_path:
            print(f"\nbest checkpoint: {checkpoint.best_model_path}")
        averaged = [c.path for c in self.trainer.callbacks if isinstance(c, CheckpointAveraging) and c.path]
        if stage == "fit" and averaged:
            print(f"averaged checkpoint: {averaged[0]}")
        for line in describe_run(self.trainer.loggers):
            print(line)

    def after_fit(self):
        self._summarise("fit")

    def after_validate(self):
        self._summarise("validate")

    def after_test(self):
        self._summarise("test")

    def predict(self, model, datamodule=None, **kwargs):
        """Generate for the data module's predict split and write predictions.jsonl to the run folder."""
        batches = self.trainer.predict(model, datamodule=datamodule, **kwargs)
        log_dir = self.trainer.log_dir  # a collective under DDP: every rank must ask
        self._write_predictions([row for batch in batches or [] for row in batch], log_dir)

    @rank_zero_only
    def _write_predictions(self, rows: list[dict], log_dir: str | None) -> None:
        out = Path(log_dir or ".") / "predictions.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps(row, ensure_ascii=False) + "\n")
        for row in rows[:3]:
            print(f"  {row['source']}\n    ref: {row['reference']}\n    out: {row['hypothesis']}")
        print(f"{len(rows)} predictions written to {out}")


def _sets_model(config) -> bool:
    """Whether a --config file sets `model` (an experiment) rather than only trainer settings."""
    try:
        with open(str(config), encoding="utf-8") as f:
            return "model" in (yaml.safe_load(f) or {})
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        return True
