"""generation.compile "auto" (issue 33, item 3): a run's decoding is compiled only when its calls
win a compile back (compiled_step.COMPILE_PAYS_FROM_CALLS, from the bench's tables); true and
false force it either way."""
from __future__ import annotations

from types import SimpleNamespace

import pytest
import torch

from attnlab import DecoderOnly
from attnlab.errors import ConfigError
from attnlab.families import decoder_only
from attnlab.generation.compiled_step import COMPILE_PAYS_FROM_CALLS, compile_pays
from attnlab.generation.sampling import SamplingConfig

BACKBONE = dict(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0)
BUDGET = 10
BATCH = {"source": torch.tensor([[7, 8, 9], [10, 11, 0]]), "source_lengths": torch.tensor([3, 2])}


def trainer(fn: str, batches, max_epochs: int = 1):
    counts = {"num_val_batches": [1], "num_test_batches": [1], "num_predict_batches": [1]}
    counts[{"test": "num_test_batches", "predict": "num_predict_batches"}.get(fn, "num_val_batches")] = [batches]
    return SimpleNamespace(state=SimpleNamespace(fn=fn), max_epochs=max_epochs, **counts)


def module(**generation) -> DecoderOnly:
    return DecoderOnly(backbone=BACKBONE, vocab_size=40, generation=dict(max_new_tokens=BUDGET, **generation)).eval()


def test_auto_is_the_default_and_settings_are_checked():
    assert SamplingConfig().compile == "auto"
    for setting in (True, False, "auto"):
        assert SamplingConfig(compile=setting).compile == setting
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="generation.compile=.* must be true, false or auto"):
            SamplingConfig(compile=bad)
    assert compile_pays(True, 0) and not compile_pays(False, 10**9)
    assert compile_pays("auto", COMPILE_PAYS_FROM_CALLS) and not compile_pays("auto", COMPILE_PAYS_FROM_CALLS - 1)


def test_auto_counts_the_batches_to_decode_times_the_budget():
    net = module()
    assert not net.decoding_compiled(BATCH)  # no trainer: one batch of BUDGET calls
    enough = -(-COMPILE_PAYS_FROM_CALLS // BUDGET)  # batches whose calls reach the threshold
    for fn in ("test", "predict", "validate"):
        net.trainer = trainer(fn, enough - 1)
        assert not net.decoding_compiled(BATCH), fn
        net.trainer = trainer(fn, enough)
        assert net.decoding_compiled(BATCH), fn
    net.trainer = trainer("test", float("inf"))  # a stream of unknown length: one batch
    assert not net.decoding_compiled(BATCH)
    # fit: every generating validation counts (eval_every_n_epochs 1: each of 4 epochs)
    net.trainer = trainer("fit", -(-enough // 4), max_epochs=4)
    assert net.decoding_compiled(BATCH)
    net.trainer = trainer("fit", -(-enough // 4), max_epochs=3)
    assert not net.decoding_compiled(BATCH)


@pytest.mark.parametrize("setting", [True, False])
def test_true_and_false_force_it(setting, monkeypatch):
    net = module(compile=setting)
    net.trainer = trainer("test", 10**9 if not setting else 1)
    seen = []
    monkeypatch.setattr(decoder_only, "generate", lambda *args, compiled, **kwargs: seen.append(compiled))
    net.generate_ids({**BATCH, "target": BATCH["source"], "target_lengths": BATCH["source_lengths"]})
    assert seen == [setting]
