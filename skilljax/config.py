"""Helpers shared by the config files in configs/ (big_vision style)."""

from __future__ import annotations

import ast

import ml_collections


def parse_arg(arg: str | None, *, lazy: bool = False, **spec) -> ml_collections.ConfigDict:
    """Parse `--config configs/x.py:model=tiny,runlocal` against `spec` (name → default).

    A bare `name` sets a boolean to True; `name=value` is converted to the default's type. Unknown
    names raise unless `lazy`, in which case they are kept as strings or literals.
    """
    out = ml_collections.ConfigDict(dict(spec))
    for part in filter(None, (p.strip() for p in (arg or "").split(","))):
        name, sep, value = part.partition("=")
        if name not in spec and not lazy:
            raise ValueError(f"Unknown config argument {name!r} in {arg!r}; known: {sorted(spec)}.")
        default = spec.get(name)
        if not sep:
            if default is not None and not isinstance(default, bool):
                raise ValueError(f"Config argument {name!r} needs a value ({name}=...).")
            out[name] = True
        elif isinstance(default, bool):
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"Config argument {name}={value!r}: expected true/false.")
            out[name] = value.lower() in ("true", "1")
        elif default is None or isinstance(default, str):
            out[name] = value if default is not None else _literal(value)
        else:
            out[name] = type(default)(value)
    return out


def _literal(value: str):
    try:
        return ast.literal_eval(value)
    except (ValueError, SyntaxError):
        return value
