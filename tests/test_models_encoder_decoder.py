"""The encoder-decoder: cache exactness, beam search, padding invariance, loss and schedule."""
import math

import pytest
import torch

from attnlab import BackboneConfig, EncoderDecoder
from attnlab.generation.beam_search import beam_search, length_penalty
from attnlab.generation.encoder_decoder import translate_beam, translate_greedy
from reference_decoding import translate_uncached
from attnlab.models.encoder_decoder import EncoderDecoderModel
from attnlab.models.framing import IGNORE, frame_source_target
from attnlab.families.optim import OptimizerConfig, lr_multiplier

SOURCES = torch.tensor([[5, 6, 7, 8, 3], [9, 10, 3, 0, 0], [11, 3, 0, 0, 0]])
MAX = torch.tensor([9, 9, 9])


def tiny(positional="sinusoidal", norm_position="post", seed=0, **kw):
    torch.manual_seed(seed)
    cfg = BackboneConfig(**{"d_model": 32, "n_heads": 4, "n_kv_heads": 2, "n_layers": 2, "d_ff": 64,
                            "dropout": 0.0, "positional": positional, "norm_position": norm_position, **kw})
    return EncoderDecoderModel(cfg, vocab_size=40).eval()


def encode(model, sources=SOURCES):
    return model.encode(sources, sources != 0)[0]


@pytest.mark.parametrize("positional", ["sinusoidal", "learned", "rope", "alibi", "none"])
@pytest.mark.parametrize("norm_position", ["post", "pre"])
def test_cached_decoding_equals_uncached(positional, norm_position):
    model = tiny(positional, norm_position)
    encoded = encode(model)
    cached, cached_logits = translate_greedy(model, encoded, max_lengths=MAX, bos_id=2, eos_id=3, pad_id=0, return_logits=True)
    full, full_logits = translate_uncached(model, encoded, max_lengths=MAX, bos_id=2, eos_id=3, pad_id=0)
    assert cached == full
    torch.testing.assert_close(cached_logits, full_logits, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("positional", ["sinusoidal", "rope", "alibi"])
def test_beam_size_one_is_greedy(positional):
    model = tiny(positional)
    encoded = encode(model)
    assert translate_beam(model, encoded, max_lengths=MAX, bos_id=2, eos_id=3, beam_size=1, alpha=0.6) == \
        translate_greedy(model, encoded, max_lengths=MAX, bos_id=2, eos_id=3, pad_id=0)


def test_a_padded_batch_translates_like_each_source_alone():
    model = tiny("alibi")
    batch_greedy = translate_greedy(model, encode(model), max_lengths=MAX, bos_id=2, eos_id=3, pad_id=0)
    batch_beam = translate_beam(model, encode(model), max_lengths=MAX, bos_id=2, eos_id=3, beam_size=3, alpha=0.6)
    for i, n in enumerate([5, 3, 2]):
        alone = encode(model, SOURCES[i : i + 1, :n])
        assert translate_greedy(model, alone, max_lengths=MAX[:1], bos_id=2, eos_id=3, pad_id=0)[0] == batch_greedy[i]
        assert translate_beam(model, alone, max_lengths=MAX[:1], bos_id=2, eos_id=3, beam_size=3, alpha=0.6)[0] == batch_beam[i]


class ToyState:
    """A fixed table of next-token log-probabilities keyed by the prefix, to check the search itself."""

    def __init__(self, n):
        self.prefixes = [()] * n

    def reorder(self, index):
        self.prefixes = [self.prefixes[i] for i in index.tolist()]


def toy_step(table, vocab=5, eos=3):
    def step(last, state):
        state.prefixes = [p + (int(t),) for p, t in zip(state.prefixes, last[:, 0])]
        out = torch.full((len(state.prefixes), vocab), -20.0)
        for row, prefix in enumerate(state.prefixes):
            for token, prob in table.get(prefix[1:], {eos: 1.0}).items():
                out[row, token] = math.log(prob)
        return out

    return step


def test_beam_search_finds_the_sequence_greedy_misses():
    # Greedy takes 4 (p=.6) then has only p=.3 choices; 1 (p=.4) leads to a certain eos: .4 > .6*.3.
    table = {(): {4: 0.6, 1: 0.4}, (4,): {1: 0.3, 2: 0.3, 3: 0.3, 4: 0.1}, (1,): {3: 1.0},
             (4, 1): {3: 1.0}, (4, 2): {3: 1.0}}
    step = toy_step(table)
    results = []
    for beams in (1, 2):
        state = ToyState(beams)
        first = step(torch.zeros(beams, 1, dtype=torch.long), state)  # after bos
        results.append(beam_search(step, first, state, 1, beams, bos_id=0, eos_id=3, max_lengths=torch.tensor([5]),
                                   alpha=0.0))
    greedy, beam = results
    assert greedy == [[4, 1]]
    assert beam == [[1]]


def test_length_penalty_is_gnmt():
    assert length_penalty(torch.tensor([1]), 0.6).item() == pytest.approx(1.0)
    assert length_penalty(torch.tensor([7]), 0.6).item() == pytest.approx((12 / 6) ** 0.6)


def test_framing_for_encoder_and_decoder():
    batch = {"source": torch.tensor([[7, 8], [9, 0]]), "source_lengths": torch.tensor([2, 1]),
             "target": torch.tensor([[20, 21, 22], [23, 0, 0]]), "target_lengths": torch.tensor([3, 1])}
    src, valid, dec_in, labels = frame_source_target(batch, bos=2, eos=3, pad=0)
    assert src.tolist() == [[7, 8, 3], [9, 3, 0]]
    assert valid.tolist() == [[True, True, True], [True, True, False]]
    assert dec_in.tolist() == [[2, 20, 21, 22], [2, 23, 0, 0]]
    assert labels.tolist() == [[20, 21, 22, 3], [23, 3, IGNORE, IGNORE]]


def test_label_smoothed_loss_equals_its_formula():
    eps = 0.1
    module = EncoderDecoder(backbone=dict(d_model=32, n_heads=4, n_layers=1, d_ff=64, dropout=0.0),
                            optimizer=dict(label_smoothing=eps), vocab_size=40)
    batch = {"source": torch.tensor([[7, 8], [9, 0]]), "source_lengths": torch.tensor([2, 1]),
             "target": torch.tensor([[20, 21, 22], [23, 0, 0]]), "target_lengths": torch.tensor([3, 1])}
    terms = module.loss_terms(batch)
    src, valid, dec_in, labels = frame_source_target(batch, 2, 3, 0)
    log_p = module.model(src, valid, dec_in).log_softmax(-1)
    expected, expected_nll = torch.zeros(2), torch.zeros(2)
    for b in range(2):
        for t in range(4):
            y = int(labels[b, t])
            if y == IGNORE:
                continue
            expected[b] += (1 - eps) * -log_p[b, t, y] + eps * -log_p[b, t].mean()
            expected_nll[b] += -log_p[b, t, y]
    assert terms.targets.tolist() == [4, 2]  # target + eos per row
    torch.testing.assert_close(terms.loss, expected, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(terms.nll, expected_nll, rtol=1e-5, atol=1e-5)  # val/nll stays unsmoothed


def test_noam_rate_follows_the_papers_formula():
    cfg = OptimizerConfig(lr=1.0, schedule="noam", warmup_steps=4000)
    for step in (1, 100, 4000, 10_000, 100_000):
        expected = 512 ** -0.5 * min(step ** -0.5, step * 4000 ** -1.5)
        assert lr_multiplier(cfg, step - 1, 0, d_model=512) == pytest.approx(expected)
    assert lr_multiplier(cfg, 3999, 0, 512) > lr_multiplier(cfg, 3998, 0, 512)
    assert lr_multiplier(cfg, 4000, 0, 512) < lr_multiplier(cfg, 3999, 0, 512)


def test_shared_embeddings_are_one_matrix():
    model = tiny()
    assert model.encoder.embedding is model.decoder.embedding
    untied = EncoderDecoderModel(model.decoder.cfg, 40, share_embeddings=False)
    assert untied.encoder.embedding is not untied.decoder.embedding


def test_encoder_sees_the_future_and_decoder_does_not():
    model = tiny()
    src = torch.tensor([[5, 6, 7, 3]])
    changed = src.clone()
    changed[0, 2] = 8
    first_a = encode(model, src).memory[0, 0]
    first_b = encode(model, changed).memory[0, 0]
    assert not torch.allclose(first_a, first_b)  # bidirectional: token 0 sees token 2
    encoded = encode(model, src)
    dec = torch.tensor([[2, 10, 11]])
    dec2 = torch.tensor([[2, 10, 12]])
    h1, _ = model.decode(dec, encoded)
    h2, _ = model.decode(dec2, encoded)
    torch.testing.assert_close(h1[:, :2], h2[:, :2])  # causal: earlier positions unaffected
