"""Training checkpoints: params, optimizer state, RNG and a JSON item of host state, via orbax.

`RunState` is the trainer's host state (step, evaluations, warm start, timing, curriculum and
ReuseRL state); it is saved whole in every checkpoint and restored whole on resume.

Orbax writes each step into a temporary directory and renames it when complete, so a crash
mid-save leaves earlier steps untouched and the half-written one invisible. `restore` also
survives a step that is complete on disk but unreadable (a truncated or edited file): it says
which step it skipped and why, and falls back to the newest one that loads.
"""

from __future__ import annotations

import dataclasses
import logging
import os
from typing import Any

import jax
import numpy as np
import orbax.checkpoint as ocp
from etils import epath
from flax import nnx

log = logging.getLogger(__name__)


class CheckpointError(RuntimeError):
    """No usable checkpoint where one was expected."""


@dataclasses.dataclass
class RunState:
    """What a run carries between steps besides parameters, optimizer state and its RNG.

    step: the last finished RL step (0: before RL). eval: phase ("initial", "final") → eval block.
    warm_start: the warm start's record (None until it ran). wall_s: wall time of the processes that
    ran before this one (resume adds). timing: seconds per phase, over all of them. curriculum,
    reuse: `state_dict()` of the SKILL0 curriculum and of ReuseRL's segmentation cost, when the run
    has them. task_stream: the RL task stream's iterator state (`rl.task_stream.TaskStream`).
    evolution: SkillForge's bank, buffers and counters (`skills.evolver.Evolver.state_dict()`).
    """
    step: int = 0
    eval: dict = dataclasses.field(default_factory=dict)
    warm_start: dict | None = None
    wall_s: float = 0.0
    timing: dict = dataclasses.field(default_factory=dict)
    curriculum: dict | None = None
    reuse: dict | None = None
    task_stream: dict | None = None
    evolution: dict | None = None

    def to_json(self) -> dict:
        return dataclasses.asdict(self)

    @classmethod
    def from_json(cls, d: dict) -> "RunState":
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = set(d) - known - {"wall_s_base"}  # wall_s_base: checkpoints before RunState
        if unknown:
            raise CheckpointError(f"The checkpoint's run state has keys this version does not "
                                  f"know: {sorted(unknown)}; was it written by a newer skilljax?")
        return cls(**{k: v for k, v in d.items() if k in known})


def _global(tree: Any, model: nnx.Module) -> Any:
    """In a multi-process run, arrays that live on one local device (an optimizer's step count,
    the RNG key) are replicated over the global mesh: orbax saves only global arrays there."""
    if jax.process_count() == 1:
        return tree
    layout = getattr(model, "layout", None)
    mesh = layout.mesh if layout is not None else jax.sharding.Mesh(np.array(jax.devices()), ("all",))
    replicated = jax.sharding.NamedSharding(mesh, jax.sharding.PartitionSpec())

    def one(x):
        if isinstance(x, jax.Array) and not isinstance(x.sharding, jax.sharding.NamedSharding):
            return jax.device_put(np.asarray(x), replicated)
        return x
    return jax.tree.map(one, tree)


def _arrays(model: nnx.Module, optimizer: nnx.Optimizer | None) -> dict[str, Any]:
    out = {"params": nnx.state(model, nnx.Param).to_pure_dict()}
    if optimizer is not None:
        out["optimizer"] = nnx.state(optimizer).to_pure_dict()
    return _global(out, model)


def _load(node: nnx.Module | nnx.Optimizer, pure: dict, *filters) -> None:
    state = nnx.state(node, *filters)
    state.replace_by_pure_dict(pure)
    nnx.update(node, state)


def _check_params(restored: dict, directory, step: int) -> None:
    """Every parameter came from the checkpoint: a partial restore leaves the ones the checkpoint
    lacks as abstract shapes, which would silently keep the model's initial values."""
    missing = ["/".join(str(getattr(p, "key", p)) for p in path)
               for path, v in jax.tree_util.tree_flatten_with_path(restored)[0]
               if not isinstance(v, jax.Array)]
    if missing:
        raise CheckpointError(
            f"Step {step} in {directory} lacks parameters of this model: {missing[:6]}"
            + (f" (+{len(missing) - 6} more)" if len(missing) > 6 else "")
            + ". Checkpoints written before skilljax stored layers stacked (per-layer keys "
              "layers/0/...) are read by that version only: export them there "
              "(python -m skilljax.tools.export_hf) and load the HF directory; otherwise the "
              "checkpoint belongs to another model config.")


class Checkpointer:
    def __init__(self, directory: str | os.PathLike, *, max_to_keep: int = 3,
                 async_save: bool = True):
        # Local or remote (gs://...): orbax writes through etils.epath either way.
        self.directory = (epath.Path(os.path.abspath(directory)) if "://" not in os.fspath(directory)
                          else epath.Path(directory))
        self.manager = ocp.CheckpointManager(
            self.directory, options=ocp.CheckpointManagerOptions(
                max_to_keep=max_to_keep, enable_async_checkpointing=async_save, create=True))

    def save(self, step: int, model: nnx.Module, optimizer: nnx.Optimizer | None = None, *,
             rng: jax.Array | None = None, host_state: dict | None = None) -> None:
        """Start saving `step`; returns once device buffers are copied (writes may continue)."""
        arrays = _arrays(model, optimizer)
        if rng is not None:
            arrays["rng"] = _global(jax.random.key_data(rng), model)
        self.manager.save(step, args=ocp.args.Composite(
            arrays=ocp.args.StandardSave(arrays),
            host=ocp.args.JsonSave({"host_state": host_state or {}, "has_rng": rng is not None,
                                    "rng_impl": None if rng is None else str(jax.random.key_impl(rng))})))

    def wait(self) -> None:
        self.manager.wait_until_finished()

    def steps(self) -> list[int]:
        return sorted(self.manager.all_steps())

    def restore(self, model: nnx.Module, optimizer: nnx.Optimizer | None = None,
                step: int | None = None) -> tuple[int, jax.Array | None, dict]:
        """Load into `model` / `optimizer` in place; returns (step, rng, host_state).

        Without `step`, the newest readable step. Raises CheckpointError when none loads.
        """
        self.wait()
        candidates = [step] if step is not None else self.steps()[::-1]
        if not candidates:
            raise CheckpointError(f"No checkpoints in {self.directory}.")
        target = _arrays(model, optimizer)
        abstract = jax.tree.map(ocp.utils.to_shape_dtype_struct, target)
        problems = []
        for s in candidates:
            try:
                host = self.manager.restore(s, args=ocp.args.Composite(host=ocp.args.JsonRestore()))["host"]
                if host["has_rng"]:
                    abstract["rng"] = ocp.utils.to_shape_dtype_struct(
                        _global(jax.numpy.zeros((2,), np.uint32), model))
                if optimizer is None:  # evaluation / export: read the parameters only
                    restore_args = ocp.args.PyTreeRestore(
                        abstract, restore_args=ocp.checkpoint_utils.construct_restore_args(abstract),
                        partial_restore=True)
                else:
                    restore_args = ocp.args.StandardRestore(abstract)
                restored = self.manager.restore(s, args=ocp.args.Composite(
                    arrays=restore_args))["arrays"]
            except Exception as e:  # orbax raises many types for damaged files
                problems.append(f"step {s}: {type(e).__name__}: {str(e)[:200]}")
                log.warning("Checkpoint step %d in %s is unreadable (%s); trying an older one.",
                            s, self.directory, e)
                continue
            if optimizer is None:
                _check_params(restored["params"], self.directory, s)
            _load(model, restored["params"], nnx.Param)
            if optimizer is not None:
                _load(optimizer, restored["optimizer"])
            rng = None
            if host["has_rng"]:
                rng = jax.random.wrap_key_data(restored["rng"], impl=host["rng_impl"])
            if problems:
                log.warning("Restored step %d after skipping: %s", s, "; ".join(problems))
            return s, rng, host["host_state"]
        raise CheckpointError(f"No readable checkpoint in {self.directory}:\n  " + "\n  ".join(problems))

    def close(self) -> None:
        self.manager.wait_until_finished()
        self.manager.close()
