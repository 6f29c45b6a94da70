"""ALFWorld-style games synthesized offline from what the `alfworld` wheel ships.

ALFWorld's official games are ALFRED trajectories' initial states written as PDDL problems; the
wheel ships no games (`alfworld-download` fetches them) and regenerating them needs AI2-THOR. What it
does ship is enough to write new problems in the same form: the room inventories of ALFRED's 120
floor plans (`gen/layouts/FloorPlan*-{objects,openable}.json`: which object and receptacle types a
room has, and the receptacle instances with positions), the affordance tables (`gen/constants.py`:
which receptacle types hold which objects, what can be heated, cooled, cleaned, opened, toggled),
the goal library (`gen/goal_library.py`: each task type's PDDL goal and its templated instruction),
the PDDL domain and the text grammar. A synthesized game places each of the room's portable object
types (1-2 instances; the target 1-3, or 2-3 for the two-object task) in receptacles that may hold
them (a receptacle type at random, then one of its instances); closed receptacles start closed, and
the agent starts in the middle of the room. The game file is written exactly like a real one
(`game.tw-pddl`: domain, grammar with the instruction inserted, problem) next to a `traj_data.json`
holding the task parameters the handcoded expert reads, so the real-game loader plays both.

The problem states which receptacle types may hold which object types (`canContain`): without
those facts no object can ever be put anywhere and the planner deems every goal unreachable.

Splits (`SPLITS`): "train" and "valid_seen" use ALFRED's training floor plans and the object types
outside `HELD_OUT_OBJECTS`, and hold disjoint task combinations (type, target object, destination,
floor plan); "valid_unseen" uses ALFRED's test floor plans (`constants.TEST_SCENE_NUMBERS`) and
targets only the held-out object types, which never appear in train or valid_seen rooms.

Generation writes the files, then plays the game with the handcoded expert and keeps it only if the
expert wins within `MAX_EXPERT_STEPS`; otherwise it re-places the objects (a deterministic sequence
of attempts), so the same task always yields the same game. A spec none of whose placements the
expert wins (rare: 1 in ~1,000) is replaced by a stand-in of the same type (`substitute`) in the
same task slot; its traj_data.json records both specs.
"""

from __future__ import annotations

import functools
import glob
import hashlib
import json
import os
import random
from collections import Counter
from typing import Any

# ALFWorld's six task types (alfworld's TASK_TYPES) under the skill bank's keys; the first keeps its
# ALFRED directory prefix "pick_and_place_simple".
TASK_TYPES = ("pick_and_place", "pick_two_obj_and_place", "look_at_obj_in_light",
              "pick_heat_then_place_in_recep", "pick_cool_then_place_in_recep",
              "pick_clean_then_place_in_recep")
ALFRED_TYPE = {t: t for t in TASK_TYPES} | {"pick_and_place": "pick_and_place_simple"}
SPLITS = ("train", "valid_seen", "valid_unseen")
SEEN_EVERY = 8            # 1 in 8 training-room combinations is held out for valid_seen
# Targets of valid_unseen only; never placed in train/valid_seen rooms. Chosen so that every task
# type keeps targets on both sides (Potato/Cup: heat, cool, clean; Watch/CellPhone/Vase: pick and
# look; SoapBar: clean in bathrooms).
HELD_OUT_OBJECTS = frozenset({"Potato", "Cup", "Watch", "CellPhone", "Vase", "SoapBar"})
MAX_EXPERT_STEPS = 40     # the episode limit is 50; leave room for a few mistakes
ATTEMPTS = 10
SUBSTITUTES = 5           # stand-in combinations tried when no placement of a spec is won
_STOVE_BURNERS = 4        # layouts list no burners; AI2-THOR kitchens have four
_APPLIANCE = {"pick_heat_then_place_in_recep": "Microwave",
              "pick_cool_then_place_in_recep": "Fridge",
              "pick_clean_then_place_in_recep": "SinkBasin"}
_ACTION_CLASS = {"pick_heat_then_place_in_recep": "Heatable",
                 "pick_cool_then_place_in_recep": "Coolable",
                 "pick_clean_then_place_in_recep": "Cleanable"}
_LAMPS = ("DeskLamp", "FloorLamp")
# Where lamps stand: ALFRED only lists them as toggle targets when they are in a receptacle.
_LAMP_STANDS = ("Desk", "SideTable", "Dresser", "CoffeeTable", "TVStand", "Shelf", "DiningTable")


def _constants():
    import alfworld.gen.constants as constants
    return constants


def _layouts_dir() -> str:
    import alfworld.gen
    return os.path.join(os.path.dirname(alfworld.gen.__file__), "layouts")


def floor_plans(split: str) -> list[int]:
    c = _constants()
    scenes = c.TEST_SCENE_NUMBERS if split == "valid_unseen" else c.TRAIN_SCENE_NUMBERS
    have = {int(os.path.basename(p)[len("FloorPlan"):-len("-objects.json")])
            for p in glob.glob(os.path.join(_layouts_dir(), "FloorPlan*-objects.json"))}
    return sorted(n for n in scenes if n in have)


def _receptacle_type(layout_id: str) -> str:
    parts = layout_id.split("|")
    return parts[-1] if len(parts) > 4 else parts[0]   # "Sink|x|y|z|SinkBasin" -> SinkBasin


@functools.lru_cache(maxsize=None)
def room(floor_plan: int) -> dict[str, Any]:
    """Receptacle instances (layout ids, in layout order) and the room's object types."""
    c = _constants()
    base = os.path.join(_layouts_dir(), f"FloorPlan{floor_plan}")
    with open(f"{base}-objects.json") as f:
        types = set(json.load(f))
    with open(f"{base}-openable.json") as f:
        receptacles = sorted(json.load(f))
    static = set(c.VAL_RECEPTACLE_OBJECTS) - c.MOVABLE_RECEPTACLES_SET
    listed = {_receptacle_type(r) for r in receptacles}
    for rtype in sorted((types & static) - listed):
        # The layouts list only receptacles with a precomputed interaction pose; the others
        # (coffee machines, toasters, burners, towel holders, ...) get one instance (four burners).
        for i in range(_STOVE_BURNERS if rtype == "StoveBurner" else 1):
            receptacles.append(f"{rtype}|{i}")
    portable = set().union(*c.VAL_RECEPTACLE_OBJECTS.values())
    objects = sorted(t for t in types if t in portable and not t.endswith("Sliced"))
    return {"receptacles": receptacles, "objects": objects,
            "lamps": sorted(t for t in _LAMPS if t in types)}


def _rtypes(floor_plan: int) -> set[str]:
    return {_receptacle_type(r) for r in room(floor_plan)["receptacles"]}


def _holds(rtype: str, otype: str) -> bool:
    return otype in _constants().VAL_RECEPTACLE_OBJECTS.get(rtype, ())


def _stable_hash(*key) -> int:
    return int.from_bytes(hashlib.sha256(repr(key).encode()).digest()[:8], "little")


@functools.lru_cache(maxsize=None)
def combos(task_type: str, split: str) -> tuple[tuple, ...]:
    """Every (floor plan, object, destination) the split allows for the type; for look_at_obj_in_light
    the destination is the lamp type."""
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    c = _constants()
    out = []
    for fp in floor_plans(split):
        r = room(fp)
        rtypes = _rtypes(fp)
        targets = [o for o in r["objects"] if (o in HELD_OUT_OBJECTS) == (split == "valid_unseen")]
        if task_type in _APPLIANCE:
            if _APPLIANCE[task_type] not in rtypes:
                continue
            targets = [o for o in targets if o in c.VAL_ACTION_OBJECTS[_ACTION_CLASS[task_type]]]
        if task_type == "look_at_obj_in_light":
            stands = [t for t in _LAMP_STANDS if t in rtypes]
            targets = [o for o in targets if any(_holds(t, o) for t in rtypes)]
            out += [(fp, o, lamp) for lamp in r["lamps"] if stands for o in targets]
            continue
        for o in targets:
            for dest in sorted(rtypes):
                # The target never starts in its destination type (`_place`), so it needs another
                # receptacle type to start in (a bathroom whose only plunger holder is the cabinet
                # would get no plunger and an unreachable goal).
                starts = {t for t in rtypes if _holds(t, o)} - {dest}
                if _holds(dest, o) and dest != _APPLIANCE.get(task_type) and starts:
                    out.append((fp, o, dest))
    if split != "valid_unseen":
        seen = split == "valid_seen"
        out = [x for x in out if (_stable_hash(task_type, *x) % SEEN_EVERY == 0) == seen]
    return tuple(out)


def room_size(floor_plan: int) -> int:
    """The number of receptacle instances the agent can go to (kitchens 16-54, other rooms 6-35)."""
    return len(room(floor_plan)["receptacles"])


@functools.lru_cache(maxsize=None)
def choices(task_type: str, split: str, max_receptacles: int | None = None) -> tuple[tuple, ...]:
    """`combos`, restricted to rooms of at most `max_receptacles` receptacles when given."""
    out = combos(task_type, split)
    if max_receptacles is not None:
        out = tuple(x for x in out if room_size(x[0]) <= max_receptacles)
        if not out:
            need = min(room_size(x[0]) for x in combos(task_type, split))
            raise ValueError(f"max_receptacles={max_receptacles} leaves no {task_type} task in "
                             f"split {split!r}: its smallest room has {need} receptacles; raise "
                             "max_receptacles to at least that (or leave it unset).")
    elif not out:
        raise ValueError(f"no {task_type} combinations in split {split!r}")
    return out


def spec(task_type: str, split: str, seed: int, index: int,
         max_receptacles: int | None = None) -> dict[str, Any]:
    """The task's targets and generation seed (no files). With `max_receptacles` the room is one of
    at most that many receptacles (a smaller search; the spec records the cap, so its stand-ins
    keep it)."""
    rng = random.Random(f"alfworld/{task_type}/{split}/{seed}/{index}")
    return _draw(task_type, split, max_receptacles, rng)


def _draw(task_type: str, split: str, max_receptacles: int | None,
          rng: random.Random) -> dict[str, Any]:
    fp, obj, dest = rng.choice(choices(task_type, split, max_receptacles))
    toggle = dest if task_type == "look_at_obj_in_light" else ""
    s = {"task_type": task_type, "split": split, "floor_plan": fp, "object": obj,
         "receptacle": "" if toggle else dest, "toggle": toggle,
         "game_seed": rng.getrandbits(31)}
    if max_receptacles is not None:  # absent otherwise: uncapped specs (and their games) unchanged
        s["max_receptacles"] = max_receptacles
    return s


def substitute(s: dict[str, Any], k: int) -> dict[str, Any]:
    """The k-th stand-in (k >= 1) for a spec whose every placement the expert failed to win within
    MAX_EXPERT_STEPS: another combination of the same type and split, drawn from the spec's seed.
    (Two-object tasks in the big kitchens take the expert 53-120 steps whatever the placement: it
    opens a dozen drawers before it reaches the counters.)"""
    rng = random.Random(f"{s['game_seed']}/substitute/{k}")
    return _draw(s["task_type"], s["split"], s.get("max_receptacles"), rng)


def dir_name(s: dict[str, Any]) -> str:
    """ALFRED's task directory name: <type>-<object>-<movable recep>-<destination or lamp>-<scene>."""
    return (f"{ALFRED_TYPE[s['task_type']]}-{s['object']}-None-"
            f"{s['receptacle'] or s['toggle']}-{s['floor_plan']}")


# --- the PDDL problem -------------------------------------------------------------------------

def _mangle(text: str) -> str:
    """ALFRED's id escaping for PDDL names (planned_game_state.fix_pddl_str_chars)."""
    for a, b in (("-", "_minus_"), ("|", "_bar_"), ("+", "_plus_"), (".", "_dot_"), (",", "_comma_")):
        text = text.replace(a, b)
    return text


def _coords(rng: random.Random) -> str:
    return "|".join(f"{rng.uniform(-4, 4):+06.2f}" for _ in range(3))


def _place(s: dict[str, Any], attempt: int) -> dict[str, Any]:
    """Instances and their receptacles for one attempt."""
    rng = random.Random(f"{s['game_seed']}/{attempt}")
    r = room(s["floor_plan"])
    receptacles = []
    for layout_id in r["receptacles"]:
        rtype = _receptacle_type(layout_id)
        if layout_id.count("|") < 3:   # no layout pose: invent a position for the id
            layout_id = f"{rtype}|{_coords(rng)}"
        receptacles.append((_mangle(layout_id), rtype))
    unseen = s["split"] == "valid_unseen"
    goal_dest = s["receptacle"]
    objects, placed = [], []   # (id, type), (id, receptacle id)
    for otype in r["objects"]:
        if otype in HELD_OUT_OBJECTS and not unseen:
            continue
        if otype == s["object"]:
            n = rng.randint(2, 3) if s["task_type"] == "pick_two_obj_and_place" else rng.randint(1, 3)
        else:
            n = rng.randint(1, 2)
        # The target never starts in a destination-type receptacle (the game would be half won).
        hosts = [(rid, rt) for rid, rt in receptacles if _holds(rt, otype)
                 and not (otype == s["object"] and rt == goal_dest)]
        # A receptacle type first, then one of its instances: a kitchen's fifteen cabinets do not
        # swallow everything (and the expert, which opens them one by one, stays within its steps).
        host_types = sorted({rt for _, rt in hosts})
        for _ in range(n if hosts else 0):
            oid = _mangle(f"{otype}|{_coords(rng)}")
            rtype = rng.choice(host_types)
            objects.append((oid, otype))
            placed.append((oid, rng.choice([rid for rid, rt in hosts if rt == rtype])))
    if not any(t == s["object"] for _, t in objects):
        raise ValueError(f"no receptacle of floor plan {s['floor_plan']} can hold the target "
                         f"{s['object']} outside its destination: {s} is unreachable")
    lamps = []
    stands = [(rid, rt) for rid, rt in receptacles if rt in _LAMP_STANDS]
    for lamp in r["lamps"] if stands else ():
        if s["toggle"] and lamp != s["toggle"]:
            continue
        lid = _mangle(f"{lamp}|{_coords(rng)}")
        lamps.append((lid, lamp))
        placed.append((lid, rng.choice(stands)[0]))
    return {"receptacles": receptacles, "objects": objects, "lamps": lamps, "placed": placed}


def problem(s: dict[str, Any], attempt: int = 0) -> str:
    """The PDDL problem text, laid out like ALFRED's initial_state.pddl."""
    c = _constants()
    scene = _place(s, attempt)
    receptacles, objects, lamps = scene["receptacles"], scene["objects"], scene["lamps"]
    locs = {rid: f"loc_bar_{i}" for i, (rid, _) in enumerate(receptacles)}
    otypes = sorted(set(c.OBJECTS) - set(c.VAL_RECEPTACLE_OBJECTS) | c.MOVABLE_RECEPTACLES_SET)
    otypes = sorted(set(otypes) | {t for _, t in objects + lamps})
    rtypes = sorted(set(c.VAL_RECEPTACLE_OBJECTS) - c.MOVABLE_RECEPTACLES_SET)
    decl = ["agent1 - agent"]
    decl += [f"{t}Type - otype" for t in otypes] + [f"{t}Type - rtype" for t in rtypes]
    decl += [f"{i} - object" for i, _ in sorted(objects + lamps)]
    decl += [f"{i} - receptacle" for i, _ in sorted(receptacles)]
    decl += [f"{loc} - location" for loc in sorted(locs.values())] + ["loc_bar_start - location"]
    action = c.VAL_ACTION_OBJECTS
    present_rtypes = sorted({t for _, t in receptacles})
    present_otypes = sorted({t for _, t in objects})
    init = [f"(receptacleType {i} {t}Type)" for i, t in receptacles]
    init += [f"(objectType {i} {t}Type)" for i, t in objects + lamps]
    init += [f"(canContain {rt}Type {ot}Type)" for rt in present_rtypes for ot in present_otypes
             if _holds(rt, ot)]
    init += [f"(pickupable {i})" for i, _ in objects]
    init += [f"(isReceptacleObject {i})" for i, t in objects if t in c.MOVABLE_RECEPTACLES_SET]
    init += [f"(openable {i})" for i, t in receptacles if t in c.OPENABLE_CLASS_SET]
    init += ["(atLocation agent1 loc_bar_start)"]
    for fact, cls in (("cleanable", "Cleanable"), ("heatable", "Heatable"),
                      ("coolable", "Coolable"), ("sliceable", "Sliceable")):
        init += [f"({fact} {i})" for i, t in objects if t in action[cls]]
    if s["toggle"]:
        init += [f"(toggleable {i})" for i, t in lamps if t == s["toggle"]]
    host = dict(scene["placed"])
    init += [f"(inReceptacle {o} {r})" for o, r in scene["placed"]]
    init += [f"(receptacleAtLocation {i} {locs[i]})" for i, _ in receptacles]
    init += [f"(objectAtLocation {i} {locs[host[i]]})" for i, _ in objects + lamps]
    import alfworld.gen.goal_library as goals
    goal = goals.gdict[ALFRED_TYPE[s["task_type"]]]["pddl"].replace("#", "-").format(
        obj=s["object"], recep=s["receptacle"], toggle=s["toggle"])
    sep = "\n        "
    return (f"\n(define (problem plan_{_mangle(dir_name(s))}_{s['game_seed']}_{attempt})\n"
            f"(:domain alfred)\n(:objects\n        {sep.join(decl)}\n        )\n\n"
            f"(:init\n        {sep.join(init)}\n        )\n\n{goal}")


def instruction(s: dict[str, Any]) -> str:
    """The templated instruction, as alfworld's get_templated_task_desc writes it."""
    import alfworld.gen.goal_library as goals
    rng = random.Random(f"{s['game_seed']}/template")
    template = rng.choice(goals.gdict[ALFRED_TYPE[s["task_type"]]]["templates"])
    return template.format(obj=s["object"].lower(), recep=s["receptacle"].lower(),
                           toggle=s["toggle"].lower(), mrecep="")


def traj_data(s: dict[str, Any]) -> dict[str, Any]:
    """The subset of ALFRED's traj_data.json that ALFWorld's loader and expert read."""
    return {"task_type": ALFRED_TYPE[s["task_type"]],
            "pddl_params": {"object_target": s["object"], "parent_target": s["receptacle"],
                            "toggle_target": s["toggle"], "mrecep_target": "",
                            "object_sliced": False},
            "scene": {"floor_plan": f"FloorPlan{s['floor_plan']}", "scene_num": s["floor_plan"]},
            "skilljax_spec": s}


def game_data(s: dict[str, Any], attempt: int) -> dict[str, Any]:
    """game.tw-pddl's content (walkthrough and solvable filled in once the expert has played it)."""
    import alfworld.info
    with open(alfworld.info.ALFRED_PDDL_PATH) as f:
        domain = f.read()
    with open(alfworld.info.ALFRED_TWL2_PATH) as f:
        grammar = f.read().replace("UNKNOWN GOAL", instruction(s))
    return {"pddl_domain": domain, "grammar": grammar, "pddl_problem": problem(s, attempt),
            "solvable": None, "walkthrough": None}


def counts(s: dict[str, Any], attempt: int = 0) -> Counter:
    """Object types and their instance counts in one attempt (for tests and analysis)."""
    scene = _place(s, attempt)
    return Counter(t for _, t in scene["objects"])
