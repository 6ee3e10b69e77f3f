"""Block diffusion: the mask, vectorized vs naive loss, the AR limit, padding and cached sampling."""
import warnings

import pytest
import torch

from attnlab import BackboneConfig, BlockDiffusion, ConfigError, SamplingConfig
from attnlab.components.masks import block_diffusion_mask
from attnlab.generation.block_diffusion import sample_blocks, unmask_schedule
from reference_decoding import denoise, denoise_block, sample_blocks_uncached
from attnlab.models.framing import frame_blocks
from attnlab.models.masked_diffusion import mask_blocks, reachable, sample_block_times

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


def naive_block_loss(module, f, noisy, masked, t_token, label_smoothing, shift=False, causal=False):
    """For each row and block b, run the model on [clean blocks < b ; noisy block b] with a
    mask written out by loops; sum the 1/t-weighted loss of the masked tokens. `causal`: a
    clean token sees clean tokens up to itself; `shift`: token k of the block is predicted by
    the hidden state just before it (the last clean token for k = 0)."""
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
                        mask[i, j] = j <= i if causal else context_blocks[j] <= context_blocks[i]
            hidden, _ = module.model.stack(seq[None], torch.arange(n)[None], mask=mask[None, None])
            logits = module.model.logits(hidden[0, n_ctx - 1 : n - 1] if shift else hidden[0, n_ctx:]).log_softmax(-1)
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


VIEWS = {"bd3lm": {}, "shift": {"shift": True}, "causal": {"context": "causal"},
         "shift+causal": {"shift": True, "context": "causal"}}


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("positional", ["sinusoidal", "rope", "alibi"])
@pytest.mark.parametrize("batch,block_size", [(CONDITIONAL, 2), (CONDITIONAL, 3), (PLAIN_LM, 4), (CONDITIONAL, 16)])
def test_vectorized_loss_equals_a_naive_loop_over_blocks(positional, batch, block_size, view):
    module = tiny_module(block_size, positional, label_smoothing=0.1, **VIEWS[view])
    f = frame(batch, block_size)
    tokens, blocks, _ = f.target_view()
    t = sample_block_times(2, tokens.shape[1] // block_size, 0.2, 0.9, generator=torch.Generator().manual_seed(1))
    loss, _ = module.nelbo_terms(f, 0, 1, generator=torch.Generator().manual_seed(7), t=t)
    noisy, masked, t_token = mask_blocks(tokens, blocks, t, MASK, torch.Generator().manual_seed(7))
    assert masked.any()
    expected = naive_block_loss(module, f, noisy, masked, t_token, label_smoothing=0.1,
                                shift="shift" in view, causal="causal" in view)
    torch.testing.assert_close(loss, expected, atol=1e-5, rtol=1e-5)


@pytest.mark.parametrize("batch", [CONDITIONAL, PLAIN_LM], ids=["conditional", "plain_lm"])
def test_shifted_block_size_one_with_everything_masked_is_decoder_only_nll(batch):
    """The same network as a DecoderOnly: its logits over `[bos] source [sep] target [eos]`
    (mask token ruled out, as block diffusion never predicts it) give the NLL of the target and
    eos; shifted block diffusion with blocks of 1, every token masked (t = 1) and a causal
    context must give exactly that, row by row."""
    from attnlab import DecoderOnly
    from attnlab.models.framing import IGNORE, frame_prefix_target

    module = tiny_module(block_size=1, shift=True, context="causal")
    f = frame(batch, block_size=1)
    _, nll = module.nelbo_terms(f, 0, 1, t=torch.ones(2, f.region.max().item()))
    ar = DecoderOnly(backbone=module.hparams["backbone"], vocab_size=40).eval()
    ar.model.load_state_dict(module.model.state_dict())
    tokens, labels = frame_prefix_target(batch, BOS, SEP, EOS, PAD)
    logits = ar.model(tokens).float()
    logits[..., MASK] = float("-inf")
    token_nll = -logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
    expected = (token_nll * (labels != IGNORE)).sum(1)
    torch.testing.assert_close(nll, expected, atol=1e-5, rtol=1e-5)


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


@pytest.mark.parametrize("context", ["block_causal", "causal"])
def test_flex_block_mask_computes_the_dense_mask_function(context):
    dense, flex = tiny_module(2, context=context), tiny_module(2, mask_backend="flex", context=context)
    f = frame(CONDITIONAL, 2)
    tokens, blocks, positions = f.target_view()
    args = (tokens, blocks, positions, f.clean, f.clean_blocks)
    with torch.no_grad(), warnings.catch_warnings():
        warnings.simplefilter("ignore")  # eager flex on CPU warns that it is a slow reference
        flex_hidden = denoise(flex.model, *args)
    with pytest.raises(ConfigError, match="mask_backend=flex cannot train on CPU"):
        denoise(flex.model, *args)
    for r, region in enumerate(f.region.tolist()):  # padded queries may differ; real ones may not
        torch.testing.assert_close(flex_hidden[r, :region], denoise(dense.model, *args)[r, :region], atol=1e-5, rtol=1e-5)


PROMPTS = [[BOS, 7, 8, 9, SEP], [BOS, 11, SEP], [BOS, 12, 13, SEP]]


DECODINGS = [(u, temperature, steps) for u in ("confidence", "random") for temperature, steps in
             ((0.0, 4), (1.0, 2), (0.8, 1))] + [("first_hitting", 0.0, 4), ("first_hitting", 1.0, 4)]


@pytest.mark.parametrize("view", VIEWS)
@pytest.mark.parametrize("unmasking,temperature,steps", DECODINGS)
def test_cached_sampling_gives_the_tokens_of_uncached_sampling(unmasking, temperature, steps, view):
    module = tiny_module(block_size=4, positional="alibi", **VIEWS[view])
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


def test_resample_redraws_exactly_the_blocks_outside_the_range():
    """Blocks of 4, range [0.5, 0.8]: row 0 block 1 has 1/4 masked (below), row 1 block 1 has 4/4
    (above): those two are drawn again until inside; row 0 block 2 (3/4) is kept bit for bit and
    row 1 block 2 is padding, never masked."""
    from attnlab.models.masked_diffusion import resample_masks

    masked = torch.tensor([[1, 0, 0, 0, 1, 1, 0, 1], [1, 1, 1, 1, 0, 0, 0, 0]], dtype=torch.bool)
    blocks = torch.tensor([[1, 1, 1, 1, 2, 2, 2, 2], [1, 1, 1, 1, -1, -1, -1, -1]])
    t_token = torch.full((2, 8), 0.65)
    for seed in range(20):
        out = resample_masks(masked, blocks, t_token, 4, 0.5, 0.8, torch.Generator().manual_seed(seed))
        assert torch.equal(out[0, 4:], masked[0, 4:]) and not out[1, 4:].any()
        for row in range(2):
            assert out[row, :4].sum().item() in (2, 3), out  # fractions 0.5 and 0.75 are the only ones inside
    # An edge at the evaluation floor or at 1 is not enforced (bd3lms): nothing is redrawn.
    assert torch.equal(resample_masks(masked, blocks, t_token, 4, 1e-3, 1.0), masked)
    # Only the lower edge: the full block is inside [0.5, 1], the quarter one is not.
    out = resample_masks(masked, blocks, t_token, 4, 0.5, 1.0, torch.Generator().manual_seed(0))
    assert torch.equal(out[1], masked[1]) and out[0, :4].sum() >= 2


def test_the_training_range_reads_back_as_configured_so_resample_keeps_bd3lms_edges():
    """The range lives in a float32 buffer (saved with the weights): read back naively, 1e-3 is
    0.0010000000474974513, an edge `resample` would enforce (redrawing every block with nothing
    masked), and 0.3 is above 0.3."""
    from attnlab.models.masked_diffusion import enforced_bounds

    floor = tiny_module(block_size=4, noise_range=[1e-3, 1.0], resample=True)
    assert floor.train_range == (1e-3, 1.0) and enforced_bounds(*floor.train_range) == (None, None)
    assert tiny_module(block_size=10, noise_range=[0.3, 0.9], resample=True).train_range == (0.3, 0.9)


def test_a_range_no_block_can_reach_is_refused_with_resample():
    with pytest.raises(ConfigError, match="noise_range.*no block of 4 tokens"):
        tiny_module(block_size=4, noise_range=[0.3, 0.45], resample=True)
    tiny_module(block_size=4, noise_range=[0.3, 0.45])  # without resample the range is only where t is drawn


def test_first_hitting_reveals_one_uniformly_chosen_position_per_call():
    """Each call turns exactly one masked position into a token drawn from that position's own
    distribution (position j puts all its mass on token 10 + j), the position chosen uniformly
    among those still masked: over 4,000 rows each of the 4 positions comes first ~1,000 times."""

    rows, size, seen = 4000, 4, []

    def logits_of(block):
        seen.append(block.clone())
        logits = torch.full((rows, size, 40), -1e4)
        logits[:, torch.arange(size), 10 + torch.arange(size)] = 0.0
        return logits

    empty = torch.full((rows, size), MASK)
    out = denoise_block(empty, logits_of, size, MASK, SamplingConfig(temperature=1.0), "first_hitting",
                        torch.Generator().manual_seed(0))
    assert len(seen) == size and torch.equal(out, (10 + torch.arange(size)).expand(rows, -1))
    after = seen[1:] + [out]
    firsts = []
    for before, now in zip(seen, after):
        changed = before != now
        assert (changed.sum(1) == 1).all() and (before[changed] == MASK).all()
        firsts.append(changed.float().argmax(1))
    counts = torch.bincount(firsts[0], minlength=size)
    assert ((counts - rows / size).abs() < 150).all(), counts  # ~5 standard deviations
    second = torch.bincount(firsts[1][firsts[0] == 0], minlength=size)[1:]  # uniform over the 3 left
    assert second.min() > 0.75 * second.float().mean()


def zero_output(module):
    """Every logit 0 (the output layer, tied to the embedding, zeroed): uniform predictions."""
    with torch.no_grad():
        module.model.stack.embedding.weight.zero_()
    return module


def test_eos_fillers_are_trained_and_scored_but_not_counted_in_the_bound():
    """By hand: one pair, source [7], target [20, 21]: the target block (size 4) holds 20 21 eos
    and one eos filler. With the output layer zeroed every prediction is uniform over the 39
    tokens that are not the mask, so at t = 1 (all 4 masked, weight 1) each masked token costs
    log 39 nats. The bound scores all 4 (the filled sequence's terms: a true bound) over the 3
    tokens an AR model counts (target and eos); the training loss trains the filler too."""
    import math

    module = zero_output(tiny_module(block_size=4, positional="sinusoidal"))
    batch = {"source": torch.tensor([[7]]), "source_lengths": torch.tensor([1]),
             "target": torch.tensor([[20, 21]]), "target_lengths": torch.tensor([2])}
    f = frame(batch, 4)
    assert f.n_targets.tolist() == [3] and f.region.tolist() == [4]
    loss, nll = module.nelbo_terms(f, 0, 1, t=torch.ones(1, 1))
    assert nll.item() == pytest.approx(4 * math.log(39), rel=1e-6)
    assert loss.item() == pytest.approx(4 * math.log(39), rel=1e-6)
    terms = module.loss_terms(batch)
    assert terms.targets.tolist() == [3]


def test_the_conditional_nelbo_bounds_the_exact_nll_of_a_model_whose_views_agree():
    """A shifted, causal model with its output zeroed predicts the same (uniform) distribution in
    its diffusion view and its AR view, so its AR view's NLL of target and eos is exact: the NELBO,
    averaged over many noise draws at the evaluation range, must not fall below it. It sits above
    it by the fillers' terms (here three: 5 tokens in two blocks of 4)."""
    import math

    module = zero_output(tiny_module(block_size=4, positional="rope", shift=True, context="causal"))
    batch = {"source": torch.tensor([[7, 8]]), "source_lengths": torch.tensor([2]),
             "target": torch.tensor([[20, 21, 22, 23]]), "target_lengths": torch.tensor([4])}
    sequence = torch.tensor([[BOS, 7, 8, SEP, 20, 21, 22, 23, EOS]])
    hidden, _ = module.model.stack(sequence[:, :-1], torch.arange(8), is_causal=True)
    exact = torch.nn.functional.cross_entropy(module.model.logits(hidden[0, 3:]), sequence[0, 4:], reduction="sum")
    draws = 4000  # the same pair as many rows, each with its own noise
    f = frame({key: value.expand(draws, -1) if value.dim() == 2 else value.expand(draws) for key, value in batch.items()}, 4)
    bound = module.nelbo_terms(f, 1e-3, 1.0, generator=torch.Generator().manual_seed(0))[1].mean().item()
    assert exact.item() == pytest.approx(5 * math.log(39), rel=1e-5)
    assert bound >= exact.item()
    assert bound == pytest.approx(8 * math.log(39), rel=0.05)  # 5 tokens and 3 fillers, each log 39 in expectation


def test_complementary_masks_train_every_target_token_once():
    """With complementary masks and uniform weighting the row's loss is the mean of two copies
    whose masks partition the target region: the sum over both is the cross-entropy of every
    target token once, whatever was drawn; so two different draws give the same loss when the
    model cannot see the masks (zeroed output: every token costs log 39)."""
    import math

    module = zero_output(tiny_module(block_size=2, complementary_masks=True, loss_weighting="uniform").train())
    f = frame(CONDITIONAL, 2)
    region = f.region.tolist()
    for seed in range(3):
        loss, _ = module.nelbo_terms(f, 0.2, 0.9, generator=torch.Generator().manual_seed(seed))
        assert loss.tolist() == pytest.approx([r * math.log(39) / 2 for r in region], rel=1e-5)
    # The second copy's input is the first's complement: every target-region token masked in exactly one.
    inputs, joint_pass = [], module.model.joint_pass
    module.model.joint_pass = lambda noisy, *rest: inputs.append(noisy) or joint_pass(noisy, *rest)
    module.nelbo_terms(f, 0.2, 0.9, generator=torch.Generator().manual_seed(0))
    (noisy,) = inputs
    first, second = (noisy[:len(region)] == MASK), (noisy[len(region):] == MASK)
    _, blocks, _ = f.target_view()
    assert torch.equal(first ^ second, blocks >= 0) and not (first & second).any()
    with pytest.raises(ConfigError, match="complementary_masks needs loss_weighting: uniform"):
        tiny_module(block_size=2, complementary_masks=True)


def test_the_ar_loss_is_the_clean_halfs_next_token_loss():
    """ar_loss_weight w adds w times DecoderOnly's loss of the same network on the same pairs
    (context causal: the clean half is that decoder's pass), and nothing to the bound."""
    from attnlab import DecoderOnly

    plain = tiny_module(block_size=2, shift=True, context="causal").train()
    with_ar = tiny_module(block_size=2, shift=True, context="causal", ar_loss_weight=0.5).train()
    f = frame(CONDITIONAL, 2)
    t = torch.full((2, f.region.max().item() // 2), 0.6)
    (base, nll), (total, nll_ar) = (m.nelbo_terms(f, 0, 1, generator=torch.Generator().manual_seed(1), t=t)
                                    for m in (plain, with_ar))
    ar = DecoderOnly(backbone=plain.hparams["backbone"], vocab_size=40)
    ar.model.load_state_dict(plain.model.state_dict())
    from attnlab.models.framing import IGNORE, frame_prefix_target

    tokens, labels = frame_prefix_target(CONDITIONAL, BOS, SEP, EOS, PAD)
    with torch.no_grad():
        logits = ar.model(tokens).float()
    logits[..., MASK] = float("-inf")
    expected = (-logits.log_softmax(-1).gather(-1, labels.clamp(min=0)[..., None]).squeeze(-1)
                * (labels != IGNORE)).sum(1)
    torch.testing.assert_close(total - base, 0.5 * expected, atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(nll_ar, nll)
    with pytest.raises(ConfigError, match="ar_loss_weight > 0 needs context: causal"):
        tiny_module(block_size=2, ar_loss_weight=0.5)


def test_noise_search_measures_the_nelbo_terms_whatever_the_training_weights():
    """bd3lms picks the range by the variance of the 1/t-weighted loss; with plain cross-entropy
    (loss_weighting uniform) the statistic stays that one, so the two weightings see the same
    per-token terms for the same network and noise."""
    elbo, uniform = tiny_module(block_size=2), tiny_module(block_size=2, loss_weighting="uniform")
    uniform.load_state_dict(elbo.state_dict())
    f = frame(CONDITIONAL, 2)
    terms = [m.nelbo_terms(f, 0.2, 0.9, generator=torch.Generator().manual_seed(3), per_token=True)[2]
             for m in (elbo, uniform)]
    assert terms[0].abs().sum() > 0 and torch.equal(terms[0], terms[1])


def test_the_ar_loss_is_trained_but_left_out_of_evaluation():
    """val/loss stays the bound's loss, comparable with a model trained without the AR loss."""
    plain = tiny_module(block_size=2, shift=True, context="causal")
    with_ar = tiny_module(block_size=2, shift=True, context="causal", ar_loss_weight=0.5)
    losses = [m.loss_terms(CONDITIONAL).loss for m in (plain, with_ar)]
    assert torch.equal(losses[0], losses[1])
    plain.train(), with_ar.train()
    torch.manual_seed(0)
    base = plain.loss_terms(CONDITIONAL).loss
    torch.manual_seed(0)
    assert not torch.allclose(with_ar.loss_terms(CONDITIONAL).loss, base)


def test_bd3lms_windows_are_its_five_widths_slid_by_a_twentieth():
    from attnlab.models.masked_diffusion import bd3lms_windows

    windows = bd3lms_windows()
    expected = {(0.001, 1.0)} | {(max(round(0.05 * i, 2), 0.001), round(0.05 * (i + w), 2))
                                 for w in (10, 12, 14, 16, 18) for i in range(0, 21 - w)}
    assert windows[0] == (0.001, 1.0) and set(windows) == expected and len(windows) == len(expected) == 36
    module = tiny_module(block_size=4, noise_search="bd3lms", resample=True)
    assert module.noise_candidates and all(reachable(low, high, 4) for low, high in module.noise_candidates)
    with pytest.raises(ConfigError, match="noise_search='every' must be a list of"):
        tiny_module(noise_search="every")


def test_noise_searchs_statistic_resamples_the_masks_as_training_does():
    """With resample, the variance statistic is measured on masks redrawn into the candidate
    range, as bd3lms measures it: every block's masked share lies in [low, high] (without resample,
    some do not)."""
    module = tiny_module(block_size=4)
    f = frame({key: value.repeat(20, 1) if value.dim() == 2 else value.repeat(20) for key, value in CONDITIONAL.items()}, 4)
    _, blocks, _ = f.target_view()
    real = (blocks >= 0).view(len(blocks), -1, 4).all(-1)

    def shares(resample):
        *_, per_token = module.nelbo_terms(f, 0.5, 0.75, generator=torch.Generator().manual_seed(0), per_token=True,
                                           resample=resample)
        return (per_token != 0).float().view(len(blocks), -1, 4).mean(-1)[real]

    assert ((shares(True) >= 0.5) & (shares(True) <= 0.75)).all()
    assert ((shares(False) < 0.5) | (shares(False) > 0.75)).any()
