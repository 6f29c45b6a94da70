"""ReuseRL (paper 003): skill projection, segmentation DP, greedy BPE skill dictionary, success buffer.

A successful trajectory is projected to a sequence of atomic skill symbols (φ, §3.1: one symbol per
env step, by rules over the action's verb; `skills/projection.py`). A dictionary C is a set of phrases
(tuples of symbols, at most L long) that always holds every single symbol; seg(s, C) is the fewest
phrases that cover s exactly. The batch description length of the successful sequences B+ is

    L_BDL(C) = L_dict(C) / |B+| + mean_{s ∈ B+} seg(s, C)                      (§3.2, eq. 3)

with L_dict(C) = the number of symbols stored in C's multi-symbol phrases. Why symbols: the code
for one phrase reference (a segment) and the code for one stored symbol are taken to cost the
same, so both terms count "units written down" — storing a phrase of length k costs k units, each
use of it saves k − 1 units. That makes the trade-off exact and easy to read: a phrase pays off
only when it is used u times with u·(k − 1) > k (twice for k ≥ 3, three times for k = 2).
Singletons are in every admissible dictionary, so their storage is a constant left out. (A bit
count — k·log2|Σ| per stored phrase, log2|C| per segment — ranks dictionaries much the same on
the small alphabets used here and ties the cost to an alphabet size we would have to choose.)

`extract_dictionary` minimises L_BDL greedily, BPE style (the E-step, §3.3): tokenise every
sequence into phrases, count adjacent phrase pairs, and add the most frequent pair whose merged
phrase (≤ L symbols) lowers L_BDL, re-tokenising with it; stop when no pair does; then drop any
phrase that later merges made useless (its removal lowers L_BDL). `brute_force_dictionary` is
the exact minimum over all admissible dictionaries, for tests and the benchmark.

`SegmentationCost` is what the trainer holds: a global FIFO success buffer (default 256
sequences, app. E), the current dictionary, and the reward terms — SegCost −λ·seg(s, C)/T and the
pure round-length baseline −λ·|s|/T on successful trajectories (λ = 10 with reward 10, T = the
step limit; app. E, §4.4).
"""

from __future__ import annotations

import collections
import dataclasses
import heapq
import itertools
from collections.abc import Iterable, Mapping, Sequence

Phrase = tuple[str, ...]

# A symbol for a step no rule covers (malformed output): it is never merged into a phrase, so it
# always costs one segment — and |s| stays the number of env steps.
OTHER = "?"

MODES = ("none", "length", "segcost")


# ----------------------------------------------------------------------------- segmentation

def _max_len(dictionary: Iterable[Phrase]) -> int:
    return max((len(p) for p in dictionary), default=1)


def segmentation(seq: Sequence[str], dictionary: set[Phrase], max_len: int | None = None
                 ) -> list[Phrase]:
    """One shortest exact cover of `seq` by dictionary phrases (a single symbol always fits)."""
    seq = tuple(seq)
    max_len = max_len or _max_len(dictionary)
    n = len(seq)
    best = [0] + [n + 1] * n
    back = [0] * (n + 1)
    for i in range(1, n + 1):
        best[i], back[i] = best[i - 1] + 1, 1   # the singleton, admissible by definition
        for k in range(2, min(max_len, i) + 1):
            if best[i - k] + 1 < best[i] and seq[i - k:i] in dictionary:
                best[i], back[i] = best[i - k] + 1, k
    out, i = [], n
    while i > 0:
        out.append(seq[i - back[i]:i])
        i -= back[i]
    return out[::-1]


def segment_count(seq: Sequence[str], dictionary: set[Phrase], max_len: int | None = None) -> int:
    """seg(s, C): the fewest dictionary phrases that cover `seq` exactly (dynamic programming)."""
    seq = tuple(seq)
    max_len = max_len or _max_len(dictionary)
    best = [0] * (len(seq) + 1)
    for i in range(1, len(seq) + 1):
        b = best[i - 1] + 1
        for k in range(2, min(max_len, i) + 1):
            if best[i - k] + 1 < b and seq[i - k:i] in dictionary:
                b = best[i - k] + 1
        best[i] = b
    return best[-1]


def dictionary_cost(dictionary: Iterable[Phrase]) -> int:
    """L_dict(C): symbols stored in the multi-symbol phrases (singletons are always there)."""
    return sum(len(p) for p in dictionary if len(p) > 1)


def description_length(sequences: Sequence[Sequence[str]], dictionary: set[Phrase]) -> float:
    """L_BDL(C) = L_dict(C)/|B+| + mean seg(s, C) (§3.2); 0 for an empty batch."""
    if not sequences:
        return 0.0
    max_len = _max_len(dictionary)
    segs = sum(segment_count(s, dictionary, max_len) for s in sequences)
    return (dictionary_cost(dictionary) + segs) / len(sequences)


# ----------------------------------------------------------------------------- extraction

def _singletons(sequences: Sequence[Phrase], alphabet: Iterable[str]) -> set[Phrase]:
    return {(a,) for a in alphabet} | {(x,) for s in sequences for x in s}


def _merge(tokens: list[Phrase], a: Phrase, b: Phrase) -> list[Phrase]:
    out, i = [], 0
    while i < len(tokens):
        if i + 1 < len(tokens) and tokens[i] == a and tokens[i + 1] == b:
            out.append(a + b)
            i += 2
        else:
            out.append(tokens[i])
            i += 1
    return out


def _occurrences(seqs: Sequence[Phrase], max_len: int) -> dict[Phrase, dict[int, list[int]]]:
    """Every multi-symbol substring (≤ max_len, without OTHER) → {sequence index: start positions}."""
    occ: dict[Phrase, dict[int, list[int]]] = {}
    for j, s in enumerate(seqs):
        for k in range(2, max_len + 1):
            for i in range(len(s) - k + 1):
                occ.setdefault(s[i:i + k], {}).setdefault(j, []).append(i)
    return {p: o for p, o in occ.items() if OTHER not in p}


def _max_uses(phrase: Phrase, where: Mapping[int, list[int]]) -> int:
    """Non-overlapping occurrences of `phrase` over all sequences: a bound on its uses."""
    total = 0
    for starts in where.values():
        end = -1
        for i in starts:
            if i > end:
                total, end = total + 1, i + len(phrase) - 1
    return total


def _worth_trying(occ: Mapping[Phrase, Mapping[int, list[int]]]) -> list[Phrase]:
    """Phrases that could pay off: one used at most u times with u·(|p| − 1) ≤ |p| never lowers
    L_BDL (dropping it costs at most u·(|p| − 1) segments and saves |p| stored symbols)."""
    return sorted(p for p, where in occ.items() if _max_uses(p, where) * (len(p) - 1) > len(p))


def extract_dictionary(sequences: Sequence[Sequence[str]], max_phrase_len: int = 4,
                       alphabet: Iterable[str] = (), prune: bool = True, polish_limit: int = 64
                       ) -> set[Phrase]:
    """Greedy BPE merges on L_BDL (module docstring); always holds every singleton.

    `prune` drops phrases later merges made useless; corpora of at most `polish_limit` sequences
    also get a local search over all substrings (`_polish`: on app. G.1's groups of 10 it closes
    most of BPE's gap to the optimum for ~0.3 ms; on a 256-sequence buffer it would cost seconds).
    """
    if max_phrase_len < 1:
        raise ValueError(f"max_phrase_len must be >= 1, got {max_phrase_len}.")
    seqs = [tuple(s) for s in sequences]
    dictionary = _singletons(seqs, alphabet)
    if not seqs or max_phrase_len == 1:
        return dictionary
    tokens = [[(x,) for x in s] for s in seqs]
    segs = [len(s) for s in seqs]                 # seg under singletons only
    rejected: set[Phrase] = set()
    occ = _occurrences(seqs, max_phrase_len)
    while True:
        pairs: collections.Counter = collections.Counter()
        for toks in tokens:
            for a, b in zip(toks, toks[1:]):
                if (OTHER not in a and OTHER not in b and len(a) + len(b) <= max_phrase_len
                        and a + b not in dictionary and a + b not in rejected):
                    pairs[(a, b)] += 1
        # Most frequent first; ties by the phrase itself, so extraction is deterministic.
        candidates = sorted((c for c in pairs.items() if c[1] >= 2), key=lambda c: (-c[1], c[0]))
        for (a, b), _ in candidates:
            phrase = a + b
            trial = dictionary | {phrase}
            touched = list(occ[phrase])
            new = {i: segment_count(seqs[i], trial, max_phrase_len) for i in touched}
            gain = sum(segs[i] - new[i] for i in touched) - len(phrase)
            if gain > 0:                          # L_BDL drops by gain / |B+|
                dictionary = trial
                for i in touched:
                    segs[i] = new[i]
                tokens = [_merge(t, a, b) for t in tokens]
                rejected.clear()                  # the new phrase changes every other gain
                break
            rejected.add(phrase)
        else:
            break
    if prune:
        dictionary = _prune(seqs, dictionary, max_phrase_len, occ)
    if len(seqs) <= polish_limit:
        dictionary = _polish(seqs, dictionary, max_phrase_len, occ)
    return dictionary


def _polish(seqs: list[Phrase], dictionary: set[Phrase], max_len: int, occ: Mapping,
            slack: int = 1) -> set[Phrase]:
    """Local search after BPE, which only ever sees pairs of its own tokens.

    Adds the substring that lowers L_BDL most while one does (lazy greedy: a phrase's gain is at
    most u·(|p| − 1) − |p| and rarely grows as the dictionary does, so stale gains are kept as
    bounds and only the top one is re-evaluated), then prunes; then tries swaps: a phrase that
    alone loses at most `slack`, added together with the prune it allows (so it can replace a
    phrase it subsumes). Each swap round evaluates every candidate on the whole corpus, hence
    `polish_limit` in `extract_dictionary`.
    """
    segs = [segment_count(s, dictionary, max_len) for s in seqs]

    def gain(p, d):
        return sum(segs[i] - segment_count(seqs[i], d | {p}, max_len) for i in occ[p]) - len(p)

    heap = [(-(_max_uses(p, occ[p]) * (len(p) - 1) - len(p)), p) for p in _worth_trying(occ)
            if p not in dictionary]
    heapq.heapify(heap)
    while heap:
        _, p = heapq.heappop(heap)
        g = gain(p, dictionary)
        if heap and g < -heap[0][0]:
            heapq.heappush(heap, (-g, p))          # stale bound: re-queue with the true gain
            continue
        if g <= 0:
            break
        dictionary = dictionary | {p}
        for i in occ[p]:
            segs[i] = segment_count(seqs[i], dictionary, max_len)
    dictionary = _prune(seqs, dictionary, max_len, occ)
    current = description_length(seqs, dictionary)
    while True:
        best, best_len = None, current - 1e-9
        for p in _worth_trying(occ):
            if p not in dictionary:
                trial = dictionary | {p}
                added = description_length(seqs, trial)
                if added - current <= slack / len(seqs):
                    trial = _prune(seqs, trial, max_len, occ)
                    added = description_length(seqs, trial)
                if added < best_len:
                    best, best_len = trial, added
        if best is None:
            return dictionary
        dictionary, current = best, best_len


def _prune(seqs: list[Phrase], dictionary: set[Phrase], max_len: int, occ: Mapping
           ) -> set[Phrase]:
    """Drop multi-symbol phrases whose removal lowers L_BDL (later merges can subsume earlier ones)."""
    improved = True
    while improved:
        improved = False
        for phrase in sorted((p for p in dictionary if len(p) > 1), key=lambda p: (len(p), p)):
            trial = dictionary - {phrase}
            loss = sum(segment_count(seqs[i], trial, max_len)
                       - segment_count(seqs[i], dictionary, max_len) for i in occ.get(phrase, ()))
            if loss < len(phrase):
                dictionary, improved = trial, True
    return dictionary


def brute_force_dictionary(sequences: Sequence[Sequence[str]], max_phrase_len: int = 4,
                           alphabet: Iterable[str] = (), max_candidates: int = 22
                           ) -> tuple[set[Phrase], float]:
    """The admissible dictionary of least L_BDL, by exhaustive search, and that L_BDL.

    Only phrases that could ever pay off are searched (`_worth_trying`): some optimum lacks the
    others. Raises when more than `max_candidates` remain.
    """
    seqs = [tuple(s) for s in sequences]
    base = _singletons(seqs, alphabet)
    cands = _worth_trying(_occurrences(seqs, max_phrase_len))
    if len(cands) > max_candidates:
        raise ValueError(f"{len(cands)} candidate phrases: 2^{len(cands)} dictionaries is too many "
                         f"for brute force (max_candidates={max_candidates}); use fewer sequences.")
    best, best_len = base, description_length(seqs, base)
    for r in range(1, len(cands) + 1):
        for subset in itertools.combinations(cands, r):
            d = base | set(subset)
            cost = description_length(seqs, d)
            if cost < best_len - 1e-12:
                best, best_len = d, cost
    return best, best_len


# ----------------------------------------------------------------------------- the reward term

@dataclasses.dataclass(frozen=True)
class SegmentationConfig:
    mode: str = "segcost"          # "none" (vanilla GRPO), "length" (pure round length), "segcost"
    coef: float = 10.0             # λ (app. E: 10 with the success reward 10)
    horizon: int = 50              # T, the episode step limit
    max_phrase_len: int = 4        # L
    buffer_size: int = 256         # the global FIFO success buffer (app. E)
    use_buffer: bool = True        # False: extract from the batch's successes only (§6.2)
    # The local search after BPE (`extract_dictionary`'s polish) in every update or in none: the
    # buffer ablation must differ only in its corpus, not in the extraction procedure.
    polish: bool = False
    alphabet: tuple[str, ...] = ()

    def __post_init__(self):
        if self.mode not in MODES:
            raise ValueError(f"Unknown reuse mode {self.mode!r}; choose one of {MODES}.")
        if self.horizon < 1 or self.buffer_size < 0 or self.max_phrase_len < 1:
            raise ValueError(f"Bad segmentation settings {self}: horizon and max_phrase_len must "
                             "be >= 1, buffer_size >= 0.")


class SegmentationCost:
    """The success buffer, the current dictionary, and the per-trajectory penalties."""

    def __init__(self, config: SegmentationConfig):
        self.config = config
        self.buffer: collections.deque[Phrase] = collections.deque(maxlen=config.buffer_size)
        self.dictionary: set[Phrase] = {(a,) for a in config.alphabet}

    def update(self, successes: Sequence[Sequence[str]]) -> dict:
        """E-step: a dictionary from the batch's successful sequences (+ the buffer); then buffer them.

        Returns metrics: dictionary size (multi-symbol phrases), L_BDL, mean seg/|s| and the most
        used phrases on this batch's successes.
        """
        batch = [tuple(s) for s in successes if len(s) > 0]
        corpus = (list(self.buffer) if self.config.use_buffer else []) + batch
        if corpus:
            self.dictionary = extract_dictionary(
                corpus, self.config.max_phrase_len, self.config.alphabet,
                polish_limit=len(corpus) if self.config.polish else 0)
        if self.config.use_buffer:
            self.buffer.extend(batch)
        m: dict = {"dict_size": sum(len(p) > 1 for p in self.dictionary),
                   "corpus": len(corpus), "buffer": len(self.buffer)}
        if batch:
            max_len = _max_len(self.dictionary)
            cuts = [segmentation(s, self.dictionary, max_len) for s in batch]
            m["seg_ratio"] = sum(len(c) / len(s) for c, s in zip(cuts, batch)) / len(batch)
            m["l_bdl"] = description_length(corpus, self.dictionary)
            used = collections.Counter(p for c in cuts for p in c if len(p) > 1)
            m["top_phrases"] = [[" ".join(p), k] for p, k in used.most_common(5)]
        return m

    def penalty(self, seq: Sequence[str], won: bool) -> float:
        """The reward term of one trajectory (0 on failures and in mode "none")."""
        if not won or self.config.mode == "none":
            return 0.0
        cost = len(seq) if self.config.mode == "length" else segment_count(seq, self.dictionary)
        return -self.config.coef * cost / self.config.horizon

    def state_dict(self) -> dict:
        return {"buffer": [list(s) for s in self.buffer],
                "dictionary": sorted(list(p) for p in self.dictionary)}

    def load_state_dict(self, state: Mapping) -> None:
        self.buffer.clear()
        self.buffer.extend(tuple(s) for s in state["buffer"])
        self.dictionary = {tuple(p) for p in state["dictionary"]}
