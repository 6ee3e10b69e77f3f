#!/bin/bash
# The AR-to-block-diffusion recipe on Multi30k en->de, at the DecoderOnly run's own CPU budget.
#
#   1. DecoderOnly trains as experiments/multi30k/decoder_only.yaml, keeping a checkpoint per epoch;
#      its wall time is the budget B.
#   2. Its epoch-K checkpoint (written T_K after the fit started) becomes a BlockDiffusion model
#      (`run.init_from`: same network) that fine-tunes for B - T_K (experiments/multi30k/block_diffusion_from_ar.yaml),
#      so both models cost the same CPU time. Checkpoints: DecoderOnly's averaged.ckpt (the last 5
#      epochs, as its config has always been scored), block diffusion's best by val/nll (a few
#      epochs of fine-tuning: an average would reach back to the first).
#   3. Both are tested on test2016 at eval batch 1 and 64: DecoderOnly greedy (and beam 4, the README's
#      earlier row), the converted model (shifted, causal context: see its config) with 4 and 2 steps
#      per block of 4 and with threshold decoding; at batch 1, 16 and 64, DecoderOnly greedy and the
#      converted model by draft-and-verify (generation.verify; at batch 1 also with blocks of 2, 8 and
#      16), all eager.
#   4. With `scratch` as third argument: BlockDiffusion from scratch (experiments/multi30k/block_diffusion.yaml)
#      for the same budget B, tested the same way.
#   5. The table (scripts/multi30k_table.py): every evaluation with sacreBLEU's paired bootstrap
#      against DecoderOnly greedy, each row's training cost, and whether the goal of issue 32 holds.
#
# Run it from the repository root with the virtual environment active.
# Usage: scripts/multi30k_from_ar.sh [K] [DATA_DIR] [scratch]   (defaults: K=7, ../shared/data/multi30k)
# Steps already done (a fit folder with summary.json, a test folder with metrics.csv) are skipped.
set -euo pipefail
python -c "import attnlab, torch" 2> /dev/null || { echo "error: this python cannot import attnlab and torch: activate the virtual environment (. .venv/bin/activate) and run from the repository root" >&2; exit 2; }
K=${1:-7}
DATA=${2:-../shared/data/multi30k}
ROOT=runs/multi30k
AR_VERSION=${AR_VERSION:-budget}  # the DecoderOnly run's version (folder name)
AR=$ROOT/decoder_only/$AR_VERSION
BD=$ROOT/block_diffusion_from_ar/epoch$K
D=(--data.init_args.data_dir "$DATA" --run.wandb disabled)
mkdir -p "$ROOT"
[ -f "$ROOT/recipe.json" ] || python -c 'import json, sys; from attnlab.reports.provenance import context
print(json.dumps(context(" ".join(sys.argv[1:])), indent=1))' scripts/multi30k_from_ar.sh "$@" > "$ROOT/recipe.json"  # command, machine, commit for the table

if [ ! -f "$AR/summary.json" ]; then
  attnlab fit --config experiments/multi30k/decoder_only.yaml "${D[@]}" --run.version "$AR_VERSION" \
    --trainer.callbacks+=lightning.pytorch.callbacks.ModelCheckpoint --trainer.callbacks.filename='ar-{epoch}' \
    --trainer.callbacks.save_top_k=-1 --trainer.callbacks.every_n_epochs=1
fi
EPOCH=$AR/checkpoints/ar-epoch=$K.ckpt
if ! ls "$AR"/checkpoints/ar-epoch=*.ckpt > /dev/null 2>&1; then
  echo "error: $AR has no per-epoch checkpoints (ar-epoch=*.ckpt): it was trained without this script; move it away or set AR_VERSION" >&2; exit 2
fi
[ -f "$EPOCH" ] || { echo "error: $EPOCH does not exist: the DecoderOnly run has fewer than $((K + 1)) epochs; pass a smaller K" >&2; exit 2; }
# Training seconds by Lightning's own clock (the Timer that enforces max_time, which a resume
# carries on): the AR run's whole budget (its last checkpoint) and its epoch K; the fine-tune gets
# the rest. Printed also as max_time strings (DD:HH:MM:SS).
read -r BUDGET SPENT LEFT BUDGET_TIME LEFT_TIME < <(python - "$AR/checkpoints/last.ckpt" "$EPOCH" <<'EOF'
import sys
import torch
end, epoch = (round(torch.load(p, map_location="cpu", weights_only=False)["callbacks"]["Timer"]["time_elapsed"]["train"])
              for p in sys.argv[1:])
clock = lambda s: f"00:{s // 3600:02d}:{s % 3600 // 60:02d}:{s % 60:02d}"
print(end, epoch, end - epoch, clock(end), clock(end - epoch))
EOF
)
echo "budget: DecoderOnly trained ${BUDGET}s; its epoch $K after ${SPENT}s; the fine-tune gets ${LEFT}s ($LEFT_TIME)"
[ "$LEFT" -ge 300 ] || { echo "error: only ${LEFT}s would be left for the fine-tune after epoch $K; pass a smaller K" >&2; exit 2; }

if [ ! -f "$BD/summary.json" ]; then
  attnlab fit --config experiments/multi30k/block_diffusion_from_ar.yaml "${D[@]}" --run.version "epoch$K" \
    --run.init_from "$EPOCH" --trainer.max_time "$LEFT_TIME"
fi

evaluate() {  # config checkpoint run_folder version [overrides...]
  local config=$1 ckpt=$2 run=$3 version=$4; shift 4
  [ -f "$(dirname "$run")/$version/metrics.csv" ] && return
  attnlab test --config "$config" "${D[@]}" --ckpt_path "$ckpt" --run.name "$(dirname "${run#runs/}")" \
    --run.version "$version" "$@"
}
AR_CKPT=$AR/checkpoints/averaged.ckpt
best() {  # the best-by-val/nll checkpoint of a fit folder
  local found; found=$(ls -t "$1"/checkpoints/best-*.ckpt 2> /dev/null | head -1)
  [ -n "$found" ] || { echo "error: $1 has no best-*.ckpt: did its fit finish?" >&2; exit 2; }
  echo "$found"
}
BD_CKPT=$(best "$BD")
evaluate_bd() {  # config checkpoint run_folder version_prefix: 4 and 2 steps per block, then threshold decoding
  if grep -q "context: causal" "$1"; then  # draft-and-verify: the AR view's greedy output, drafts checked in its calls
    for B in 1 16 64; do
      evaluate "$1" "$2" "$3" "$4-verify@b$B" --data.init_args.eval_batch_size $B --model.init_args.generation.verify true
    done
    for N in 2 8 16; do  # blocks of 2, 8 and 16 from the same model (trained on blocks of 4): p by position
      evaluate "$1" "$2" "$3" "$4-verify-block$N@b1" --data.init_args.eval_batch_size 1 \
        --model.init_args.generation.verify true --model.init_args.block_size $N --model.init_args.denoising_steps null
    done
  fi
  for B in 1 64; do
    evaluate "$1" "$2" "$3" "$4-steps=4@b$B" --data.init_args.eval_batch_size $B
    evaluate "$1" "$2" "$3" "$4-steps=2@b$B" --data.init_args.eval_batch_size $B --model.init_args.denoising_steps 2
    for TAU in 0.9 0.7; do
      evaluate "$1" "$2" "$3" "$4-tau=$TAU@b$B" --data.init_args.eval_batch_size $B \
        --model.init_args.unmasking threshold --model.init_args.threshold $TAU
    done
  done
}
for B in 1 16 64; do
  evaluate experiments/multi30k/decoder_only.yaml "$AR_CKPT" "$AR" "$AR_VERSION-greedy@b$B" \
    --data.init_args.eval_batch_size $B --model.init_args.generation.beam_size 1
done
evaluate experiments/multi30k/decoder_only.yaml "$AR_CKPT" "$AR" "$AR_VERSION-beam4@b64" --data.init_args.eval_batch_size 64
evaluate_bd experiments/multi30k/block_diffusion_from_ar.yaml "$BD_CKPT" "$BD" "epoch$K"

if [ "${3:-}" = scratch ]; then
  SCRATCH=$ROOT/block_diffusion/budget
  if [ ! -f "$SCRATCH/summary.json" ]; then
    attnlab fit --config experiments/multi30k/block_diffusion.yaml "${D[@]}" --run.version budget \
      --trainer.max_time "$BUDGET_TIME"
  fi
  SCRATCH_CKPT=$(best "$SCRATCH")
  evaluate_bd experiments/multi30k/block_diffusion.yaml "$SCRATCH_CKPT" "$SCRATCH" budget
fi
python scripts/multi30k_table.py "$ROOT" "decoder_only/$AR_VERSION-greedy@b64"  # --page docs/results/multi30k.md publishes it
