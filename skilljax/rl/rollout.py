"""The host rollout loop: tasks → prompts → sampler ↔ env pool → step samples and trajectories.

For a batch of tasks, each played by G rollouts (a group), every turn builds one prompt per live
episode, generates all responses in one sampler call, parses an action from each, and steps all
envs in one pool call, until every episode is done or `max_turns` is reached.

A step sample is one env step (DESIGN §4): its prompt is that step's whole prompt (role, task,
skill context, the last `history_length` (observation, action) pairs, the current observation and
admissible actions, the output-format instruction) and its response is that step's generation. The
ids stored are exactly the ids the sampler consumed and produced; the prompt is tokenised piece by
piece, so the skill / history / observation / template token counts add up to its length exactly.

Prompt layout and action parsing follow the released SKILL0 ALFWorld manager
(`shared/reference/skill0_released_code.md` §4.2), in our own words.
"""

from __future__ import annotations

import dataclasses
import functools
import re
import time
from concurrent import futures
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np

from skilljax import distributed
from skilljax.envs.base import StepResult, Task
from skilljax.envs.pool import EnvPool
from skilljax.models import vl_image
from skilljax.sampling import Sampler, SampleOutput, SamplingParams
from skilljax.tokenizer import IM_END, IM_START, Tokenizer

PROMPT_PARTS = ("skill", "history", "observation", "template", "image")
_CJK = re.compile(r"[\u4e00-\u9fff]")


# ---------------------------------------------------------------------------- response format

@dataclasses.dataclass(frozen=True)
class ThinkAction:
    """`<think>…</think>` then `<action>…</action>` (SKILL0's ALFWorld projection, §4.2).

    Invalid: action tags missing or repeated (action "" then), think tags missing or repeated when
    required, CJK text, or undecodable bytes (U+FFFD). An action extracted from an otherwise invalid
    response is still executed; only the penalty applies, as in the released code.
    """
    require_think: bool = True
    instruction: str = ("First reason step by step inside <think> </think>, then give exactly one "
                        "admissible action inside <action> </action>.")

    def render(self, action: str, thought: str = "") -> str:
        """The response that states `action` in this format (expert data for the warm start)."""
        think = f"<think>{thought}</think>" if self.require_think or thought else ""
        return f"{think}<action>{action}</action>"

    def parse(self, text: str) -> tuple[str, bool, str]:
        """(action, valid, reason)."""
        low = text.lower()
        if low.count("<action>") != 1 or low.count("</action>") != 1:
            return "", False, "action tags missing or repeated"
        start, end = low.index("<action>") + len("<action>"), low.index("</action>")
        if end < start:
            return "", False, "action tags out of order"
        action = " ".join(text[start:end].split()).lower()
        if "\ufffd" in text:
            return action, False, "undecodable bytes"
        if _CJK.search(text):
            return action, False, "CJK characters"
        if self.require_think and (text.count("<think>") != 1 or text.count("</think>") != 1):
            return action, False, "think tags missing or repeated"
        return action, True, ""


COMPRESSION_RANGE = (1.0, 5.0)
_COMPRESSION = re.compile(r"<compression>(.*?)</compression>", re.I | re.S)


def parse_compression(text: str, *, answer: bool = False) -> tuple[float, bool]:
    """(cf, valid): the area compression factor the agent chose for its next history image
    (SKILL0's visual path, `<compression>x</compression>` after the action; §4.2 / §5 of the
    released-code notes). The first tag's number clamped to [1, 5]; a missing tag, an unreadable,
    NaN or infinite number → 1.0, still valid; more than one open or close tag → 1.0 and invalid;
    `answer` (a final answer, Search) → 1.0."""
    low = text.lower()
    if low.count("<compression>") > 1 or low.count("</compression>") > 1:
        return 1.0, False
    match = _COMPRESSION.search(text)
    if answer or match is None:
        return 1.0, True
    try:
        cf = float(match.group(1).strip())
    except ValueError:
        return 1.0, True
    if not np.isfinite(cf):
        return 1.0, True
    return float(min(max(cf, COMPRESSION_RANGE[0]), COMPRESSION_RANGE[1])), True


# ---------------------------------------------------------------------------- prompts

@dataclasses.dataclass(frozen=True)
class PromptConfig:
    role: str = "You are an expert agent acting in a text environment."
    history_length: int = 2
    show_admissible: bool = True
    system_prompt: str | None = None
    max_prompt_tokens: int | None = None  # drop oldest history records to fit; error if still over


@dataclasses.dataclass
class Prompt:
    ids: list[int]
    counts: dict[str, int]  # PROMPT_PARTS → tokens
    text: str


def _oneline(s: str) -> str:
    return " ".join(s.split())


def history_line(observation: str, action: str) -> str:
    """One past step as the prompt (or its history image) shows it."""
    return f"[Observation]: {_oneline(observation)} [Action]: {_oneline(action) or '(none)'}"


def build_prompt(tok: Tokenizer, cfg: PromptConfig, fmt, *, goal: str, observation: str,
                 history: Sequence[tuple[str, str]], step: int, skill_context: str = "",
                 admissible: Sequence[str] | None = None,
                 image: Callable[[list[tuple[str, str]]], int] | None = None,
                 compression: bool = False) -> Prompt:
    """One user turn (after an optional system turn), tokenised piece by piece.

    Every piece boundary is one byte-level BPE pre-tokenisation never merges across (after a
    newline, or between punctuation and " word"), so the ids equal `tok.chat(...)` of the text.

    `image` (SKILL0's visual context): called with the history records shown, it draws their
    image and returns its image-pad count; the image opens the user turn and the history text is
    left out. `compression`: the instruction asks for the next image's compression factor.
    """
    records = list(history[-cfg.history_length:]) if cfg.history_length > 0 else []
    while True:
        pieces: list[tuple[str, str | list[int]]] = []
        if cfg.system_prompt is not None:
            pieces.append(("template", f"{IM_START}system\n{cfg.system_prompt}{IM_END}\n"))
        role = f"{cfg.role}\n" if cfg.role else ""
        if image is not None:
            from skilljax.rl.visual import image_prompt_ids
            pieces.append(("template", f"{IM_START}user\n"))
            pieces.append(("image", image_prompt_ids(tok, image(records))))
            pieces.append(("template", f"\n{role}Your task is to:"))
        else:
            pieces.append(("template", f"{IM_START}user\n{role}Your task is to:"))
        pieces.append(("observation", f" {_oneline(goal)}\n"))
        if skill_context.strip():
            pieces.append(("skill", skill_context.strip() + "\n"))
        if records and image is not None:
            pieces.append(("template", f"Before this step you took {step} step(s). The image "
                           f"shows your last {len(records)} observation(s) and action(s).\n"))
        elif records:
            pieces.append(("template", f"Before this step you took {step} step(s). Your last "
                           f"{len(records)} observation(s) and action(s):\n"))
            pieces.append(("history", "".join(history_line(o, a) + "\n" for o, a in records)))
        pieces.append(("template", f"Step {step + 1}. Current observation:"))
        pieces.append(("observation", f" {_oneline(observation)}\n"))
        if cfg.show_admissible and admissible:
            pieces.append(("template", "Admissible actions:"))
            pieces.append(("observation", " [" + ", ".join(admissible) + "]\n"))
        instruction = f"{fmt.instruction}" if fmt.instruction else ""
        if compression:
            from skilljax.rl.visual import compression_suffix
            instruction = compression_suffix(instruction)
        pieces.append(("template", f"{instruction}{IM_END}\n{IM_START}assistant\n"))
        ids, counts = [], dict.fromkeys(PROMPT_PARTS, 0)
        for part, text in pieces:
            piece_ids = text if isinstance(text, list) else tok.encode(text)
            ids += piece_ids
            counts[part] += len(piece_ids)
        if cfg.max_prompt_tokens is None or len(ids) <= cfg.max_prompt_tokens:
            return Prompt(ids, counts, "".join(t if isinstance(t, str) else tok.decode(t)
                                               for _, t in pieces))
        if not records:
            raise ValueError(f"Prompt of {len(ids)} tokens exceeds max_prompt_tokens="
                             f"{cfg.max_prompt_tokens} even without history; raise the limit or "
                             "shorten the skill context.")
        records = records[1:]


# ---------------------------------------------------------------------------- outputs

@dataclasses.dataclass
class StepSample:
    prompt_ids: list[int]
    response_ids: list[int]      # as generated, through the stop token
    logprobs: np.ndarray         # [len(response_ids)] policy logprobs (GRPO's old logprobs)
    episode: int                 # index into RolloutResult.trajectories
    group: int                   # index of the task in the batch (GRPO group)
    step: int
    action: str
    valid: bool
    invalid_reason: str
    reward: float                # the env reward of this step
    truncated_response: bool     # hit max_new_tokens without a stop token
    counts: dict[str, int]       # skill/history/observation/template/response tokens
    anchor: str = ""             # the env state the action was taken in (GiGPO's anchor state):
                                 # info["state"] where the env gives one, else the observation
    perturbed: bool = False      # expert data only: a random action the noise took instead of the
                                 # expert's (it leads to states to recover from; not a target)
    compression: float = 1.0     # visual path: the factor chosen for the next history image
    image: tuple[str, float] | None = None  # visual path: the history text of the image this
                                 # step was shown and the factor it was compressed by


@dataclasses.dataclass
class Trajectory:
    task: Task
    group: int
    seed: int
    actions: list[str] = dataclasses.field(default_factory=list)
    rewards: list[float] = dataclasses.field(default_factory=list)
    valid: list[bool] = dataclasses.field(default_factory=list)
    env_valid: list[bool] = dataclasses.field(default_factory=list)  # the env applied the action
    samples: list[int] = dataclasses.field(default_factory=list)  # indices into .samples
    observations: list[str] = dataclasses.field(default_factory=list)  # after each action
    goal: str = ""               # the task description the prompts show
    calls: list[dict] = dataclasses.field(default_factory=list)  # skill calls (SkillForge):
                                 # {"step", "names", "skill_id" (resolved, or None)}
    won: bool = False
    done: bool = False
    failure: str | None = None   # env crash / timeout reason

    @property
    def steps(self) -> int:
        return len(self.actions)

    @property
    def total_reward(self) -> float:
        return float(sum(self.rewards))


@dataclasses.dataclass
class RolloutResult:
    samples: list[StepSample]
    trajectories: list[Trajectory]
    stats: dict[str, float]


# ---------------------------------------------------------------------------- the loop

@dataclasses.dataclass(frozen=True)
class RolloutConfig:
    group_size: int = 8
    max_turns: int = 50
    sampling: SamplingParams = SamplingParams(max_new_tokens=64)
    prompt: PromptConfig = PromptConfig()
    visual: Any = None  # skilljax.rl.visual.VisualConfig: the history as an image (SKILL0)
    # Half the episodes step their envs while the other half samples (one process; slow envs).
    env_overlap: bool = False


def rollout(sampler: Sampler | None, tok: Tokenizer, pool: EnvPool, tasks: Sequence[Task],
            cfg: RolloutConfig, rng: jax.Array, *, seeds: Sequence[int] | None = None,
            skill_context: Callable[[Task], str] | Mapping[str, str] | None = None,
            fmt=ThinkAction(), expert: bool = False, expert_noise: float = 0.0,
            expert_repeat: float = 0.0, noise_seed: int = 0,
            group_ids: Sequence[int] | None = None, catalog=None,
            expert_call: Callable[[str], str | None] | None = None) -> RolloutResult:
    """Plays every task `group_size` times; all members of a group get the same env seed.

    Sampling is keyed per episode: member m of the task with group id `group_ids[k]` (default k)
    samples turn t from `fold_in(fold_in(fold_in(rng, group), m), t)`, whatever else shares the
    batch. A process playing its share of a batch's tasks (`group_ids`: their positions in the whole
    batch) therefore samples what one process playing them all would; `merge` joins the shares. In a
    multi-process run, sampled rollouts are collective: every process calls this, and the turns go
    on while any process has a live episode.

    With `expert=True` the env's expert acts instead of the sampler (responses rendered by
    `fmt.render`, logprobs 0): the same prompts, for supervised warm-start data. With
    `expert_noise` > 0, each expert step is replaced with that probability by a random admissible
    action other than the expert's (drawn from `noise_seed`), marked `perturbed`: the expert's next
    steps then show how to recover from a mistake (noise injection, as in DART), which pure expert
    episodes never do. A share `expert_repeat` of the noisy steps repeats the episode's previous
    action instead (when it differs from the expert's): the loop a greedy policy falls into, often
    an action the env rejects, which random admissible actions never show.

    With a `catalog` (SkillForge, `skills.evolution.Catalog`), each episode's prompts carry the
    skills retrieved for its task description, `<skill>NAME</skill>` tags in a response are read
    (and removed before the action is parsed; a format problem makes the step invalid), and the
    called skill's content, or why the call failed, is appended to the next observation (paper
    002 eq. 4). Calls are recorded per step in `Trajectory.calls`. `expert_call(description)`: the
    skill name an expert appends to each of its responses for that task description (warm-start
    data), or None.
    """
    if expert_noise and not expert:
        raise ValueError("expert_noise applies to expert rollouts only (expert=True).")
    if not 0.0 <= expert_noise < 1.0:
        raise ValueError(f"expert_noise={expert_noise} must be in [0, 1): the chance that a "
                         "random action replaces the expert's at a step.")
    if not 0.0 <= expert_repeat <= 1.0:
        raise ValueError(f"expert_repeat={expert_repeat} must be in [0, 1]: the share of noisy "
                         "steps that repeat the previous action.")
    noise_rng = np.random.default_rng(noise_seed)
    n_groups, g = len(tasks), cfg.group_size
    seeds = list(seeds) if seeds is not None else list(range(n_groups))
    group_ids = list(group_ids) if group_ids is not None else list(range(n_groups))
    trajs = [Trajectory(task, group_ids[i // g], seeds[i // g]) for i, task in
             enumerate(t for t in tasks for _ in range(g))]
    # Key data of every episode's turns, made at once (per-turn device ops would compile a small
    # program for each number of live episodes).
    turn_keys = np.asarray(_turn_keys(rng, np.asarray([t.group for t in trajs], np.int32),
                                      np.arange(len(trajs), dtype=np.int32) % g, cfg.max_turns)
                           ) if not expert else None
    collective = not expert and distributed.count() > 1
    contexts = [skill_text(skill_context, t.task) for t in trajs]
    params = dataclasses.replace(cfg.sampling, stop_token_ids=cfg.sampling.stop_token_ids
                                 or tok.stop_ids)
    t_start = time.perf_counter()
    resets = pool.reset([t.task for t in trajs], [t.seed for t in trajs]) if trajs else []
    env_s, sample_s = time.perf_counter() - t_start, 0.0
    prefill = dict.fromkeys(PREFILL_KEYS, 0)  # the sampler's counts, over the whole batch
    obs, admissible, goal, history, state = {}, {}, {}, {}, {}
    for i, r in enumerate(resets):
        if r.failure:
            trajs[i].done, trajs[i].failure = True, r.failure
        else:
            obs[i], admissible[i] = r.observation, r.info.get("admissible_actions")
            state[i] = r.info.get("state", r.observation)
            goal[i], history[i] = r.info.get("goal") or r.observation, []
            trajs[i].goal = goal[i]
            if catalog is not None:
                listing = catalog.text(goal[i], trajs[i].task.type)
                contexts[i] = "\n".join(x for x in (contexts[i].strip(), listing) if x)
    feedback: dict[int, str] = {}
    samples: list[StepSample] = []
    visual = cfg.visual
    compression = visual is not None and visual.agent_compression
    renderers = {i: visual.renderer() for i in obs} if visual is not None else {}
    cf_next = dict.fromkeys(range(len(trajs)), 1.0)  # each episode's factor for its next image
    line = getattr(fmt, "image_line", history_line)  # a past step as the image shows it
    in_image = visual is not None and visual.skills_in_image

    def act(live: list[int], turn: int) -> dict[int, str]:
        """Prompts of the `live` episodes at `turn`, their responses (sampled, or the expert's)
        as StepSamples, and the actions parsed from them."""
        nonlocal sample_s
        shown: dict[int, tuple] = {}  # visual: (history text, cf[, pixel values, grid])

        def draw(i):
            def image(records):
                text = "\n".join(([contexts[i]] if in_image else [])
                                 + [line(o, a) for o, a in records])
                if expert:  # the prompt needs only the image's size
                    shown[i] = (text, cf_next[i])
                    grid = visual.grid(renderers[i].size(text, cf_next[i]))
                else:
                    pixels, grid, _ = visual.inputs(renderers[i].image(text, cf_next[i]))
                    shown[i] = (text, cf_next[i], pixels, grid)
                return sum(vl_image.num_image_tokens(grid, visual.merge_size))
            return image

        prompts = [build_prompt(tok, cfg.prompt, fmt, goal=goal[i], observation=obs[i],
                                history=history[i], step=turn,
                                skill_context="" if in_image else contexts[i],
                                admissible=admissible[i],
                                image=draw(i) if visual is not None else None,
                                compression=compression) for i in live]
        t0 = time.perf_counter()
        perturbed = set()
        if expert:
            acts = pool.expert_actions(live)
            calls = ({i: expert_call(goal[i]) for i in live} if expert_call is not None
                     else {})
            out = _expert_output(tok, fmt, acts, live, calls)
            if expert_noise:
                last = {i: trajs[i].actions[-1] for i in live if trajs[i].actions}
                perturbed = _perturb(out, tok, fmt, acts, live, admissible, expert_noise,
                                     noise_rng, expert_repeat, last)
            if compression:  # the expert's responses state a factor too
                tag = tok.encode(f"<compression>{visual.expert_compression}</compression>")
                for j in range(len(live)):
                    _replace(out, j, out.token_ids[j][:-1] + tag + out.token_ids[j][-1:])
        else:
            keys = turn_keys[np.asarray(live, np.int64), turn]  # (no live episode: [0, words])
            images = {"images": [shown[i][2:] for i in live]} if visual is not None else {}
            out = sampler.generate([p.ids for p in prompts], params, keys, **images)
            timing = getattr(sampler, "last_timing", {})  # (a stand-in sampler may not count)
            prefill["prefill_tokens"] += timing.get("prefill_tokens", 0)
            prefill["prefill_tokens_saved"] += (timing.get("prefill_tokens", 0)
                                                - timing.get("prefill_tokens_computed", 0))
        sample_s += time.perf_counter() - t0
        actions = {}
        for j, i in enumerate(live):
            text = tok.decode(out.token_ids[j], skip_special_tokens=True)
            problem = ""
            if catalog is not None:
                called = catalog.respond(goal[i], trajs[i].task.type, text)
                text, problem, feedback[i] = called.text, called.problem, called.feedback
                if called.names:
                    trajs[i].calls.append({"step": turn, "names": called.names,
                                           "skill_id": called.skill_id})
            action, valid, reason = fmt.parse(text)
            if valid and problem:
                valid, reason = False, problem
            cf = 1.0
            if compression:
                cf, ok = parse_compression(text, answer=action.startswith("answer:"))
                if valid and not ok:
                    valid, reason = False, "compression tags repeated"
                cf_next[i] = cf
            actions[i] = action
            counts = dict(prompts[j].counts, response=len(out.token_ids[j]))
            trajs[i].samples.append(len(samples))
            samples.append(StepSample(prompts[j].ids, list(out.token_ids[j]), out.logprobs[j], i,
                                      trajs[i].group, turn, action, valid, reason, 0.0,
                                      out.finish_reasons[j] == "length", counts, state[i],
                                      perturbed=i in perturbed, compression=cf,
                                      image=shown[i][:2] if i in shown else None))
        return actions

    def apply(results: Mapping[int, StepResult]) -> None:
        """The env's answers to one turn's actions, into their episodes."""
        for i, r in results.items():
            t, s = trajs[i], samples[trajs[i].samples[-1]]
            s.reward = r.reward
            t.actions.append(s.action)
            t.rewards.append(r.reward)
            t.valid.append(s.valid)
            t.env_valid.append(env_applied(r))
            history[i].append((obs[i], s.action))
            t.observations.append(r.observation)
            note = feedback.pop(i, "")
            obs[i] = f"{r.observation} {note}" if note else r.observation
            admissible[i] = r.info.get("admissible_actions")
            state[i] = r.info.get("state", r.observation)
            if r.done:
                t.done, t.won = True, bool(r.won)
                t.failure = r.info.get("failure")
                s.compression = 1.0  # no image follows the last step (as released: 1 when done)

    def env_step(actions: dict[int, str]) -> tuple[dict[int, StepResult], float]:
        t0 = time.perf_counter()
        return pool.step(actions), time.perf_counter() - t0

    overlap = cfg.env_overlap and not expert and not collective and len(trajs) > 1
    if not overlap:
        for turn in range(cfg.max_turns):
            live = [i for i, t in enumerate(trajs) if not t.done]
            if not (distributed.any_process(bool(live)) if collective else live):
                break
            actions = act(live, turn)
            if live:
                results, seconds = env_step(actions)
                env_s += seconds
                apply(results)
    else:  # two halves of the episodes take turns: one steps its env while the other samples
        workers = getattr(pool, "num_workers", 1)  # each half spans every env worker
        halves = [[i for i in range(len(trajs)) if (i // workers) % 2 == h] for h in (0, 1)]
        if not halves[1]:
            halves = [halves[0][::2], halves[0][1::2]]
        pending: list = [None, None]

        def collect(h: int) -> None:  # half h's last turn, stepped meanwhile
            nonlocal env_s
            if pending[h] is not None:
                results, seconds = pending[h].result()
                env_s += seconds
                apply(results)
                pending[h] = None

        with futures.ThreadPoolExecutor(1, thread_name_prefix="skilljax-env") as env_thread:
            for turn in range(cfg.max_turns):
                moved = False
                for h in (0, 1):
                    collect(h)
                    live = [i for i in halves[h] if not trajs[i].done]
                    if live:
                        pending[h] = env_thread.submit(env_step, act(live, turn))
                        moved = True
                if not moved:
                    break
            for h in (0, 1):
                collect(h)
        # Laid out as the sequential loop lays them: by turn, then episode.
        order = sorted(range(len(samples)), key=lambda k: (samples[k].step, samples[k].episode))
        where = {k: n for n, k in enumerate(order)}
        samples[:] = [samples[k] for k in order]
        for t in trajs:
            t.samples = [where[k] for k in t.samples]
    stats = _stats(samples, trajs, time.perf_counter() - t_start, env_s, sample_s)
    if not expert:
        stats.update(prefill)
    return RolloutResult(samples, trajs, stats)


@functools.partial(jax.jit, static_argnums=3)
def _turn_keys(rng, groups_E, members_E, turns: int) -> jax.Array:
    """Key data [E, turns, words]: episode e's turn t samples from
    fold_in(fold_in(fold_in(rng, group), member), t)."""
    member = jax.vmap(lambda grp, m: jax.random.fold_in(jax.random.fold_in(rng, grp), m))(
        groups_E, members_E)
    keys = jax.vmap(lambda k: jax.vmap(lambda t: jax.random.fold_in(k, t))(
        jnp.arange(turns)))(member)
    return jax.random.key_data(keys)


# Prompt tokens of a rollout's sampler calls, and those the shared-prefix prefill did not run.
PREFILL_KEYS = ("prefill_tokens", "prefill_tokens_saved")


def _stats(samples: Sequence[StepSample], trajs: Sequence[Trajectory], wall: float, env_s: float,
           sample_s: float) -> dict[str, float]:
    n = max(len(samples), 1)
    return dict(
        wall_s=wall, env_s=env_s, sample_s=sample_s, env_steps=len(samples),
        steps_per_s=len(samples) / wall if wall else 0.0,
        success_rate=float(np.mean([t.won for t in trajs])) if trajs else 0.0,
        invalid_rate=sum(not s.valid for s in samples) / n,
        failures=sum(t.failure is not None for t in trajs),
        skill_calls=sum(len(c["names"]) for t in trajs for c in t.calls) / max(len(trajs), 1),
        skill_calls_unknown=sum(c["skill_id"] is None for t in trajs for c in t.calls),
        **behaviour_stats(trajs),
        **({"compression_mean": float(np.mean([s.compression for s in samples]))}
           if any(s.image is not None for s in samples) else {}),
        **{f"tokens_{k}": sum(s.counts[k] for s in samples) / n for k in PROMPT_PARTS + ("response",)})


def merge(parts: Sequence[RolloutResult]) -> RolloutResult:
    """One result from the shares that processes played of one batch of tasks, laid out as one
    process playing all of them would have: trajectories by group id (members in order), samples
    by (turn, episode). Timings are those of the slowest share."""
    if len(parts) == 1:
        return parts[0]
    order = sorted(((t.group, k, i) for k, part in enumerate(parts)
                    for i, t in enumerate(part.trajectories)))
    new = {(k, i): e for e, (_, k, i) in enumerate(order)}
    trajs = [dataclasses.replace(parts[k].trajectories[i], samples=[]) for _, k, i in order]
    samples = [dataclasses.replace(s, episode=new[k, s.episode])
               for k, part in enumerate(parts) for s in part.samples]
    samples.sort(key=lambda s: (s.step, s.episode))
    for k, s in enumerate(samples):
        trajs[s.episode].samples.append(k)
    slowest = lambda key: max((p.stats.get(key, 0.0) for p in parts), default=0.0)
    stats = _stats(samples, trajs, slowest("wall_s"), slowest("env_s"), slowest("sample_s"))
    # The sampler's counts are of the collective batch: every share holds the same.
    stats.update({k: slowest(k) for k in PREFILL_KEYS if k in parts[0].stats})
    return RolloutResult(samples, trajs, stats)


def env_applied(r) -> bool:
    """Whether the env applied an action: its `info["valid"]` where it reports one, else not
    ALFWorld's "Nothing happens." reply (which chores shares)."""
    if "valid" in r.info:
        return bool(r.info["valid"])
    return not r.observation.lstrip().startswith("Nothing happens")


def behaviour_stats(trajs: Sequence[Trajectory]) -> dict[str, float]:
    """ReuseRL's behaviour signals (paper 003, Table 2): actions the env rejected ("Nothing
    happens."), actions repeated within their episode, and successful-episode length — over all
    episodes and over the successful ones."""
    def rates(ts):
        steps = sum(t.steps for t in ts)
        rejected = sum(not v for t in ts for v in t.env_valid)
        repeated = sum(sum(a in t.actions[:k] for k, a in enumerate(t.actions)) for t in ts)
        return (rejected / steps, repeated / steps) if steps else (0.0, 0.0)
    won = [t for t in trajs if t.won]
    out = dict(zip(("rejected_rate", "repeat_rate"), rates(trajs)))
    out.update(zip(("rejected_rate_won", "repeat_rate_won"), rates(won)))
    out["success_steps"] = float(np.mean([t.steps for t in won])) if won else 0.0
    return out


def _response_ids(tok: Tokenizer, fmt, action: str, call: str | None = None) -> list[int]:
    """The tokens of a response that states `action` (and calls skill `call`), through the
    end-of-turn token."""
    tag = f"<skill>{call}</skill>" if call else ""
    return tok.encode(fmt.render(action) + tag) + [tok.im_end_id]


def _expert_output(tok: Tokenizer, fmt, acts: Mapping[int, str], live: list[int],
                   calls: Mapping[int, str | None] | None = None) -> SampleOutput:
    calls = calls or {}
    ids = [_response_ids(tok, fmt, acts[i], calls.get(i)) for i in live]
    return SampleOutput(ids, [np.zeros(len(x), np.float32) for x in ids],
                        np.array([len(x) for x in ids]), ["stop"] * len(ids))


def _perturb(out: SampleOutput, tok: Tokenizer, fmt, acts: Mapping[int, str], live: list[int],
             admissible: dict, p: float, rng: np.random.Generator, repeat: float = 0.0,
             last: Mapping[int, str] | None = None) -> set[int]:
    """Replaces, with probability `p` each, the expert's responses in `out` (in place; `acts`: its
    actions) by a random other admissible action, or with probability `repeat` of those by the
    episode's previous action (`last`) where it differs from the expert's; returns the episodes
    perturbed."""
    done = set()
    for j, i in enumerate(live):
        if rng.random() >= p:
            continue
        prev = (last or {}).get(i, "")
        if repeat and rng.random() < repeat and prev and not _same(prev, acts[i]):
            _replace(out, j, _response_ids(tok, fmt, prev))
            done.add(i)
            continue
        if admissible.get(i) is None:
            raise ValueError("expert noise needs an env that lists its admissible actions "
                             "(info['admissible_actions']); set the noise to 0 for this env.")
        others = [a for a in admissible[i] if not _same(a, acts[i])]
        if not others:
            continue
        _replace(out, j, _response_ids(tok, fmt, others[rng.integers(len(others))]))
        done.add(i)
    return done


def _same(a: str, b: str) -> bool:
    return a.strip().lower() == b.strip().lower()


def _replace(out: SampleOutput, j: int, ids: list[int]) -> None:
    out.token_ids[j], out.logprobs[j] = ids, np.zeros(len(ids), np.float32)
    out.lengths[j] = len(ids)


def skill_text(skill_context, task: Task) -> str:
    """The skill text `rollout` puts in a task's prompts ("" for none)."""
    if skill_context is None:
        return ""
    if callable(skill_context):
        return skill_context(task)
    return skill_context.get(task.type, "")
