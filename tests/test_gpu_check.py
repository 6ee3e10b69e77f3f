"""scripts/gpu_check.py stays runnable: its smoke run fills every row on CPU; the GPU-only checks
run where CUDA is (skipped with a reason elsewhere, so `-ra` lists them)."""
import subprocess
import sys

import pytest
import torch

from conftest import REPO

SCRIPT = REPO / "scripts" / "gpu_check.py"
CUDA = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA GPU (scripts/gpu_check.py runs these paths)")


def run_script(*args, timeout=600):
    return subprocess.run([sys.executable, SCRIPT, *map(str, args)], cwd=REPO, capture_output=True, text=True,
                          timeout=timeout)


def test_smoke_run_fills_every_row_of_the_table(tmp_path):
    result = run_script("--smoke", "--device", "cpu", "--out", tmp_path)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    table = (tmp_path / "gpu_check.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| ") and not line.startswith("| check")]
    assert len(rows) == 6, table
    for family in ("decoder_only", "encoder_decoder", "block_diffusion"):
        assert any(row.startswith(f"| {family}: 2-step fit") and row.endswith("| holds |") for row in rows), table
    flex = next(row for row in rows if row.startswith("| FlexAttention"))
    assert flex.endswith("| holds |") and "recompiles over 3 batches" in flex
    assert "not run: 0 GPU(s) visible" in rows[-1]
    for log in ("bench.log", "flex.log", "fit_decoder_only_bf16-mixed.log"):
        assert (tmp_path / log).is_file()


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the message shown where CUDA is absent")
def test_without_cuda_it_says_so_in_one_line_and_exits_2(tmp_path):
    result = run_script("--out", tmp_path / "out", timeout=120)
    assert result.returncode == 2
    assert len(result.stderr.strip().splitlines()) == 1 and "no CUDA device" in result.stderr
    assert "--smoke --device cpu" in result.stderr
    assert not (tmp_path / "out").exists()


@CUDA
def test_flex_attention_equals_the_dense_mask_forward_and_backward_on_gpu():
    sys.path.insert(0, str(SCRIPT.parent))
    from gpu_check import flex_measurement

    assert flex_measurement("cuda", smoke=True)["max_difference"] < 5e-2


@CUDA
def test_mfu_divides_by_a_data_sheet_peak_on_known_gpus():
    from attnlab.training.flops import PEAK_FLOPS
    from attnlab.training.mfu import MFU

    mfu = MFU.for_device(torch.device("cuda", 0), "bf16-mixed")
    known = any(key in torch.cuda.get_device_name(0) for key in PEAK_FLOPS)
    assert mfu.source == ("data sheet" if known else "measured") and mfu.peak > 0
