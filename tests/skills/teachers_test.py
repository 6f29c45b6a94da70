"""Teachers: JSON extraction and retries, the HTTP client against a real local server, the replay
cache, make_teacher, and a tiny local model as teacher."""

import copy
import hashlib
import http.server
import json
import pickle
import socket
import threading
import time

import pytest

from skilljax.skills import teachers
from skilljax.skills.teachers import (HTTPTeacher, LocalTeacher, Prompt, ReplayTeacher,
                                      TeacherConfig, TeacherError, complete_json,
                                      complete_json_many, complete_many, make_teacher, parse_json)


class Scripted:
    """Answers from a list, in order; counts calls."""

    def __init__(self, answers, name="scripted"):
        self.answers, self.name, self.prompts = list(answers), name, []

    def complete(self, prompt):
        self.prompts.append(prompt)
        answer = self.answers.pop(0)
        if isinstance(answer, Exception):
            raise answer
        return answer


class Echo:
    name = "echo"

    def __init__(self):
        self.calls = 0

    def complete(self, prompt):
        self.calls += 1
        return json.dumps({"echo": str(prompt)})


def needs_int_x(obj):
    if not isinstance(obj, dict) or not isinstance(obj.get("x"), int):
        raise ValueError("x must be an int")
    return obj["x"]


# ---------------------------------------------------------------------------------------- Prompt

def test_prompt_is_a_str_with_kind_and_data():
    p = Prompt("abstract this", kind="abstraction", data={"task": "heat"})
    assert p == "abstract this" and str(p) == "abstract this"
    assert type(p[:3]) is str and p[:3] == "abs" and type(p + "!") is str
    for q in (pickle.loads(pickle.dumps(p)), copy.copy(p), copy.deepcopy(p)):
        assert type(q) is Prompt and q == p
        assert q.kind == "abstraction" and q.data == {"task": "heat"}
    assert Prompt("x").kind == "" and Prompt("x").data == {}


# ------------------------------------------------------------------------------------ parse_json

def test_parse_json():
    assert parse_json('```json\n{"a": [1, 2]}\n```') == {"a": [1, 2]}
    assert parse_json('Sure! Here:\n{"verdict": "keep"}\nHope that helps.') == {"verdict": "keep"}
    skills = [{"title": "t"}, {"title": "u"}]
    assert parse_json(f"Skills: {json.dumps(skills)} done") == skills
    assert parse_json('see [note] then {"a": 1}') == {"a": 1}  # the earlier span is not JSON
    assert parse_json('<think>maybe {x}?</think>{"a": 2}') == {"a": 2}
    with pytest.raises(ValueError, match="no JSON"):
        parse_json("I cannot do that.")
    with pytest.raises(ValueError, match="not valid JSON"):
        parse_json('{"a": 1,, }')


# --------------------------------------------------------------------------------- complete_json

def test_complete_json_retries_malformed_then_valid():
    t = Scripted(["no json here", '{"x": 3}'])
    logs = []
    assert complete_json(t, Prompt("q", kind="induction"), needs_int_x, log=logs.append) == 3
    assert len(t.prompts) == 2 and not logs
    # The retry tells the teacher what was wrong and keeps the prompt's kind.
    assert t.prompts[1].startswith("q\n\n") and "no JSON" in t.prompts[1]
    assert t.prompts[1].kind == "induction"


def test_complete_json_gives_up_and_logs():
    t = Scripted(["garbage"] * 3, name="scripted")
    logs = []
    assert complete_json(t, Prompt("q", kind="reflexion"), needs_int_x, retries=2,
                         log=logs.append) is None
    assert len(t.prompts) == 3 and len(logs) == 1
    assert "scripted" in logs[0] and "reflexion" in logs[0] and "3 tries" in logs[0]
    assert "no JSON object or array" in logs[0]


def test_validate_error_and_teacher_error_count_as_failed_tries():
    t = Scripted(['{"x": "three"}', TeacherError("server down"), '{"x": 4}'])
    assert complete_json(t, Prompt("q"), needs_int_x, log=pytest.fail) == 4
    t = Scripted(['{"x": "three"}', '{"x": "four"}'])
    logs = []
    assert complete_json(t, Prompt("q"), needs_int_x, retries=1, log=logs.append) is None
    assert "x must be an int" in logs[0] and "untyped" in logs[0] and "2 tries" in logs[0]


def test_complete_json_many_keeps_good_answers_and_retries_bad_ones():
    class ByPrompt:
        name = "byprompt"
        asked = []

        def complete(self, prompt):
            self.asked.append(str(prompt))
            if prompt.startswith("bad") and "previous answer" not in prompt:
                return "oops"
            if prompt.startswith("down"):
                raise TeacherError("down")
            return json.dumps({"x": len(prompt)})

    t = ByPrompt()
    logs = []
    out = complete_json_many(t, ["ok", "bad", "down", "ok2"], needs_int_x, retries=1,
                             log=logs.append)
    assert out[0] == 2 and out[3] == 3 and isinstance(out[1], int) and out[2] is None
    assert len(logs) == 1 and "down" in logs[0]
    assert len(t.asked) == 6  # 4 first tries, then only "bad" and "down" again


# ------------------------------------------------------------------------------ HTTP: fake server

def chat_response(content):
    return {"id": "x", "object": "chat.completion",
            "choices": [{"index": 0, "message": {"role": "assistant", "content": content},
                         "finish_reason": "stop"}]}


class FakeServer:
    """A real ThreadingHTTPServer; `behave(n, body) -> (status, payload, delay_s)` per request."""

    def __init__(self):
        self.requests, self.lock, self.release = [], threading.Lock(), threading.Event()
        self.in_flight = self.max_in_flight = 0
        self.behave = lambda n, body: (200, chat_response("hello"), 0)
        outer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                with outer.lock:
                    outer.requests.append((self.path, dict(self.headers), body))
                    n = len(outer.requests)
                    outer.in_flight += 1
                    outer.max_in_flight = max(outer.max_in_flight, outer.in_flight)
                status, payload, delay = outer.behave(n, body)
                if delay:
                    outer.release.wait(delay)
                # Out of flight before the answer goes out: the client may send its next request
                # as soon as it reads this one's answer, which a busy machine can schedule before
                # this thread runs again.
                with outer.lock:
                    outer.in_flight -= 1
                try:
                    data = payload if isinstance(payload, bytes) else json.dumps(payload).encode()
                    self.send_response(status)
                    self.send_header("Content-Type", "application/json")
                    self.send_header("Content-Length", str(len(data)))
                    self.end_headers()
                    self.wfile.write(data)
                except OSError:  # the client gave up (timeout test)
                    pass

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.server.handle_error = lambda *a: None
        self.base_url = f"http://127.0.0.1:{self.server.server_address[1]}/v1"
        self.thread = threading.Thread(target=self.server.serve_forever, args=(0.05,), daemon=True)
        self.thread.start()

    def close(self):
        self.release.set()
        self.server.shutdown()
        self.server.server_close()


@pytest.fixture
def server():
    s = FakeServer()
    yield s
    s.close()


def fast(server, **kw):
    return HTTPTeacher(server.base_url + "/", "tiny-teacher", backoff_s=0.01, **kw)


def test_http_canned_answer_and_request(server):
    t = HTTPTeacher(server.base_url, "tiny-teacher", api_key="sk-test", temperature=0.25,
                    max_tokens=77)
    assert t.name == "http:tiny-teacher"
    assert t.complete(Prompt("what now?", kind="induction")) == "hello"
    ((path, headers, body),) = server.requests
    assert path == "/v1/chat/completions"
    assert body == {"model": "tiny-teacher", "messages": [{"role": "user", "content": "what now?"}],
                    "temperature": 0.25, "max_tokens": 77}
    assert headers["Authorization"] == "Bearer sk-test"
    fast(server).complete("again")
    assert "Authorization" not in server.requests[-1][1]


def test_http_timeout_raises_after_retries_quickly(server):
    server.behave = lambda n, body: (200, chat_response("late"), 5.0)
    t0 = time.perf_counter()
    with pytest.raises(TeacherError, match=r"failed after 2 tries.*server is running"):
        fast(server, timeout_s=0.3, retries=1).complete("q")
    assert time.perf_counter() - t0 < 2.0
    assert len(server.requests) == 2


def test_http_malformed_content_is_retried_by_complete_json(server):
    server.behave = lambda n, body: (200, chat_response("I think the answer is yes"), 0)
    logs = []
    assert complete_json(fast(server), Prompt("q", kind="attribution"), needs_int_x,
                         log=logs.append) is None
    assert len(server.requests) == 3 and "attribution" in logs[0] and "http:tiny-teacher" in logs[0]


def test_http_5xx_is_retried(server):
    server.behave = lambda n, body: ((500, {"error": "busy"}, 0) if n == 1
                                     else (200, chat_response('{"x": 1}'), 0))
    assert fast(server).complete("q") == '{"x": 1}'
    assert len(server.requests) == 2


def test_http_4xx_raises_at_once(server):
    server.behave = lambda n, body: (400, {"error": "model 'tiny-teacher' not found"}, 0)
    with pytest.raises(TeacherError, match=r"HTTP 400.*not found"):
        fast(server).complete("q")
    assert len(server.requests) == 1


def test_http_response_without_content(server):
    server.behave = lambda n, body: (200, {"choices": []}, 0)
    with pytest.raises(TeacherError, match="choices"):
        fast(server).complete("q")
    server.behave = lambda n, body: (200, b"<html>not json</html>", 0)
    with pytest.raises(TeacherError, match="OpenAI-compatible"):
        fast(server).complete("q")


def test_http_connection_refused_names_the_endpoint():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    t = HTTPTeacher(f"http://127.0.0.1:{port}/v1", "m", retries=1, backoff_s=0.01)
    with pytest.raises(TeacherError, match=rf"127.0.0.1:{port}/v1/chat/completions.*base_url"):
        t.complete("q")


def test_http_concurrency_limit_and_order(server):
    server.behave = lambda n, body: (200, chat_response("re:" + body["messages"][0]["content"]),
                                     0.1)
    prompts = [f"p{i}" for i in range(8)]
    assert fast(server, concurrency=2).complete_many(prompts) == [f"re:p{i}" for i in range(8)]
    assert server.max_in_flight == 2


def test_http_complete_many_returns_errors_in_place(server):
    def behave(n, body):
        content = body["messages"][0]["content"]
        return (400, {"error": "bad"}, 0) if content == "p1" else (200, chat_response(content), 0)
    server.behave = behave
    t = fast(server, concurrency=3)
    out = t.complete_many(["p0", "p1", "p2"])
    assert out[0] == "p0" and out[2] == "p2" and isinstance(out[1], TeacherError)
    with pytest.raises(TeacherError, match="HTTP 400"):
        complete_many(t, ["p0", "p1"])
    assert complete_many(t, ["p0", "p1"], return_errors=True)[0] == "p0"


def test_http_from_env(monkeypatch):
    monkeypatch.setenv("SKILLJAX_TEACHER_URL", "http://host:9/v1")
    monkeypatch.setenv("SKILLJAX_TEACHER_MODEL", "qwen-teacher")
    monkeypatch.setenv("MY_KEY", "secret")
    t = HTTPTeacher.from_env(api_key_env="MY_KEY", timeout_s=5.0)
    assert (t.url, t.model, t.api_key, t.timeout_s) == (
        "http://host:9/v1/chat/completions", "qwen-teacher", "secret", 5.0)
    t = HTTPTeacher.from_env("http://other/v1", "m2", api_key_env="ABSENT_KEY_VAR")
    assert (t.url, t.model, t.api_key) == ("http://other/v1/chat/completions", "m2", None)
    monkeypatch.delenv("SKILLJAX_TEACHER_URL")
    with pytest.raises(ValueError, match="SKILLJAX_TEACHER_URL"):
        HTTPTeacher.from_env()
    monkeypatch.setenv("SKILLJAX_TEACHER_URL", "http://host:9/v1")
    monkeypatch.delenv("SKILLJAX_TEACHER_MODEL")
    with pytest.raises(ValueError, match="SKILLJAX_TEACHER_MODEL"):
        HTTPTeacher.from_env()


# ---------------------------------------------------------------------------------------- replay

def test_replay_records_then_replays_offline(tmp_path):
    path = tmp_path / "teacher.jsonl"
    inner = Echo()
    rec = ReplayTeacher(path, inner)
    assert rec.name == "echo"
    a = rec.complete(Prompt("first", kind="abstraction"))
    b = rec.complete_many(["second", "first", "second"])
    assert inner.calls == 2 and (rec.hits, rec.misses) == (2, 2)  # "second" asked once
    assert b == [json.dumps({"echo": "second"}), a, json.dumps({"echo": "second"})]
    rows = [json.loads(line) for line in path.read_text().splitlines()]
    assert [r["prompt"] for r in rows] == ["first", "second"]
    assert rows[0] == {"key": ReplayTeacher.key("first"), "kind": "abstraction", "teacher": "echo",
                       "prompt": "first", "answer": a}
    assert rows[0]["key"] == hashlib.sha256("first".encode("utf-8")).hexdigest()

    replay = ReplayTeacher(path)
    assert replay.name == "echo"  # the recorded teacher
    assert replay.complete("first") == a and replay.complete_many(["second"]) == b[:1]
    assert replay.hits == 2 and inner.calls == 2
    with pytest.raises(TeacherError, match=r"induction prompt [0-9a-f]{12} in .*jsonl.*seed"):
        replay.complete(Prompt("never asked", kind="induction"))
    out = replay.complete_many(["first", "never asked"])
    assert out[0] == a and isinstance(out[1], TeacherError)


def test_replay_never_records_errors(tmp_path):
    path = tmp_path / "c.jsonl"
    rec = ReplayTeacher(path, Scripted([TeacherError("down"), "fine"]))
    with pytest.raises(TeacherError, match="down"):
        rec.complete("q")
    assert not path.exists()
    assert rec.complete("q") == "fine"
    assert [json.loads(x)["answer"] for x in path.read_text().splitlines()] == ["fine"]


def test_replay_tolerates_a_truncated_last_line(tmp_path, caplog):
    path = tmp_path / "c.jsonl"
    ReplayTeacher(path, Echo()).complete_many(["a", "b"])
    good = path.read_text()
    path.write_text(good + '{"key": "abc", "kind": "", "ans')  # crash mid-write
    rec = ReplayTeacher(path, Echo())
    assert "truncated last line" in caplog.text
    assert rec.complete("a") == json.dumps({"echo": "a"}) and rec.inner.calls == 0
    rec.complete("c")  # the partial line is cut before appending
    assert [json.loads(x)["prompt"] for x in path.read_text().splitlines()] == ["a", "b", "c"]
    path.write_text('{"bad\n' + good)
    with pytest.raises(ValueError, match=":1: not a teacher cache line"):
        ReplayTeacher(path)


def test_replay_appends_after_a_last_line_without_newline(tmp_path):
    path = tmp_path / "c.jsonl"
    ReplayTeacher(path, Echo()).complete("a")
    path.write_text(path.read_text().rstrip("\n"))
    ReplayTeacher(path, Echo()).complete("b")
    assert len(ReplayTeacher(path).answers) == 2


# ----------------------------------------------------------------------------------- make_teacher

def test_make_teacher_kinds(tmp_path, monkeypatch):
    cache = tmp_path / "run" / "teacher.jsonl"
    rule = Echo()
    t = make_teacher(TeacherConfig(kind="rule"), cache_path=cache, rule=rule)
    assert isinstance(t, ReplayTeacher) and t.inner is rule and t.path == cache
    assert isinstance(t, teachers.Teacher) and t.name == "echo"
    t.complete("x")
    with pytest.raises(ValueError, match="rule"):
        make_teacher(TeacherConfig(kind="rule"), cache_path=cache)

    monkeypatch.delenv("SKILLJAX_TEACHER_URL", raising=False)
    t = make_teacher(TeacherConfig(kind="http", base_url="http://h:1/v1", model="m", timeout_s=3.0,
                                   concurrency=7, max_new_tokens=99), cache_path=cache)
    assert isinstance(t.inner, HTTPTeacher)
    assert (t.inner.timeout_s, t.inner.concurrency, t.inner.max_tokens) == (3.0, 7, 99)
    with pytest.raises(ValueError, match="SKILLJAX_TEACHER_URL"):
        make_teacher(TeacherConfig(kind="http", model="m"), cache_path=cache)

    with pytest.raises(ValueError, match="evolution.teacher.checkpoint"):
        make_teacher(TeacherConfig(kind="local"), cache_path=cache)
    with pytest.raises(ValueError, match="replay_from"):
        make_teacher(TeacherConfig(kind="replay"), cache_path=cache)
    with pytest.raises(ValueError, match="not a file"):
        make_teacher(TeacherConfig(kind="replay", replay_from=str(tmp_path / "none")),
                     cache_path=cache)
    with pytest.raises(ValueError, match=r"'rule', 'http', 'local', 'policy', 'replay'"):
        make_teacher(TeacherConfig(kind="gpt"), cache_path=cache)

    new_cache = tmp_path / "replayed" / "teacher.jsonl"
    t = make_teacher(TeacherConfig(kind="replay", replay_from=str(cache)), cache_path=new_cache)
    assert isinstance(t, ReplayTeacher) and t.inner is None
    assert t.complete("x") == json.dumps({"echo": "x"}) and rule.calls == 1
    assert new_cache.read_text() == cache.read_text()


# ---------------------------------------------------------------------------------- local teacher

@pytest.fixture(scope="module")
def tiny():
    from skilljax import models
    from skilljax.tokenizer import Tokenizer
    tok = Tokenizer.train(["return the skill as json", '{"verdict": "keep"}'], vocab_size=300)
    _, model = models.load("tiny", None, "float32", seed=0, vocab_size=tok.vocab_size,
                           num_layers=1, embed_dim=32, mlp_dim=64, num_heads=2, num_kv_heads=1,
                           head_dim=16)
    return model, tok


@pytest.mark.slow  # in `bash run.sh test-slow`: ~12 s
def test_local_teacher_is_reproducible(tiny, tmp_path):
    prompts = ["review this skill", "induce a skill"]
    a = LocalTeacher(*tiny, max_new_tokens=8, temperature=1.0, seed=3)
    b = LocalTeacher(*tiny, max_new_tokens=8, temperature=1.0, seed=3)
    answers = [a.complete(p) for p in prompts]
    assert all(isinstance(x, str) for x in answers)
    assert [b.complete(p) for p in prompts] == answers and b.calls == 2
    greedy = LocalTeacher(*tiny, max_new_tokens=8)
    first = greedy.complete("review this skill")
    assert greedy.complete_many(["review this skill"] * 2) == [first, first]

    # The "policy" kind wraps the caller's model; the "local" kind loads an exported checkpoint.
    t = make_teacher(TeacherConfig(kind="policy", max_new_tokens=8),
                     cache_path=tmp_path / "p.jsonl", policy=tiny)
    assert isinstance(t.inner, LocalTeacher) and t.name == "policy"
    assert t.complete("review this skill") == first
    from skilljax.models import hf_io
    ckpt = hf_io.export(tiny[0], tmp_path / "ckpt")
    tiny[1].save(ckpt)
    t = make_teacher(TeacherConfig(kind="local", checkpoint=str(ckpt), max_new_tokens=8),
                     cache_path=tmp_path / "l.jsonl")
    assert isinstance(t.inner, LocalTeacher) and t.inner.name == "local:ckpt"
    assert t.complete("review this skill") == first


def test_local_teacher_too_long_prompt_is_a_teacher_error(tiny):
    t = LocalTeacher(*tiny, max_new_tokens=8)
    out = t.complete_many(["short", "word " * 1100])  # past the preset's 2048 positions
    assert isinstance(out[0], str) and isinstance(out[1], TeacherError)


def test_module_imports_no_jax():
    import subprocess
    import sys
    code = ("import sys, skilljax.skills.teachers; "
            "assert 'jax' not in sys.modules, 'teachers imported jax'")
    subprocess.run([sys.executable, "-c", code], check=True)
    assert teachers.KINDS == ("rule", "http", "local", "policy", "replay")
