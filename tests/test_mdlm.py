"""MDLM as MDLM: a BlockDiffusion whose target is one block runs no clean half (its noisy tokens
read only the prefix), so it computes, counts and pays what a masked diffusion LM does, about
what an AR model of the same backbone does per token, with the loss of the two-half pass."""
import pytest
import torch
from torch.utils.flop_counter import FlopCounterMode

from attnlab import BlockDiffusion, DecoderOnly
from attnlab.models.framing import frame_blocks

BOS, EOS, SEP, PAD, MASK = 2, 3, 4, 0, 5
VOCAB, LENGTH = 40, 12
BACKBONE = dict(d_model=32, n_heads=4, n_layers=2, d_ff=64, dropout=0.0, positional="rope", backend="math")


def plain_lm(rows: int = 3, seed: int = 0) -> dict:
    """Chunks of LENGTH tokens of plain text, as TextFolderDataModule serves them."""
    target = torch.randint(6, VOCAB, (rows, LENGTH), generator=torch.Generator().manual_seed(seed))
    return {"source": torch.zeros(rows, 0, dtype=torch.long), "source_lengths": torch.zeros(rows, dtype=torch.long),
            "target": target, "target_lengths": torch.full((rows,), LENGTH)}


CONDITIONAL = {"source": torch.tensor([[7, 8, 9], [11, 0, 0]]), "source_lengths": torch.tensor([3, 1]),
               "target": torch.tensor([[20, 21, 22, 23, 24], [25, 26, 0, 0, 0]]), "target_lengths": torch.tensor([5, 2])}


def mdlm(**kw) -> BlockDiffusion:
    torch.manual_seed(0)
    return BlockDiffusion(backbone=BACKBONE, vocab_size=VOCAB, block_size=LENGTH, **kw).train()


def two_halves(module: BlockDiffusion) -> BlockDiffusion:
    """The same module running the whole clean sequence beside the noisy one, as before."""
    module._clean_half = lambda frame, training: (frame.clean, frame.clean_blocks)
    return module


def loss_and_grads(module, batch, seed: int = 1):
    module.zero_grad()
    torch.manual_seed(seed)  # the masking draws from the global stream in training
    terms = module.loss_terms(batch)
    (terms.loss.sum() / terms.targets.sum()).backward()
    return terms, {name: p.grad.clone() for name, p in module.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("batch", [plain_lm(), CONDITIONAL], ids=["plain_lm", "conditional"])
@pytest.mark.parametrize("view", [{}, {"shift": True}], ids=["bd3lm", "shift"])
def test_one_block_gives_the_two_half_pass_loss_bound_and_gradients_on_the_same_noise(batch, view):
    terms_one, grads_one = loss_and_grads(mdlm(**view), batch)
    terms_two, grads_two = loss_and_grads(two_halves(mdlm(**view)), batch)
    torch.testing.assert_close(terms_one.loss, terms_two.loss, rtol=1e-6, atol=1e-6)
    torch.testing.assert_close(terms_one.nll, terms_two.nll, rtol=1e-6, atol=1e-6)
    assert grads_one.keys() == grads_two.keys()
    for name in grads_one:
        torch.testing.assert_close(grads_one[name], grads_two[name], rtol=1e-4, atol=1e-6, msg=name)
    assert terms_one.flops < terms_two.flops  # and it pays less for it


def test_one_block_step_flops_are_torchs_count_of_a_pass_over_the_prefix_and_the_noisy_block():
    module, batch = mdlm(), plain_lm()
    with FlopCounterMode(display=False) as counter:
        terms, _ = loss_and_grads(module, batch)
    assert terms.flops == counter.get_total_flops()
    frame = frame_blocks(batch, BOS, SEP, EOS, PAD, LENGTH)
    assert frame.read_width == 1  # [bos]: the only clean token a noisy one reads
    assert terms.inputs == len(batch["target"]) * (LENGTH + 1)  # the positions it runs: train/tokens_per_s's count
    masked = terms.flops - module.flop_counter.step(len(batch["target"]), LENGTH + 1, 0)
    assert masked > 0 and masked % (6 * VOCAB * BACKBONE["d_model"]) == 0  # the output projection of masked tokens


def test_several_blocks_keep_the_whole_clean_sequence():
    frame = frame_blocks(plain_lm(), BOS, SEP, EOS, PAD, LENGTH // 2)
    assert frame.read_width == frame.clean.shape[1] == LENGTH + 1


def test_one_block_costs_what_decoder_only_does_per_token_but_the_unmasked_share_of_its_output():
    """Per token the same layers (a position each, and [bos]); the output projection only on the
    masked tokens, t ~ U[low, high] of them on average, against every label for AR."""
    module = mdlm(noise_range=(0.5, 1.0))
    torch.manual_seed(0)
    decoder = DecoderOnly(backbone=BACKBONE, vocab_size=VOCAB).train()
    batch = plain_lm(rows=4)
    tokens = 4 * LENGTH
    ar = decoder.loss_terms(batch).flops
    diffusion = module.expected_flops(batch)
    unmasked = tokens * (1 - 0.75)
    assert diffusion == pytest.approx(ar - 6 * VOCAB * BACKBONE["d_model"] * unmasked)
    assert 0.9 <= diffusion / ar <= 1.0
