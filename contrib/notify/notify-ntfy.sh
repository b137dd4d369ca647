#!/bin/sh
# Post a gpusched job event to an ntfy topic (https://ntfy.sh or your own server).
#
#   [[notify]]
#   events = ["end"]
#   command = ["/usr/local/lib/gpusched/notify-ntfy.sh", "https://ntfy.sh/a-long-secret-topic"]
#
# The topic URL is a password: anyone who knows it reads your jobs' events. Job facts come
# from the GPUSCHED_* variables and the event on stdin; they are only ever quoted data here.
set -eu
url="$1"
case "$GPUSCHED_JOB_STATE" in
    succeeded) tags=white_check_mark priority=default ;;
    running | pending) tags=hourglass priority=default ;;
    *) tags=warning priority=high ;;
esac
title="gpusched job $GPUSCHED_JOB_ID $GPUSCHED_EVENT ($GPUSCHED_JOB_STATE) on $GPUSCHED_HOSTNAME"
# The name (free text: kept out of the headers) and the last lines of the log.
body=$(python3 -c 'import json, sys
event = json.load(sys.stdin)
job = event["job"]
print(job["name"] or " ".join(job["command"]))
print("\n".join(event.get("log_tail", [])))')
curl -fsS --max-time 20 -H "Title: $title" -H "Tags: $tags" -H "Priority: $priority" \
    --data-binary "$body" -- "$url" > /dev/null
