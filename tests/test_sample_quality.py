"""`attnlab sample-quality` (issue 15, item 5): generative perplexity equals a hand computation,
NFE is a hand count, entropy is the samples' own, and the verb writes its table and plot."""
from __future__ import annotations

import json
import math

import pytest
import torch

from attnlab import BackboneConfig
from attnlab.probes.sample_quality import draw, sample_nll, unigram_entropy
from attnlab.generation.sampling import SamplingConfig
from attnlab.models.decoder_only import DecoderOnlyModel
from conftest import DEBUG_YAML, FAST_TRAINER, run_main

BOS, PAD = 2, 0


def test_generative_perplexity_is_the_mean_token_nll_of_bos_plus_sample_under_the_scorer():
    torch.manual_seed(0)
    scorer = DecoderOnlyModel(BackboneConfig(d_model=16, n_heads=2, n_layers=2, d_ff=32, dropout=0.0), 40).eval()
    samples = [[7, 9, 11, 3, 8], [12, 12, 30], [5, 6, 7, 8, 9, 10, 11]]
    total, count = sample_nll(scorer, samples, BOS, PAD, batch_size=2)  # two batches, padded rows
    by_hand = 0.0
    with torch.no_grad():
        for sample in samples:  # one prefix at a time, no batching, no padding
            for t, token in enumerate(sample):
                prefix = torch.tensor([[BOS] + sample[:t]])
                by_hand -= float(scorer(prefix)[0, -1].log_softmax(-1)[token])
    assert count == sum(map(len, samples))
    assert total == pytest.approx(by_hand, rel=1e-5)
    assert math.exp(total / count) == pytest.approx(math.exp(by_hand / 15), rel=1e-5)


def test_unigram_entropy_of_a_sample():
    assert unigram_entropy([4, 4, 4, 4]) == 0.0
    assert unigram_entropy([1, 1, 2, 3]) == pytest.approx(-(0.5 * math.log(0.5) + 2 * 0.25 * math.log(0.25)))
    assert unigram_entropy(list(range(8))) == pytest.approx(math.log(8))


TEXT = ["we the people of the united states", "in order to form a more perfect union",
        "establish justice and insure domestic tranquility", "provide for the common defence"] * 8


@pytest.fixture(scope="module")
def lm_checkpoints(tmp_path_factory):
    root = tmp_path_factory.mktemp("sample_quality")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(TEXT) + "\n", encoding="utf-8")
    data = ["--data", "data_modules.TextDataModule", "--data.init_args.train_files", f"[{corpus}]",
            "--data.init_args.val_files", f"[{corpus}]", "--data.init_args.seq_len", "8",
            "--data.init_args.vocab_size", "300", "--data.init_args.cache_dir", root / "cache"]
    out = {}
    for name, model in (("ar", []), ("bd", ["--model", "attnlab.BlockDiffusion", "--model.init_args.block_size", "4"])):
        result = run_main(["fit", "--config", DEBUG_YAML, *model, *data, "--run.root", root / "runs",
                           "--run.version", name, "--run.wandb", "disabled", *FAST_TRAINER], cwd=root)
        assert result.code == 0, result.err[-3000:]
        (out[name],) = (root / "runs").glob(f"*/{name}/checkpoints/last.ckpt")
    return out


def test_nfe_is_one_call_per_token_for_ar_and_steps_per_block_for_block_diffusion(lm_checkpoints):
    from attnlab.checkpoints.reading import load_checkpoint

    sampling = SamplingConfig(temperature=1.0)
    ar, _ = load_checkpoint(lm_checkpoints["ar"])
    samples, calls, _ = draw(ar, 3, 6, {}, sampling, seed=0, batch_size=3)
    assert calls == 6 and [len(s) for s in samples] == [6, 6, 6]  # the prompt call gives token 1, then 5 more
    bd, _ = load_checkpoint(lm_checkpoints["bd"])
    for steps, expected in ((1, 2), (2, 4), (4, 8)):  # 8 tokens = 2 blocks of 4
        samples, calls, _ = draw(bd, 2, 8, {"unmasking": "confidence", "steps": steps}, sampling, seed=0, batch_size=2)
        assert calls == expected and [len(s) for s in samples] == [8, 8]
    two = {"unmasking": "confidence", "steps": 2}
    assert draw(bd, 2, 8, two, sampling, seed=0, batch_size=2)[0] == draw(bd, 2, 8, two, sampling, seed=0, batch_size=2)[0]
    at_once = {"unmasking": "threshold", "steps": 4, "threshold": 0.0}
    assert draw(bd, 2, 8, at_once, sampling, seed=0, batch_size=2)[1] == 2  # one call a block


def test_the_verb_writes_the_table_json_and_plot(lm_checkpoints, tmp_path):
    out = tmp_path / "quality"
    result = run_main(["sample-quality", lm_checkpoints["bd"], lm_checkpoints["ar"], "--scorer", lm_checkpoints["ar"],
                       "--samples", "4", "--length", "8", "--steps", "1,2,4,64", "--thresholds", "0", "--output", out,
                       "--unmasking", "confidence"], cwd=tmp_path)
    assert result.code == 0, result.err[-3000:]
    rows = json.loads((out / "sample_quality.json").read_text())
    assert [(r["family"], r["steps_per_block"], r["threshold"], r["nfe"]) for r in rows] == [
        ("block_diffusion", 1, None, 2), ("block_diffusion", 2, None, 4), ("block_diffusion", 4, None, 8),
        ("block_diffusion", None, 0.0, 2), ("decoder_only", 1, None, 8)]
    # By default block diffusion samples first-hitting (BD3-LM's sampler): one call a token, whatever --steps says
    default = run_main(["sample-quality", lm_checkpoints["bd"], "--scorer", lm_checkpoints["ar"], "--samples", "2",
                        "--length", "8", "--output", tmp_path / "default"], cwd=tmp_path)
    assert default.code == 0, default.err[-3000:]
    (row,) = json.loads((tmp_path / "default" / "sample_quality.json").read_text())
    assert (row["unmasking"], row["steps_per_block"], row["nfe"]) == ("first_hitting", 4, 8)
    measured = (tmp_path / "default" / "sample_quality.md").read_text().splitlines()[0]
    assert measured.startswith("`attnlab sample-quality ") and " commit " in measured and "cores of" in measured
    assert all(0 <= r["entropy"] <= math.log(8) + 1e-9 and r["gen_ppl"] > 1 for r in rows)
    assert (out / "sample_quality.png").stat().st_size > 0
    assert "| AR | 1 | one token a call | 8.0 |" in (out / "sample_quality.md").read_text()


def test_a_scorer_that_is_not_a_plain_text_decoder_only_is_refused(lm_checkpoints, tmp_path):
    result = run_main(["sample-quality", lm_checkpoints["ar"], "--scorer", lm_checkpoints["bd"],
                       "--output", tmp_path / "q"], cwd=tmp_path)
    assert result.code == 2 and "--scorer" in result.err and "block_diffusion" in result.err
    assert not (tmp_path / "q").exists()
