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
# 8 instances (the network widens to 128 hidden units): a much smaller budget, see docs/rl.md section 5.
for v in baseline wa wg; do
  fluidopt rl train examples/scenarios/rl-router-v100-8.toml --variant $v --episodes 6 --requests 2000 --seed 0 \
    --eps-episodes 4 --train-every 8 --out "$OUT/$v-rl-8.npz" --curves "$CURVES/rl_curves_${v}_8.csv"
done
