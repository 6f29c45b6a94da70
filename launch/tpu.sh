#!/usr/bin/env bash
# Train on a Cloud TPU VM or pod slice: one process per TPU host, all running the same command.
#
# From your workstation (installs the project on every host, then starts training on all of them):
#   TPU_NAME=my-v5e-32 ZONE=us-west4-a bash launch/tpu.sh setup
#   TPU_NAME=my-v5e-32 ZONE=us-west4-a bash launch/tpu.sh run configs/alfworld_skill0.py \
#       /mnt/shared/runs/alfworld_7b --config.mesh=fsdp=32
#
# On a single-host TPU VM (v4-8, v5e-8, ...) you can also run directly on the VM:
#   bash launch/tpu.sh local configs/alfworld_skill0.py /tmp/run --config.mesh=fsdp=8
#
# Every host runs the same host loop with the same seeds (its own env workers); JAX discovers the
# slice itself (`SKILLJAX_DISTRIBUTED=auto` → jax.distributed.initialize()). The workdir must be a
# path every host sees (Filestore/NFS or a gcsfuse mount of a bucket): process 0 writes metrics,
# summary and plots; all hosts write the orbax checkpoints together.
set -euo pipefail
cd "$(dirname "$0")/.."
MODE=${1:?usage: launch/tpu.sh setup | run CONFIG WORKDIR [overrides] | local CONFIG WORKDIR [overrides]}
shift
REPO_URL=${REPO_URL:-$(git config --get remote.origin.url || echo "")}
REMOTE_DIR=${REMOTE_DIR:-skilljax}

ssh_all() {  # run a command on every host of the slice
  gcloud compute tpus tpu-vm ssh "${TPU_NAME:?set TPU_NAME}" --zone "${ZONE:?set ZONE}" \
    --worker=all --command "$1"
}

case "$MODE" in
  setup)
    [ -n "$REPO_URL" ] || { echo "set REPO_URL to a git URL the TPU hosts can clone" >&2; exit 2; }
    ssh_all "set -e; [ -d $REMOTE_DIR ] || git clone $REPO_URL $REMOTE_DIR; cd $REMOTE_DIR && git pull -q \
      && python3 -m venv .venv && .venv/bin/pip install -q -c constraints.txt -e '.[envs,tpu]' \
         -f https://storage.googleapis.com/jax-releases/libtpu_releases.html"
    ;;
  run)
    CONFIG=${1:?CONFIG}; WORKDIR=${2:?WORKDIR}; shift 2
    ARGS=$(printf '%q ' --config "$CONFIG" --workdir "$WORKDIR" "$@")  # quoted for the remote shell
    ssh_all "cd $REMOTE_DIR && SKILLJAX_DISTRIBUTED=auto nohup .venv/bin/python -m skilljax.train \
      $ARGS > train_\$(hostname).log 2>&1 &"
    echo "started on every host of $TPU_NAME; logs: ~/$REMOTE_DIR/train_<host>.log on each host"
    ;;
  local)
    CONFIG=${1:?CONFIG}; WORKDIR=${2:?WORKDIR}; shift 2
    exec "${PYTHON:-python}" -m skilljax.train --config "$CONFIG" --workdir "$WORKDIR" "$@"
    ;;
  *)
    echo "unknown mode $MODE: setup | run | local" >&2; exit 2 ;;
esac
