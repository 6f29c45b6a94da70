import dataclasses

import jax
import numpy as np
import pytest

from skilljax import models
from skilljax.envs.chores import Chores
from skilljax.envs.pool import EnvPool
from skilljax.rl import learner
from skilljax.rl import batch as batch_lib
from skilljax.rl.batch import collate
from skilljax.rl.rollout import (PROMPT_PARTS, PromptConfig, RolloutConfig, ThinkAction,
                                 Trajectory, build_prompt, merge, rollout)
from skilljax.sampling import Sampler, SampleOutput, SamplingParams, bucket_length
from skilljax.tokenizer import Tokenizer
from skilljax.tools.bench_rollout import env_texts

FMT = ThinkAction()


def chores_texts():
    procedures = [t.payload["procedure"] for t in Chores.make_tasks("train", 60, 0, "random")]
    return env_texts("chores", 60) + procedures


@pytest.fixture(scope="module")
def tok():
    return Tokenizer.train(chores_texts(), vocab_size=400)


@pytest.fixture(scope="module")
def sampler(tok):
    """A random one-layer policy over the fixture tokenizer's vocabulary."""
    _, model = models.load("tiny", vocab_size=tok.vocab_size, num_layers=1, seed=0)
    return Sampler(model, pad_id=tok.pad_id)


@pytest.fixture(scope="module")
def pool():
    with EnvPool("chores", num_workers=2) as p:
        yield p


class Recording:
    """Wraps a Sampler and keeps each call's prompts and outputs."""

    def __init__(self, sampler):
        self.sampler, self.calls = sampler, []

    def generate(self, token_ids, params, rng):
        out = self.sampler.generate(token_ids, params, rng)
        self.calls.append(([list(t) for t in token_ids], out))
        return out


class Scripted:
    """Answers every prompt with the next of a fixed list of token sequences."""

    def __init__(self, responses):
        self.responses, self.i = responses, 0

    def generate(self, token_ids, params, rng):
        out = []
        for _ in token_ids:
            out.append(self.responses[self.i % len(self.responses)])
            self.i += 1
        return SampleOutput(out, [np.zeros(len(o), np.float32) for o in out],
                            np.array([len(o) for o in out]), ["stop"] * len(out))


@pytest.mark.parametrize("which", ["trained", "qwen"])
def test_prompt_pieces_tokenise_like_the_whole_chat(which, tok, qwen3_tokenizer_dir):
    t = tok if which == "trained" else Tokenizer.load(qwen3_tokenizer_dir)
    history = [("You are in the kitchen. You see: sink, mug.", "take mug"),
               ("You take the mug.\nYou hold: mug.", ""), ("Nothing happens.", "go to bathroom")]
    cfg = PromptConfig(history_length=2, system_prompt="Be brief.")
    p = build_prompt(t, cfg, FMT, goal="clean the mug and put it in the desk.",
                     observation="You are in the bathroom.  You see: soap, basin.", history=history,
                     step=3, skill_context="### CLEAN ###\nTo clean an item: use the soap.",
                     admissible=["use soap", "use basin", "go to kitchen"])
    messages = [{"role": "system", "content": "Be brief."},
                {"role": "user", "content": p.text.split("<|im_start|>user\n", 1)[1]
                 .split("<|im_end|>")[0]}]
    assert p.ids == t.chat(messages)
    assert sum(p.counts.values()) == len(p.ids) and set(p.counts) == set(PROMPT_PARTS)
    assert p.counts["skill"] == len(t.encode("### CLEAN ###\nTo clean an item: use the soap.\n"))
    # The history window: only the last two records, newlines flattened.
    assert "take mug" not in p.text and "You take the mug. You hold: mug. [Action]: (none)" in p.text
    assert "[Action]: go to bathroom" in p.text


def test_prompt_limit_drops_oldest_history_then_fails(tok):
    history = [(f"observation number {i} " * 5, "go to kitchen") for i in range(6)]
    kw = dict(goal="heat the egg.", observation="You are in the garage.", history=history, step=6)
    full = build_prompt(tok, PromptConfig(history_length=6), FMT, **kw)
    limit = len(full.ids) - 10
    cut = build_prompt(tok, PromptConfig(history_length=6, max_prompt_tokens=limit), FMT, **kw)
    assert len(cut.ids) <= limit and cut.counts["history"] < full.counts["history"]
    assert "observation number 0" not in cut.text and "observation number 5" in cut.text
    with pytest.raises(ValueError, match="max_prompt_tokens=5 even without history"):
        build_prompt(tok, PromptConfig(max_prompt_tokens=5), FMT, **kw)


@pytest.mark.parametrize("text,action,valid", [
    ("<think>go</think><action>Take  Mug</action>", "take mug", True),
    ("take mug", "", False),
    ("<think>a</think><action>take mug</action><action>go to kitchen</action>", "", False),
    ("<action>take mug</action>", "take mug", False),             # executed, but penalised
    ("<think>a</think><think>b</think><action>x</action>", "x", False),
    ("</action>x<action>", "", False),
    ("<think>好</think><action>take mug</action>", "take mug", False),
    ("<think>\ufffd</think><action>take mug</action>", "take mug", False),
])
def test_think_action_parsing(text, action, valid):
    got_action, got_valid, reason = FMT.parse(text)
    assert (got_action, got_valid) == (action, valid) and (reason == "") == valid


def test_rollout_records_exactly_what_the_sampler_saw(tok, pool, sampler):
    rec = Recording(sampler)
    tasks = Chores.make_tasks("train", 2, seed=0)
    cfg = RolloutConfig(group_size=3, max_turns=4,
                        sampling=SamplingParams(max_new_tokens=12, temperature=1.0),
                        prompt=PromptConfig(history_length=2))
    res = rollout(rec, tok, pool, tasks, cfg, jax.random.key(0), seeds=[5, 9],
                  skill_context={"clean": "### CLEAN ###\nuse soap then basin."})
    assert [t.group for t in res.trajectories] == [0, 0, 0, 1, 1, 1]
    assert [t.seed for t in res.trajectories] == [5, 5, 5, 9, 9, 9]
    # A random tiny policy emits garbage: every step is invalid, costs a step, nothing crashes.
    assert all(t.steps == 4 and not t.won and t.failure is None for t in res.trajectories)
    assert res.stats["invalid_rate"] == 1.0 and len(res.samples) == 24 == len(rec.calls) * 6
    k = 0
    for prompts, out in rec.calls:
        for j in range(len(prompts)):
            s = res.samples[k]
            assert s.prompt_ids == prompts[j] and s.response_ids == out.token_ids[j]
            np.testing.assert_array_equal(s.logprobs, out.logprobs[j])
            assert sum(s.counts[p] for p in PROMPT_PARTS) == len(s.prompt_ids)
            assert s.counts["response"] == len(s.response_ids)
            assert (s.counts["skill"] > 0) == (res.trajectories[s.episode].task.type == "clean")
            k += 1
    # History window: step 3's prompt holds steps 1 and 2, not step 0.
    last = tok.decode(res.samples[-1].prompt_ids)
    assert last.count("[Observation]:") == 2 and "Your last 2 observation(s)" in last
    # Collated for the learner, the stored logprobs are the policy's (recomputed by a forward pass).
    arrays = batch_lib.to_host(collate(res.samples, np.zeros(len(res.samples)), tok.pad_id))
    longest = max(len(s.prompt_ids) + len(s.response_ids) for s in res.samples)
    t = arrays["tokens_BT"].shape[1]
    assert t == bucket_length(longest) >= longest  # one bucket policy
    logp, _ = learner.token_logprobs(sampler.model, arrays["tokens_BT"], arrays["attn_mask_BT"])
    mask = arrays["loss_mask_BT"] > 0
    np.testing.assert_allclose(np.asarray(logp)[mask], arrays["old_logp_BT"][mask], atol=2e-5)
    assert mask.sum() == sum(len(s.response_ids) for s in res.samples)
    # At an explicit longer length: the same rows, padded with nothing attended.
    padded = batch_lib.to_host(collate(res.samples, np.zeros(len(res.samples)), tok.pad_id,
                                       length=t + 7))
    assert padded["tokens_BT"].shape[1] == t + 7
    for k, v in arrays.items():
        if v.ndim == 1:  # per-row values (advantages)
            np.testing.assert_array_equal(padded[k], v)
            continue
        np.testing.assert_array_equal(padded[k][:, :t], v)
        assert not padded[k][:, t:].any() or k == "tokens_BT"


def test_shares_of_a_batch_merge_into_the_whole_rollout(tok, pool, sampler):
    """What processes do under jax.distributed, in one process: each plays a share of the task
    groups (`group_ids`: their positions in the whole batch); merged, the shares equal one rollout of all
    tasks: the same trajectories, step samples in the same order, the same sampled tokens."""
    tasks = Chores.make_tasks("train", 3, seed=1)
    cfg = RolloutConfig(group_size=2, max_turns=3,
                        sampling=SamplingParams(max_new_tokens=10, temperature=1.0))
    seeds, key = [4, 7, 11], jax.random.key(3)
    whole = rollout(sampler, tok, pool, tasks, cfg, key, seeds=seeds)
    shares = [rollout(sampler, tok, pool, [tasks[i] for i in ids], cfg, key,
                      seeds=[seeds[i] for i in ids], group_ids=ids) for ids in ([1], [0, 2])]
    empty = rollout(sampler, tok, pool, [], cfg, key, seeds=[], group_ids=[])
    assert not empty.trajectories and not empty.samples  # a process with no share this time
    merged = merge([shares[0], empty, shares[1]])  # interleaved shares, as the task stream deals them
    assert [t.group for t in merged.trajectories] == [0, 0, 1, 1, 2, 2]
    assert [(t.task.id, t.seed, t.actions) for t in merged.trajectories] == \
        [(t.task.id, t.seed, t.actions) for t in whole.trajectories]
    assert [(s.episode, s.group, s.step, s.prompt_ids, s.response_ids) for s in merged.samples] == \
        [(s.episode, s.group, s.step, s.prompt_ids, s.response_ids) for s in whole.samples]
    assert [t.samples for t in merged.trajectories] == [t.samples for t in whole.trajectories]
    assert merged.stats["success_rate"] == whole.stats["success_rate"]
    assert merged.stats["env_steps"] == whole.stats["env_steps"] == len(whole.samples)


def test_env_overlap_plays_the_same_rollout(tok, pool, sampler):
    """`env_overlap`: half the episodes step their envs while the other half samples. Rows are
    keyed per episode, so the halves sample the same tokens as the whole batch: the same
    trajectories and step samples, in the same order; logprobs equal up to the batch's shape."""
    tasks = Chores.make_tasks("train", 3, seed=2)
    cfg = RolloutConfig(group_size=3, max_turns=4,
                        sampling=SamplingParams(max_new_tokens=10, temperature=1.0))
    seeds, key = [3, 8, 1], jax.random.key(5)
    plain = rollout(sampler, tok, pool, tasks, cfg, key, seeds=seeds)
    calls = Recording(sampler)
    both = rollout(calls, tok, pool, tasks, dataclasses.replace(cfg, env_overlap=True), key,
                   seeds=seeds)
    assert len(calls.calls) == 2 * len({s.step for s in plain.samples})  # two halves a turn
    assert {len(c[0]) for c in calls.calls[:2]} == {4, 5}  # 9 episodes, 2 env workers
    assert [(t.task.id, t.actions, t.rewards, t.won, t.samples) for t in both.trajectories] == \
        [(t.task.id, t.actions, t.rewards, t.won, t.samples) for t in plain.trajectories]
    assert [(s.episode, s.step, s.prompt_ids, s.response_ids, s.valid) for s in both.samples] == \
        [(s.episode, s.step, s.prompt_ids, s.response_ids, s.valid) for s in plain.samples]
    for a, b in zip(both.samples, plain.samples):
        np.testing.assert_allclose(a.logprobs, b.logprobs, atol=1e-5)
    assert both.stats["success_rate"] == plain.stats["success_rate"]


def test_scripted_responses_valid_invalid_and_bytes(tok, pool):
    enc = lambda s: tok.encode(s) + [tok.im_end_id]
    task = Chores.make_tasks("test", 1, seed=0)[0]
    env = Chores()
    env.reset(task)
    first = env.expert_action()
    responses = [
        enc(f"<think>fetch it</think><action>{first}</action>"),
        enc("no tags at all"),
        enc("<think>x</think><action>use sink</action><action>use stove</action>"),
        [tok.tok.token_to_id("Ã"), tok.im_end_id],   # a lone UTF-8 lead byte
    ]
    res = rollout(Scripted(responses), tok, pool, [task], RolloutConfig(group_size=4, max_turns=1),
                  jax.random.key(0))
    got = [(s.action, s.valid, s.invalid_reason) for s in res.samples]
    assert got[0] == (first, True, "")
    assert got[1] == ("", False, "action tags missing or repeated")
    assert got[2] == ("", False, "action tags missing or repeated")
    assert got[3][1] is False
    assert [t.steps for t in res.trajectories] == [1, 1, 1, 1]
    assert [s.counts["response"] for s in res.samples] == [len(r) for r in responses]


def test_expert_rollout_wins_and_rewards_recorded(tok, pool):
    tasks = Chores.make_tasks("test", 3, seed=2)
    res = rollout(None, tok, pool, tasks, RolloutConfig(group_size=2, max_turns=20),
                  jax.random.key(0), expert=True)
    assert all(t.won and t.total_reward == 10.0 for t in res.trajectories)
    assert res.stats["success_rate"] == 1.0 and res.stats["invalid_rate"] == 0.0
    assert res.stats["rejected_rate"] == 0.0 and all(all(t.env_valid) for t in res.trajectories)
    assert all(t.rewards[-1] == 10.0 and sum(t.rewards[:-1]) == 0 for t in res.trajectories)
    s = res.samples[0]
    assert tok.decode(s.response_ids) == f"<think></think><action>{s.action}</action><|im_end|>"


def test_behaviour_stats_count_rejected_and_repeated_actions():
    from skilljax.rl.rollout import behaviour_stats
    task = Chores.make_tasks("test", 1, seed=0)[0]
    won = Trajectory(task, 0, 0, actions=["take egg", "take egg", "use heater", "put egg in desk"],
                     env_valid=[True, False, True, True], won=True)
    lost = Trajectory(task, 0, 0, actions=["go to garage", "go to garage"], env_valid=[True, True])
    stats = behaviour_stats([won, lost])
    assert stats["rejected_rate"] == 1 / 6 and stats["repeat_rate"] == 2 / 6
    assert stats["rejected_rate_won"] == 1 / 4 and stats["repeat_rate_won"] == 1 / 4
    assert stats["success_steps"] == 4.0


def test_expert_noise_marks_random_actions_and_the_expert_recovers(tok, pool):
    tasks = Chores.make_tasks("train", 6, seed=3)
    clean = rollout(None, tok, pool, tasks, RolloutConfig(group_size=1, max_turns=20),
                    jax.random.key(0), expert=True)
    assert not any(s.perturbed for s in clean.samples)
    noisy = rollout(None, tok, pool, tasks, RolloutConfig(group_size=1, max_turns=20),
                    jax.random.key(0), expert=True, expert_noise=0.4, noise_seed=1)
    perturbed = [s for s in noisy.samples if s.perturbed]
    assert 0 < len(perturbed) < len(noisy.samples)
    # A perturbed step replaced the expert's action by another one (the env's own expert would
    # have taken the clean rollout's action from that state); the episodes go on and the expert
    # steps after it are targets.
    assert sum(t.steps for t in noisy.trajectories) > sum(t.steps for t in clean.trajectories)
    assert all(tok.decode(s.response_ids) == f"<think></think><action>{s.action}</action><|im_end|>"
               for s in perturbed)
    with pytest.raises(ValueError, match="expert rollouts only"):
        rollout(None, tok, pool, tasks, RolloutConfig(group_size=1), jax.random.key(0),
                expert_noise=0.1)
    with pytest.raises(ValueError, match=r"must be in \[0, 1\)"):
        rollout(None, tok, pool, tasks, RolloutConfig(group_size=1), jax.random.key(0),
                expert=True, expert_noise=1.0)


def test_expert_repeat_noise_repeats_the_previous_action(tok, pool):
    tasks = Chores.make_tasks("train", 6, seed=3)
    cfg = RolloutConfig(group_size=1, max_turns=30)
    res = rollout(None, tok, pool, tasks, cfg, jax.random.key(0), expert=True, expert_noise=0.4,
                  expert_repeat=1.0, noise_seed=1)
    repeats = 0
    for traj in res.trajectories:
        steps = [res.samples[k] for k in traj.samples]
        for before, s in zip(steps, steps[1:]):
            if s.perturbed and s.action == before.action:
                repeats += 1
    perturbed = [s for s in res.samples if s.perturbed]
    # Every noisy step repeats, except a first step (no previous action: a random admissible one)
    # and a step where the expert itself would have repeated.
    assert repeats > 0 and repeats >= 0.8 * len(perturbed)
    # Repeats the env rejects are the states a greedy policy loops in; the expert goes on from
    # them and still wins.
    assert any(not v for t in res.trajectories for v in t.env_valid)
    assert sum(t.won for t in res.trajectories) >= 4
    with pytest.raises(ValueError, match="expert_repeat"):
        rollout(None, tok, pool, tasks, cfg, jax.random.key(0), expert=True, expert_noise=0.1,
                expert_repeat=1.5)


def test_countdown_expert_noise_shows_rollback():
    from skilljax.envs.countdown import Countdown
    tasks = Countdown.make_tasks("train", 12, seed=0, max_numbers=3, max_target=100)
    ctok = Tokenizer.train(env_texts("countdown", 20), vocab_size=400)
    with EnvPool("countdown", num_workers=1) as cpool:
        res = rollout(None, ctok, cpool, tasks, RolloutConfig(group_size=1, max_turns=12),
                      jax.random.key(0), expert=True, expert_noise=0.5, noise_seed=0)
    by_episode = {}
    for s in res.samples:
        by_episode.setdefault(s.episode, []).append(s)
    recoveries = 0
    for steps in by_episode.values():
        for before, after in zip(steps, steps[1:]):
            if after.action.lower() in ("rollback", "reset") and not after.perturbed:
                recoveries += 1
                assert before.perturbed or before.action.lower() in ("rollback", "reset")
    assert recoveries > 0


def test_skill_calls_feed_the_next_observation_and_are_recorded(tok, pool):
    from skilljax.skills.evolution import Catalog, CatalogConfig, EvolvingBank
    from skilljax.skills.retrieval import TfidfEmbedder
    bank = EvolvingBank()
    bank.add(title="Heat steps", principle="steps: take <A>, use heater, put <A> in <B>",
             when_to_apply="the task reads like: heat the <A>", category="heat", name="heat_steps")
    catalog = Catalog(bank, TfidfEmbedder(), CatalogConfig(instruction=""))
    task = next(t for t in Chores.make_tasks("train", 12, seed=0) if t.type == "heat")
    env = Chores()
    env.reset(task)
    first = env.expert_action()
    enc = lambda s: tok.encode(s) + [tok.im_end_id]
    # Member 0: a call after the action, then one with an unknown name and a second tag.
    # Member 1: a call inside the action (invalid format; the action still parses and runs).
    responses = [enc(f"<think>a</think><action>{first}</action><skill>heat_steps</skill>"),
                 enc(f"<think>a</think><action>{first} <skill>heat_steps</skill></action>"),
                 enc("<think>b</think><action>use heater</action><skill>nope</skill>"
                     "<skill>heat_steps</skill>"),
                 enc("<think>b</think><action>use heater</action>")]
    recorder = Recording(Scripted(responses))
    res = rollout(recorder, tok, pool, [task], RolloutConfig(group_size=2, max_turns=2),
                  jax.random.key(0), catalog=catalog)
    first_prompts = [tok.decode(p) for p in recorder.calls[0][0]]
    assert all("- heat_steps: the task reads like: heat the <A>" in p for p in first_prompts)
    second = [tok.decode(p) for p in recorder.calls[1][0]]
    assert all("Skill output: call_name: heat_steps" in p and
               "principle: steps: take <A>, use heater, put <A> in <B>" in p for p in second)
    s = res.samples
    assert (s[0].action, s[0].valid) == (first, True)
    assert (s[1].action, s[1].valid, s[1].invalid_reason) == (first, False,
                                                               "skill tag inside the action")
    t0, t1 = res.trajectories
    assert t0.calls == [{"step": 0, "names": ["heat_steps"], "skill_id": "s0001"},
                        {"step": 1, "names": ["nope", "heat_steps"], "skill_id": None}]
    assert t1.calls == [{"step": 0, "names": ["heat_steps"], "skill_id": "s0001"}]
    # Trajectories keep the env's own observations; the skill output went to the next prompt.
    assert "Skill output" not in t0.observations[0]
    assert res.stats["skill_calls"] == 2.0 and res.stats["skill_calls_unknown"] == 1  # 4 tags
    assert t0.goal == task.payload["goal"] and len(t0.observations) == 2
