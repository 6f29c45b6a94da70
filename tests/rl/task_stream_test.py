"""The RL task stream (grain): shares per process, env seeds, epochs and resume."""

import pytest

from skilljax.rl.task_stream import TaskStream


def steps(stream, n):
    return [next(stream) for _ in range(n)]


@pytest.mark.parametrize("processes", [2, 3])
def test_process_shares_partition_each_step_like_one_process(processes):
    one = steps(TaskStream(20, 6, seed=4, process_index=0, process_count=1), 8)
    shares = [steps(TaskStream(20, 6, seed=4, process_index=p, process_count=processes), 8)
              for p in range(processes)]
    for s, whole in enumerate(one):
        assert whole.groups == list(range(6))
        joined = sorted((g, t, e) for share in shares for g, t, e in
                        zip(share[s].groups, share[s].tasks, share[s].seeds))
        assert joined == list(zip(whole.groups, whole.tasks, whole.seeds))
        assert all(len(share[s].tasks) == 6 // processes for share in shares)


def test_epochs_cover_every_task_and_reshuffle():
    stream = TaskStream(12, 4, seed=0, process_index=0, process_count=1)
    first, second = ([t for s in steps(stream, 3) for t in s.tasks] for _ in range(2))
    assert sorted(first) == sorted(second) == list(range(12)) and first != second
    other = TaskStream(12, 4, seed=1, process_index=0, process_count=1)
    assert [t for s in steps(other, 3) for t in s.tasks] != first


def test_state_resumes_where_it_stopped():
    a = TaskStream(30, 4, seed=2, process_index=0, process_count=1)
    steps(a, 5)
    state = a.get_state()
    rest = steps(a, 4)
    b = TaskStream(30, 4, seed=2, process_index=0, process_count=1)
    b.set_state(state)
    assert steps(b, 4) == rest


def test_groups_that_cannot_be_split_evenly_are_an_error():
    with pytest.raises(ValueError, match="tasks_per_step=5 .* over 2 processes"):
        TaskStream(10, 5, seed=0, process_index=0, process_count=2)
    with pytest.raises(ValueError, match="exceeds the 3 training tasks"):
        TaskStream(3, 4, seed=0, process_index=0, process_count=1)


def test_neighbouring_seeds_do_not_share_epochs():
    a = [t for s in steps(TaskStream(8, 4, seed=0, process_index=0, process_count=1), 4)
         for t in s.tasks]
    b = [t for s in steps(TaskStream(8, 4, seed=1, process_index=0, process_count=1), 2)
         for t in s.tasks]
    assert a[8:] != b  # seed 0's second epoch is not seed 1's first
