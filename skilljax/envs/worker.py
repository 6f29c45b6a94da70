"""The env worker process: `python -m skilljax.envs.worker ENV_NAME ENV_KWARGS_JSON`.

Speaks JSON lines on its own stdout (the host's pipe); anything the environment prints goes to
stderr instead, so a chatty game cannot corrupt the protocol. One request line carries a command and
a list of items; the worker answers with one line per item as soon as that item is done (so the host
can time out a single hung item), then a final `{"done": true}` line.

Commands: `reset` (items: [episode, task, seed]), `step` ([episode, action]), `expert` ([episode]),
`drop` ([episode]); `shutdown`. An exception inside the environment fails that item only (the
answer carries `error`); the worker keeps serving.
"""

from __future__ import annotations

import json
import os
import sys
import traceback


def _serve(env_name: str, env_kwargs: dict, out) -> None:
    from skilljax.envs import base

    cls = base.env_class(env_name)
    envs: dict[int, base.Env] = {}

    def answer(obj):
        out.write(json.dumps(obj) + "\n")
        out.flush()

    def run(cmd, item):
        eid = item[0]
        if cmd == "reset":
            env = envs.get(eid)
            if env is None:
                env = envs[eid] = cls(**env_kwargs)
            obs, info = env.reset(base.Task.from_json(item[1]), int(item[2]))
            return {"observation": obs, "info": info}
        if cmd == "step":
            return {"result": envs[eid].step(item[1]).to_json()}
        if cmd == "expert":
            return {"action": envs[eid].expert_action()}
        if cmd == "drop":
            env = envs.pop(eid, None)
            if env is not None:
                env.close()
            return {}
        raise ValueError(f"unknown command {cmd!r}")

    answer({"ready": True, "pid": os.getpid()})
    for line in sys.stdin:
        request = json.loads(line)
        cmd = request["cmd"]
        if cmd == "shutdown":
            break
        if cmd == "step":  # the env's batched preparation (e.g. one retrieval request)
            try:
                cls.before_step([(envs[i[0]], i[1]) for i in request["items"] if i[0] in envs])
            except Exception:  # noqa: BLE001  (each step then meets the problem itself)
                traceback.print_exc()
        for item in request["items"]:
            try:
                reply = run(cmd, item)
            except Exception as e:  # the env's fault: fail this item, keep the worker
                reply = {"error": f"{type(e).__name__}: {e}",
                         "traceback": traceback.format_exc(limit=8)}
            reply["episode"] = item[0]
            answer(reply)
        answer({"done": True})
    for env in envs.values():
        env.close()


def main() -> None:
    env_name, env_kwargs = sys.argv[1], json.loads(sys.argv[2])
    # Keep the protocol on a private copy of fd 1; route fd 1 (Python and C prints) to stderr.
    out = os.fdopen(os.dup(1), "w")
    os.dup2(2, 1)
    sys.stdout = sys.stderr
    _serve(env_name, env_kwargs, out)


if __name__ == "__main__":
    main()
