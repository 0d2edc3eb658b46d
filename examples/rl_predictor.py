"""Output-length predictors: the noisy oracle's accuracy and the trainable binned predictor's
confusion matrix on the RL setting's workload and (when present) on the Azure conversation trace.

    python examples/rl_predictor.py
"""

from __future__ import annotations

from fluidopt.core.interrupt import script_guard

script_guard()  # Ctrl-C / SIGTERM from here on, the imports below included: one line, exit 130 / 143

from pathlib import Path

import numpy as np

from fluidopt.rl.core import episode_workload
from fluidopt.rl.predictors import BinnedPredictor, NoisyOracle, bucket_of, confusion_matrix
from fluidopt.scenario import load_scenario

ROOT = Path(__file__).resolve().parents[1]
AZURE = ROOT.parent / "shared" / "data" / "azure-llm-inference-2023" / "AzureLLMInferenceTrace_conv.csv"


def show(title, true, pred):
    cm = confusion_matrix(true, pred)
    print(f"{title}: accuracy {np.trace(cm) / cm.sum():.3f} on {cm.sum():,} requests")
    print("  true \\ predicted   [0,256)  [256,2048)  [2048,inf)")
    for i, row in enumerate(cm):
        print(f"  {['[0,256)', '[256,2048)', '[2048,inf)'][i]:>16s}  " + "  ".join(f"{v:9d}" for v in row))


def main() -> None:
    sc = load_scenario(ROOT / "examples" / "scenarios" / "rl-router-v100.toml")
    tr, te = episode_workload(sc, 20000, 1), episode_workload(sc, 20000, 2)
    true = [bucket_of(o) for o in te.output]
    orc = NoisyOracle(0.79, seed=3)
    show("noisy oracle (accuracy 0.79), RL setting", true,
         [orc.predict(t, c, p, o) for t, c, p, o in zip(te.time, te.cls, te.prompt, te.output)])
    bp = BinnedPredictor().fit(tr.prompt, tr.output, tr.cls)
    show("binned predictor (task + prompt length), RL setting", true, bp.predict_many(te.prompt, te.cls))
    bp0 = BinnedPredictor().fit(tr.prompt, tr.output)
    show("binned predictor (prompt length only), RL setting", true, bp0.predict_many(te.prompt))
    if AZURE.is_file():
        from fluidopt.workloads.traces import read_azure_trace

        df = read_azure_trace(AZURE)
        half = len(df) // 2
        p, o = df["prompt"].to_numpy(), df["output"].to_numpy()
        bpa = BinnedPredictor().fit(p[:half], o[:half])
        show("binned predictor (prompt length only), Azure conversation trace, second half", [bucket_of(x) for x in o[half:]],
             bpa.predict_many(p[half:]))


if __name__ == "__main__":
    from fluidopt.core.interrupt import script_main

    # Ctrl-C / SIGTERM: one line on what was kept, exit 130 / 143, no traceback
    raise SystemExit(script_main(main))
