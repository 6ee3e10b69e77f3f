"""train/mfu: each step's FLOPs equal torch's own count, and MFU = tokens/s × FLOPs per token / peak,
one peak per run (a step above it logs its true ratio, with one warning)."""
import warnings

import lightning as L
import pytest
import torch
from lightning.pytorch.utilities import rank_zero_only
from torch.utils.flop_counter import FlopCounterMode

from attnlab.training import mfu as mfu_module
from attnlab.training.mfu import MEASURED_PEAK_NOISE, MFU
from data_modules.batch import Example, collate
from test_bench import TINY, math_module

FAMILIES = ["decoder_only", "encoder_decoder", "block_diffusion"]


def padded_batch(module, seed: int = 0) -> dict:
    """Rows of different source and target lengths, so the batch is padded."""
    generator = torch.Generator().manual_seed(seed)
    examples = []
    for source_len, target_len in [(5, 9), (11, 4), (8, 13)]:
        source = torch.randint(6, TINY.vocab, (source_len,), generator=generator).tolist()
        target = torch.randint(6, TINY.vocab, (target_len,), generator=generator).tolist()
        examples.append(Example(source, target, "", ""))
    return collate(examples, module.special.pad)


def counted(module, batch) -> tuple[int, object]:
    with FlopCounterMode(display=False) as counter:
        terms = module.loss_terms(batch)
        (terms.loss.sum() / terms.targets.sum()).backward()
    return counter.get_total_flops(), terms


@pytest.mark.parametrize("family", FAMILIES)
def test_step_flops_equal_torchs_flop_counter_on_a_padded_batch(family):
    module = math_module(family).train()
    if family == "block_diffusion":
        module.train_noise.copy_(torch.tensor([0.3, 0.8]))  # some target tokens masked, some not
    flops, terms = counted(module, padded_batch(module))
    assert terms.flops == flops


class LastBatch(L.Callback):
    """Keeps the last training batch, so the test can count its FLOPs itself."""

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.batch = batch


@pytest.mark.parametrize("family", FAMILIES)
def test_a_fit_logs_train_mfu_as_tokens_per_s_times_flops_per_token_over_the_peak(family, monkeypatch, tmp_path):
    peak = 5e13  # far above a CPU's rate, so MFU is not capped
    monkeypatch.setattr(mfu_module, "_measured", lambda device, dtype: peak)
    module = math_module(family)
    batches = [padded_batch(module, seed) for seed in range(3)]
    last = LastBatch()
    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[last],
                        default_root_dir=tmp_path)
    trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(batches, batch_size=None))
    metrics = trainer.callback_metrics
    torch.manual_seed(0)
    flops, terms = counted(module.train(), last.batch)
    flops_per_token = flops / terms.inputs
    expected = metrics["train/tokens_per_s"].item() * flops_per_token
    assert metrics["train/tflops"].item() * 1e12 == pytest.approx(expected, rel=1e-5)
    assert metrics["train/mfu"].item() == pytest.approx(expected / peak, rel=1e-5)
    assert 0 < metrics["train/mfu"].item() < 1


def test_a_step_faster_than_the_peak_is_flagged_and_the_peak_does_not_move():
    """The true ratio, not a peak raised to the step's rate (which made "never above 1" hold by
    construction, and divided later steps by a different number)."""
    mfu = MFU(peak=1e12, source="measured")
    assert mfu(5e11) == 0.5 and mfu.above_peak == 0
    with pytest.warns(UserWarning, match="above the measured peak.*below a real step's rate") as warned:
        assert mfu(2e12) == 2.0
    assert len(warned) == 1 and "\n" not in str(warned[0].message)
    assert mfu.peak == 1e12 and mfu.source == "measured" and mfu.above_peak == 1
    assert mfu(1e12) == 1.0 and mfu(5e11) == 0.5  # later steps: the same peak
    with warnings.catch_warnings(record=True) as again:
        warnings.simplefilter("always")
        assert mfu(3e12) == 3.0
    assert not again and mfu.above_peak == 2  # warned once per run, every such step counted


def test_a_step_within_a_measured_peaks_noise_is_counted_but_not_warned_about():
    """A measured peak taken in a slow second reads low (a CI step reached 1.0x of one); only a step
    MEASURED_PEAK_NOISE times above it warns. A data sheet's peak has no noise: any step above warns."""
    measured = MFU(peak=1e12, source="measured")
    with warnings.catch_warnings(record=True) as quiet:
        warnings.simplefilter("always")
        assert measured(1.2e12) == pytest.approx(1.2) and measured(1e12 * MEASURED_PEAK_NOISE) == MEASURED_PEAK_NOISE
    assert not quiet and measured.above_peak == 2
    with pytest.warns(UserWarning, match="above the measured peak"):
        measured(1.01e12 * MEASURED_PEAK_NOISE)
    sheet = MFU(peak=1e12, source="data sheet")
    with pytest.warns(UserWarning, match="above the data sheet peak"):
        assert sheet(1.01e12) == pytest.approx(1.01)
    assert sheet.above_peak == 1


def test_only_rank_zero_warns_about_a_step_above_the_peak(monkeypatch):
    monkeypatch.setattr(rank_zero_only, "rank", 1)
    mfu = MFU(peak=1e12, source="measured")
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        assert mfu(2e12) == 2.0
    assert not warned and mfu.above_peak == 1


def test_a_fit_divides_every_step_by_one_peak_measured_once(monkeypatch, tmp_path):
    """A peak below the steps' real rate: every step logs its true ratio (> 1), one warning."""
    peak, measured = 1e3, []
    monkeypatch.setattr(mfu_module, "_measured", lambda device, dtype: measured.append(device) or peak)
    module = math_module("decoder_only")
    logged = []

    class Logged(L.Callback):  # each step's values, read once the module has logged them
        def read(self, trainer):
            logged.append((trainer.callback_metrics["train/tflops"].item(), trainer.callback_metrics["train/mfu"].item()))

        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            if trainer.global_step:
                self.read(trainer)

        def on_train_end(self, trainer, pl_module):
            self.read(trainer)

    trainer = L.Trainer(max_steps=3, accelerator="cpu", logger=False, enable_checkpointing=False,
                        enable_progress_bar=False, enable_model_summary=False, callbacks=[Logged()],
                        default_root_dir=tmp_path)
    with warnings.catch_warnings(record=True) as warned:
        warnings.simplefilter("always")
        trainer.fit(module, train_dataloaders=torch.utils.data.DataLoader(
            [padded_batch(module, seed) for seed in range(3)], batch_size=None))
    assert len(measured) == 1  # once, at the start of the fit
    assert len(logged) == 3 and all(ratio > 1 for _, ratio in logged)
    for tflops, ratio in logged:
        assert ratio == pytest.approx(tflops * 1e12 / peak, rel=1e-5)
    assert len([w for w in warned if "above the measured peak" in str(w.message)]) == 1


def test_a_known_gpu_divides_by_its_data_sheet(monkeypatch):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H200")
    assert MFU.for_device(torch.device("cuda", 0), "bf16-mixed").peak == 989e12
    assert MFU.for_device(torch.device("cuda", 0), "32-true").peak == 67e12


def test_a_bounded_peak_measurement_starts_no_size_after_its_time(monkeypatch):
    """A fit measures the peak within FIT_PEAK_SECONDS: bf16 on a CPU without bf16 kernels would
    otherwise spend many seconds on the largest matmul before the first step."""
    from attnlab.training import flops

    made = []
    real = flops.matmul_step

    def recording(size, device, dtype):
        made.append(size)
        return real(size, device, dtype)

    monkeypatch.setattr(flops, "matmul_step", recording)
    assert flops.measured_peak(torch.device("cpu"), torch.float32, (64, 32, 128), seconds=0.0) > 0
    assert made == [32]  # the smallest first, then nothing: the time was spent
    made.clear()
    flops.measured_peak(torch.device("cpu"), torch.float32, (64, 32, 128))
    assert made == [32, 64, 128]  # unbounded (the bench): every size
