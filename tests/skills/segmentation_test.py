"""ReuseRL's segmentation DP, BPE extraction against brute force, buffer and reward terms."""

import dataclasses
import functools
import random

import pytest

from skilljax.skills import segmentation as seg

S1, S2, S3 = "s1", "s2", "s3"


def exhaustive_count(seq, dictionary):
    """The fewest pieces over every way of cutting `seq` (2^(n-1) cuts)."""
    seq = tuple(seq)

    @functools.lru_cache(None)
    def best(i):
        if i == len(seq):
            return 0
        return min(1 + best(j) for j in range(i + 1, len(seq) + 1) if seq[i:j] in dictionary)
    return best(0)


def random_corpus(rng, n, alphabet="ABCDE", lengths=(2, 6)):
    return [tuple(rng.choice(alphabet) for _ in range(rng.randint(*lengths))) for _ in range(n)]


def test_segment_count_equals_exhaustive_search():
    rng = random.Random(0)
    for _ in range(300):
        alphabet = "ABC"[:rng.randint(2, 3)]
        seq = tuple(rng.choice(alphabet) for _ in range(rng.randint(1, 12)))
        phrases = {tuple(rng.choice(alphabet) for _ in range(rng.randint(2, 4)))
                   for _ in range(rng.randint(0, 6))}
        dictionary = {(a,) for a in alphabet} | phrases
        want = exhaustive_count(seq, dictionary)
        assert seg.segment_count(seq, dictionary) == want
        cut = seg.segmentation(seq, dictionary)
        assert len(cut) == want and sum(cut, ()) == seq and all(p in dictionary for p in cut)


def test_segment_count_edge_cases():
    assert seg.segment_count((), {("a",)}) == 0
    # A symbol missing from the dictionary is still a singleton (every dictionary holds them all).
    assert seg.segment_count(("a", "b", "a", "b"), {("a",), ("a", "b")}) == 2
    assert seg.segment_count(("a",) * 7, {("a",), ("a", "a", "a")}) == 3   # 3 + 3 + 1


def test_proposition_1_counterexample():
    """App. B.1: equal raw length T, seg T/2 vs T — round length cannot tell them apart."""
    T = 8
    dictionary = {(S1,), (S2,), (S3,), (S1, S2)}
    s_a, s_b = (S1, S2) * (T // 2), (S1, S3, S2, S3) * (T // 4)
    assert len(s_a) == len(s_b) == T
    assert (seg.segment_count(s_a, dictionary), seg.segment_count(s_b, dictionary)) == (T // 2, T)
    length = seg.SegmentationCost(seg.SegmentationConfig(mode="length", horizon=T))
    assert length.penalty(s_a, True) == length.penalty(s_b, True) == -10.0
    cost = seg.SegmentationCost(seg.SegmentationConfig(mode="segcost", horizon=T))
    cost.dictionary = dictionary
    assert (cost.penalty(s_a, True), cost.penalty(s_b, True)) == (-5.0, -10.0)
    assert cost.penalty(s_b, False) == 0.0   # failures are never penalised


def test_description_length_by_hand():
    seqs = [("a", "b", "c"), ("a", "b"), ("c",)]
    singles = {("a",), ("b",), ("c",)}
    assert seg.description_length(seqs, singles) == pytest.approx((3 + 2 + 1) / 3)
    # ("a","b") stores 2 symbols and saves one segment in each of two sequences: (2 + 2+1+1)/3.
    assert seg.description_length(seqs, singles | {("a", "b")}) == pytest.approx(6 / 3)
    assert seg.description_length([], singles) == 0.0


def test_extraction_keeps_singletons_respects_length_and_is_deterministic():
    rng = random.Random(1)
    corpus = random_corpus(rng, 60, "ABC", (3, 10)) + [("A", "B", "C", "A")] * 20
    d = seg.extract_dictionary(corpus, max_phrase_len=3, alphabet=("A", "B", "C", "Z"))
    assert {("A",), ("B",), ("C",), ("Z",)} <= d
    assert max(len(p) for p in d) <= 3 and any(len(p) == 3 for p in d)
    assert d == seg.extract_dictionary(list(corpus), max_phrase_len=3, alphabet=("A", "B", "C", "Z"))
    assert seg.description_length(corpus, d) < seg.description_length(
        corpus, {(a,) for a in "ABC"})
    # A phrase worth storing is found: 20 copies of ABCA compress to 2 segments each.
    assert seg.segment_count(("A", "B", "C", "A"), d) <= 2


def test_other_is_never_merged():
    corpus = [("a", seg.OTHER, "a", seg.OTHER)] * 10
    d = seg.extract_dictionary(corpus, 4)
    assert all(len(p) == 1 for p in d)
    assert seg.segment_count(corpus[0], d) == 4


def test_greedy_is_within_one_percent_of_brute_force_on_the_g1_corpus():
    """App. G.1: ~200 random sequences over 5 symbols, lengths 2-6, groups of 10."""
    rng = random.Random(2026)
    greedy, best, found = [], [], 0
    for _ in range(20):
        group = random_corpus(rng, 10)
        d = seg.extract_dictionary(group, max_phrase_len=4)
        bf, bf_len = seg.brute_force_dictionary(group, max_phrase_len=4)
        greedy.append(seg.description_length(group, d))
        best.append(bf_len)
        assert greedy[-1] >= bf_len - 1e-9            # brute force is the minimum
        found += sum(len(p) > 1 for p in bf)
    assert found > 0, "the corpus must have phrases worth storing, or the check is empty"
    mean_greedy, mean_best = sum(greedy) / 20, sum(best) / 20
    assert mean_greedy <= 1.01 * mean_best, (mean_greedy, mean_best)


def test_brute_force_pruning_is_exact_on_tiny_corpora():
    """The pruned search equals a search over every phrase that occurs at all."""
    rng = random.Random(5)
    for _ in range(15):
        group = random_corpus(rng, 4, "AB", (2, 5))
        _, pruned = seg.brute_force_dictionary(group, 3)
        found = sorted({s[i:i + k] for s in group for k in (2, 3) for i in range(len(s) - k + 1)})
        singles = {(x,) for s in group for x in s}
        full = min(seg.description_length(group, singles | {p for j, p in enumerate(found)
                                                            if mask >> j & 1})
                   for mask in range(2 ** len(found)))
        assert pruned == pytest.approx(full)


def test_buffer_state_and_modes():
    cfg = seg.SegmentationConfig(mode="segcost", horizon=10, buffer_size=3, max_phrase_len=2)
    cost = seg.SegmentationCost(cfg)
    m = cost.update([("a", "b", "a", "b"), ("a", "b")])
    assert m["buffer"] == 2 and ("a", "b") in cost.dictionary
    assert m["top_phrases"][0] == ["a b", 3] and m["seg_ratio"] == pytest.approx(0.5)
    cost.update([("c",), ("c", "c"), ()])
    assert list(cost.buffer) == [("a", "b"), ("c",), ("c", "c")]   # FIFO of 3; empty dropped
    restored = seg.SegmentationCost(cfg)
    restored.load_state_dict(cost.state_dict())
    assert list(restored.buffer) == list(cost.buffer) and restored.dictionary == cost.dictionary
    assert cost.penalty(("a", "b"), True) == pytest.approx(-10.0 * seg.segment_count(
        ("a", "b"), cost.dictionary) / 10)
    no_buffer = seg.SegmentationCost(dataclasses.replace(cfg, use_buffer=False))
    no_buffer.update([("a", "b")] * 5)
    no_buffer.update([("c", "d")])
    assert len(no_buffer.buffer) == 0 and ("a", "b") not in no_buffer.dictionary
    assert seg.SegmentationCost(dataclasses.replace(cfg, mode="none")).penalty(("a",), True) == 0
    with pytest.raises(ValueError, match="Unknown reuse mode"):
        seg.SegmentationConfig(mode="bpe")


@pytest.mark.parametrize("polish", [False, True])
def test_buffer_arms_extract_by_the_same_procedure(polish):
    """A small batch (the no-buffer arm) and a 256-sequence buffer get the same extraction: the
    local search runs in every update or in none, never by corpus size."""
    rng = random.Random(3)
    batches = [random_corpus(rng, 10) for _ in range(30)]
    differs = [b for b in batches if seg.extract_dictionary(b, 4, polish_limit=0)
               != seg.extract_dictionary(b, 4)]
    assert differs, "need a batch where the local search changes the dictionary"
    cfg = seg.SegmentationConfig(mode="segcost", horizon=10, max_phrase_len=4, polish=polish)
    for batch in differs[:3]:
        no_buffer = seg.SegmentationCost(dataclasses.replace(cfg, use_buffer=False))
        no_buffer.update(batch)
        expected = seg.extract_dictionary(batch, 4, polish_limit=len(batch) if polish else 0)
        assert no_buffer.dictionary == expected
        buffered = seg.SegmentationCost(cfg)   # first update: its corpus is the same batch
        buffered.update(batch)
        assert buffered.dictionary == no_buffer.dictionary
