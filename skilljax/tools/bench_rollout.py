"""Rollout benchmark: env steps/s of the full host loop (prompts, sampler, parsing, env pool).

    python -m skilljax.tools.bench_rollout [--env chores] [--model tiny] [--tasks 8] [--group 8]
        [--turns 8] [--max-new-tokens 32] [--workers 2] [--repeats 3]

The policy is a random-weight model of the given preset with a BPE tokenizer trained on the env's
own text (as the CPU-scale experiment uses), so every response is sampled to its full length: an
upper bound on the sampler's share. The first rollout compiles and is not counted. Also printed:
the expert playing through the same loop (no sampler), i.e. the host loop + env pool alone. The last
stdout line is JSON.
"""

from __future__ import annotations

import argparse
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
        for mode in ("policy", "expert"):
            runs = []
            for r in range(args.repeats + (mode == "policy")):
                res = rollout(sampler, tok, pool, tasks, cfg, jax.random.key(r),
                              expert=mode == "expert")
                runs.append(res.stats)
            if mode == "policy":
                runs = runs[1:]  # the first run compiles
            best = max(runs, key=lambda s: s["steps_per_s"])
            out[mode] = dict(steps_per_s=statistics.median(s["steps_per_s"] for s in runs),
                             env_share=best["env_s"] / best["wall_s"],
                             sampler_share=best["sample_s"] / best["wall_s"],
                             prompt_tokens=sum(best[f"tokens_{k}"] for k in
                                               ("skill", "history", "observation", "template")))
            print(f"{mode}: {out[mode]['steps_per_s']:.1f} env steps/s "
                  f"(env {out[mode]['env_share']:.0%}, sampler {out[mode]['sampler_share']:.0%} of "
                  f"wall; {out[mode]['prompt_tokens']:.0f} prompt tokens/step)")
    print(json.dumps(out))


if __name__ == "__main__":
    main()
