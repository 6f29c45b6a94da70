import numpy as np

from skilljax import rewards
from skilljax.envs.base import Task
from skilljax.rl.rollout import RolloutResult, StepSample, Trajectory


def sample(episode, valid):
    return StepSample([1], [2], np.zeros(1), episode, 0, 0, "a", valid, "", 0.0, False, {})


def test_scores_by_hand():
    task = Task("t", "x", "train", {})
    trajs = [Trajectory(task, 0, 0, rewards=[0.0, 10.0]), Trajectory(task, 0, 0, rewards=[0.0])]
    samples = [sample(0, True), sample(0, False), sample(1, False)]
    res = RolloutResult(samples, trajs, {})
    np.testing.assert_allclose(rewards.trajectory_rewards(res), [10.0, 0.0])
    np.testing.assert_allclose(rewards.sample_scores(res, invalid_penalty=0.1), [10.0, 9.9, -0.1])
    bonus = lambda t: -0.5 * len(t.rewards)  # an extra trajectory term composes additively
    np.testing.assert_allclose(rewards.sample_scores(res, 0.0, [bonus]), [9.0, 9.0, -0.5])
