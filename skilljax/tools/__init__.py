"""Command-line tools (`python -m skilljax.tools.<name>`). This module must not import JAX."""

from __future__ import annotations

import math
import os
import re


def request_host_devices(mesh_spec: str | None) -> None:
    """Make the CPU platform expose enough devices for `mesh_spec`; call before importing JAX.

    Only affects the host (CPU) platform, so it is harmless on accelerators; an explicit
    --xla_force_host_platform_device_count in XLA_FLAGS wins.
    """
    if not mesh_spec:
        return
    sizes = [int(v) for v in re.findall(r"=\s*(-?\d+)", mesh_spec)]
    n = math.prod(s for s in sizes if s > 0)
    flags = os.environ.get("XLA_FLAGS", "")
    if n > 1 and "xla_force_host_platform_device_count" not in flags:
        os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={n}".strip()
