"""Teachers: the LLMs that abstract trajectories, induce skills and review weak ones (SkillForge
§3.3, prompts in appendix A.10), all behind `teacher.complete(prompt) -> str`.

Backends: `HTTPTeacher` (an OpenAI-compatible chat-completions server the user runs: vLLM, SGLang,
...), `LocalTeacher` (a checkpoint, or the run's own policy, through skilljax's sampler) and a
rule-based teacher written elsewhere that reads `Prompt.data`. `ReplayTeacher` wraps any of them and
records every answer, so a run can be replayed exactly and tests run offline. The cache is JSON
lines, one call per line: {"key": sha256 hex of the prompt's utf-8 text, "kind", "teacher",
"prompt", "answer"}.

Errors: `complete` raises `TeacherError`; `complete_many` returns errors as values (a TeacherError
in place of the answer), so one failing prompt never loses the others' answers.

JAX is imported only by `LocalTeacher`: the skills package stays importable without it.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import hashlib
import http.client
import json
import logging
import os
import re
import shutil
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol, runtime_checkable

_log = logging.getLogger(__name__)
KINDS = ("rule", "http", "local", "policy", "replay")


class Prompt(str):
    """A teacher prompt: the text LLM teachers read, plus its `kind` ("abstraction", "induction",
    "attribution", "reflexion") and the structured inputs `data` a rule-based teacher reads.
    Slicing and concatenation give plain str; the kind travels only with the Prompt itself."""

    kind: str
    data: dict

    def __new__(cls, text: str, kind: str = "", data: dict | None = None) -> Prompt:
        self = super().__new__(cls, text)
        self.kind, self.data = kind, {} if data is None else data
        return self

    def __reduce__(self):
        return (Prompt, (str(self), self.kind, self.data))


class TeacherError(RuntimeError):
    """A teacher could not answer (server down, HTTP 4xx, no recorded answer)."""


@runtime_checkable
class Teacher(Protocol):
    name: str

    def complete(self, prompt: str) -> str: ...


def kind_of(prompt: str) -> str:
    return getattr(prompt, "kind", "") or "untyped"


def complete_many(teacher: Teacher, prompts: Sequence[str], *,
                  return_errors: bool = False) -> list[Any]:
    """Answers in prompt order: through `teacher.complete_many` when it has one (HTTP: concurrent,
    local: one batch), else one `complete` per prompt. A TeacherError for one prompt takes that
    answer's place with `return_errors`; otherwise the first one is raised once all have run."""
    if hasattr(teacher, "complete_many"):
        out = list(teacher.complete_many(list(prompts)))
    else:
        out = []
        for p in prompts:
            try:
                out.append(teacher.complete(p))
            except TeacherError as e:
                out.append(e)
    if not return_errors:
        for a in out:
            if isinstance(a, TeacherError):
                raise a
    return out


# ------------------------------------------------------------------------------------ JSON answers

_FENCE = re.compile(r"```[A-Za-z]*[ \t]*\n?(.*?)```", re.S)
_THINK = re.compile(r"<think>.*?</think>", re.S)  # reasoning models may put braces there


def parse_json(text: str) -> Any:
    """The JSON value in an LLM answer: a fenced block, else the text from the first `{` (`[`) to
    the last `}` (`]`). ValueError with a short reason when there is none."""
    text = _THINK.sub("", text)
    fenced = _FENCE.findall(text)
    candidates = [f.strip() for f in fenced] + [text.strip()]
    for t in list(candidates):  # spans after the whole texts, the earlier-starting span first
        spans = [(t.find(a), t.rfind(b)) for a, b in ("{}", "[]")]
        candidates += [t[i:j + 1] for i, j in sorted(spans) if 0 <= i < j]
    reason = "no JSON object or array in the answer"
    for c in dict.fromkeys(c for c in candidates if c):
        try:
            return json.loads(c)
        except json.JSONDecodeError as e:
            if c[:1] in "{[":
                reason = f"not valid JSON ({e.msg} at char {e.pos})"
    raise ValueError(reason)


def _retry_prompt(prompt: str, reason: str) -> str:
    """The prompt again with the reason its answer failed. A changed text, because a greedy teacher
    (or a replay cache) answers the same text the same way: retrying it unchanged is futile."""
    text = (f"{prompt}\n\nYour previous answer could not be used ({reason[:200]}). "
            "Answer again with the JSON only.")
    return Prompt(text, getattr(prompt, "kind", ""), getattr(prompt, "data", None))


def complete_json_many(teacher: Teacher, prompts: Sequence[str],
                       validate: Callable[[Any], Any], *, retries: int = 2,
                       log: Callable[[str], Any] | None = None) -> list[Any | None]:
    """`validate(parse_json(answer))` per prompt, None where every try failed (logged with why).

    `validate` returns the value to keep and raises ValueError(reason) when the answer is unusable;
    that, malformed JSON and TeacherError each count as a failed try. Each round sends all pending
    prompts through `complete_many` (concurrently for HTTP); a retry carries the last reason.
    """
    log = log or _log.warning
    results: list[Any | None] = [None] * len(prompts)
    pending = dict(enumerate(prompts))
    reasons: dict[int, str] = {}
    for _ in range(retries + 1):
        if not pending:
            break
        idx = list(pending)
        answers = complete_many(teacher, [pending[i] for i in idx], return_errors=True)
        for i, answer in zip(idx, answers):
            try:
                if isinstance(answer, TeacherError):
                    raise answer
                results[i] = validate(parse_json(answer))
                del pending[i]
            except (ValueError, TeacherError) as e:
                reasons[i] = str(e) or type(e).__name__
                pending[i] = _retry_prompt(prompts[i], reasons[i])
    for i in pending:
        log(f"teacher {getattr(teacher, 'name', type(teacher).__name__)}: gave up on a "
            f"{kind_of(prompts[i])} prompt after {retries + 1} tries; last reason: {reasons[i]}")
    return results


def complete_json(teacher: Teacher, prompt: str, validate: Callable[[Any], Any], *,
                  retries: int = 2, log: Callable[[str], Any] | None = None) -> Any | None:
    """One prompt of `complete_json_many`."""
    return complete_json_many(teacher, [prompt], validate, retries=retries, log=log)[0]


# --------------------------------------------------------------------------------------- backends

class HTTPTeacher:
    """An OpenAI-compatible chat-completions endpoint, standard library only."""

    def __init__(self, base_url: str, model: str, *, api_key: str | None = None,
                 timeout_s: float = 60.0, retries: int = 2, concurrency: int = 4,
                 temperature: float = 0.0, max_tokens: int = 1024, backoff_s: float = 0.5):
        self.url = base_url.rstrip("/") + "/chat/completions"
        self.model, self.api_key = model, api_key
        self.timeout_s, self.retries, self.concurrency = timeout_s, retries, max(1, concurrency)
        self.temperature, self.max_tokens, self.backoff_s = temperature, max_tokens, backoff_s
        self.name = f"http:{model}"

    @classmethod
    def from_env(cls, base_url: str | None = None, model: str | None = None,
                 api_key_env: str = "OPENAI_API_KEY", **kw) -> HTTPTeacher:
        base_url = base_url or os.environ.get("SKILLJAX_TEACHER_URL")
        model = model or os.environ.get("SKILLJAX_TEACHER_MODEL")
        if not base_url:
            raise ValueError("No teacher URL: set evolution.teacher.base_url or the environment "
                             "variable SKILLJAX_TEACHER_URL (e.g. http://localhost:8000/v1).")
        if not model:
            raise ValueError("No teacher model: set evolution.teacher.model or the environment "
                             "variable SKILLJAX_TEACHER_MODEL (the name the server serves).")
        return cls(base_url, model, api_key=os.environ.get(api_key_env) if api_key_env else None,
                   **kw)

    def _post(self, prompt: str) -> bytes:
        body = json.dumps({"model": self.model, "messages": [{"role": "user", "content": prompt}],
                           "temperature": self.temperature, "max_tokens": self.max_tokens})
        headers = {"Content-Type": "application/json"}
        if self.api_key:
            headers["Authorization"] = f"Bearer {self.api_key}"
        request = urllib.request.Request(self.url, body.encode(), headers, method="POST")
        with urllib.request.urlopen(request, timeout=self.timeout_s) as response:
            return response.read()

    def complete(self, prompt: str) -> str:
        reason = ""
        for attempt in range(self.retries + 1):
            if attempt:
                time.sleep(min(self.backoff_s * 2 ** (attempt - 1), 4.0))
            try:
                raw = self._post(str(prompt))
            except urllib.error.HTTPError as e:
                detail = e.read().decode("utf-8", "replace")[:500]
                if e.code != 429 and e.code < 500:  # the request is wrong: retrying won't help
                    raise TeacherError(f"{self.url} answered HTTP {e.code}: {detail!r}. Check "
                                       f"base_url (it should end in /v1), the model name "
                                       f"{self.model!r} and the API key.") from e
                reason = f"HTTP {e.code}: {detail[:200]!r}"
            except (OSError, http.client.HTTPException) as e:  # URLError, timeouts, resets
                reason = f"{type(e).__name__}: {getattr(e, 'reason', e)}"
            else:
                try:
                    content = json.loads(raw)["choices"][0]["message"]["content"]
                except (ValueError, KeyError, IndexError, TypeError) as e:
                    raise TeacherError(f"{self.url} gave no choices[0].message.content ({e!r}); "
                                       f"is it an OpenAI-compatible server? Body: {raw[:300]!r}")
                if not isinstance(content, str):
                    raise TeacherError(f"{self.url} answered content={content!r}, not text.")
                return content
        raise TeacherError(f"Teacher endpoint {self.url} failed after {self.retries + 1} tries "
                           f"(last: {reason}). Check that the server is running and reachable, "
                           f"that base_url ends in /v1, and that it serves {self.model!r}.")

    def complete_many(self, prompts: Sequence[str]) -> list[str | TeacherError]:
        """At most `concurrency` requests in flight; a TeacherError in place of a failed answer."""
        def one(p: str) -> str | TeacherError:
            try:
                return self.complete(p)
            except TeacherError as e:
                return e
        if len(prompts) <= 1:
            return [one(p) for p in prompts]
        with concurrent.futures.ThreadPoolExecutor(min(self.concurrency, len(prompts))) as pool:
            return list(pool.map(one, prompts))


class LocalTeacher:
    """A checkpoint, or the run's own policy (the sampler reads the model's current weights), as the
    teacher. Answer i of the run samples with fold_in(key(seed), i): the same prompts in the same
    order give the same answers. In a multi-process run every process must call it alike
    (`Sampler.generate` is collective)."""

    def __init__(self, model, tok, *, max_new_tokens: int = 512, temperature: float = 0.0,
                 seed: int = 0, name: str = "local"):
        from skilljax.sampling import Sampler, SamplingParams

        self.model, self.tok, self.seed, self.name = model, tok, seed, name
        self.sampler = Sampler(model, pad_id=tok.pad_id)
        self.params = SamplingParams(max_new_tokens=max_new_tokens, temperature=temperature,
                                     stop_token_ids=tok.stop_ids)
        self.calls = 0

    @classmethod
    def load(cls, checkpoint_dir: str | os.PathLike, *, dtype: str = "float32",
             **kw) -> LocalTeacher:
        from skilljax import models
        from skilljax.tokenizer import Tokenizer

        # Inference only: parameters kept in the compute dtype (no float32 master copy).
        _, model = models.load(checkpoint_dir, None, dtype, param_dtype=dtype)
        kw.setdefault("name", f"local:{Path(checkpoint_dir).name}")
        return cls(model, Tokenizer.load(checkpoint_dir), **kw)

    def complete(self, prompt: str) -> str:
        (answer,) = complete_many(self, [prompt])
        return answer

    def complete_many(self, prompts: Sequence[str]) -> list[str | TeacherError]:
        """All prompts in one generate call; a prompt too long for the model gets a TeacherError."""
        import jax
        import numpy as np

        ids = [self.tok.chat([{"role": "user", "content": str(p)}]) for p in prompts]
        rows = np.arange(self.calls, self.calls + len(ids))
        self.calls += len(ids)
        limit = self.model.cfg.max_position_embeddings - self.params.max_new_tokens
        out: list[str | TeacherError] = [
            TeacherError(f"{self.name}: prompt of {len(t)} tokens exceeds the model's context "
                         f"({limit} + max_new_tokens)") for t in ids]
        ok = [i for i, t in enumerate(ids) if len(t) <= limit]
        if ok:
            keys = jax.vmap(jax.random.fold_in, (None, 0))(jax.random.key(self.seed), rows[ok])
            sample = self.sampler.generate([ids[i] for i in ok], self.params, keys)
            for i, gen in zip(ok, sample.token_ids):
                out[i] = self.tok.decode(gen, skip_special_tokens=True)
        return out


class ReplayTeacher:
    """Every answer recorded by prompt hash: a recorded run replays exactly and tests run offline.

    The key is the prompt text alone, so a prompt asked twice in a run gets the first answer again
    (intended: a replay then needs no count of repeats). Errors are never recorded. Its `name` is
    the answering teacher's (the inner one, or the one the file recorded), so what a replayed run
    writes in skill provenance matches the recorded run.
    """

    def __init__(self, path: str | os.PathLike, inner: Teacher | None = None):
        self.path, self.inner = Path(path), inner
        recorded: list[str] = []
        self.answers: dict[str, str] = {}
        self.hits = self.misses = 0
        self._lock = threading.Lock()
        data = self.path.read_bytes() if self.path.exists() else b""
        lines = data.split(b"\n")  # a complete line ends in "\n": only the last can be partial
        self._cut: int | None = None  # where a partial last line starts: cut before appending
        self._newline = not data.endswith(b"\n") and bool(data)
        offset = 0
        for n, line in enumerate(lines, 1):
            if line.strip():
                try:
                    row = json.loads(line)
                    self.answers.setdefault(row["key"], row["answer"])
                    recorded.append(row.get("teacher") or "")
                except (ValueError, KeyError, TypeError) as e:
                    if n < len(lines):
                        raise ValueError(f"{self.path}:{n}: not a teacher cache line ({e}).") from e
                    _log.warning("%s: ignoring a truncated last line (a crash while writing).",
                                 self.path)
                    self._cut, self._newline = offset, False
            offset += len(line) + 1
        self.name = inner.name if inner is not None else next(
            (n for n in recorded if n), "replay")

    @staticmethod
    def key(prompt: str) -> str:
        return hashlib.sha256(str(prompt).encode("utf-8")).hexdigest()

    def _record(self, prompt: str, answer: str) -> None:
        row = {"key": self.key(prompt), "kind": getattr(prompt, "kind", ""),
               "teacher": getattr(self.inner, "name", ""), "prompt": str(prompt), "answer": answer}
        self.path.parent.mkdir(parents=True, exist_ok=True)
        with open(self.path, "ab") as f:
            if self._cut is not None:
                f.truncate(self._cut)
            f.write(b"\n" * self._newline + (json.dumps(row) + "\n").encode("utf-8"))
            f.flush()
            os.fsync(f.fileno())
        self._cut, self._newline = None, False
        self.answers[row["key"]] = answer

    def _miss_error(self, prompt: str) -> TeacherError:
        return TeacherError(
            f"No recorded answer for the {kind_of(prompt)} prompt {self.key(prompt)[:12]} in "
            f"{self.path}: this run asks what the recorded run did not (different seed, config or "
            "code), or the cache is from another run. Replay with the recorded run's config and "
            "seed, or use a live teacher kind to fill the cache.")

    def complete(self, prompt: str) -> str:
        (answer,) = complete_many(self, [prompt])
        return answer

    def complete_many(self, prompts: Sequence[str]) -> list[str | TeacherError]:
        """Recorded answers; the misses go to the inner teacher in one `complete_many` call."""
        keys = [self.key(p) for p in prompts]
        with self._lock:
            out: list[str | TeacherError | None] = [self.answers.get(k) for k in keys]
            todo = {k: p for k, p, a in zip(keys, prompts, out) if a is None}  # one ask per text
            self.hits += len(prompts) - len(todo)  # a repeat within the batch rides on one ask
            self.misses += len(todo)
        if todo:
            asked = (complete_many(self.inner, list(todo.values()), return_errors=True)
                     if self.inner is not None else [self._miss_error(p) for p in todo.values()])
            with self._lock:
                for p, answer in zip(todo.values(), asked):
                    if not isinstance(answer, TeacherError) and self.key(p) not in self.answers:
                        self._record(p, answer)
                # Another thread may have recorded the same prompt meanwhile: its answer stands.
                got = {k: self.answers.get(k, a) for k, a in zip(todo, asked)}
            out = [got[k] if a is None else a for k, a in zip(keys, out)]
        return out  # type: ignore[return-value]


# ------------------------------------------------------------------------------------- from config

@dataclasses.dataclass(frozen=True)
class TeacherConfig:
    kind: str = "rule"  # one of KINDS
    base_url: str = ""  # http: e.g. http://localhost:8000/v1 (else $SKILLJAX_TEACHER_URL)
    model: str = ""     # http: the served model name (else $SKILLJAX_TEACHER_MODEL)
    api_key_env: str = "OPENAI_API_KEY"
    timeout_s: float = 60.0
    retries: int = 2
    concurrency: int = 4
    checkpoint: str = ""  # local: an HF directory
    max_new_tokens: int = 1024
    temperature: float = 0.0
    replay_from: str = ""  # replay: a recorded run's teacher cache


def make_teacher(cfg: TeacherConfig, *, cache_path: str | os.PathLike, rule: Teacher | None = None,
                 policy: tuple[Any, Any] | None = None) -> Teacher:
    """The configured backend behind a ReplayTeacher recording to `cache_path` (a resumed run reuses
    what it recorded). "replay" answers from `cfg.replay_from` only, copied to `cache_path` so the
    replayed run's workdir holds its own cache."""
    if cfg.kind == "replay":
        if not cfg.replay_from:
            raise ValueError("evolution.teacher.kind='replay' needs evolution.teacher.replay_from: "
                             "the teacher cache file of the run to replay.")
        source = Path(cfg.replay_from)
        if not source.is_file():
            raise ValueError(f"evolution.teacher.replay_from={cfg.replay_from!r} is not a file.")
        if Path(cache_path).resolve() != source.resolve():
            Path(cache_path).parent.mkdir(parents=True, exist_ok=True)
            shutil.copyfile(source, cache_path)
        return ReplayTeacher(source)
    inner: Teacher
    if cfg.kind == "http":
        inner = HTTPTeacher.from_env(cfg.base_url or None, cfg.model or None, cfg.api_key_env,
                                     timeout_s=cfg.timeout_s, retries=cfg.retries,
                                     concurrency=cfg.concurrency, temperature=cfg.temperature,
                                     max_tokens=cfg.max_new_tokens)
    elif cfg.kind == "local":
        if not cfg.checkpoint:
            raise ValueError("evolution.teacher.kind='local' needs evolution.teacher.checkpoint "
                             "(an HF directory with config.json, safetensors and tokenizer.json).")
        inner = LocalTeacher.load(cfg.checkpoint, max_new_tokens=cfg.max_new_tokens,
                                  temperature=cfg.temperature)
    elif cfg.kind == "policy":
        if policy is None:
            raise ValueError("evolution.teacher.kind='policy' needs the run's (model, tokenizer).")
        inner = LocalTeacher(*policy, max_new_tokens=cfg.max_new_tokens,
                             temperature=cfg.temperature, name="policy")
    elif cfg.kind == "rule":
        if rule is None:
            raise ValueError("evolution.teacher.kind='rule' needs the rule-based teacher instance.")
        inner = rule
    else:
        raise ValueError(f"Unknown evolution.teacher.kind={cfg.kind!r}; choose one of {KINDS}.")
    return ReplayTeacher(cache_path, inner)
