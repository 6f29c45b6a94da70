#!/usr/bin/env bash
# Train on CUDA GPUs.
#
# One node, all its GPUs in one process (the usual case):
#   bash launch/gpu.sh configs/alfworld_skill0.py /data/runs/alfworld_3b --config.mesh=fsdp=8
#
# Several nodes, one process per node (run the same command on every node, with its rank):
#   NNODES=2 NODE_RANK=0 MASTER_ADDR=10.0.0.1 bash launch/gpu.sh CONFIG WORKDIR --config.mesh=fsdp=16
#   NNODES=2 NODE_RANK=1 MASTER_ADDR=10.0.0.1 bash launch/gpu.sh CONFIG WORKDIR --config.mesh=fsdp=16
# WORKDIR must be on a filesystem every node sees (NFS, Lustre, a gcsfuse mount): process 0
# writes metrics, summary and plots, and all processes write the orbax checkpoints together.
#
# Needs a CUDA build of JAX in the environment, e.g. (the tested versions, with the CUDA plugin)
#   pip install -c constraints.txt -e ".[cuda12]"
# Extra arguments after WORKDIR are config overrides (--config.a.b=value).
set -euo pipefail
cd "$(dirname "$0")/.."
CONFIG=${1:?usage: launch/gpu.sh CONFIG[:arg] WORKDIR [--config.a.b=v ...]}
WORKDIR=${2:?usage: launch/gpu.sh CONFIG[:arg] WORKDIR [--config.a.b=v ...]}
shift 2
PY=${PYTHON:-python}

# Env workers are plain CPU processes, so the training process may take most of each GPU:
# JAX preallocates 75 % by default; 90 % leaves more room for the sampler's KV cache.
export XLA_PYTHON_CLIENT_MEM_FRACTION=${XLA_PYTHON_CLIENT_MEM_FRACTION:-0.9}

if [ "${NNODES:-1}" -gt 1 ]; then
  export SKILLJAX_COORDINATOR="${MASTER_ADDR:?set MASTER_ADDR to the address of node 0}:${MASTER_PORT:-12355}"
  export SKILLJAX_NUM_PROCESSES="$NNODES"
  export SKILLJAX_PROCESS_ID="${NODE_RANK:?set NODE_RANK (0..NNODES-1)}"
fi
exec "$PY" -m skilljax.train --config "$CONFIG" --workdir "$WORKDIR" "$@"
