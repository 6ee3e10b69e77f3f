"""The names of the metrics every family logs, without torch: reports and sweeps read them too.

Checkpoint selection, sweeps and reports read these keys; families/metrics.py computes them.
"""

# The keys every family logs per split: likelihoods (lower is better) and, when it generates,
# generation scores and speed (higher is better) and its cost in model calls (lower is better).
LIKELIHOOD_METRICS = ("loss", "nll", "ppl", "bpb")
GENERATION_METRICS = ("bleu", "bleu_lc", "chrf", "exact_match", "gen_tokens_per_s", "nfe_per_token")
LOWER_IS_BETTER = LIKELIHOOD_METRICS + ("nfe_per_token",)
