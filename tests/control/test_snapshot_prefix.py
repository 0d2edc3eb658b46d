"""ClusterSnapshot answers the protocol's prefix-cache query from the router's own index (issue 42)."""

from __future__ import annotations

import pytest

from fluidopt.control.protocol import ClusterView, Context
from fluidopt.control.snapshot import ClusterSnapshot
from fluidopt.core.errors import ActionError


def test_the_snapshot_answers_cached_prefix_tokens_from_its_index():
    snap = ClusterSnapshot(2, 4, 1, block_size=10)
    assert isinstance(snap, Context) and isinstance(snap, ClusterView)
    a = snap.add_request(0, 35, 5, blocks=[1, 2, 3, 4])  # last block partial: 5 tokens
    snap.start_prefill(a, 0)
    b = snap.add_request(0, 30, 5, blocks=[1, 2, 9])
    assert snap.cached_prefix_tokens(b, 0) == 0  # a's blocks are not computed yet
    assert snap.prefill_finished(a) == 0
    assert [snap.cached_prefix_tokens(b, g) for g in (0, 1)] == [20, 0]
    c = snap.add_request(0, 35, 5, blocks=[1, 2, 3, 4])
    assert snap.cached_prefix_tokens(c, 0) == 35  # the whole prompt, not 4 whole blocks
    snap.evict_blocks(0, [2])
    assert snap.cached_prefix_tokens(b, 0) == 10 and snap.cached_prefix_tokens(c, 0) == 10
    snap.evict_blocks(0)
    assert snap.cached_prefix_tokens(c, 0) == 0
    plain = snap.add_request(0, 30, 5)  # no blocks known: nothing cached
    assert snap.cached_prefix_tokens(plain, 0) == 0


def test_blocks_need_a_block_size_and_bad_ids_are_one_line():
    with pytest.raises(ActionError, match="block_size"):
        ClusterSnapshot(1, 4, 1).add_request(0, 30, blocks=[1, 2])
    with pytest.raises(ActionError, match="block_size"):
        ClusterSnapshot(1, 4, 1, block_size=0)
    snap = ClusterSnapshot(1, 4, 1, block_size=8)
    r = snap.add_request(0, 30, blocks=[1])
    with pytest.raises(ActionError):
        snap.cached_prefix_tokens(r, 5)
    with pytest.raises(ActionError):
        snap.cached_prefix_tokens(99, 0)
