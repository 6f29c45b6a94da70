"""Compiled programs are dropped before the process runs out of memory mappings (XLA:CPU)."""

import jax
import jax.numpy as jnp

from skilljax import jit_cache


def test_trim_drops_compiled_programs_past_the_share_of_the_limit(tmp_path):
    f = jax.jit(lambda x: jnp.tanh(x) * 2)
    for n in (1, 2, 3):
        f(jnp.ones(n))
    assert f._cache_size() == 3
    assert not jit_cache.trim(0.6, count=39_000, limit=65_530)  # below 60 %: kept
    assert f._cache_size() == 3
    assert jit_cache.trim(0.6, count=40_000, limit=65_530)
    assert f._cache_size() == 0
    assert float(f(jnp.ones(2))[0]) == float(2 * jnp.tanh(1.0))  # compiles again when called
    # What the trainer reads on Linux: this process's mappings, the kernel's limit.
    assert jit_cache.map_count() > 100 and jit_cache.map_limit() > 1000
    (tmp_path / "limit").write_text("262144\n")
    assert jit_cache.map_limit(str(tmp_path / "limit")) == 262144
    assert jit_cache.map_count(str(tmp_path / "none")) is None
    held = jit_cache.map_count()
    assert jit_cache.trim(0.6) == (held >= 0.6 * jit_cache.map_limit())


def test_disk_cache_folder_per_jax_version_and_cpu(tmp_path):
    before = jax.config.jax_compilation_cache_dir
    try:
        jit_cache.use_disk_cache(str(tmp_path / "xla"))
        (folder,) = (tmp_path / "xla").iterdir()
        assert folder.name.startswith(f"jax{jax.__version__}-")
        assert jax.config.jax_compilation_cache_dir == str(folder)
        jit_cache.use_disk_cache("")  # off: nothing changes
        assert jax.config.jax_compilation_cache_dir == str(folder)
    finally:
        jax.config.update("jax_compilation_cache_dir", before)
