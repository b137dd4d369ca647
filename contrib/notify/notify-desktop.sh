#!/bin/sh
# A desktop notification from a daemon that runs as you (user mode, `gpusched daemon
# start`): the daemon's environment may lack your session bus, so name it.
#
#   [[notify]]
#   events = ["end"]
#   command = ["/home/alice/.local/bin/notify-desktop.sh"]
#
# Jobs you wait for in a terminal need no hook: `gpusched wait --notify ID`.
set -eu
export DBUS_SESSION_BUS_ADDRESS="${DBUS_SESSION_BUS_ADDRESS:-unix:path=/run/user/$(id -u)/bus}"
exec notify-send -a gpusched -- \
    "gpusched job $GPUSCHED_JOB_ID $GPUSCHED_JOB_STATE" "$GPUSCHED_JOB_NAME"
