"""LightningCLI for fit / validate / test / predict, in subclass mode over families and data modules."""
from __future__ import annotations

import json
from pathlib import Path

import yaml
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.utilities import rank_zero_only

from attnlab.checkpoints.atomic_io import AtomicCheckpointIO
from attnlab.checkpoints.averaging import CheckpointAveraging
from attnlab.checkpoints.checks import check_fits, load_network
from attnlab.checkpoints.reading import read_checkpoint
from attnlab.cli.config_save import AtomicConfigSave
from attnlab.cli.preflight import check_accelerator, check_run_root, check_training_budget
from attnlab.distributed.failures import ChildProcessReaper
from attnlab.errors import AttnlabError, ConfigError
from attnlab.sweeps.spec import name_under_experiments
import attnlab.families
from attnlab.families.base import FamilyModule
from attnlab.loggers.run_loggers import RunOptions, build_loggers, describe_run
from attnlab.training.preemption import Preemption
from attnlab.training.run_folder import Version, hold_run_folder, launcher_job_id, resolve_version
from attnlab.training.budget import check_budget_warmup, parse_budget
from attnlab.training.config_fingerprint import differences, fingerprint
from attnlab.training.final_validation import FinalValidation
from attnlab.training.guards import NonFiniteLossGuard
from attnlab.training.ledger import BudgetLedger
from attnlab.training.per_example import PerExampleWriter, gather_rows
from attnlab.training.resume import EpochEndResume, LastCheckpoint, RngStates, last_checkpoint
from attnlab.training.parameter_summary import ParameterSummary
from attnlab.training.run_summary import RunSummary
import data_modules
from data_modules.base import TokenizedDataModule

data_modules.load_all()  # the data modules by their short class names, as `--data GrammarDataModule`
attnlab.families.load_all()  # and the families, as `--model DecoderOnly`


class AttnlabCLI(LightningCLI):
    def __init__(self, args=None, run=True):
        super().__init__(
            FamilyModule,
            TokenizedDataModule,
            subclass_mode_model=True,
            subclass_mode_data=True,
            save_config_callback=AtomicConfigSave,
            save_config_kwargs={"overwrite": True},
            trainer_defaults={"callbacks": [
                # the best-by-run.monitor ModelCheckpoint (and EarlyStopping) join in instantiate_trainer
                LastCheckpoint(),  # last.ckpt, also mid-epoch (run.checkpoint_every_n_steps): see attnlab.training.resume
                RngStates(),
                EpochEndResume(),  # a checkpoint from an epoch's end resumes the next epoch under max_steps too
                BudgetLedger(),  # FLOPs, tokens, epochs and time spent; run.budget sets max_steps (attnlab.training.budget)
                RunSummary(),
                NonFiniteLossGuard(),
                FinalValidation(),  # a run that max_steps stops mid-epoch validates at its last step
                ChildProcessReaper(),
                PerExampleWriter(),
                Preemption(),  # SIGTERM / Ctrl-C / SIGUSR1: last.ckpt, exit 75 (checkpoint callbacks run after it)
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

    def parse_arguments(self, parser, args) -> None:
        """Parse, then read a --ckpt_path file before anything is built or written: it must load
        with weights_only=True and be attnlab's (`check_fits` later checks it against the model).

        The path is held back until `before_instantiate_classes`: the model is built from --config,
        and Lightning would otherwise re-parse the checkpoint's hparams as the model's config (which
        loses the family's class); --ckpt_path only restores state.
        """
        from attnlab.checkpoints.reading import check_ckpt_path_arg

        super().parse_arguments(parser, args)
        self._checked_ckpt = check_ckpt_path_arg(self.config)
        subcommand = self.config.get("subcommand")
        self._held_ckpt_path = self.config[subcommand].get("ckpt_path") if subcommand else None
        if self._held_ckpt_path:
            self.config[subcommand]["ckpt_path"] = None

    def before_instantiate_classes(self) -> None:
        if self._held_ckpt_path:
            self.config[self.subcommand]["ckpt_path"] = self._held_ckpt_path
        self._resolve_run_folder()

    def _resolve_run_folder(self, early: bool = True) -> None:
        """The run folder's version and, when that folder exists, its lock. A named folder
        (--run.version, a fit's job id) is resolved before the classes are built, so a second
        command on a folder in use is refused before it builds the data or prints anything; a
        timestamp only once they are built (it creates its folder, which a bad argument must not)."""
        options = self.setting(self.config, "run")
        command = self.subcommand or "fit"
        if early and not (options.version or (command == "fit" and launcher_job_id() is not None)):
            self._version = None
            return
        check_run_root(options.root)  # a root that cannot be made is named before a folder under it is tried
        name = self._experiment_name()
        self._version = resolve_version(options.version, lambda v: Path(options.root) / name / v, command=command)
        folder = Path(options.root) / name / self._version.name
        if folder.is_dir() and self.setting(self.config, "trainer", {}).get("logger") in (None, True):
            hold_run_folder(folder)

    def _before_subcommand(self) -> None:
        """What the Trainer method gets: the checkpoint `fit` resumes from, and weights_only=True
        unless asked otherwise (a checkpoint from elsewhere must not be able to run code)."""
        section = self.config_init[self.subcommand]
        if self.subcommand == "fit" and getattr(self, "_resume_from", None) is not None:
            section["ckpt_path"] = self._resume_from[0]
        if "weights_only" in section and section["weights_only"] is None:
            section["weights_only"] = True

    before_fit = before_validate = before_test = before_predict = _before_subcommand

    def setting(self, config, key: str, default=None):
        """A value of the parsed config, inside the subcommand's section when there is one."""
        return config.get(str(self.subcommand), config).get(key, default)

    def config_as_dict(self) -> dict:
        """The whole parsed config as plain data (what config.yaml holds), for the loggers."""
        dumped = yaml.safe_load(self.parser.dump(self.config, skip_link_targets=False, skip_none=False, format="yaml"))
        return dumped[self.config.subcommand] if "subcommand" in self.config else dumped

    def _experiment_name(self) -> str:
        """run.name, else the config's path under experiments/ without .yaml (multi30k/decoder_only).

        The config is the last one that sets `model`: a trainer fragment added after it
        (experiments/distributed/fsdp.yaml) does not rename the run.
        """
        options = self.setting(self.config, "run")
        if options.name:
            return options.name
        configs = self.setting(self.config, "config") or []
        if not configs:
            return _family_of(self.setting(self.config, "model").class_path)
        experiments = [c for c in configs if _sets_model(c)] or configs
        return name_under_experiments(Path(str(experiments[-1])))

    def _check_before_writing(self) -> None:
        """Mistakes caught before the run folder is written (config.yaml, loggers): no such
        accelerator, a run root that cannot be created, a learned position table too short for
        the data, a --ckpt_path that does not fit the model, `test` of data without a test split."""
        model, datamodule = self.model, self.datamodule
        trainer_config = self.setting(self.config_init, "trainer", default={})
        check_accelerator(trainer_config.get("accelerator"), trainer_config.get("devices"))
        check_run_root(self.setting(self.config_init, "run").root)
        check_training_budget(trainer_config, fit=self.subcommand == "fit")
        if self.subcommand == "test" and isinstance(datamodule, TokenizedDataModule):
            datamodule.examples("test")  # ConfigError naming the setting that adds the split
        if self.subcommand == "fit" and isinstance(datamodule, TokenizedDataModule):
            datamodule.check_token_budget()  # a max_tokens below every training example
        if isinstance(model, FamilyModule) and datamodule is not None:
            model.check_position_table(datamodule)
        checked, self._checked_ckpt = getattr(self, "_checked_ckpt", None), None
        if isinstance(model, FamilyModule) and checked is not None:
            check_fits(model, checked[1], source=f"--ckpt_path {checked[0]}")
            model.checkpoint_checked = True
        init_from = self.setting(self.config_init, "run").init_from
        if init_from and self.subcommand in ("fit", None) and isinstance(model, FamilyModule):  # None: run=False
            checkpoint = read_checkpoint(init_from, arg="run.init_from")
            load_network(model, checkpoint, f"run.init_from {init_from}", getattr(datamodule, "tokenizer", None))
            self._say(f"starting from the network weights of {init_from} ({checkpoint['attnlab']['family']})")
            self._started_from = (init_from, checkpoint)  # its cost goes to the ledger (instantiate_trainer)
        budget = parse_budget(self.setting(self.config_init, "run").budget)
        if self.subcommand == "fit" and budget is not None:
            if budget.kind == "time" and isinstance(model, FamilyModule) and model.optim.schedule == "cosine":
                raise ConfigError(f"run.budget time={budget.value!r} gives no step count for the cosine schedule to "
                                  "end at: set --model.init_args.optimizer.schedule to constant, inverse_sqrt or "
                                  "noam, or give a budget of flops, tokens or epochs")
            if budget.kind != "time" and not (isinstance(model, FamilyModule) and isinstance(datamodule, TokenizedDataModule)):
                raise ConfigError(f"run.budget {budget.kind} needs an attnlab family and data module (they know "
                                  "what a training step costs)")
            if isinstance(model, FamilyModule):
                check_budget_warmup(budget, model.optim.warmup_steps, model.optim.warmup_ratio)
        if self.subcommand == "fit" and isinstance(model, FamilyModule):
            model.check_monitor(self.setting(self.config_init, "run").monitor,
                                datamodule if isinstance(datamodule, TokenizedDataModule) else None)

    def _selection_callbacks(self) -> list:
        """The best checkpoint by run.monitor (best-{epoch}-{step}.ckpt) and, with run.patience, early stopping."""
        if self.subcommand not in ("fit", None):  # None: run=False. Evaluations choose nothing; Lightning would
            return []                              # warn that a restored ModelCheckpoint's folder changed
        options = self.setting(self.config_init, "run")
        callbacks = [ModelCheckpoint(monitor=options.monitor, mode=options.mode, filename="best-{epoch}-{step}",
                                     auto_insert_metric_name=True)]
        if options.patience is not None:
            callbacks.append(EarlyStopping(monitor=options.monitor, mode=options.mode, patience=options.patience))
        return callbacks

    def instantiate_trainer(self, **kwargs):
        self._check_before_writing()
        trainer_config = self.setting(self.config_init, "trainer", default={})
        every = self.setting(self.config_init, "run").checkpoint_every_n_steps
        budget = self.setting(self.config_init, "run").budget if self.subcommand in ("fit", None) else None
        ledger = BudgetLedger(budget, replaces=_replaced_by_budget(trainer_config, budget))
        started_from, self._started_from = getattr(self, "_started_from", None), None
        if started_from is not None:
            ledger.inherit(started_from[1], started_from[0])
        kwargs.update(budget_trainer_args(budget))
        defaults = [LastCheckpoint(every) if isinstance(c, LastCheckpoint) else ledger if isinstance(c, BudgetLedger) else c
                    for c in self.trainer_defaults["callbacks"] if type(c) not in (ModelCheckpoint, EarlyStopping, ParameterSummary)]
        self.trainer_defaults["callbacks"] = self._selection_callbacks() + defaults
        if trainer_config.get("enable_model_summary", True) is not False:  # ours instead of Lightning's default
            self.trainer_defaults["callbacks"].append(ParameterSummary())
            kwargs["enable_model_summary"] = False
        options = self.setting(self.config_init, "run")
        if self.subcommand == "fit" and isinstance(self.model, FamilyModule):
            self.model.run_config = fingerprint(self.config_as_dict())
        if self._version is None:
            self._resolve_run_folder(early=False)
        if not trainer_config.get("default_root_dir"):
            # Lightning writes (SLURM requeue's hpc_ckpt) and finds (a later SLURM job's resume)
            # checkpoints there: in the run folder, never a stale one in the working directory.
            kwargs["default_root_dir"] = str(self._run_dir())
        logged = trainer_config.get("logger") in (None, True)
        if logged:
            hold_run_folder(self._run_dir())  # a second command on this folder stops here, having written nothing
        self._resume_from = self._find_resume()
        if logged:
            kwargs["logger"] = build_loggers(
                options, self._experiment_name(), self._version.name, config=self.config_as_dict(),
                resume=self._resume_from is not None and self._resume_from[1],
            )
        kwargs["plugins"] = with_atomic_checkpoints(trainer_config.get("plugins"))
        for callback in self.trainer_defaults["callbacks"]:
            if isinstance(callback, Preemption):
                callback.resume_hint = self._resume_hint()
        trainer = super().instantiate_trainer(**kwargs)
        if self.subcommand == "fit":
            self._announce_run(trainer)
        return trainer

    def _run_dir(self) -> Path:
        """runs/<name>/<version> (the version is resolved in instantiate_trainer)."""
        return Path(self.setting(self.config_init, "run").root) / self._experiment_name() / self._version.name

    def _resume_hint(self) -> str:
        """What resumes this run folder after an interruption."""
        version: Version = self._version
        if version.source == "--run.version":
            return "the same command resumes it"
        if version.source == "timestamp":
            return f"the same command plus --run.version {version.name} resumes it"
        return f"the same command in a job with the same {version.source} resumes it (or add --run.version {version.name})"

    def _find_resume(self) -> tuple[str, bool] | None:
        """(checkpoint to resume `fit` from, whether it continues this run folder's logs), or None.

        `--run.version V` of a run folder holding checkpoints/last.ckpt resumes from it (the same
        command resumes an interrupted run); `--ckpt_path last` means that file; another
        --ckpt_path resumes from that file, continuing the run folder's logs if it has any.
        """
        if self.subcommand != "fit":
            return None
        ckpt_path, run_dir = self.setting(self.config, "ckpt_path"), self._run_dir()
        last = last_checkpoint(run_dir) if self._version.named else None
        if ckpt_path is None or str(ckpt_path) == "last":
            if last is None:
                if ckpt_path is not None:
                    named = run_dir if self._version.named else "runs/<name>/<version>"
                    self._say(f"--ckpt_path last: no {named}/checkpoints/last.ckpt "
                              "(name the run with --run.version): starting from scratch")
                return None
            checkpoint = self._check_resumable(last)
            self._say(f"resuming {run_dir} from {last} (epoch {checkpoint['epoch']}, step {checkpoint['global_step']})")
            return str(last), True
        continues = self._version.named and (run_dir / "metrics.csv").is_file()
        return str(ckpt_path), continues

    def _check_resumable(self, last: Path) -> dict:
        """The run folder's last.ckpt (returned) loads and fits the model (one line, not Lightning's
        traceback, for a damaged file or a config that changed since)."""
        try:
            checkpoint = read_checkpoint(last, arg=f"resuming {self._run_dir()}", mmap=True, sharded=True)
            if isinstance(self.model, FamilyModule):
                check_fits(self.model, checkpoint, source=str(last))
        except AttnlabError as err:
            raise AttnlabError(f"{err} (move {last} aside, or choose another --run.version, to start this run "
                               "afresh)") from None
        saved = (checkpoint.get("attnlab") or {}).get("config")
        current = getattr(self.model, "run_config", None)
        differ = differences(saved, current) if saved is not None and current is not None else []
        if differ:
            raise ConfigError(f"{self._run_dir()} holds a run of another configuration ({'; '.join(differ[:4])}"
                              + (f"; {len(differ) - 4} more" if len(differ) > 4 else "")
                              + "): rerun with the settings it was trained with to resume it, or add "
                              "--run.version NAME to start a new run in its own folder")
        return checkpoint

    @rank_zero_only
    def _say(self, line: str) -> None:
        print(line, flush=True)

    @rank_zero_only
    def _announce_run(self, trainer) -> None:
        loggers = trainer.loggers
        if not loggers or self._resume_from is not None:
            return
        print(f"run folder: {loggers[0].log_dir}; if interrupted, {self._resume_hint()}", flush=True)

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
        """Generate for the data module's predict split and write predictions.jsonl to the run folder,
        in split order (every rank's rows gathered under DDP)."""
        batches = self.trainer.predict(model, datamodule=datamodule, **kwargs)
        rows = gather_rows(self.trainer, [row for batch in batches or [] for row in batch])
        log_dir = self.trainer.log_dir  # a collective under DDP: every rank must ask
        self._write_predictions(sorted(rows, key=lambda row: row["index"]), log_dir)

    @rank_zero_only
    def _write_predictions(self, rows: list[dict], log_dir: str | None) -> None:
        out = Path(log_dir or ".") / "predictions.jsonl"
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", encoding="utf-8") as f:
            for row in rows:
                f.write(json.dumps({k: v for k, v in row.items() if k != "index"}, ensure_ascii=False) + "\n")
        for row in rows[:3]:
            print(f"  {row['source']}\n    ref: {row['reference']}\n    out: {row['hypothesis']}")
        print(f"{len(rows)} predictions written to {out}")


def with_atomic_checkpoints(plugins):
    """The trainer's plugins, with checkpoints written beside their target, flushed, then renamed
    over it (attnlab.checkpoints.atomic), unless the config brings its own CheckpointIO."""
    from lightning.fabric.plugins import CheckpointIO

    plugins = [] if plugins is None else list(plugins) if isinstance(plugins, (list, tuple)) else [plugins]
    if not any(isinstance(p, CheckpointIO) for p in plugins):
        plugins.append(AtomicCheckpointIO())
    return plugins


def budget_trainer_args(budget: dict | None) -> dict:
    """Trainer arguments a run.budget replaces: a time budget is max_time with no step or epoch
    limit; the others set max_steps at setup (BudgetLedger), so only a max_time of the config goes."""
    parsed = parse_budget(budget)
    if parsed is None:
        return {}
    if parsed.kind == "time":
        return {"max_time": parsed.value, "max_steps": -1, "max_epochs": -1}
    return {"max_time": None}


def _replaced_by_budget(trainer_config, budget: dict | None) -> str:
    """The trainer limits of the config that a run.budget overrides, as the run's line names them."""
    if budget is None:
        return ""
    limits = [(key, trainer_config.get(key)) for key in ("max_steps", "max_epochs", "max_time")]
    return ", ".join(f"trainer.{key}={value}" for key, value in limits if value not in (None, -1))


def _family_of(class_path: str) -> str:
    """The family name of a model class path (the run's name when no --config names it)."""
    import importlib

    module, _, name = class_path.rpartition(".")
    return getattr(importlib.import_module(module), name).family


def _sets_model(config) -> bool:
    """Whether a --config file sets `model` (an experiment) rather than only trainer settings."""
    try:
        with open(str(config), encoding="utf-8") as f:
            return "model" in (yaml.safe_load(f) or {})
    except (OSError, yaml.YAMLError, AttributeError, TypeError):
        return True
