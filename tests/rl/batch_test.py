"""Step samples → learner batch: one padding policy, the response window, rows sharded."""

import jax
import numpy as np
import pytest

from skilljax import sharding
from skilljax.rl import batch as batch_lib
from skilljax.rl.rollout import StepSample
from skilljax.sampling import bucket_length


def sample(prompt: int, response: int) -> StepSample:
    return StepSample(list(range(1, prompt + 1)), [7] * response, np.full(response, -0.5, np.float32),
                      episode=0, group=0, step=0, action="", valid=True, invalid_reason="",
                      reward=0.0, truncated_response=False, counts={})


def test_collate_pads_once_to_the_bucket_of_the_longest_sample():
    samples = [sample(30, 5), sample(41, 9), sample(3, 2)]
    b = batch_lib.collate(samples, [1.0, -1.0, 0.5], pad_id=0)
    assert b.tokens_BT.shape == (3, bucket_length(50)) == (3, 64)
    np.testing.assert_array_equal(b.loss_mask_BT.sum(axis=1), [5, 9, 2])
    np.testing.assert_array_equal(b.attn_mask_BT.sum(axis=1), [35, 50, 5])
    assert b.loss_mask_BT[1, 41:50].all() and not b.loss_mask_BT[1, :41].any()
    np.testing.assert_array_equal(b.advantages_B, np.float32([1.0, -1.0, 0.5]))
    assert batch_lib.response_window(b.loss_mask_BT) == 16  # longest response 9 → 16 < 64
    with pytest.raises(ValueError, match="more than length=40"):
        batch_lib.collate(samples, [0.0] * 3, pad_id=0, length=40)


@pytest.mark.parametrize("mesh_spec,layout", [("data=2,fsdp=2,tensor=2", "fsdp_tp"),
                                              ("data=4,tensor=2", "tp")])
def test_place_shards_rows_over_the_batch_axes(mesh_spec, layout):
    lay = sharding.Layout(sharding.make_mesh(mesh_spec), layout)
    dp = lay.mesh.shape["data"] * lay.mesh.shape["fsdp"]
    host = batch_lib.collate([sample(10 + i, 3) for i in range(8)], np.arange(8.0), pad_id=0)
    placed = batch_lib.place_batch(batch_lib.to_host(host), lay)
    for name, x in placed._asdict().items():
        if x is None:
            continue
        np.testing.assert_array_equal(np.asarray(x), getattr(host, name))
        assert x.sharding.shard_shape(x.shape)[0] == 8 // dp  # rows split, no device holds all
        assert len(jax.tree.leaves(x)) == 1
    assert batch_lib.place(np.zeros((3, 4)), None).shape == (3, 4)  # no mesh: one device
