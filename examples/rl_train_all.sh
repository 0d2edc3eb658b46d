#!/bin/sh
# Trains the three shipped RL routers (4 instances) exactly as shipped, with their training curves.
# The budget (30 episodes x 2,000 requests, one gradient update per 4 steps) is documented in docs/rl.md.
set -e
OUT=${1:-fluidopt/rl/weights}
CURVES=${2:-docs/data}
mkdir -p "$OUT" "$CURVES"
for v in baseline wa wg; do
  fluidopt rl train examples/scenarios/rl-router-v100.toml --variant $v --episodes 30 --requests 2000 --seed 0 \
    --eps-episodes 20 --train-every 4 --out "$OUT/$v-rl-4.npz" --curves "$CURVES/rl_curves_$v.csv"
done
# 8 instances: the per-instance shared-weights network with multi-dispatch epochs and the "fits" wait mask
# (docs/rl.md sections 2, 4 and 5); the flat 8-instance MLP of the paper's MDP collapsed (section 8), and without
# the mask Baseline RL waited for ever on an idle fleet and WA-RL collapsed into waiting (section 5).
# WG-RL ships without the mask: retrained with it, it was worse (docs/rl.md section 5); the masked WG-RL of that
# comparison is examples/weights/wg-rl-masked-8.npz.
for v in baseline wa wg; do
  MASK=fits
  [ "$v" = wg ] && MASK=none
  fluidopt rl train examples/scenarios/rl-router-v100-8.toml --variant $v --episodes 30 --requests 2000 --seed 0 \
    --eps-episodes 20 --train-every 4 --arch shared --multi-dispatch --wait-mask $MASK --out "$OUT/$v-rl-8.npz" \
    --curves "$CURVES/rl_curves_${v}_8.csv"
done
