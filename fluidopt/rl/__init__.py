"""The workload-guided RL router (Jain et al., arXiv:2408.13510): environment, agent, predictors.

Without torch or gymnasium: :mod:`fluidopt.rl.core` (state, reward, episodes),
:mod:`fluidopt.rl.predictors`, :mod:`fluidopt.rl.mlp` (numpy inference, weight files) and
:mod:`fluidopt.rl.policies` (the registered ``baseline-rl``, ``wa-rl``, ``wg-rl``). With the ``rl``
extra (``pip install -e ".[rl]"``): :mod:`fluidopt.rl.env` (Gymnasium) and :mod:`fluidopt.rl.dqn`
(Double DQN in torch). See docs/rl.md.
"""

from __future__ import annotations

from fluidopt.core.errors import UsageError

__all__ = ["require_extra"]

EXTRA_HINT = 'pip install -e ".[rl]"'


def require_extra(what: str = "training"):
    """Import torch and gymnasium, or raise one UsageError line saying how to install them."""
    try:
        import gymnasium  # noqa: F401
        import torch  # noqa: F401
    except ImportError as e:
        raise UsageError(f"RL {what} needs the rl extra (torch, gymnasium), missing {e.name!r}: {EXTRA_HINT}") from None
