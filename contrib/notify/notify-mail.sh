#!/bin/sh
# Mail a gpusched job event through the local sendmail (Postfix, Exim, msmtp-mta, ...).
#
#   [[notify]]
#   events = ["fail", "timeout", "oom", "lost"]
#   command = ["/usr/local/lib/gpusched/notify-mail.sh", "alice@example.org"]
#
# The recipient is this script's argument, never read from the message (no `sendmail -t`),
# and the job's name goes in the body only: a name cannot add a header or a recipient.
set -eu
to="$1"
{
    printf 'To: %s\n' "$to"
    printf 'Subject: gpusched job %s %s on %s\n' \
        "$GPUSCHED_JOB_ID" "$GPUSCHED_JOB_STATE" "$GPUSCHED_HOSTNAME"
    printf 'Content-Type: text/plain; charset=utf-8\n\n'
    python3 -c 'import json, sys
event = json.load(sys.stdin)
job = event["job"]
print("job %(id)s (%(name)s) of %(user)s: %(state)s, exit %(exit_code)s" % job)
print("command:", " ".join(job["command"]))
print("GPUs:", ",".join(map(str, job["gpus"])) or "none")
print("log:", job["log"])
print()
print("\n".join(event.get("log_tail", [])))'
} | sendmail -oi -- "$to"
