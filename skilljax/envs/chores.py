"""chores: a small procedural household world for CPU-scale skill experiments (DESIGN §6).

Four rooms with fixed furniture: devices one can `use` and receptacles one can `put` things in.
A task asks to treat an object (clean it, heat it, ...) and usually to put it somewhere. Treating
means using a fixed sequence of devices while holding the object, in order; a device used out of
turn does nothing. Which devices, in which rooms and in what order is a convention of this world
that the observation never shows (the kitchen has a sink, but cleaning happens in the bathroom):
that knowledge is exactly what a skill text gives, or what training must internalise.

Two task sources:
- `source="benchmark"` (default): six task types with the world's fixed conventions, `BENCHMARK`,
  echoing ALFWorld's six (clean, heat, cool, light, put away, and a three-device "prepare").
  Train and test splits hold disjoint (type, object, destination, object room) combinations.
- `source="random"`: tasks with a made-up verb and a random procedure over the same devices, each
  carrying its own procedure text (`procedure_text`), for the warm start that teaches a policy to
  follow skill text rather than the benchmark's conventions.
- `source="convention"`: made-up verbs with one fixed procedure each (`CONVENTION_VERBS`), for
  warm-start episodes shown without text: conventions known by heart, as a pretrained LLM knows
  everyday ones, so the policy also maps a task's verb to a procedure when no skill is given.

Actions: `go to ROOM`, `take OBJECT` (one object in hand), `use DEVICE`, `put OBJECT in RECEPTACLE`.
Taking, using and putting walk to the right room first (one step in all): rooms shape what one
sees, but a policy need not learn the floor plan — only the procedures, which is the point.
Anything else, or an action that does not apply, is "Nothing happens." and costs a step.

Observations are short and Markov: the room, and what is held with the devices
already used on it ("You hold: egg (used: freezer)"; "; ready" once the procedure is complete).
The goal says where the object starts. So the state never needs the history; what it never shows is
what comes next: that is the procedure.
"""

from __future__ import annotations

import hashlib
import itertools
import random
import re
from typing import Any

from skilljax.envs.base import Env, StepResult, Task

ROOMS: dict[str, dict[str, tuple[str, ...]]] = {
    "kitchen": {"devices": ("sink", "stove", "knife"), "receptacles": ("counter", "cabinet", "basket")},
    "bathroom": {"devices": ("soap", "basin", "dryer"), "receptacles": ("rack",)},
    "bedroom": {"devices": ("lamp", "fan", "mirror"), "receptacles": ("desk", "shelf", "wardrobe")},
    "garage": {"devices": ("heater", "freezer", "brush"), "receptacles": ("workbench", "toolbox")},
}
ROOM_OF = {name: room for room, f in ROOMS.items() for name in f["devices"] + f["receptacles"]}
DEVICES = tuple(d for f in ROOMS.values() for d in f["devices"])
RECEPTACLES = tuple(r for f in ROOMS.values() for r in f["receptacles"])

OBJECTS = {
    "dish": ("mug", "plate", "bowl", "cup", "jar"),
    "food": ("apple", "potato", "egg", "bread", "tomato"),
    "paper": ("book", "letter", "map", "card"),
    "cloth": ("shirt", "sock", "scarf", "glove"),
    "tool": ("hammer", "wrench", "spoon", "key"),
}
CATEGORY_OF = {o: c for c, objs in OBJECTS.items() for o in objs}
HOME = {"dish": "cabinet", "food": "basket", "paper": "shelf", "cloth": "wardrobe", "tool": "toolbox"}

# The benchmark's conventions: task type → (verb, devices in order, object categories, destinations;
# None = no destination, "home" = the object's home receptacle).
BENCHMARK: dict[str, dict[str, Any]] = {
    "clean": dict(verb="clean", steps=("soap", "basin"), objects=("dish", "cloth"),
                  dests=("counter", "desk", "rack", "workbench")),
    "heat": dict(verb="heat", steps=("heater",), objects=("food", "dish"),
                 dests=("counter", "desk", "workbench")),
    "cool": dict(verb="cool", steps=("freezer", "fan"), objects=("food",),
                 dests=("counter", "desk", "basket")),
    "light": dict(verb="look at", steps=("lamp",), objects=("paper", "tool"), dests=(None,)),
    "place": dict(verb="put away", steps=(), objects=tuple(OBJECTS), dests=("home",)),
    "prepare": dict(verb="prepare", steps=("knife", "sink", "stove"), objects=("food",),
                    dests=("counter", "desk", "workbench")),
}
# Made-up verbs for randomised procedures (never a benchmark verb).
RANDOM_VERBS = ("polish", "rinse", "dust", "wrap", "seal", "stamp", "tune", "press", "scrub", "mark",
                "chill", "warm", "season", "fold", "spin", "shake", "tag", "buff", "coat", "glaze")
# Made-up verbs with a fixed procedure each (`source="convention"`): conventions a policy can only
# know by heart, as a pretrained model knows everyday ones. Disjoint from both lists above.
CONVENTION_VERBS = ("sort", "mend", "prime", "sand", "steam", "iron", "soak", "grind", "freshen",
                    "varnish", "pack", "trim")


def convention_steps(verb: str) -> tuple[str, ...]:
    """The fixed procedure of a convention verb (1–3 distinct devices, from a hash of the verb)."""
    rng = random.Random(int(hashlib.sha256(f"convention/{verb}".encode()).hexdigest(), 16))
    return tuple(rng.sample(DEVICES, rng.randint(1, 3)))


def procedure_text(verb: str, steps: tuple[str, ...], dest: str | None) -> str:
    """The procedure in the words skill files and randomised tasks use.

    Devices are listed back to back ("use heater, basin, soap in this order") rather than each with
    its room: the held object's state names the devices already used, so the next one is the name
    after the last used one — a lookup a tiny policy can learn. Rooms are world knowledge (`ROOMS`).
    """
    if len(steps) > 1:
        text = f"To {verb} an item: take it, use {', '.join(steps)} in this order"
    elif steps:
        text = f"To {verb} an item: take it, use {steps[0]}"
    else:
        text = f"To {verb} an item: take it"
    if dest == "home":
        return text + ", then put it in its home: dishes in the cabinet, food in the basket, " \
                      "paper in the shelf, cloth in the wardrobe, tools in the toolbox."
    if dest is None:
        return text + ", and keep holding it."
    return text + ", then put it where the task says."


def _task_text(verb: str, obj: str, dest: str | None) -> str:
    if dest is None:
        return f"{verb} the {obj} under the lamp." if verb == "look at" else f"{verb} the {obj}."
    if dest == "home" or verb == "put away":
        return f"{verb} the {obj}."
    return f"{verb} the {obj} and put it in the {dest}."


def _split_of(*key) -> str:
    """A fixed 1-in-4 test split over combination keys (stable across Python runs)."""
    h = int(hashlib.sha256("/".join(map(str, key)).encode()).hexdigest(), 16)
    return "test" if h % 4 == 0 else "train"


def _payload(rng: random.Random, verb, obj, obj_room, dest, steps) -> dict[str, Any]:
    dest_name = HOME[CATEGORY_OF[obj]] if dest == "home" else dest
    others = [o for o in CATEGORY_OF if o != obj]
    picks = rng.sample(others, len(ROOMS))  # distinct, one per room
    distractors = {room: [o] for room, o in zip(ROOMS, picks)}
    return dict(verb=verb, object=obj, object_room=obj_room, dest=dest_name, steps=list(steps),
                start_room=rng.choice(list(ROOMS)), distractors=distractors,
                goal=f"{_task_text(verb, obj, dest)} The {obj} is in the {obj_room}.",
                procedure=procedure_text(verb, tuple(steps), dest))


class Chores(Env):
    name = "chores"
    max_steps = 20

    @classmethod
    def task_types(cls) -> tuple[str, ...]:
        return tuple(BENCHMARK)

    @classmethod
    def make_tasks(cls, split: str, num: int, seed: int = 0, source: str = "benchmark",
                   **options) -> list[Task]:
        if options:
            raise TypeError(f"chores.make_tasks: unknown options {sorted(options)}.")
        if split not in ("train", "test"):
            raise ValueError(f"chores has splits 'train' and 'test', not {split!r}.")
        rng = random.Random(f"chores/{source}/{split}/{seed}")
        if source == "benchmark":
            combos = {t: [c for c in cls._combos(t) if _split_of(t, *c) == split] for t in BENCHMARK}
            tasks = []
            for i in range(num):
                ttype = list(BENCHMARK)[i % len(BENCHMARK)]  # balanced over types
                obj, dest, room = rng.choice(combos[ttype])
                spec = BENCHMARK[ttype]
                tasks.append(Task(f"{ttype}-{split}-{seed}-{i}", ttype, split,
                                  _payload(rng, spec["verb"], obj, room, dest, spec["steps"])))
            return tasks
        if source in ("random", "convention"):
            tasks = []
            for i in range(num):
                if source == "random":
                    verb = rng.choice(RANDOM_VERBS)
                    steps = rng.sample(DEVICES, rng.randint(1, 3))
                else:
                    verb = rng.choice(CONVENTION_VERBS)
                    steps = convention_steps(verb)
                dest = rng.choice(RECEPTACLES + (None,))
                obj, room = rng.choice(list(CATEGORY_OF)), rng.choice(list(ROOMS))
                tasks.append(Task(f"{source}-{split}-{seed}-{i}", source, split,
                                  _payload(rng, verb, obj, room, dest, steps)))
            return tasks
        raise ValueError(f"chores task source must be 'benchmark', 'random' or 'convention', "
                         f"not {source!r}.")

    @staticmethod
    def _combos(ttype: str):
        spec = BENCHMARK[ttype]
        objs = [o for c in spec["objects"] for o in OBJECTS[c]]
        return list(itertools.product(objs, spec["dests"], list(ROOMS)))

    # ---------------------------------------------------------------- game

    def reset(self, task: Task, seed: int = 0) -> tuple[str, dict[str, Any]]:
        p = task.payload
        self.task, self.t, self.done = task, 0, False
        self.obj, self.dest, self.steps = p["object"], p["dest"], tuple(p["steps"])
        self.room, self.held, self.progress = p["start_room"], None, 0
        # Where every loose object is: a room (on the floor) or a receptacle.
        self.where = {o: room for room, objs in p["distractors"].items() for o in objs}
        self.where[self.obj] = p["object_room"]
        return self._describe(), self._info(valid=True, goal=p["goal"])

    def _describe(self) -> str:
        # Short on purpose (DESIGN §6): where you are and what you hold. What the rooms contain is
        # in the admissible actions; acting walks to the right room anyway.
        held = self.held or "nothing"
        if self.held == self.obj and self.progress:  # the object's state, not what comes next
            done = self.progress == len(self.steps)
            held += f" (used: {', '.join(self.steps[:self.progress])}{'; ready' if done else ''})"
        return f"You are in the {self.room}. You hold: {held}."

    def admissible_actions(self) -> list[str]:
        acts = [f"go to {r}" for r in ROOMS if r != self.room]
        if self.held is None:
            acts += [f"take {o}" for o in sorted(self.where)]
        acts += [f"use {d}" for d in DEVICES]
        if self.held is not None:
            acts += [f"put {self.held} in {r}" for r in RECEPTACLES]
        return acts

    def _info(self, valid: bool, **extra) -> dict[str, Any]:
        # "state": the observation without the last action's message (GiGPO's anchor state).
        return dict(admissible_actions=self.admissible_actions(), valid=valid,
                    state=self._describe(), room=self.room,
                    held=self.held, progress=self.progress, task_type=self.task.type, **extra)

    def _won(self) -> bool:
        if self.progress < len(self.steps):
            return False
        return self.held == self.obj if self.dest is None else self.where.get(self.obj) == self.dest

    def step(self, action: str) -> StepResult:
        if self.done:
            raise RuntimeError("step() after the episode ended; call reset().")
        self.t += 1
        act = re.sub(r"\s+", " ", action.strip().lower().rstrip(".")).replace(" the ", " ")
        valid = act in self.admissible_actions()
        message = self.invalid_observation
        if valid:
            message = self._apply(act)
        won = self._won()
        truncated = not won and self.t >= self.max_steps
        self.done = won or truncated
        if won:
            message += " Task complete."
        return StepResult(f"{message} {self._describe()}", self.success_reward if won else 0.0,
                          self.done, won=won, truncated=truncated,
                          info=self._info(valid=valid, action=act if valid else ""))

    def _walk(self, room: str) -> str:
        if room == self.room:
            return ""
        self.room = room
        return f"You walk to the {room}. "

    def _apply(self, act: str) -> str:
        verb, _, rest = act.partition(" ")
        if verb == "go":
            return self._walk(rest[len("to "):]).strip() or "You are already here."
        if verb == "take":
            loc = self.where.pop(rest)
            self.held = rest
            return f"{self._walk(ROOM_OF.get(loc, loc))}You take the {rest}."
        if verb == "put":
            obj, _, recep = rest.partition(" in ")
            self.where[obj], self.held = recep, None
            return f"{self._walk(ROOM_OF[recep])}You put the {obj} in the {recep}."
        walk = self._walk(ROOM_OF[rest])
        # use DEVICE: advances the procedure only for its next device, with the object in hand.
        if (self.held == self.obj and self.progress < len(self.steps)
                and self.steps[self.progress] == rest):
            self.progress += 1
            done = " It is ready." if self.progress == len(self.steps) else ""
            return f"{walk}You use the {rest} on the {self.obj}.{done}"
        return f"{walk}{self.invalid_observation}"

    def expert_action(self) -> str:
        """Shortest completion from any state: fetch the object, run the procedure, deliver."""
        if self.held is not None and self.held != self.obj:
            return f"put {self.held} in {ROOMS[self.room]['receptacles'][0]}"
        if self.held is None:
            return f"take {self.obj}"
        if self.progress < len(self.steps):
            return f"use {self.steps[self.progress]}"
        return f"put {self.obj} in {self.dest}"
