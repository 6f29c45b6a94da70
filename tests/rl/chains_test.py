"""SAGE's chains: a library passes from task to task within its chain only; the chain reward."""

import itertools
import re

import jax
import numpy as np
import pytest

from skilljax import rewards
from skilljax.envs.apps import tasks as apps_tasks
from skilljax.envs.apps.env import Apps, CodeAction
from skilljax.envs.base import Task
from skilljax.envs.pool import EnvPool
from skilljax.rewards import chain_terms
from skilljax.rl.chains import Chain, ValidationCache, chain_rollout, scenarios_of
from skilljax.rl.rollout import (PromptConfig, RolloutConfig, RolloutResult,
                                 Trajectory)
from skilljax.sampling import SampleOutput, SamplingParams
from skilljax.skills.library import sandbox_validator
from skilljax.tokenizer import Tokenizer

FMT = CodeAction()
PAY = re.compile(r"Send (\d+) dollars to (.+?) for (\w+)\.")


@pytest.fixture(scope="module")
def tok():
    texts = [t.function for t in apps_tasks.TEMPLATES.values()] + [
        t.instruction for t in apps_tasks.TEMPLATES.values()]
    return Tokenizer.train(texts * 4, vocab_size=400)


@pytest.fixture(scope="module")
def pool():
    with EnvPool("apps", num_workers=2) as p:
        yield p


def _cfg(group_size):
    return RolloutConfig(group_size=group_size, max_turns=2,
                         sampling=SamplingParams(max_new_tokens=256),
                         prompt=PromptConfig(history_length=1, show_admissible=False))


class PayPolicy:
    """Reads the payment from the prompt. Without a library in the prompt, even rows of a call
    write and call `pay_contact`, odd rows end the task without paying; with one, every row only
    calls `pay_contact`."""

    def __init__(self, tok):
        self.tok, self.prompts = tok, []

    def generate(self, token_ids, params, rng):
        out = []
        for j, ids in enumerate(token_ids):
            text = self.tok.decode(ids)
            self.prompts.append(text)
            amount, name, note = PAY.search(text).groups()
            call = f"pay_contact({name!r}, {amount}, {note!r})\napis.supervisor.complete_task()"
            if "Functions from earlier tasks" in text:
                code = call
            elif j % 2 == 0:
                code = apps_tasks.TEMPLATES["pay_contact"].function.strip() + "\n" + call
            else:
                code = "apis.supervisor.complete_task()"
            out.append(self.tok.encode(FMT.render(code)) + [self.tok.im_end_id])
        return SampleOutput(out, [np.zeros(len(o), np.float32) for o in out],
                            np.array([len(o) for o in out]), ["stop"] * len(out))


def test_library_reaches_the_next_task_of_its_own_chain_only(tok, pool, tmp_path):
    tasks = Apps.make_tasks("train", 36, templates="pay_contact")
    scenarios = scenarios_of(tasks)[:2]
    policy = PayPolicy(tok)
    validate = ValidationCache(sandbox_validator(tmp_path))
    res, chains = chain_rollout(policy, tok, pool, scenarios, _cfg(2), jax.random.key(0),
                                length=2, validate=validate, fmt=FMT)
    assert len(res.trajectories) == 8 and len(chains) == 4
    for c in chains:
        first, second = (res.trajectories[e] for e in c.episodes)
        assert first.task.id == scenarios[c.group][0].id and second.task.id == \
            scenarios[c.group][1].id
        if c.member == 0:  # wrote the function, solved task 1: task 2 calls it and succeeds
            assert first.won and second.won
            assert c.created == [["pay_contact"], []] and c.offered == [[], ["pay_contact"]]
            assert c.used == [[], ["pay_contact"]] and c.used_previous == [False, True]
            assert second.task.payload["library_code"].startswith("def pay_contact(")
        else:  # failed task 1: no library, so the same call is a NameError in task 2
            assert not first.won and not second.won
            assert c.offered == [[], []] and "library_code" not in second.task.payload
        # What task 2's prompt showed (the policy saw 4 prompts per turn, chains in order).
        shown = policy.prompts[4 + 2 * c.group + c.member]
        assert ("Functions from earlier tasks, callable as they are: pay_contact(name, amount, "
                "note)" in shown) == (c.member == 0)
    # Group ids: position p of scenario k is the GRPO group p * num_groups + k.
    assert [t.group for t in res.trajectories] == [0, 0, 1, 1, 2, 2, 3, 3]
    assert res.stats["sgc"] == 0.5 and res.stats["tgc"] == 0.5
    assert res.stats["skill_use_rate"] == 1.0 and res.stats["library_size"] == 0.5
    # The reward: member 0's tasks are each credited once more (R1 = R2 = 2), member 1's nothing.
    term = chain_terms(res, chains, scale=10.0)
    for c in chains:
        bonus = [term(res.trajectories[e]) for e in c.episodes]
        assert bonus == ([10.0, 10.0] if c.member == 0 else [0.0, 0.0])
    # The same chains without libraries: nothing is offered, so member 0 writes its function
    # again on task 2 (and wins without the reuse credit).
    res2, chains2 = chain_rollout(PayPolicy(tok), tok, pool, scenarios, _cfg(2),
                                  jax.random.key(0), length=2, use_library=False, fmt=FMT)
    assert all(c.offered == [[], []] for c in chains2)
    assert res2.stats["sgc"] == 0.5 and res2.stats["skill_use_rate"] == 0.0
    term2 = chain_terms(res2, chains2, scale=10.0)
    assert all(term2(t) == 0.0 for t in res2.trajectories)


def test_expert_chains_reuse_their_functions(tok, pool, tmp_path):
    scenarios = scenarios_of(Apps.make_tasks("test", 18))
    validate = ValidationCache(sandbox_validator(tmp_path))
    with_lib, chains = chain_rollout(None, tok, pool, scenarios, _cfg(1), jax.random.key(0),
                                     length=3, validate=validate, fmt=FMT, expert=True)
    without, _ = chain_rollout(None, tok, pool, scenarios, _cfg(1), jax.random.key(0), length=3,
                               use_library=False, fmt=FMT, expert=True)
    assert with_lib.stats["sgc"] == 1.0 and without.stats["sgc"] == 1.0
    assert with_lib.stats["skill_use_rate"] == 1.0 and with_lib.stats["library_size"] == 1.0
    # Calling instead of rewriting: fewer generated tokens per scenario.
    assert with_lib.stats["tokens_per_scenario"] < 0.8 * without.stats["tokens_per_scenario"]
    assert all(c.created[0] == [scenarios[c.group][0].type] for c in chains)


def _traj(task, won, code):
    return Trajectory(task, 0, 0, actions=[code], won=won, done=True)


def test_chain_terms_are_the_papers_reward_for_two_tasks():
    task = Task("t", "x", "train", {})
    for r1, r2, from_q1, has1, has2 in itertools.product((0, 1), (0, 1), (False, True),
                                                          (False, True), (False, True)):
        t1 = _traj(task, bool(r1) and has1, "f(1)" if has1 else "")
        t2 = _traj(task, bool(r2) and has2, "f(2)" if has2 else "")
        chain = Chain("s", 0, 0, episodes=[0, 1], offered=[[], ["f"]],
                      created=[["f"], []], used=[[], ["f"] if from_q1 else []],
                      used_previous=[False, from_q1])
        res = RolloutResult([], [t1, t2], {})
        term = chain_terms(res, [chain], scale=1.0)
        big = rewards.chain_rewards(int(t1.won), int(t2.won), from_q1, from_q1,
                                    has_code=(has1, has2))
        assert (term(t1) + t1.won, term(t2) + t2.won) == big


def test_chain_needs_scenarios():
    with pytest.raises(ValueError, match="scenario"):
        scenarios_of([Task("a", "x", "train", {})])


def test_code_action_parsing():
    assert FMT.parse("look first\n<code>\n  x = 1\n  print(x)\n</code>") == \
        ("x = 1\nprint(x)", True, "")
    assert FMT.parse("no code") == ("", False, "code tags missing or repeated")
    assert FMT.parse("<code></code>")[1:] == (False, "empty code block")
    assert FMT.parse("<code>a</code><code>b</code>")[1] is False
    assert FMT.parse("<code>x = '\u4e2d'</code>")[1:] == (False, "CJK characters")
    code = "def f(a):\n    return a\nf(1)"
    assert FMT.parse(FMT.render(code)) == (code, True, "")


def test_chain_terms_on_a_chain_of_three():
    # Every task solved, each calling what the one before wrote: the middle task is credited
    # both for being reused (pair 2-3) and for reusing (pair 1-2).
    task = Task("t", "x", "train", {})
    trajs = [_traj(task, True, f"f{i}()") for i in range(3)]
    chain = Chain("s", 0, 0, episodes=[0, 1, 2], offered=[[], ["f0"], ["f0", "f1"]],
                  created=[["f0"], ["f1"], []], used=[[], ["f0"], ["f1"]],
                  used_previous=[False, True, True])
    term = chain_terms(RolloutResult([], trajs, {}), [chain], scale=10.0)
    assert [term(t) for t in trajs] == [10.0, 20.0, 10.0]
