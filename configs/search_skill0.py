"""SKILL0 on Search-QA with the released launch settings (`scripts/train_search_skillzero_3b.sh`).

    python -m skilljax.train --config configs/search_skill0.py:checkpoint=/models/Qwen2.5-3B-Instruct \
        --workdir /runs/search_3b --config.mesh=fsdp=4
    python -m skilljax.train --config configs/search_skill0.py:runlocal --workdir /tmp/search_local

Released settings (`shared/reference/skill0_released_code.md` §7.2): Qwen2.5(-VL)-3B/7B-Instruct,
lr 1e-6, G = 8, 128 questions per step, budgets [5, 3, 0] over 180 steps with validation every 10
(the set chosen at a validation applies to the following steps), temperature 1.0 in training and
0.4 (sampled) in validation, exact-match reward 1 and invalid-action penalty 0.01, token-mean
loss, no KL, entropy 0.001, AdamW weight decay 0.01, one optimiser step per 512 step samples
(`ppo_mini_batch_size`), old logprobs recomputed by the learner, validation questions drawn from
the test questions (as the released `val_1000`, so every question type's skill file is scored),
at most 4 turns with the last 4 turns in the prompt, prompts ≤ 4096 and responses ≤ 512 tokens,
BM25 top-3 retrieval. Two paths:
- text (the default): the history as text; use the text-only Instruct checkpoints.
- `visual` (the released SKILL0 default): the history as an image (560 px wide, DejaVu Sans Mono
  12, `<search>` blue / `<information>` red) for a Qwen2.5-VL-3B/7B-Instruct checkpoint, the
  agent's `<compression>` factor for each next image (1.0 on answers) and the reward
  0.01 · ln(cf) on successful trajectories every 8th step (§5, §7.2):

      python -m skilljax.train --config configs/search_skill0.py:checkpoint=/models/Qwen2.5-VL-3B-Instruct,visual \
          --workdir /runs/search_vl_3b --config.mesh=fsdp=4

Retrieval at paper scale (the released setup, as Search-R1's: one retrieval server, E5 over
wiki-18, top 3): build the index once from your corpus, then pass `index=`; the trainer starts one
retrieval service over it (envs/retrieval_service.py) that all env workers query, and restarts it
if it dies. Or run the service yourself (one per machine) and pass `service_url=`.

    python -m skilljax.envs.search_index --corpus /data/wiki-18.jsonl --kind dense \
        --model /models/e5-base-v2 --query-prefix "query: " --passage-prefix "passage: " \
        --faiss flat --out /data/wiki18_e5          # or --kind bm25 (no model)
    python -m skilljax.train --config configs/search_skill0.py:checkpoint=...,data_dir=/data/nq_hotpotqa,index=/data/wiki18_e5 ...

Arguments: `checkpoint` (an HF directory with the model and its tokenizer.json; required unless
`runlocal`), `seed`, `variant` (the paper's ablations, VARIANTS), `data_dir` (your Search-R1-style
data; default: the generated offline corpus), `index` (an index directory: retrieval through a
service the trainer runs), `service_url` (a service you run), `runlocal` (tiny random policy, a
minute on a CPU), `visual`. Without `index` or `service_url`, each env worker runs BM25 in-process (right
for the generated corpus and small ones).
Hardware: the released runs used 4 GPUs (80 GB); on TPU use an fsdp mesh over the slice.
"""

from skilljax.config import apply_variant, base_config, parse_arg, skill0_variants

VARIANTS = skill0_variants(5)  # four question-type files + general skills


def get_config(arg=None):
    arg = parse_arg(arg, seed=0, checkpoint="", data_dir="", index="", service_url="",
                    runlocal=False, variant="curriculum", visual=False)
    if not arg.checkpoint and not arg.runlocal:
        raise ValueError("configs/search_skill0.py needs checkpoint=<HF directory of "
                         "Qwen2.5-3B/7B-Instruct> (weights are never downloaded), or runlocal.")
    c = base_config()
    c.seed = arg.seed
    c.env.update(name="search_qa", workers=8, timeout_s=60.0,
                 kwargs=_retrieval(arg),
                 task_options={"data_dir": arg.data_dir} if arg.data_dir else {},
                 train_tasks=20000)
    c.tokenizer.path = c.model.checkpoint = arg.checkpoint
    c.prompt.update(history_length=4, show_admissible=False, require_think=False,
                    format="search_answer")
    c.rl.update(tasks_per_step=128, max_turns=4, mini_batch_size=512, micro_batch_size=16,
                invalid_penalty=0.01)
    c.skills.update(budgets=(5, 3, 0),
                    # The released val_1000 is drawn from the test questions (§3.5): Search-R1's
                    # training questions have no PopQA rows, so the attribute file would go unscored.
                    val_tasks_per_type=128, val_split="test")
    c.eval.tasks = 512
    apply_variant(c, VARIANTS, arg.variant)
    c.visual.enabled = arg.visual  # the env's released renderer setting (560 px, font 12)

    if arg.runlocal:  # the same pipeline with a tiny random policy and its own small tokenizer
        c.env.workers, c.env.train_tasks = 2, 16
        c.tokenizer.update(path="", vocab_size=600, corpus_tasks=12)
        c.model.update(checkpoint="tiny", dtype="float32")
        c.model.overrides.update(num_layers=1, embed_dim=64, mlp_dim=128, num_heads=2,
                                 num_kv_heads=2, head_dim=32)
        c.prompt.max_prompt_tokens = None
        c.sft.update(steps=4, tasks=8, batch_size=8, learning_rate=1e-3)
        c.rl.update(steps=2, tasks_per_step=2, group_size=2, max_new_tokens=12,
                    learning_rate=1e-4, mini_batch_size=4, micro_batch_size=None,
                    batch_multiple=4)
        c.skills.update(validate_every=1, val_tasks_per_type=1)
        c.eval.tasks = 4
        c.checkpoint.every = 1
        c.metrics.tensorboard = False
        if arg.visual:  # the "tiny" decoder with a 2-block tower; small images
            c.model.checkpoint = "tiny_vl"
            c.model.overrides.update(embed_dim=None, mlp_dim=None, num_heads=None,
                                     head_dim=None, num_layers=1)
            c.visual.max_pixels = 28 * 28 * 64
    return c


def _retrieval(arg) -> dict:
    """search_qa's retrieval kwargs: BM25 in each worker, or a retrieval service (one process,
    started by the trainer over `index`, or the user's at `service_url`)."""
    if arg.index and arg.service_url:
        raise ValueError("Give index= (the trainer runs the service) or service_url= (you run "
                         "it), not both.")
    if arg.service_url:
        return {"retriever": "service", "service_url": arg.service_url, "top_k": 3}
    if arg.index:
        return {"retriever": "service", "service_index": arg.index, "top_k": 3}
    return {"retriever": "bm25", "top_k": 3}


def sweep(add, arg=None):
    for variant in VARIANTS:
        add(arg=f"variant={variant}")
