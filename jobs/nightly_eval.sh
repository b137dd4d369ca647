#!/bin/sh
# Nightly evaluation under gpusched, for cron: waits for the job, exits with its status.
#
#   30 2 * * *  cd /srv/project && jobs/nightly_eval.sh >> nightly_eval.log 2>&1
#
# `submit --wait` queues the job like any other (it never lands on a GPU someone else is
# using), blocks until it ends, and exits with the job's status, so cron mails you when
# the evaluation fails. Settings come from the environment (cron's is small: set PATH).
set -u
cd "$(dirname "$0")/.."

GPUSCHED="${GPUSCHED:-gpusched}"
PYTHON="${PYTHON:-python3}"
CHECKPOINT_DIR="${CHECKPOINT_DIR:-checkpoints/train_ddp}"
MAX_LOSS="${MAX_LOSS:-0.05}"

echo "$(date '+%Y-%m-%d %H:%M:%S') nightly eval of $CHECKPOINT_DIR: submitting"
# submit --wait prints the job id at once, then exits with the job's status when it ends.
job_id=$("$GPUSCHED" submit --wait --gpus "${EVAL_GPUS:-1}" --name "nightly-eval-$(date +%Y%m%d)" \
    -- "$PYTHON" jobs/train_ddp.py --eval-only --checkpoint-dir "$CHECKPOINT_DIR" \
       --max-loss "$MAX_LOSS")
status=$?
if [ -n "$job_id" ]; then  # the job's own output, for the mail cron sends
    "$GPUSCHED" logs "$job_id"
    "$GPUSCHED" logs --stderr "$job_id" >&2
fi
echo "$(date '+%Y-%m-%d %H:%M:%S') nightly eval (job ${job_id:-none}) ended with status $status"
exit "$status"
