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
# The per-scenario default wg-rl files (fluidopt.rl.mlp.SCENARIO_WEIGHTS; docs/rl.md section 6b):
# the paper's operating point: the regime routers, fitted to Small-Large (fewest requests within its groups) under
# its action mask on the log-count state (--state log: counts that do not saturate in the overload), one per regime
# scenario (about 15 s each); the first version, fitted to the reserving hold rule, is
# examples/weights/wg-rl-regime-reserve-4.npz (fluidopt rl imitate ... --expert reserve)
fluidopt rl imitate examples/scenarios/rl-router-paper-regime.toml --expert small-large --state log \
  --out "$OUT/wg-rl-regime.npz"
fluidopt rl imitate examples/scenarios/rl-router-paper-regime-fig4b.toml --expert small-large --state log \
  --out "$OUT/wg-rl-regime-fig4b.npz"
# the V100 settings (4 and 8 instances): the time-in-system agent of section 6's ablation, training seed 1
fluidopt rl train examples/scenarios/rl-router-v100.toml --variant wg --episodes 30 --requests 2000 --seed 1 \
  --eps-episodes 20 --train-every 4 --objective time-in-system --arch shared --multi-dispatch --wait-mask fits \
  --gamma 0.998 --out "$OUT/wg-rl-tis.npz"
# the stable-baselines3 reference agents on the regime router's environment (about 1 minute each)
python examples/rl_sb3.py --algo dqn --timesteps 40000 --requests 2000 --seed 0 --out "$OUT/sb3-dqn-regime.npz"
python examples/rl_sb3.py --algo ppo --timesteps 40000 --requests 2000 --seed 0 --out "$OUT/sb3-ppo-regime.npz"
