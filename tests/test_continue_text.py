"""A checkpoint trained on plain text continues its prompt (`[bos] prompt`, no separator); one
trained on pairs translates as before (issue 15, item 6)."""
from __future__ import annotations

import pytest
import torch

from attnlab import BackboneConfig
from attnlab.checkpoints.reading import load_checkpoint
from attnlab.generation.decoder_only import generate
from attnlab.generation.encoder_decoder import translate_beam, translate_greedy
from attnlab.models.encoder_decoder import EncoderDecoderModel
from conftest import DEBUG_YAML, FAST_TRAINER, run_main

TEXT = ["we the people of the united states", "in order to form a more perfect union",
        "establish justice and insure domestic tranquility", "provide for the common defence"] * 8
PROMPT = "the people of"


@pytest.fixture(scope="module")
def text_checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("lm")
    corpus = root / "corpus.txt"
    corpus.write_text("\n".join(TEXT) + "\n", encoding="utf-8")
    result = run_main(["fit", "--config", DEBUG_YAML, "--data", "data_modules.TextDataModule",
                       "--data.init_args.train_files", f"[{corpus}]", "--data.init_args.val_files", f"[{corpus}]",
                       "--data.init_args.seq_len", "8", "--data.init_args.vocab_size", "300",
                       "--model.init_args.generation.max_new_tokens", "6",
                       "--run.root", root / "runs", "--run.version", "lm", "--run.wandb", "disabled", *FAST_TRAINER],
                      cwd=root)
    assert result.code == 0, result.err[-3000:]
    (ckpt,) = (root / "runs").glob("*/lm/checkpoints/last.ckpt")
    return ckpt


def test_a_plain_text_checkpoint_continues_its_prompt_like_the_model_itself(text_checkpoint, tmp_path):
    module, _ = load_checkpoint(text_checkpoint)
    assert module.plain_lm
    ids = module.special
    own = generate(module.model, [[ids.bos] + module.tokenizer.encode(PROMPT)], max_new_tokens=6,
                   eos_id=ids.eos, pad_id=ids.pad)
    expected = module.tokenizer.decode_batch(own)[0]
    result = run_main(["generate", text_checkpoint, PROMPT], cwd=tmp_path)
    assert result.code == 0, result.err[-3000:]
    assert result.out.strip().splitlines() == [expected]


def test_the_prompt_is_fed_as_plain_text_without_a_separator(text_checkpoint, monkeypatch):
    import attnlab.families.decoder_only as family

    module, _ = load_checkpoint(text_checkpoint)
    seen = []
    real = family.generate

    def recording(model, prompts, **kwargs):
        seen.append(prompts)
        return real(model, prompts, **kwargs)

    monkeypatch.setattr(family, "generate", recording)
    module.translate([PROMPT, "form a"])
    ids = module.special
    assert seen == [[[ids.bos] + module.tokenizer.encode(PROMPT), [ids.bos] + module.tokenizer.encode("form a")]]


def test_generate_help_says_what_a_checkpoint_does(text_checkpoint, tmp_path):
    result = run_main(["generate", text_checkpoint, "--help"], cwd=tmp_path)
    assert result.code == 0 and "continues each input text" in result.out


def _tiny_encoder_decoder():
    torch.manual_seed(0)
    cfg = BackboneConfig(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, positional="rope")
    return EncoderDecoderModel(cfg, vocab_size=40).eval()


@torch.no_grad()
def _greedy_by_recomputation(model, encoded, prefix, steps, eos):
    """Re-decode the whole `prefix + generated` each step through the training path (one row)."""
    tokens = torch.tensor([prefix])
    out = []
    for _ in range(steps):
        hidden, _ = model.decode(tokens, encoded)
        token = int(model.logits(hidden[:, -1]).argmax(-1))
        if token == eos:
            break
        out.append(token)
        tokens = torch.cat((tokens, torch.tensor([[token]])), dim=1)
    return out


def test_encoder_decoder_continues_prefixes_of_different_lengths_as_each_alone():
    model = _tiny_encoder_decoder()
    source = torch.tensor([[3], [3], [3]])  # plain text: the encoder reads eos alone
    encoded = model.encode(source, source != 0)[0]
    prefixes = [[2, 7, 8, 9, 10], [2, 11], [2, 12, 13]]
    budgets = torch.tensor([7, 7, 7])
    batched = translate_greedy(model, encoded, max_lengths=budgets, bos_id=2, eos_id=3, pad_id=0, prefixes=prefixes)
    for i, prefix in enumerate(prefixes):
        one = model.encode(source[i : i + 1], source[i : i + 1] != 0)[0]
        assert batched[i] == _greedy_by_recomputation(model, one, prefix, 7, eos=3)
    beams = translate_beam(model, encoded, max_lengths=budgets, bos_id=2, eos_id=3, beam_size=1, alpha=0.6,
                           prefixes=prefixes, pad_id=0)
    assert beams == batched  # beam 1 is greedy, from the prefixes too
