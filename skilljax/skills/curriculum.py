"""SKILL0's dynamic curriculum (paper §3.3, Algorithm 1): withdraw skill files by helpfulness Δ
within a linearly decaying budget, until the policy runs with no skills at all.

Every `validate_every` steps (d; paper §4.4 picks d = 10) the trainer runs the validation tasks
twice, with the currently active files and with none, and hands the per-task-type success rates
to `Curriculum.update`. Δ of a task type is the difference; Δ_k of a skill file is the mean over
the task types it serves (the released code, `shared/reference/skill0_released_code.md` §3.3; the
general file serves every type). Then Filter (drop Δ_k < 0), Rank (Δ_k descending) and Select
(the stage's budget M(s), the general file taking one slot) give the files active until the next
update. A budget of 0 removes every file, general included.

Stages. Training has N_S stages of equal length; an update after step t uses the budget of the
stage t falls in, so with T = 180, d = 10 and N_S = 3 the updates after steps 10–60, 70–120 and
130–180 use M(1), M(2), M(3) (the released code's `get_current_max_set`; the files chosen after
step 60 already serve steps 61–70, so M(1) governs steps 1–70). The released code also validates
before step 1, where its stage index is −1 and picks the *last* budget, 0, wiping all skills before
training starts (§3.2, §9.4). Here the stage is clamped to the first at step 0; `clamp_start=False`
with `validate_at_start=True` reproduces the bug. Before the first update every file is active
(Algorithm 1, line 5), unless the first budget is 0, in which case none is (lines 18–19).

Ablations (paper §4.4, Table 2, Figures 7–8), all switches of `CurriculumConfig`:
- `filter=False` ("w/o Filter"): files with negative Δ stay candidates; still ranked and cut to
  the budget.
- `rank="random"` ("w/o Rank"): the filtered candidates in a random order instead of by Δ, seeded
  by (`seed`, step) so a resumed run repeats it.
- `fixed_full=True` ("Fixed Full"): every file at every step; Δ is still measured and logged.
- fixed budgets, e.g. `budgets=(6, 6, 6)`, `(3, 3, 3)`, `(0, 0, 0)`: a constant budget list with the
  same Δ-driven Filter → Rank → Select. That is how the paper separates [6,6,6] from Fixed Full
  (−13.3 vs −12.3 without skills, §4.4): the budget only caps the set, the filter still prunes.
  (0, 0, 0) trains with no skills from step 1.
- `strict=True`: keep only Δ > 0, as Algorithm 1 line 14 writes it; the released code keeps Δ ≥ 0.
"""

from __future__ import annotations

import dataclasses
import json
import math
import random
from collections.abc import Mapping

from skilljax.skills.bank import GENERAL, SkillBank

_DELTA_DECIMALS = 9   # Δ are differences of success fractions; round off float noise so 0 stays 0


def budget_schedule(num_files: int, num_stages: int) -> list[int]:
    """M(s) = ceil(N·(N_S − s)/(N_S − 1)) for s = 1..N_S (paper eq. 6): [N, …, 0]."""
    if num_files < 0:
        raise ValueError(f"num_files must be >= 0, got {num_files}.")
    if num_stages < 2:
        raise ValueError(f"Eq. 6 needs num_stages >= 2 (it divides by N_S - 1), got {num_stages}; "
                         "give an explicit budget list instead.")
    # Integer ceiling: float division could round N·k/(N_S−1) just above an integer.
    return [-(-num_files * (num_stages - s) // (num_stages - 1)) for s in range(1, num_stages + 1)]


def select_skills(deltas: Mapping[str, float], budget: int, keep_general: bool = True,
                  strict: bool = False, *, filter: bool = True,
                  rng: random.Random | None = None) -> list[str]:
    """Filter, rank and select skill files by Δ within `budget` (paper Algorithm 1, steps 2–3).

    With `keep_general`, `general_skills` (when it is among `deltas`) comes first and takes one
    slot whatever its Δ; otherwise it is a candidate like any other. Candidates need Δ ≥ 0 (Δ > 0
    when `strict`; any Δ without `filter`) and are ranked by Δ descending, ties broken by name
    ascending so the result never depends on dict order. `rng` replaces the ranking by a random
    order ("w/o Rank"). Budget 0 → [].
    """
    if budget < 0:
        raise ValueError(f"budget must be >= 0, got {budget}.")
    for name, d in deltas.items():
        if not isinstance(d, (int, float)) or math.isnan(d):
            raise ValueError(f"Δ of {name!r} must be a number, got {d!r}.")
    if budget == 0:
        return []
    kept = [GENERAL] if keep_general and GENERAL in deltas else []
    candidates = [k for k in deltas if k not in kept]
    if filter:
        candidates = [k for k in candidates if (deltas[k] > 0 if strict else deltas[k] >= 0)]
    if rng is None:
        candidates.sort(key=lambda k: (-deltas[k], k))
    else:
        candidates.sort()           # a fixed starting order, so the shuffle depends on rng only
        rng.shuffle(candidates)
    return (kept + candidates)[:budget]


def file_deltas(bank: SkillBank, with_skills: Mapping[str, float],
                without_skills: Mapping[str, float]) -> dict[str, float]:
    """Δ_k per skill file: mean over its measured task types of (with − without) success rate.

    Files none of whose task types were measured get no Δ, so they are no candidates this round
    (as in the released code). Both passes must cover the same task types, all known to the bank.
    """
    if set(with_skills) != set(without_skills):
        raise ValueError("The with-skill and without-skill passes measured different task types: "
                         f"{sorted(set(with_skills) ^ set(without_skills))}.")
    if unknown := set(with_skills) - set(bank.task_types):
        raise ValueError(f"Success rates for task types the bank does not map: {sorted(unknown)}; "
                         f"mapped: {list(bank.task_types)}.")
    if not with_skills:
        raise ValueError("No task type was measured; the curriculum needs at least one.")
    task_delta = {t: float(with_skills[t]) - float(without_skills[t]) for t in with_skills}
    out = {}
    for name in bank.file_names:
        measured = [task_delta[t] for t in bank.task_types_of(name) if t in task_delta]
        if measured:
            out[name] = round(sum(measured) / len(measured), _DELTA_DECIMALS)
    return out


@dataclasses.dataclass(frozen=True)
class CurriculumConfig:
    total_steps: int                       # T: training steps of the whole run
    validate_every: int = 10               # d (paper §4.4, Table 3: d = 10)
    num_stages: int = 3                    # N_S for eq. 6 (paper §4.1: N_S = 3)
    budgets: tuple[int, ...] | None = None  # explicit M list (its length is N_S); None → eq. 6
    filter: bool = True                    # False: "w/o Filter"
    rank: str = "delta"                    # "delta" | "random" ("w/o Rank")
    fixed_full: bool = False               # "Fixed Full": never withdraw
    keep_general: bool = True              # general file always first, taking one slot
    strict: bool = False                   # Δ > 0 (Algorithm 1) instead of Δ ≥ 0 (released code)
    clamp_start: bool = True               # False reproduces the released step-0 wipe
    validate_at_start: bool = False        # also update before step 1 (released val_before_train)
    seed: int = 0                          # for rank="random"

    def __post_init__(self):
        if self.total_steps < 1 or self.validate_every < 1:
            raise ValueError("total_steps and validate_every must be >= 1.")
        if self.rank not in ("delta", "random"):
            raise ValueError(f"rank must be 'delta' or 'random', not {self.rank!r}.")
        if self.budgets is not None:
            if not self.budgets or any(int(b) != b or b < 0 for b in self.budgets):
                raise ValueError(f"budgets must be a non-empty list of ints >= 0, got "
                                 f"{self.budgets}.")
            object.__setattr__(self, "budgets", tuple(int(b) for b in self.budgets))


class Curriculum:
    """The active skill files over training, their Δ history, and checkpointable state."""

    def __init__(self, bank: SkillBank, config: CurriculumConfig):
        self.bank, self.config = bank, config
        self.budgets: tuple[int, ...] = (config.budgets if config.budgets is not None else
                                         tuple(budget_schedule(len(bank), config.num_stages)))
        self.active: tuple[str, ...] = bank.file_names if self.budgets[0] > 0 else ()
        self.history: list[dict] = []

    @property
    def num_stages(self) -> int:
        return len(self.budgets)

    def stage(self, step: int) -> int:
        """Stage s ∈ 1..N_S whose budget an update after `step` uses (0 only unclamped at step 0)."""
        done = max(step - 1, 0) if self.config.clamp_start else step - 1
        return max(min(done * self.num_stages // self.config.total_steps + 1, self.num_stages), 0)

    def budget(self, step: int) -> int:
        return self.budgets[self.stage(step) - 1]   # stage 0 → budgets[-1]: the released bug

    def due(self, step: int) -> bool:
        """Whether the trainer should validate and call `update` after `step`."""
        if step == 0:
            return self.config.validate_at_start
        return step % self.config.validate_every == 0 or step == self.config.total_steps

    def needs_with_pass(self, step: int) -> bool:
        """Whether the update after `step` uses a with-skills pass: not when its budget is 0
        (Algorithm 1 skips it: the selection is empty whatever Δ says), unless "Fixed Full"
        keeps every file anyway and still logs Δ."""
        return self.config.fixed_full or self.budget(step) > 0

    def update(self, step: int, with_skills: Mapping[str, float] | None,
               without_skills: Mapping[str, float]) -> tuple[str, ...]:
        """New active files from per-task-type success rates with the active files and without.

        `with_skills` is measured with the files active now (Algorithm 1 line 10), so a type whose
        file was withdrawn measures only what is still active for it, as in the released code.
        It is None when the pass was skipped (`needs_with_pass` is False): no Δ, no file kept.
        """
        stage, budget = self.stage(step), self.budget(step)
        if with_skills is None:
            if self.needs_with_pass(step):
                raise ValueError(f"The update after step {step} has budget {budget}: it needs the "
                                 "with-skills pass.")
            deltas = {}
        else:
            deltas = file_deltas(self.bank, with_skills, without_skills)
        if self.config.fixed_full:
            active = self.bank.file_names
        else:
            rng = (random.Random(f"{self.config.seed}/{step}")
                   if self.config.rank == "random" else None)
            active = tuple(select_skills(deltas, budget, self.config.keep_general,
                                         self.config.strict, filter=self.config.filter, rng=rng))
        self.active = active
        self.history.append({
            "step": step, "stage": stage, "budget": budget, "deltas": deltas,
            "active": list(active),
            "with_skills": (None if with_skills is None else
                            {t: float(v) for t, v in with_skills.items()}),
            "without_skills": {t: float(v) for t, v in without_skills.items()}})
        return active

    def context(self, task_type: str) -> str:
        return self.bank.context(task_type, self.active)

    def contexts(self) -> dict[str, str]:
        return self.bank.contexts(self.active)

    # ------------------------------------------------------------------ checkpoints

    def state_dict(self) -> dict:
        """JSON-ready state for `Checkpointer.save(host_state=...)`; a copy, safe to save async."""
        return json.loads(json.dumps({"budgets": list(self.budgets), "active": list(self.active),
                                      "history": self.history}, allow_nan=False))

    def load_state_dict(self, state: Mapping) -> None:
        if list(state["budgets"]) != list(self.budgets):
            raise ValueError(f"Checkpointed curriculum has budgets {list(state['budgets'])}, this "
                             f"run {list(self.budgets)}; resume with the same configuration.")
        if unknown := set(state["active"]) - set(self.bank.file_names):
            raise ValueError(f"Checkpointed active skill files {sorted(unknown)} are not in the "
                             f"bank {list(self.bank.file_names)}.")
        self.active = tuple(state["active"])
        self.history = json.loads(json.dumps(list(state["history"])))
