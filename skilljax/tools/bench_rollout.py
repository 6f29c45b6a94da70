"""Rollout benchmark: env steps/s of the full host loop (prompts, sampler, parsing, env pool).

    python -m skilljax.tools.bench_rollout [--env chores] [--model tiny] [--tasks 8] [--group 8]
        [--turns 8] [--max-new-tokens 32] [--workers 2] [--repeats 3] [--env-overlap]

The policy is a random-weight model of the given preset with a BPE tokenizer trained on the env's
own text (as the CPU-scale experiment uses), so every response is sampled to its full length: an
upper bound on the sampler's share. The first rollout compiles and is not counted. Also printed:
the expert playing through the same loop (no sampler), i.e. the host loop + env pool alone, and,
with `--env-overlap`, the policy again with `rl.env_overlap` (half the episodes step their envs
while the other half samples) and its speed-up over the plain loop in the same run. The last
stdout line is JSON.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import statistics


def env_texts(env_name: str, num: int = 40) -> list[str]:
    """Observations, goals and expert responses of `num` expert episodes (tokenizer corpus)."""
    from skilljax.envs import base
    cls = base.env_class(env_name)
    env, texts = cls(), []
    for task in cls.make_tasks("train", num, seed=0):
        obs, info = env.reset(task)
        texts += [obs, info.get("goal", ""), " ".join(info.get("admissible_actions") or [])]
        while True:
            action = env.expert_action()
            r = env.step(action)
            texts += [f"<think></think><action>{action}</action>", r.observation]
            if r.done:
                break
    return texts


def main(argv=None):
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--env", default="chores")
    p.add_argument("--model", default="tiny")
    p.add_argument("--tasks", type=int, default=8)
    p.add_argument("--group", type=int, default=8)
    p.add_argument("--turns", type=int, default=8)
    p.add_argument("--max-new-tokens", type=int, default=32)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--env-overlap", action="store_true",
                   help="also time the loop with env steps overlapping sampling (rl.env_overlap)")
    args = p.parse_args(argv)

    import jax

    from skilljax import models
    from skilljax.envs import base
    from skilljax.envs.pool import EnvPool
    from skilljax.rl.rollout import PromptConfig, RolloutConfig, rollout
    from skilljax.sampling import Sampler, SamplingParams
    from skilljax.tokenizer import Tokenizer

    tok = Tokenizer.train(env_texts(args.env), vocab_size=512)
    _, model = models.load(args.model, vocab_size=tok.vocab_size, seed=0)
    sampler = Sampler(model, pad_id=tok.pad_id)
    tasks = base.env_class(args.env).make_tasks("train", args.tasks, seed=0)
    cfg = RolloutConfig(group_size=args.group, max_turns=args.turns,
                        sampling=SamplingParams(max_new_tokens=args.max_new_tokens, temperature=1.0,
                                                stop_token_ids=(-2,)),  # never stops: full length
                        prompt=PromptConfig(history_length=2))
    out = {"env": args.env, "model": args.model, "episodes": args.tasks * args.group}
    with EnvPool(args.env, num_workers=args.workers) as pool:
        for mode in ("policy", "expert") + (("env_overlap",) if args.env_overlap else ()):
            runs = []
            for r in range(args.repeats + (mode != "expert")):
                res = rollout(sampler, tok, pool, tasks,
                              dataclasses.replace(cfg, env_overlap=mode == "env_overlap"),
                              jax.random.key(r), expert=mode == "expert")
                runs.append(res.stats)
            if mode != "expert":
                runs = runs[1:]  # the first run compiles (the halves: their own batch shapes)
            best = max(runs, key=lambda s: s["steps_per_s"])
            out[mode] = dict(steps_per_s=statistics.median(s["steps_per_s"] for s in runs),
                             env_share=best["env_s"] / best["wall_s"],
                             sampler_share=best["sample_s"] / best["wall_s"],
                             prompt_tokens=sum(best[f"tokens_{k}"] for k in
                                               ("skill", "history", "observation", "template")))
            print(f"{mode}: {out[mode]['steps_per_s']:.1f} env steps/s "
                  f"(env {out[mode]['env_share']:.0%}, sampler {out[mode]['sampler_share']:.0%} of "
                  f"wall; {out[mode]['prompt_tokens']:.0f} prompt tokens/step)")
    if args.env_overlap:
        out["env_overlap_speedup"] = out["env_overlap"]["steps_per_s"] / out["policy"]["steps_per_s"]
        print(f"env overlap: {out['env_overlap_speedup']:.2f}x the plain loop's env steps/s")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
