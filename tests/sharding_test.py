import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import PartitionSpec as P

from skilljax import sharding


def test_make_mesh_shapes_and_errors():
    assert dict(sharding.make_mesh("data=1,fsdp=2,tensor=4").shape) == {"data": 1, "fsdp": 2, "tensor": 4}
    assert dict(sharding.make_mesh({"tensor": 2, "fsdp": -1}).shape) == {"data": 1, "fsdp": 4, "tensor": 2}
    assert sharding.make_mesh().shape["fsdp"] == len(jax.devices())
    with pytest.raises(ValueError, match="needs 4 devices but 8 are visible"):
        sharding.make_mesh("fsdp=2,tensor=2")
    with pytest.raises(ValueError, match="Bad mesh spec"):
        sharding.make_mesh("model=8")
    with pytest.raises(ValueError, match="xla_force_host_platform_device_count"):
        sharding.make_mesh("fsdp=16")


def test_spec_per_layout_and_divisibility():
    mesh = sharding.make_mesh("data=2,fsdp=2,tensor=2")
    assert sharding.spec((64, 8, 16), ("embed", "heads", "head_dim"), mesh, "fsdp_tp") == P("fsdp", "tensor", None)
    assert sharding.spec((64, 8, 16), ("embed", "heads", "head_dim"), mesh, "fsdp") == P("fsdp", None, None)
    assert sharding.spec((64, 8, 16), ("embed", "heads", "head_dim"), mesh, "tp") == P(None, "tensor", None)
    assert sharding.spec((4, 10), ("batch", "seq"), mesh, "fsdp_tp") == P(("data", "fsdp"), None)
    # 2 rows cannot split over data×fsdp=4: keep the prefix that divides.
    assert sharding.spec((2, 10), ("batch", "seq"), mesh, "fsdp_tp") == P("data", None)
    assert sharding.spec((64, 3, 16), ("embed", "kv_heads", "head_dim"), mesh, "tp") == P(None, None, None)
    with pytest.raises(KeyError, match="no row"):
        sharding.spec((4,), ("hidden",), mesh, "fsdp")
    with pytest.raises(ValueError, match="Unknown sharding layout"):
        sharding.Layout(mesh, "zero3")


def test_parameter_without_logical_axes_fails_loudly():
    mesh = sharding.make_mesh("fsdp=8")
    state = nnx.State({"w": nnx.Param(jnp.zeros((8, 8)))})
    with pytest.raises(ValueError, match="no logical_axes"):
        sharding.state_shardings(state, sharding.Layout(mesh, "fsdp"))


def test_constrain_really_shards_inside_jit():
    layout = sharding.Layout(sharding.make_mesh("data=2,fsdp=2,tensor=2"), "fsdp_tp")
    out = jax.jit(lambda x: sharding.constrain(x * 2, ("batch", "seq", "act_mlp"), layout))(
        jnp.ones((8, 4, 16)))
    assert out.sharding.spec == P(("data", "fsdp"), None, "tensor")
    assert sharding.is_split(out)
    np.testing.assert_array_equal(out, 2.0)
    assert sharding.constrain(jnp.ones(3), ("norm",), None).shape == (3,)
