"""generation.compile (issue 45, item 2): compiled decoding is off unless set to true, on any
device; "auto", once the default, is refused with its fix, and a checkpoint that recorded it reads
as false."""
from __future__ import annotations

import re

import pytest
import torch

from attnlab import DecoderOnly
from attnlab.checkpoints.reading import load_checkpoint
from attnlab.errors import ConfigError
from attnlab.families import decoder_only
from attnlab.generation import compiled_step
from attnlab.generation.sampling import SamplingConfig
from conftest import DEBUG_YAML

BACKBONE = dict(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0)
BATCH = {"source": torch.tensor([[7, 8, 9], [10, 11, 0]]), "source_lengths": torch.tensor([3, 2]),
         "target": torch.tensor([[7, 8], [9, 0]]), "target_lengths": torch.tensor([2, 1])}


def module(**generation) -> DecoderOnly:
    return DecoderOnly(backbone=BACKBONE, vocab_size=40, generation=dict(max_new_tokens=4, **generation)).eval()


def test_off_is_the_default_and_settings_are_checked():
    assert SamplingConfig().compile is False
    for setting in (True, False):
        assert SamplingConfig(compile=setting).compile is setting
    with pytest.raises(ConfigError, match="generation.compile=auto is no longer a setting.*set generation.compile true"):
        SamplingConfig(compile="auto")
    for bad in ("yes", 1, None):
        with pytest.raises(ConfigError, match="generation.compile=.* must be true or false"):
            SamplingConfig(compile=bad)


@pytest.mark.parametrize("setting", [True, False])
def test_the_family_decodes_as_set_whatever_the_run(setting, monkeypatch):
    seen = []
    monkeypatch.setattr(decoder_only, "generate", lambda *args, compiled, **kwargs: seen.append(compiled))
    module(compile=setting).generate_ids(BATCH)
    assert seen == [setting]


def test_auto_on_the_command_line_is_one_line_naming_the_key(cli, tmp_path):
    result = cli("fit", "--config", DEBUG_YAML, "--run.root", tmp_path, "--model.init_args.generation.compile", "auto")
    assert result.code == 2
    assert "model.init_args.generation.compile" in result.err and "auto" in result.err
    assert not (tmp_path / "debug").exists()


def test_a_checkpoint_that_recorded_auto_reads_as_false(tmp_path):
    """Checkpoints written while "auto" was the default record it: they load, decoding eagerly."""
    net = module()
    hyper = dict(net.hparams)
    hyper["generation"] = {**hyper["generation"], "compile": "auto"}
    path = tmp_path / "old.ckpt"
    torch.save({"state_dict": net.state_dict(), "hyper_parameters": hyper, "attnlab": {"family": "decoder_only"}}, path)
    loaded, _ = load_checkpoint(path)
    assert loaded.sampling.compile is False
    for name, value in net.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], value), name


def test_a_torch_without_isolated_recompiles_is_one_clear_error(monkeypatch):
    """Each kind of decoding call is compiled as a region of its own (torch.compile's
    isolate_recompiles); a torch that lacks it is named, with the fix, before anything compiles."""
    monkeypatch.setattr(compiled_step, "ISOLATES_RECOMPILES", False)
    with pytest.raises(ConfigError, match=rf"needs a torch .*isolate_recompiles.*torch {re.escape(torch.__version__)}.*false"):
        SamplingConfig(compile=True)
    with pytest.raises(ConfigError, match="isolate_recompiles"):
        compiled_step.step_runner(True)
    assert compiled_step.step_runner(False) is compiled_step.cached_forward
