"""Block diffusion: the mask, vectorized vs naive loss, the AR limit, padding and cached sampling."""
import warnings

import pytest
import torch

from attnlab import BackboneConfig, BlockDiffusion, ConfigError, SamplingConfig
from attnlab.components.masks import block_diffusion_mask
from attnlab.generation.block_diffusion import denoise_block, sample_blocks, unmask_schedule
from reference_decoding import sample_blocks_uncached
from attnlab.models.framing import frame_blocks
from attnlab.models.masked_diffusion import mask_blocks, sample_block_times

BOS, EOS, SEP, PAD, MASK = 2, 3, 4, 0, 5
CONDITIONAL = {
    "source": torch.tensor([[7, 8, 9], [11, 0, 0]]), "source_lengths": torch.tensor([3, 1]),
    "target": torch.tensor([[20, 21, 22, 23, 24], [25, 26, 0, 0, 0]]), "target_lengths": torch.tensor([5, 2]),
}
PLAIN_LM = {
    "source": torch.zeros(2, 0, dtype=torch.long), "source_lengths": torch.tensor([0, 0]),
    "target": torch.tensor([[20, 21, 22, 23, 24, 30], [25, 26, 27, 0, 0, 0]]), "target_lengths": torch.tensor([6, 3]),
}


def tiny_module(block_size=2, positional="rope", label_smoothing=0.0, **kw):
    torch.manual_seed(0)
    backbone = dict(d_model=32, n_heads=4, n_kv_heads=2, n_layers=2, d_ff=64, dropout=0.0, positional=positional)
    module = BlockDiffusion(backbone=backbone, optimizer=dict(label_smoothing=label_smoothing), vocab_size=40,
                            block_size=block_size, **kw)
    return module.eval()


def frame(batch, block_size):
    return frame_blocks(batch, BOS, SEP, EOS, PAD, block_size)


def test_mask_matches_the_hand_written_example():
    """x_t ⊕ x_0 for 4 tokens in blocks of 2 (rows: queries x_t1..4, x_01..4; columns: keys)."""
    blocks = torch.tensor([[0, 0, 1, 1]])
    expected = torch.tensor([
        [1, 1, 0, 0, 0, 0, 0, 0],  # noisy block 0 sees itself only
        [1, 1, 0, 0, 0, 0, 0, 0],
        [0, 0, 1, 1, 1, 1, 0, 0],  # noisy block 1 sees itself and clean block 0
        [0, 0, 1, 1, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 0, 0],  # clean block 0 sees clean block 0
        [0, 0, 0, 0, 1, 1, 0, 0],
        [0, 0, 0, 0, 1, 1, 1, 1],  # clean block 1 sees clean blocks 0 and 1
        [0, 0, 0, 0, 1, 1, 1, 1],
    ], dtype=torch.bool)
    assert torch.equal(block_diffusion_mask(blocks, blocks)[0, 0], expected)


def test_framing_fills_the_last_block_with_eos_and_marks_padding():
    f = frame(CONDITIONAL, block_size=4)
    # row 0: [bos] 7 8 9 [sep] | 20 21 22 23 | 24 eos eos eos ; row 1: [bos] 11 [sep] | 25 26 eos eos | pad…
    assert f.clean.tolist() == [[2, 7, 8, 9, 4, 20, 21, 22, 23, 24, 3, 3, 3],
                                [2, 11, 4, 25, 26, 3, 3, 0, 0, 0, 0, 0, 0]]
    assert f.clean_blocks.tolist() == [[0] * 5 + [1] * 4 + [2] * 4, [0] * 3 + [1] * 4 + [-1] * 6]
    assert f.n_targets.tolist() == [6, 3]
    tokens, blocks, positions = f.target_view()
    assert tokens.tolist() == [[20, 21, 22, 23, 24, 3, 3, 3], [25, 26, 3, 3, 0, 0, 0, 0]]
    assert blocks.tolist() == [[1, 1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, -1, -1, -1, -1]]
    assert positions[0].tolist() == list(range(5, 13)) and positions[1, :4].tolist() == [3, 4, 5, 6]


def test_padding_is_never_masked_nor_trained():
    f = frame(CONDITIONAL, block_size=4)
    tokens, blocks, _ = f.target_view()
    t = torch.ones(2, 2)  # every real target position masked
    _, masked, _ = mask_blocks(tokens, blocks, t, MASK)
    assert torch.equal(masked, blocks >= 0)
    # With every position masked the loss is deterministic: a row's loss does not depend on the
    # batch it is padded into.
    module = tiny_module(block_size=4)
    together, _ = module.nelbo_terms(f, 0, 1, t=t)
    for row in range(2):
        alone_batch = {k: v[row : row + 1] for k, v in CONDITIONAL.items()}
        alone_batch["source"] = alone_batch["source"][:, : int(CONDITIONAL["source_lengths"][row])]
        alone_batch["target"] = alone_batch["target"][:, : int(CONDITIONAL["target_lengths"][row])]
        f_alone = frame(alone_batch, block_size=4)
        alone, _ = module.nelbo_terms(f_alone, 0, 1, t=t[row : row + 1, : f_alone.region.item() // 4])
        torch.testing.assert_close(alone[0], together[row], atol=1e-5, rtol=1e-5)


def naive_block_loss(module, f, noisy, masked, t_token, label_smoothing):
    """For each row and block b, run the model on [clean blocks < b ; noisy block b] with a
    mask written out by loops; sum the 1/t-weighted loss of the masked tokens."""
    bs, total = module.block_size, torch.zeros(len(noisy))
    for r in range(len(noisy)):
        start, region = int(f.target_start[r]), int(f.region[r])
        for b in range(region // bs):
            context = f.clean[r, : start + b * bs]
            context_blocks = f.clean_blocks[r, : start + b * bs].tolist()
            seq = torch.cat((context, noisy[r, b * bs : (b + 1) * bs]))
            n_ctx, n = len(context), len(seq)
            mask = torch.zeros(n, n, dtype=torch.bool)
            for i in range(n):
                for j in range(n):
                    if i >= n_ctx:
                        mask[i, j] = True  # the noisy block sees every clean token before it and itself
                    elif j < n_ctx:
                        mask[i, j] = context_blocks[j] <= context_blocks[i]
            hidden, _ = module.model.stack(seq[None], torch.arange(n)[None], mask=mask[None, None])
            logits = module.model.logits(hidden[0, n_ctx:]).log_softmax(-1)
            for k in range(bs):
                pos = b * bs + k
                if not masked[r, pos]:
                    continue
                label = f.clean[r, start + pos]
                nll = -logits[k, label]
                others = torch.cat((logits[k, :MASK], logits[k, MASK + 1 :]))
                loss = (1 - label_smoothing) * nll - label_smoothing * others.mean()
                total[r] += loss / t_token[r, pos]
    return total


@pytest.mark.parametrize("positional", ["sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("batch,block_size", [(CONDITIONAL, 2), (CONDITIONAL, 3), (PLAIN_LM, 4), (CONDITIONAL, 16)])
def test_vectorized_loss_equals_a_naive_loop_over_blocks(positional, batch, block_size):
    module = tiny_module(block_size, positional, label_smoothing=0.1)
    f = frame(batch, block_size)
    tokens, blocks, _ = f.target_view()
    t = sample_block_times(2, tokens.shape[1] // block_size, 0.2, 0.9, generator=torch.Generator().manual_seed(1))
    loss, _ = module.nelbo_terms(f, 0, 1, generator=torch.Generator().manual_seed(7), t=t)
    noisy, masked, t_token = mask_blocks(tokens, blocks, t, MASK, torch.Generator().manual_seed(7))
    assert masked.any()
    expected = naive_block_loss(module, f, noisy, masked, t_token, label_smoothing=0.1)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


def test_block_size_one_with_everything_masked_is_the_autoregressive_nll():
    module = tiny_module(block_size=1)
    f = frame(PLAIN_LM, block_size=1)
    _, nll = module.nelbo_terms(f, 0, 1, t=torch.ones(2, f.region.max().item()))
    for r in range(2):
        expected = torch.zeros(())
        for k in range(int(f.n_targets[r])):  # predict target token k from [bos] + tokens < k
            seq = torch.cat((f.clean[r, : 1 + k], torch.tensor([MASK])))
            hidden, _ = module.model.stack(seq[None], torch.arange(len(seq)), is_causal=True)
            expected -= module.model.logits(hidden[0, -1]).log_softmax(-1)[f.clean[r, 1 + k]]
        torch.testing.assert_close(nll[r], expected, atol=1e-5, rtol=1e-5)


def test_flex_block_mask_computes_the_dense_mask_function():
    dense, flex = tiny_module(2), tiny_module(2, mask_backend="flex")
    f = frame(CONDITIONAL, 2)
    tokens, blocks, positions = f.target_view()
    args = (tokens, blocks, positions, f.clean, f.clean_blocks)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex on CPU warns that it is a slow reference
        flex_hidden = flex.model.denoise(*args)
    with pytest.raises(ConfigError, match="mask_backend=flex cannot train on CPU"):
        flex.model.denoise(*args)
    for r, region in enumerate(f.region.tolist()):  # padded queries may differ; real ones may not
        torch.testing.assert_close(flex_hidden[r, :region], dense.model.denoise(*args)[r, :region], atol=1e-5, rtol=1e-5)


PROMPTS = [[BOS, 7, 8, 9, SEP], [BOS, 11, SEP], [BOS, 12, 13, SEP]]


@pytest.mark.parametrize("unmasking", ["confidence", "random"])
@pytest.mark.parametrize("temperature,steps", [(0.0, 4), (1.0, 2), (0.8, 1)])
def test_cached_sampling_gives_the_tokens_of_uncached_sampling(unmasking, temperature, steps):
    module = tiny_module(block_size=4, positional="alibi")
    sampling = SamplingConfig(temperature=temperature, top_p=0.9)

    def run(sampler):
        return sampler(module.model, PROMPTS, max_new_tokens=10, block_size=4, steps=steps, eos_id=EOS, pad_id=PAD,
                       sampling=sampling, unmasking=unmasking, generator=torch.Generator().manual_seed(3))

    cached = run(sample_blocks)
    assert cached == run(sample_blocks_uncached)
    assert all(len(row) <= 10 and EOS not in row and MASK not in row for row in cached)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("threshold", [0.0, 0.3, 0.9])
def test_cached_threshold_decoding_gives_the_tokens_of_uncached(temperature, threshold):
    module = tiny_module(block_size=4, positional="rope")
    sampling = SamplingConfig(temperature=temperature, top_p=0.9)

    def run(sampler):
        return sampler(module.model, PROMPTS, max_new_tokens=10, block_size=4, steps=4, eos_id=EOS, pad_id=PAD,
                       sampling=sampling, unmasking="threshold", threshold=threshold,
                       generator=torch.Generator().manual_seed(5))

    cached = run(sample_blocks)
    assert cached == run(sample_blocks_uncached)
    assert all(MASK not in row for row in cached)


@pytest.mark.parametrize("temperature", [0.0, 1.0])
def test_threshold_one_reveals_one_token_a_call_like_confidence_decoding(temperature):
    module = tiny_module(block_size=4, positional="rope")
    sampling = SamplingConfig(temperature=temperature)

    def run(unmasking, threshold=0.9):
        return sample_blocks(module.model, PROMPTS, max_new_tokens=10, block_size=4, steps=4, eos_id=EOS, pad_id=PAD,
                             sampling=sampling, unmasking=unmasking, threshold=threshold,
                             generator=torch.Generator().manual_seed(2))

    assert run("threshold", 1.0) == run("confidence")


def _counting(logits_of):
    calls = []

    def counted(x):
        calls.append(x.clone())
        return logits_of(x)
    return counted, calls


def test_threshold_zero_decodes_a_block_in_one_call_and_counts_match_a_hand_count():
    # Hand-made logits over a vocabulary of 4 (mask id 3) for one row of a 4-token block:
    # position 0 is sure (p = .97), 1 and 2 are 50/50, 3 is .9 sure. With threshold 0.8:
    # call 1 reveals 0 and 3; call 2 reveals one of the 50/50 positions (the most confident,
    # ties to the lower index) and call 3 the last: 3 calls.
    sure = torch.log(torch.tensor([0.97, 0.01, 0.01, 0.01]))
    even = torch.log(torch.tensor([0.5, 0.5, 1e-6, 1e-6]))
    likely = torch.log(torch.tensor([0.03, 0.9, 0.03, 0.04]))
    logits = torch.stack([sure, even, even, likely])[None]  # (1, 4, 4)
    empty = torch.full((1, 4), 3)
    greedy = SamplingConfig(temperature=0.0)
    counted, calls = _counting(lambda x: logits)
    block = denoise_block(empty, counted, 4, 3, greedy, "threshold", threshold=0.8)
    assert len(calls) == 3 and block.tolist() == [[0, 0, 0, 1]]
    assert (calls[1] == 3).tolist() == [[False, True, True, False]]
    counted, calls = _counting(lambda x: logits)
    assert denoise_block(empty, counted, 4, 3, greedy, "threshold", threshold=0.0).tolist() == [[0, 0, 0, 1]]
    assert len(calls) == 1
    counted, calls = _counting(lambda x: logits)
    denoise_block(empty, counted, 4, 3, greedy, "threshold", threshold=1.0)
    assert len(calls) == 4
    saturated = torch.tensor([[[40.0, 0.0, 0.0, 0.0]] * 4])  # float32 rounds p to exactly 1.0
    assert float(saturated.log_softmax(-1).max()) == 0.0
    counted, calls = _counting(lambda x: saturated)
    denoise_block(empty, counted, 4, 3, greedy, "threshold", threshold=1.0)
    assert len(calls) == 4  # tau = 1 is still one token a call


def test_a_block_diffusion_model_with_threshold_zero_makes_one_call_a_block():
    module = tiny_module(block_size=4, positional="rope")
    calls = []
    handle = module.model.stack.register_forward_hook(lambda *_: calls.append(1))
    sample_blocks(module.model, PROMPTS, max_new_tokens=12, block_size=4, steps=4, eos_id=-1, pad_id=PAD,
                  unmasking="threshold", threshold=0.0)
    handle.remove()
    assert len(calls) == 3  # 12 tokens, 3 blocks; each finished block joins the cache in the next call


def test_every_step_reveals_its_share_and_the_block_ends_clean():
    assert unmask_schedule(4, 2) == [2, 2] and unmask_schedule(5, 3) == [2, 2, 1] and unmask_schedule(4, 4) == [1] * 4


@pytest.mark.parametrize("kwargs,field", [
    ({"block_size": 0}, "block_size"),
    ({"block_size": 4, "denoising_steps": 5}, "denoising_steps"),
    ({"unmasking": "sorted"}, "unmasking"),
    ({"unmasking": "threshold", "threshold": 1.5}, "threshold"),
    ({"noise_range": [0.8, 0.3]}, "noise_range"),
    ({"noise_search": [[0.0, 1.0]]}, "noise_search"),
    ({"generation": {"beam_size": 4}}, "beam_size"),
    ({"mask_backend": "triton"}, "mask_backend"),
])
def test_bad_settings_name_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=field):
        BlockDiffusion(backbone=BackboneConfig(d_model=32, n_heads=4, n_layers=1, d_ff=64), vocab_size=40, **kwargs)


def test_antithetic_times_put_one_draw_in_each_slice_of_the_range():
    t = sample_block_times(4, 5, 0.5, 1.0, antithetic=True, generator=torch.Generator().manual_seed(0))
    slices = ((t.flatten() - 0.5) / 0.5 * 20).floor().long()
    assert sorted(slices.tolist()) == list(range(20))
    plain = sample_block_times(4, 5, 0.5, 1.0, antithetic=False, generator=torch.Generator().manual_seed(0))
    assert ((plain >= 0.5) & (plain <= 1.0)).all()


def test_each_token_is_masked_with_probability_t():
    tokens = torch.full((2, 20000), 9)
    blocks = torch.cat((torch.ones(2, 10000, dtype=torch.long), torch.full((2, 10000), 2)), dim=1)
    t = torch.tensor([[0.2, 0.7], [0.9, 0.05]])
    noisy, masked, t_token = mask_blocks(tokens, blocks, t, MASK, torch.Generator().manual_seed(0))
    rates = masked.view(2, 2, 10000).float().mean(-1)
    torch.testing.assert_close(rates, t, atol=0.015, rtol=0)
    assert torch.equal(noisy == MASK, masked) and torch.equal(t_token[:, 0], t[:, 0])


def test_a_batch_with_nothing_masked_still_backpropagates():
    module = tiny_module(block_size=2).train()
    f = frame(CONDITIONAL, 2)
    loss, _ = module.nelbo_terms(f, 0, 1, t=torch.full((2, 3), 1e-9))
    assert float(loss.sum()) == 0.0
    loss.sum().backward()  # a zero loss, but one with a graph: Lightning's backward must not fail


@torch.no_grad()
def test_an_examples_evaluation_bound_does_not_depend_on_its_batch():
    """Evaluation batches carry each example's split index, which seeds that example's noise: the
    same example gets the same NELBO alone, beside a longer example (more padding, more blocks)
    and in another position, so the bound is the same at any eval batch size or number of ranks."""
    from data_modules.batch import Example, collate_indexed

    module = tiny_module(block_size=2)
    examples = [Example([7, 8, 9], [20, 21, 22], "", ""), Example([11], [25, 26], "", ""),
                Example([7, 12, 13, 14, 15], [20, 21, 22, 23, 24, 25, 26], "", "")]

    def nll_by_index(order):
        batch = collate_indexed([(i, True, examples[i]) for i in order], PAD)
        return dict(zip(order, module.loss_terms(batch).nll.tolist()))

    alone = {i: nll_by_index([i])[i] for i in range(3)}
    for order in ([0, 1, 2], [2, 1, 0], [1, 2]):
        for i, value in nll_by_index(order).items():
            assert value == pytest.approx(alone[i], rel=1e-5), (order, i)
    assert len({round(v, 6) for v in alone.values()}) == 3
