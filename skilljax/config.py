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


def skill0_variants(num_files: int) -> dict[str, dict[str, object]]:
    """The SKILL0 paper's Table 2 / Figure 7 ablations for a bank of `num_files` skill files:
    name → {"section.key": value} overrides of a config's `skills` section."""
    n, half = num_files, max(num_files // 2, 1)
    return {
        "curriculum": {},
        "fixed_full": {"skills.fixed_full": True},           # every file, never withdrawn
        "budget_full": {"skills.budgets": (n, n, n)},        # [N, N, N]: filter and rank, no decay
        "budget_half": {"skills.budgets": (half,) * 3},      # [N/2, N/2, N/2]
        "no_skills": {"skills.budgets": (0, 0, 0)},          # [0, 0, 0]: GRPO without skills
        "no_filter": {"skills.filter": False},
        "no_rank": {"skills.rank": "random"},
    }


def apply_variant(config: ml_collections.ConfigDict, variants: dict, name: str) -> None:
    if name not in variants:
        raise ValueError(f"Unknown variant {name!r}; choose one of {sorted(variants)}.")
    for key, value in variants[name].items():
        section, leaf = key.split(".")
        config[section][leaf] = value
