#!/usr/bin/env bash
# Reproduces the bundled drafters of models/evspark-sh2-192 (run from the repo root).
# The teacher cache (~1 GB) goes to runs/, outside the repository.
set -euo pipefail
SHARED=${EVSPARK_SHARED:-../shared}
M=models/evspark-sh2-192
COMMON="--model $M --cache runs/teacher-sh2-192 --train $SHARED/data/train --gamma 16 --batch 64 --width 128 --layers 2 --prefix 64 --threads 2 --quiet"
for seed in 0 1 2; do
  evspark distill $COMMON --seed $seed --steps 3000 -o $M/drafters/seed$seed --run-dir runs/distill/seed$seed
done
# budget sweep (seed 0, shorter schedules) for the tau-vs-supervised-positions curve
for steps in 300 1000; do
  evspark distill $COMMON --seed 0 --steps $steps -o runs/distill/budget$steps/drafter --run-dir runs/distill/budget$steps
done
