"""One short check of the paths no CPU test can exercise: bf16, torch.compile, FlexAttention and
FSDP over NCCL. About five minutes on one H100 / H200; prints one Markdown table for the README.

    python scripts/gpu_check.py                   # on a machine with a GPU; writes gpu_check/
    python scripts/gpu_check.py --smoke --device cpu   # every row at toy sizes (what the tests run)

Rows: the `gpt2-small` bench with bf16 + compile (MFU against the data-sheet peak); a 50-step
bf16-mixed fit of each family against fp32 on the same batches (same seed, same data order);
compiled FlexAttention against the dense block-diffusion mask (forward + backward, and the
recompiles over 20 batches of varying length); a 20-step FSDP fit when two or more GPUs are
visible. Exit status 0 when every row holds, 1 when one does not, 2 when the device is missing.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import statistics
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
FAMILIES = ("decoder_only", "encoder_decoder", "block_diffusion")
LOSS_GAP = 0.05  # bf16-mixed against fp32: final training loss within 5 %
MFU_GOAL = 0.45  # REFERENCE.md: gpt2-small with compile + bf16 on an H100 / H200
TOY = ["vocab=97", "d_model=32", "n_layers=2", "n_heads=4", "d_ff=64"]


def attnlab(args: list[str], out: Path, log: str, in_process: bool = False) -> subprocess.CompletedProcess:
    """`python -m attnlab ARGS`, its output kept in OUT/LOG (the table quotes only the verdict).
    `in_process` (--smoke): the same command in this process, without a start-up per command."""
    args = [str(a) for a in args]
    if not in_process:
        result = subprocess.run([sys.executable, "-m", "attnlab", *args], cwd=REPO, capture_output=True, text=True)
        (out / log).write_text(result.stdout + result.stderr)
        return result
    import contextlib
    import io

    from attnlab.cli.main import main as attnlab_main

    buffer, previous = io.StringIO(), os.getcwd()
    os.chdir(REPO)
    try:
        with contextlib.redirect_stdout(buffer), contextlib.redirect_stderr(buffer):
            try:
                code = attnlab_main(args)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else 1
    finally:
        os.chdir(previous)
    (out / log).write_text(buffer.getvalue())
    return subprocess.CompletedProcess(args, code, buffer.getvalue(), "")


def bench_row(args, out: Path) -> list:
    flags = ["bench", "--only", "train", "--families", "decoder_only", "--no-references", "--device", args.device,
             "-o", out / "bench.json"]
    if args.smoke:
        flags += ["--precision", "32", "--batch", "2", "--seq-len", "16", "--rounds", "1", "--warmup", "0", "--set", *TOY]
    else:
        flags += ["--size", "gpt2-small", "--precision", "bf16-mixed", "--compile", "--rounds", "10", "--warmup", "3"]
    result = attnlab(flags, out, "bench.log", in_process=args.smoke)
    what = "gpt2-small bench, bf16-mixed + compile" if not args.smoke else "bench (smoke: toy shape, fp32)"
    if result.returncode != 0:
        return [what, f"exit {result.returncode} (see bench.log)", f"MFU >= {MFU_GOAL:.0%}", False]
    row = json.loads((out / "bench.json").read_text())["training"]["decoder_only"]
    mfu = row.get("mfu_table", row["mfu_measured"])
    kind = "data sheet" if "mfu_table" in row else "measured"
    measured = f"{row['tokens_per_s']:,.0f} tokens/s, MFU {mfu:.1%} ({kind} peak)"
    return [what, measured, f"MFU >= {MFU_GOAL:.0%}", None if args.smoke else mfu >= MFU_GOAL]


def final_loss(run_dir: Path) -> float:
    from attnlab.reports.runs import last_values, read_metrics

    return last_values(read_metrics(run_dir / "metrics.csv"))["train/loss"]


def precision_rows(args, out: Path) -> list[list]:
    steps = 2 if args.smoke else 50
    rows = []
    for family in FAMILIES:
        losses = {}
        for precision in ("32-true", "bf16-mixed"):
            flags = ["fit", "--config", f"experiments/{family}.yaml", "--trainer.max_steps", steps,
                     "--trainer.precision", precision, "--trainer.limit_val_batches", "0",
                     "--trainer.log_every_n_steps", "1", "--trainer.enable_progress_bar", "false",
                     "--model.init_args.eval_every_n_epochs", "0", "--run.root", out / "fits", "--run.name", family,
                     "--run.version", precision, "--run.wandb", "disabled", "--trainer.devices", "1",
                     "--trainer.accelerator", "cpu" if args.device == "cpu" else "gpu"]
            if args.smoke:
                flags += ["--data.init_args.n_train", "64", "--data.init_args.max_eval_examples", "8"]
            result = attnlab(flags, out, f"fit_{family}_{precision}.log", in_process=args.smoke)
            losses[precision] = final_loss(out / "fits" / family / precision) if result.returncode == 0 else math.nan
        fp32, bf16 = losses["32-true"], losses["bf16-mixed"]
        gap = abs(bf16 - fp32) / fp32 if fp32 else math.nan
        rows.append([f"{family}: {steps}-step fit, bf16-mixed against fp32",
                     f"loss {bf16:.4f} against {fp32:.4f} ({gap:+.1%})", f"within {LOSS_GAP:.0%}", gap <= LOSS_GAP])
    return rows


def flex_measurement(device: str, smoke: bool) -> dict:
    """(In a child process, where TORCH_LOGS=recompiles is set.) Block diffusion's joint pass with
    the compiled FlexAttention mask and with the dense mask: the same hidden states, and their
    forward + backward time over 20 batches of varying length (forward only on CPU: FlexAttention
    has no CPU backward)."""
    import torch

    from attnlab.bench.contenders import Options, platform_module
    from attnlab.bench.shapes import resolve_shape

    torch.manual_seed(0)
    overrides = dict(item.split("=") for item in TOY) if smoke else {}
    shape = resolve_shape("cpu" if smoke else "gpt2-small", **{k: int(v) for k, v in overrides.items()})
    module = platform_module("block_diffusion", shape, Options(torch.device(device)))
    model, block = module.model, module.block_size
    backward = device != "cpu"
    lengths = [block * (4 + (3 * i) % 13) for i in range(3 if smoke else 20)]
    rows = 2 if smoke else 8

    def batch(length):
        noisy = torch.randint(6, shape.vocab, (rows, length), device=device)
        blocks = (torch.arange(length, device=device) // block).expand(rows, -1).clone()
        blocks[0, length - block:] = -1  # one row padded by a block
        positions = torch.arange(length, device=device).expand(rows, -1)
        return noisy, blocks, positions, noisy.clone(), blocks.clone()

    def run(backend, inputs):
        model.mask_backend = backend
        with torch.set_grad_enabled(backward):
            hidden, _ = model.joint_pass(*inputs)
            if backward:
                hidden.float().pow(2).mean().backward()
        return hidden

    first = batch(lengths[0])
    valid = torch.cat((first[1], first[4]), dim=1) >= 0  # padding rows' outputs are never read
    difference = float((run("flex", first).float() - run("dense", first).float())[valid].abs().max())
    seconds = {}
    for backend in ("flex", "dense"):
        times = []
        for length in lengths:
            inputs = batch(length)
            if device != "cpu":
                torch.cuda.synchronize()
            started = time.perf_counter()
            run(backend, inputs)
            if device != "cpu":
                torch.cuda.synchronize()
            times.append(time.perf_counter() - started)
        seconds[backend] = statistics.median(times[1:])  # the first pays for compilation
    return {"max_difference": difference, "seconds": seconds, "batches": len(lengths)}


def flex_row(args, out: Path) -> list:
    env = dict(os.environ, TORCH_LOGS="recompiles")
    child = [sys.executable, __file__, "--flex-child", "--device", args.device] + (["--smoke"] if args.smoke else [])
    result = subprocess.run(child, cwd=REPO, env=env, capture_output=True, text=True)
    (out / "flex.log").write_text(result.stdout + result.stderr)
    what = "FlexAttention (compiled) against the dense block-diffusion mask"
    if result.returncode != 0:
        return [what, f"exit {result.returncode} (see flex.log)", "", False]
    measured = json.loads(result.stdout.strip().splitlines()[-1])
    recompiles = result.stderr.count("Recompiling function")
    flex, dense = measured["seconds"]["flex"], measured["seconds"]["dense"]
    pass_kind = "fwd" if args.device == "cpu" else "fwd+bwd"
    text = (f"{pass_kind} {flex * 1e3:.1f} ms against {dense * 1e3:.1f} ms ({dense / flex:.2f}x); "
            f"max abs difference {measured['max_difference']:.1e}; {recompiles} recompiles over {measured['batches']} batches")
    tolerance = 1e-4 if args.device == "cpu" else 5e-2  # bf16 kernels on GPU
    holds = measured["max_difference"] <= tolerance and (args.smoke or recompiles <= 2)
    return [what, text, "same output; <= 2 recompiles", holds]


def fsdp_row(args, out: Path) -> list:
    import torch

    what = "FSDP (LayerWiseFSDP over NCCL), 20 steps"
    gpus = torch.cuda.device_count() if args.device != "cpu" else 0
    if gpus < 2:
        return [what, f"not run: {gpus} GPU(s) visible", ">= 2 GPUs", None]
    flags = ["fit", "--config", "experiments/decoder_only.yaml", "--config", "experiments/distributed/fsdp.yaml",
             "--trainer.max_steps", "20", "--trainer.precision", "bf16-mixed", "--trainer.limit_val_batches", "0",
             "--model.init_args.eval_every_n_epochs", "0", "--run.root", out / "fits", "--run.name", "fsdp",
             "--run.version", "v1", "--run.wandb", "disabled", "--trainer.enable_progress_bar", "false"]
    result = attnlab(flags, out, "fsdp.log")
    if result.returncode != 0:
        return [what, f"exit {result.returncode} (see fsdp.log)", "finite loss", False]
    loss = final_loss(out / "fits" / "fsdp" / "v1")
    return [what, f"{gpus} GPUs, final loss {loss:.4f}", "finite loss", math.isfinite(loss)]


def table(rows: list[list]) -> str:
    verdict = {True: "holds", False: "FAILED", None: "-"}
    lines = ["| check | measured | expected | |", "|---|---|---|---|"]
    lines += [f"| {what} | {measured} | {expected} | {verdict[holds]} |" for what, measured, expected, holds in rows]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda", help="cuda (default) or cpu (with --smoke)")
    parser.add_argument("--smoke", action="store_true", help="toy sizes and 2 steps: checks the script, measures nothing")
    parser.add_argument("--out", default="gpu_check", help="folder for the logs, JSON and table (default gpu_check/)")
    parser.add_argument("--flex-child", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    import torch

    if args.device != "cpu" and not torch.cuda.is_available():
        print(f"gpu_check: --device {args.device} but torch sees no CUDA device "
              f"(torch {torch.__version__}); run it on a GPU machine, or add --smoke --device cpu", file=sys.stderr)
        return 2
    if args.flex_child:
        print(json.dumps(flex_measurement(args.device, args.smoke)))
        return 0
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    name = torch.cuda.get_device_name() if args.device != "cpu" else "CPU"
    started = time.perf_counter()
    rows = [bench_row(args, out), *precision_rows(args, out), flex_row(args, out), fsdp_row(args, out)]
    report = (f"gpu_check on {name}, torch {torch.__version__}, {time.strftime('%Y-%m-%d')}, "
              f"{time.perf_counter() - started:.0f} s\n\n{table(rows)}")
    print(report)
    (out / "gpu_check.md").write_text(report + "\n")
    return 1 if any(holds is False for *_, holds in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
