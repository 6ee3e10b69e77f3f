"""The `attnlab` command: one entry point, a verb per job.

Lightning verbs (fit / validate / test / predict) go to LightningCLI; `generate` loads a
checkpoint and translates or continues text. User mistakes print one clear line and exit 2;
`--debug` shows the traceback instead.
"""
from __future__ import annotations

import argparse
import contextlib
import gc
import os
import pickle
import re
import signal
import sys

from attnlab.cli.quiet import silence_library_noise
from attnlab.cli.runtime import tune_allocator
from attnlab.errors import AttnlabError, interrupted_status

LIGHTNING_VERBS = {
    "fit": "train a model: attnlab fit --config experiments/decoder_only.yaml",
    "validate": "evaluate on the validation split (with --ckpt_path)",
    "test": "evaluate on the test split (with --ckpt_path)",
    "predict": "generate for the test split and write predictions.jsonl",
}
OTHER_VERBS = {
    "generate": "load a checkpoint and translate / continue text from the command line or stdin",
    "average": "average the weights of checkpoints into a new one (the paper's last-5 average)",
    "sweep": "run a grid of experiments, skipping finished ones: attnlab sweep experiments/compare_families.yaml",
    "report": "turn a folder of runs into a markdown table and PNG plots: attnlab report runs/compare_families",
    "attention": "draw a checkpoint's attention for one input as PNGs (layers x heads): attnlab attention CKPT 'text'",
    "ablate-heads": "mask each attention head of a checkpoint in turn and measure the change: attnlab ablate-heads CKPT",
    "bench": "training / generation speed, MFU and attention memory against HF GPT-2 and nn.Transformer",
    "sample-quality": "generative perplexity, NFE, tokens/s and entropy of LM samples: attnlab sample-quality CKPT --scorer AR.ckpt",
}

HELP = """usage: attnlab <verb> [options]   (attnlab <verb> --help for a verb's options)

Compare and ablate transformer families (decoder-only, encoder-decoder, block diffusion).

verbs:
{verbs}

common options:
  --config FILE   an experiment YAML (see experiments/); later flags override it,
                  e.g. --trainer.max_epochs 3 --model.init_args.backbone.n_heads 4
  --debug         show full tracebacks instead of one-line errors

Runs are written to runs/<experiment>/<timestamp>/ (metrics.csv, config.yaml, checkpoints/);
wandb logs online with credentials and offline without (--run.wandb disabled turns it off).
"""


def find_user_error(err: BaseException | None) -> AttnlabError | None:
    """The AttnlabError behind an exception: jsonargparse wraps errors raised while building classes."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, AttnlabError):
            return err
        if isinstance(err, pickle.UnpicklingError):  # torch.load(weights_only=True) met code to run
            from attnlab.checkpoints.reading import unpickling_refusal

            return unpickling_refusal("(--ckpt_path)", err)
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


NOISE = ("Does not validate against any of the Union subtypes", "Subtypes:", "Errors:",
         "- Expected a <class 'NoneType'>", "Given value type:", "Given value:")


def condense_parse_error(message: str) -> str:
    """Keep what names the bad key; drop jsonargparse's account of every type it tried."""
    lines = [line for line in message.splitlines() if not line.strip().startswith(NOISE)]
    return _one_line(lines) or "\n".join(lines)


def _one_line(lines: list[str]) -> str | None:
    """jsonargparse's nested account of a bad value (`Parser key "model":` / `Problem with given
    class_path 'X':` / `Parser key "backbone.d_model":` / the problem) as one line that names the
    full key: `model.init_args.backbone.d_model: Expected a <class 'int'>. Got value: wide`."""
    key_line = re.compile(r'^Parser key "([^"]+)":$')
    class_line = re.compile(r"^Problem with given class_path '([^']+)':$")
    stripped = [line.strip().lstrip("- ").strip() for line in lines if line.strip()]
    if not stripped or not key_line.match(stripped[0]):
        return None
    keys, details, class_path, in_class = [], [], None, False
    for line in stripped:
        if m := key_line.match(line):
            keys += (["init_args"] if in_class else []) + [m.group(1)]
            in_class = False
        elif m := class_line.match(line):
            class_path, in_class = m.group(1), True
        elif not line.startswith(NOISE):
            details.append(line)
    if not details:
        return None
    if in_class and details[-1].startswith("Option '"):  # an unknown key inside the class's init_args
        keys.append("init_args")
    where = f" (class_path {class_path})" if class_path else ""
    return f"{'.'.join(keys)}: {'; '.join(details)}{where}"


def check_config_files(argv: list[str]) -> None:
    """Every `--config FILE` must parse as YAML; name the file and line (jsonargparse would not)."""
    import yaml

    from attnlab.errors import ConfigError

    for i, arg in enumerate(argv):
        if arg == "--config" and i + 1 < len(argv):
            path = argv[i + 1]
        elif arg.startswith("--config="):
            path = arg.split("=", 1)[1]
        else:
            continue
        try:
            with open(path, encoding="utf-8") as f:
                yaml.safe_load(f)
        except OSError:
            continue  # missing / unreadable, or an inline YAML string: jsonargparse reports these
        except UnicodeDecodeError as err:
            raise ConfigError(f"--config {path}: not UTF-8 text ({err.reason} at byte {err.start}); save it as UTF-8") from None
        except yaml.YAMLError as err:
            mark = getattr(err, "problem_mark", None)
            where = f", line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
            problem = getattr(err, "problem", None) or str(err).splitlines()[0]
            raise ConfigError(f"--config {path}{where}: not valid YAML ({problem}); fix the file's syntax") from None


def _help() -> str:
    verbs = {**LIGHTNING_VERBS, **OTHER_VERBS}
    width = max(map(len, verbs))
    return HELP.format(verbs="\n".join(f"  {name:<{width}} {text}" for name, text in verbs.items()))


def _generate_description(argv: list[str]) -> str:
    """The verb's description; with a checkpoint before --help, what that checkpoint does."""
    first = next((a for a in argv if not a.startswith("-")), None)
    if not ({"-h", "--help"} & set(argv)) or first is None:
        return OTHER_VERBS["generate"]
    from attnlab.checkpoints.reading import read_checkpoint

    try:
        meta = read_checkpoint(first, mmap=True)["attnlab"]
    except AttnlabError as err:
        return f"{OTHER_VERBS['generate']}\n({err})"
    does = "continues each input text (trained on plain text)" if meta.get("plain_lm") else \
        "translates each input (trained on source -> target pairs)"
    return f"{OTHER_VERBS['generate']}\n\n{first}: a {meta['family']} model that {does}."


def generate_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="attnlab generate", description=_generate_description(argv),
                                     epilog="A checkpoint trained on plain text continues each input ([bos] text); "
                                            "one trained on pairs translates it. `attnlab generate CKPT --help` "
                                            "says which CKPT does.")
    parser.add_argument("checkpoint", help="a .ckpt written by attnlab fit")
    parser.add_argument("text", nargs="*", help="inputs; read one per line from stdin when absent")
    parser.add_argument("--temperature", type=float, help="0 = greedy (default: the model's setting)")
    parser.add_argument("--top-k", type=int)
    parser.add_argument("--top-p", type=float)
    parser.add_argument("--max-new-tokens", type=int)
    parser.add_argument("--batch-size", type=int, default=64)
    parser.add_argument("--verify", action=argparse.BooleanOptionalAction, default=None,
                        help="BlockDiffusion with shift and a causal context: draft each block by diffusion and keep "
                             "what the model's own AR view agrees with (its AR output, several tokens a call)")
    args = parser.parse_args(argv)
    from attnlab.checkpoints.reading import load_checkpoint  # after parsing: --help needs no torch

    module, _ = load_checkpoint(args.checkpoint)
    for field in ("temperature", "top_k", "top_p", "max_new_tokens", "verify"):
        if getattr(args, field) is not None:
            setattr(module.sampling, field, getattr(args, field))
    module.sampling.__post_init__()
    module.check_generation()
    texts = args.text or [line.rstrip("\n") for line in sys.stdin if line.strip()]
    if not texts:
        raise AttnlabError("nothing to generate from: give text arguments or lines on stdin")
    for output in module.translate(texts, batch_size=args.batch_size):
        print(output)
    return 0


def average_main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="attnlab average", description=OTHER_VERBS["average"])
    parser.add_argument("checkpoints", nargs="+", help="checkpoints of one run, e.g. runs/x/v/checkpoints/epoch*.ckpt, "
                                                       "or CheckpointAveraging's snapshots of one run "
                                                       "(runs/x/v/checkpoints/averaging/step=*.pt; the rest of "
                                                       "the checkpoint comes from that run's last.ckpt)")
    parser.add_argument("--output", "-o", required=True, help="where to write the averaged checkpoint (must not exist)")
    args = parser.parse_args(argv)
    from attnlab.checkpoints.averaging import average_checkpoints  # after parsing: --help needs no torch

    print(f"averaged {len(args.checkpoints)} checkpoints into {average_checkpoints(args.checkpoints, args.output)}")
    return 0


def sweep_main(argv: list[str]) -> int:
    from attnlab.sweeps.sweep import sweep_main as run_sweep

    return run_sweep(argv)


def report_main(argv: list[str]) -> int:
    from attnlab.reports.report import report_main as run_report

    return run_report(argv)


def ablate_heads_main(argv: list[str]) -> int:
    from attnlab.probes.head_ablation import ablate_heads_main as run_ablation

    return run_ablation(argv)


def attention_main(argv: list[str]) -> int:
    from attnlab.probes.attention_maps import attention_main as run_attention

    return run_attention(argv)


def sample_quality_main(argv: list[str]) -> int:
    from attnlab.probes.sample_quality import sample_quality_main as run

    return run(argv)


def bench_main(argv: list[str]) -> int:
    from attnlab.bench.run import bench_main as run_bench

    return run_bench(argv)


VERB_MAINS = {"generate": generate_main, "average": average_main, "sweep": sweep_main, "report": report_main,
              "ablate-heads": ablate_heads_main, "attention": attention_main, "bench": bench_main,
              "sample-quality": sample_quality_main}


def main(argv: list[str] | None = None) -> int:
    """The console entry point; output cut short by its reader (`attnlab --help | head`) ends quietly."""
    try:
        try:
            return run_verb(argv)
        finally:
            sys.stdout.flush()  # in the try (also after argparse's --help exit): a closed pipe shows here
    except BrokenPipeError:
        # Point stdout at /dev/null so the interpreter's own final flush does not fail again.
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 128 + signal.SIGPIPE  # what a shell reports for a command its reader stopped


def run_verb(argv: list[str] | None = None) -> int:
    from_command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = "--debug" in argv
    argv = [a for a in argv if a != "--debug"]
    if from_command_line:  # LightningCLI reads sys.argv itself; keep it free of our own flags
        sys.argv = sys.argv[:1] + argv
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_help())
        return 0
    verb = argv[0]
    tune_allocator()
    silence_library_noise()
    from attnlab.training.run_folder import releasing_run_folders

    with releasing_run_folders(), finishing_wandb_runs():
        return _run_verb(verb, argv, from_command_line, debug)


@contextlib.contextmanager
def finishing_wandb_runs():
    """Finish the wandb run a command started when it ends, as a process's exit would: left open in
    a process that goes on (a notebook, the tests), it is the `wandb.run` that Lightning's next
    WandbLogger reuses, so the next fit logged into the previous run."""
    before = getattr(sys.modules.get("wandb"), "run", None)
    try:
        yield
    finally:
        run = getattr(sys.modules.get("wandb"), "run", None)
        if run is not None and run is not before:
            run.finish()


def _run_verb(verb: str, argv: list[str], from_command_line: bool, debug: bool) -> int:
    try:
        if verb in VERB_MAINS:
            return VERB_MAINS[verb](argv[1:])
        if verb not in LIGHTNING_VERBS:
            print(f"attnlab: error: unknown verb {verb!r}\n\n{_help()}", file=sys.stderr)
            return 2
        check_config_files(argv)
        from attnlab.cli.lightning_cli import AttnlabCLI
        from attnlab.training.preemption import outside_training

        with outside_training():
            AttnlabCLI(args=None if from_command_line else argv)
        from attnlab.distributed.failures import close_process_group

        gc.collect()  # the run's trainer and sharded model hold the process group: let them go first
        close_process_group()
        return 0
    except SystemExit as err:  # also argparse's --help, which ends here as it should
        status = interrupted_status(err)
        if status is None:
            raise
        return status
    except argparse.ArgumentError as err:  # a config key or value jsonargparse rejected
        if debug:
            raise
        print(f"attnlab: error: {condense_parse_error(str(err))}\n"
              f"(attnlab {verb} --help lists the options)", file=sys.stderr)
        return 2
    except Exception as err:  # noqa: BLE001 - only user errors are caught, see below
        user_error = find_user_error(err)
        if user_error is None and not debug:  # another rank of a distributed run died or hung
            from attnlab.distributed.failures import describe_distributed_failure

            lost = describe_distributed_failure(err)
            if lost:
                print(f"attnlab: error: {lost}", file=sys.stderr)
                return 1
        if user_error is None or debug:
            raise
        print(f"attnlab: error: {user_error}", file=sys.stderr)
        return getattr(user_error, "exit_status", 2)  # 2: bad input; a full disk has its own (NoRoom)


if __name__ == "__main__":
    sys.exit(main())
