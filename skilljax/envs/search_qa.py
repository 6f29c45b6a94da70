"""Search-QA: answer a question with a local search tool, the Search-R1 protocol as SKILL0 uses it.

The model emits `<search> query </search>` or `<answer> text </answer>` (`SearchAnswer` parses a
response into an env action); the env actions are the strings `search: QUERY` and `answer: TEXT`
(a raw tagged response is accepted too and parsed the same way). A search returns the top-k passages
(k=3) as `<information>Doc 1: "Title"\\ntext\\nDoc 2: ...</information>`; an answer ends the episode
with reward 1 if it exactly matches a gold answer after `normalize_answer`, else 0 (Search-R1's
`qa_em` score, as released: §8; the other envs here pay 10). At most 4 turns;
on the 4th turn a search is not run and the episode ends unanswered (reward 0, `truncated`). An
invalid action (no usable block, or an empty query) costs a turn and returns an empty observation
with `info["valid"] = False`, as in the released code (`shared/reference/skill0_released_code.md`
§4.3, §8). Unlike the released tool client, passages are not JSON-escaped.

Data, chosen per task (`make_tasks(..., data_dir=...)`, carried in the payload):
- default, offline: a corpus generated from `countryinfo` facts (one encyclopedia-style passage per
  country) and questions of four types, the SKILL0 skill categories: `direct` (capital of X; whose
  capital is Z), `attribute` (currency, language, region, population, area of X), `comparison`
  (which of X and Y has the larger/smaller population/area), `multihop` (a property of the country
  whose capital is Z, or of X's only neighbour). Train/test split by a hash of the question.
- `data_dir`: a user's Search-R1-style data, `corpus.jsonl` (`{"id", "contents"}`, contents
  `"Title"\\ntext`) and `{split}.jsonl` or `{split}.parquet` (`question`, `golden_answers`,
  optional `skill_type`, `data_source`).

Retrieval (BM25 via `bm25s`, or `dense` via sentence-transformers when installed) runs in the env
worker process: one index per process and corpus, cached on disk under `$SKILLJAX_CACHE` (default
`~/.cache/skilljax`). The expert answers from the passages it retrieved, never from the facts.

    python -m skilljax.envs.search_qa --recall [--split test] [--retriever bm25] [--data-dir DIR]
"""

from __future__ import annotations

import dataclasses
import functools
import json
import random
import re
from pathlib import Path
from typing import Any

from skilljax.envs.base import Env, EnvError, StepResult, Task
from skilljax.envs.search_corpus import (
    ATTRIBUTES, GENERATED, MAX_TURNS, TOP_K, TYPES,
    _number, contents, format_passages, normalize_answer, parse_passage,
    questions_of, read_passages, retriever_for)

# ---------------------------------------------------------------------------- answers

def exact_match(prediction: str, golds) -> bool:
    pred = normalize_answer(prediction)
    return any(pred == normalize_answer(g) for g in golds)


@dataclasses.dataclass(frozen=True)
class SearchAnswer:
    """`<search>q</search>` → `search: q`; `<answer>a</answer>` → `answer: a` (SKILL0 §4.3).

    Projection as released: keep the text up to the first `</search>` (else the first `</answer>`),
    take its first search block, else its first answer block. Invalid: neither block ("" then), both
    kinds of tag in the response, or either tag more than once; and (ours) an empty query. An action
    extracted from an otherwise invalid response is still executed; only the penalty applies.
    """
    instruction: str = (
        "Reason first, then do exactly one of: (1) if knowledge is missing or uncertain, search "
        "with <search> query </search>; (2) only when you have enough information, give the final "
        "answer inside <answer> </answer>.")

    def image_line(self, observation: str, action: str) -> str:
        """A past step in the history image (visual context): the action in its tags, so the
        released Search markers (`<search>` blue, `<information>` red) colour it."""
        from skilljax.rl.rollout import history_line
        kind, _, text = action.partition(": ")
        return history_line(observation, f"<{kind}>{text}</{kind}>"
                            if kind in ("search", "answer") else action)

    def render(self, action: str, thought: str = "") -> str:
        kind, arg = split_action(action)
        if kind is None:
            raise ValueError(f"Not a search_qa action: {action!r} (want 'search: …' or 'answer: …').")
        return (f"{thought.strip()}\n" if thought.strip() else "") + f"<{kind}> {arg} </{kind}>"

    def parse(self, text: str) -> tuple[str, bool, str]:
        """(action, valid, reason)."""
        low = text.lower()
        n_search, n_answer = low.count("<search>"), low.count("<answer>")
        head = text
        for close in ("</search>", "</answer>"):
            if close in low:
                head = text[:low.index(close) + len(close)]
                break
        action = ""
        for kind in ("search", "answer"):
            if m := re.search(rf"<{kind}>(.*?)</{kind}>", head, re.IGNORECASE | re.DOTALL):
                action = f"{kind}: {' '.join(m.group(1).split())}"
                break
        if not action:
            return "", False, "no <search> or <answer> block"
        if n_search and n_answer:
            return action, False, "both <search> and <answer>"
        if n_search > 1 or n_answer > 1:
            return action, False, "repeated <search> or <answer> tags"
        if action == "search: ":
            return action, False, "empty query"
        return action, True, ""


def split_action(action: str) -> tuple[str | None, str]:
    """("search" | "answer", argument) for an env action string, else (None, "")."""
    m = re.match(r"\s*(search|answer)\s*:\s?(.*)\Z", action, re.IGNORECASE | re.DOTALL)
    if not m:
        return None, ""
    return m.group(1).lower(), " ".join(m.group(2).split())


# ---------------------------------------------------------------------------- the env

def _same(a, b) -> bool:
    return normalize_answer(str(a)) == normalize_answer(str(b))


class SearchQA(Env):
    name = "search_qa"
    max_steps = MAX_TURNS
    success_reward = 1.0       # SKILL0 §8: exact match scores 1.0 (the invalid penalty is 0.01)
    invalid_observation = ""   # SKILL0 §4.3: an invalid step's observation is empty

    def __init__(self, retriever: str = "bm25", top_k: int = TOP_K, max_steps: int = MAX_TURNS,
                 dense_model: str | None = None, service_url: str = "",
                 service_timeout_s: float = 30.0, **service):
        if retriever not in RETRIEVERS:
            raise EnvError(f"search_qa retriever must be one of {RETRIEVERS}, not {retriever!r}.")
        unknown = set(service) - set(SERVICE_START)
        if unknown:
            raise TypeError(f"SearchQA got unexpected options {sorted(unknown)}.")
        if retriever == "service" and not service_url:
            raise EnvError(
                "search_qa retriever='service' needs service_url (a running "
                "`python -m skilljax.envs.retrieval_service`), or service_index=INDEX_DIR / "
                "service_source=generated|DATA_DIR so that the trainer starts one.")
        self.retriever_kind, self.top_k, self.max_steps = retriever, top_k, max_steps
        self.dense_model = dense_model
        self.service_url, self.service_timeout_s = service_url, service_timeout_s
        self.task: Task | None = None
        self.fmt = SearchAnswer()
        self._prefetched: dict[str, list[dict] | EnvError] = {}

    @classmethod
    def start_sidecars(cls, env_kwargs, log_dir):
        """`retriever="service"` without `service_url`: a retrieval service over
        `service_index` (an index directory) or `service_source` (`generated` or a data directory,
        with `service_kind` bm25/dense), started here and pointed at by `service_url`."""
        kw = dict(env_kwargs)
        start = {k: kw.pop(k) for k in SERVICE_START if k in kw}
        if kw.get("retriever") != "service" or kw.get("service_url"):
            return [], kw
        if not start.get("service_index") and not start.get("service_source"):
            raise EnvError("search_qa retriever='service' needs service_url, service_index or "
                           "service_source in env.kwargs.")
        from skilljax.envs.retrieval_service import ServiceProcess
        service = ServiceProcess(
            index=start.get("service_index") or None, source=start.get("service_source") or None,
            kind=start.get("service_kind", "bm25"), dense_model=kw.get("dense_model"),
            request_timeout_s=kw.get("service_timeout_s", 30.0),
            log_path=str(Path(log_dir) / "retrieval_service.log") if log_dir else None)
        kw["service_url"] = service.url
        return [service], kw

    def _retriever(self):
        if self.retriever_kind == "service":
            return _client(self.service_url, self.service_timeout_s)
        return retriever_for(self.payload["source"], self.retriever_kind, self.dense_model)

    @classmethod
    def before_step(cls, pairs) -> None:
        """The searches of one batched step, run as one `search_batch` per retriever (one request
        to a retrieval service); `step` then reads its passages from here."""
        by_retriever: dict[int, tuple[Any, list]] = {}
        for env, action in pairs:
            if env.task is None or env.done or env.turns + 1 >= env.max_steps:
                continue
            kind, arg, _, _ = env._project(action)
            if kind == "search" and arg:
                r = env.retriever
                by_retriever.setdefault(id(r), (r, []))[1].append((env, arg))
        for r, wanted in by_retriever.values():
            k = max(env.top_k for env, _ in wanted)
            try:
                hits = r.search_batch([arg for _, arg in wanted], k)
            except EnvError as e:  # each step fails with it at once, rather than ask again
                for env, arg in wanted:
                    env._prefetched[arg] = e
                continue
            for (env, arg), passages in zip(wanted, hits):
                env._prefetched[arg] = passages[:env.top_k]

    @classmethod
    def task_types(cls) -> tuple[str, ...]:
        return TYPES

    @classmethod
    def make_tasks(cls, split: str, num: int, seed: int = 0, data_dir: str | None = None,
                   types=None) -> list[Task]:
        """`num` tasks, round-robin over the types present: a seeded shuffle of each type's
        questions, reshuffled when used up (repeats get an id suffix). Prefixes agree across `num`.
        """
        questions = questions_of(split, data_dir)
        source = GENERATED if data_dir is None else str(Path(data_dir).resolve())
        by_type: dict[str, list[dict]] = {}
        for q in sorted(questions, key=lambda q: q["id"]):
            if types is None or q["type"] in types:
                by_type.setdefault(q["type"], []).append(q)
        if not by_type:
            raise EnvError(f"No search_qa questions of types {types} in split {split!r}.")
        order = [t for t in TYPES if t in by_type] + sorted(set(by_type) - set(TYPES))
        rng = random.Random(f"search_qa/{split}/{seed}")
        decks = {t: [] for t in order}
        passes = dict.fromkeys(order, -1)
        tasks = []
        for i in range(num):
            t = order[i % len(order)]
            if not decks[t]:
                decks[t] = list(by_type[t])
                rng.shuffle(decks[t])
                passes[t] += 1
            q = decks[t].pop()
            tasks.append(Task(
                id=q["id"] + (f"#{passes[t]}" if passes[t] else ""), type=t, split=split,
                payload={"question": q["question"], "golden_answers": q["golden_answers"],
                         "source": source, "gold_ids": q["gold_ids"], "plan": q["plan"]}))
        return tasks

    def reset(self, task: Task, seed: int = 0) -> tuple[str, dict[str, Any]]:
        del seed  # deterministic
        self.task, self.payload = task, task.payload
        self.turns, self.done = 0, False
        self.searches: list[tuple[str, str]] = []   # (query, observation) of every search run
        self._prefetched = {}
        self.retriever = self._retriever()
        question = self.payload["question"]
        # SKILL0 §4.3: the first observation is the question itself.
        return question, {"goal": question, "valid": True, "turns": 0}

    def _project(self, action: str) -> tuple[str | None, str, bool, str]:
        kind, arg = split_action(action)
        if kind is None and "<" in action:   # a raw response: parse it as the trainer would
            projected, valid, reason = self.fmt.parse(action)
            kind, arg = split_action(projected)
            return kind, arg, valid, reason
        if kind is None:
            return None, "", False, "not a search or answer action"
        if kind == "search" and not arg:
            return kind, arg, False, "empty query"
        return kind, arg, True, ""

    def step(self, action: str) -> StepResult:
        if self.task is None or self.done:
            raise EnvError("SearchQA.step called with no live episode; call reset(task) first.")
        self.turns += 1
        kind, arg, valid, error = self._project(action)
        info: dict[str, Any] = {"valid": valid, "error": error or None, "turns": self.turns}
        observation, won, truncated = self.invalid_observation, False, False
        if kind == "answer":
            won = exact_match(arg, self.payload["golden_answers"])
            info["answer"] = arg
            self.done = True
        elif self.turns >= self.max_steps:
            self.done = truncated = True   # SKILL0 §4.3: the last turn's search is not run
            observation = ""
        elif kind == "search" and arg:
            passages = self._prefetched.pop(arg, None)
            self._prefetched.clear()
            if isinstance(passages, Exception):
                raise passages
            if passages is None:
                passages = self.retriever.search(arg, self.top_k)
            observation = format_passages(passages)
            info["query"], info["retrieved"] = arg, [p["id"] for p in passages]
            self.searches.append((arg, observation))
        return StepResult(observation, self.success_reward if won else 0.0, self.done, won=won,
                          truncated=truncated, info=info)

    # ------------------------------------------------------------------------ the expert

    def expert_action(self) -> str:
        """The next query of the question's plan, or the answer once the passages state it.

        Reads only the passages its own searches returned (`parse_passage`), never the facts. A
        query that found nothing is retried once as the whole question; then it answers "unknown".
        User questions have no plan: search the question, then answer a gold answer if a passage
        states it (a retrieval oracle: the reader is perfect, the retriever is what is tested).
        """
        plan = self.payload.get("plan")
        if plan is None:
            return self._oracle_action()
        facts = [parse_passage(text) for _, obs in self.searches for _, text in read_passages(obs)]

        def lookup(entity, attr):
            for f in facts:
                if _same(f.get("name", ""), entity) and attr in f:
                    return f[attr]
            return None

        def by_capital(capital):
            return next((f["name"] for f in facts if _same(f.get("capital", ""), capital)), None)

        kind, attr = plan["kind"], plan.get("attr")
        if kind == "lookup":
            value = lookup(plan["entity"], attr)
            return self._answer(value) if value is not None else self._search(
                f"{plan['entity']} {_query_word(attr)}")
        if kind == "compare":
            values = []
            for entity in plan["entities"]:
                value = lookup(entity, attr)
                if value is None:
                    return self._search(f"{entity} {_query_word(attr)}")
                values.append((value, entity))
            return self._answer((max if plan["larger"] else min)(values)[1])
        if kind == "bridge":
            bridge = by_capital(plan["capital"])
            if bridge is None:
                return self._search(f"{plan['capital']} capital city")
        else:  # neighbour
            bridge = lookup(plan["entity"], "only_neighbour")
            if bridge is None:
                return self._search(f"{plan['entity']} borders")
        if attr is None:
            return self._answer(bridge)
        value = lookup(bridge, attr)
        return self._answer(value) if value is not None else self._search(
            f"{bridge} {_query_word(attr)}")

    def _search(self, query: str) -> str:
        asked = {q for q, _ in self.searches}
        for q in (query, self.payload["question"]):
            if q not in asked and self.turns < self.max_steps - 1:
                return f"search: {q}"
        return "answer: unknown"

    @staticmethod
    def _answer(value) -> str:
        if isinstance(value, list):
            value = value[0]
        return f"answer: {_number(value) if isinstance(value, int) else value}"

    def _oracle_action(self) -> str:
        if not self.searches:
            return f"search: {self.payload['question']}"
        seen = " " + " ".join(normalize_answer(obs) for _, obs in self.searches) + " "
        for gold in self.payload["golden_answers"]:
            if normalize_answer(gold) and f" {normalize_answer(gold)} " in seen:
                return f"answer: {gold}"
        return "answer: unknown"


RETRIEVERS = ("bm25", "dense", "service")
# env.kwargs read by `SearchQA.start_sidecars` (the trainer's side), not by the env.
SERVICE_START = ("service_index", "service_source", "service_kind")


@functools.lru_cache(maxsize=None)
def _client(url: str, timeout_s: float):
    from skilljax.envs.retrieval_service import ServiceClient
    return ServiceClient(url, timeout_s)


def _query_word(attr: str) -> str:
    return "capital" if attr == "capital" else ATTRIBUTES[attr][1]


# ---------------------------------------------------------------------------- recall report

def recall_report(split: str = "test", data_dir: str | None = None, retriever: str = "bm25",
                  top_k: int = TOP_K, num: int | None = None) -> dict[str, dict[str, float]]:
    """Per type: recall@k of the gold passages for the question as query (`question`) and for the
    expert's own queries (`expert`), the expert's success, and (user data, which has no passage
    labels) how often a gold answer string is in the question's top k (`answer_in_topk`)."""
    questions = questions_of(split, data_dir)[:num]
    source = GENERATED if data_dir is None else str(Path(data_dir).resolve())
    env = SearchQA(retriever=retriever, top_k=top_k)
    search = retriever_for(source, retriever).search
    sums: dict[str, dict[str, list[float]]] = {}
    for q in questions:
        row = sums.setdefault(q["type"], {})
        top = search(q["question"], top_k)
        text = " " + " ".join(normalize_answer(contents(p)) for p in top) + " "
        row.setdefault("answer_in_topk", []).append(
            any(f" {normalize_answer(g)} " in text for g in q["golden_answers"]))
        gold = set(q["gold_ids"])
        if gold:
            row.setdefault("question", []).append(len(gold & {p["id"] for p in top}) / len(gold))
        env.reset(Task(q["id"], q["type"], split, {**q, "source": source}))
        found, result = set(), None
        while result is None or not result.done:
            result = env.step(env.expert_action())
            found.update(result.info.get("retrieved", []))
        row.setdefault("expert_success", []).append(float(result.won))
        if gold:
            row.setdefault("expert", []).append(len(gold & found) / len(gold))
    return {t: {k: round(sum(v) / len(v), 4) for k, v in row.items()}
            | {"n": len(row["expert_success"])} for t, row in sorted(sums.items())}


def main(argv=None) -> None:
    import argparse
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--recall", action="store_true", help="print per-type retrieval recall@k")
    ap.add_argument("--split", default="test")
    ap.add_argument("--data-dir", default=None)
    ap.add_argument("--retriever", default="bm25")
    ap.add_argument("--top-k", type=int, default=TOP_K)
    ap.add_argument("--num", type=int, default=None, help="only the first NUM questions")
    args = ap.parse_args(argv)
    if not args.recall:
        ap.error("nothing to do: pass --recall")
    print(json.dumps(recall_report(args.split, args.data_dir, args.retriever, args.top_k,
                                   args.num)))


if __name__ == "__main__":
    main()
