#!/bin/sh
# sparkrig lab STAND-IN for nvidia-smi (lab/dgxos.py): the lab has no GPU. lab/dgxos.py puts
# this GPU's figures above (CAP, NAME, MAX_SM, POWER_*), which are the stand-in's, not read
# from a real card. It answers the queries sparkrig makes (--query-gpu with the fields sparkrig
# reads, -L) consistently with the settings it was given, and takes the settings sparkrig's GPU
# policy makes (-pm, -lgc, -rgc, -pl), as root only, as nvidia-smi does. Those settings live
# under /run, so a reboot loses them as a real GPU does; every setting call is also recorded,
# with the boot it came in, in a log that survives reboots, for the lab tests to read.
# Everything else fails as nvidia-smi does without a driver (exit 9).
STATE=/run/sparkrig-lab-nvidia-smi
LOG_DIR=/var/lib/sparkrig-lab-nvidia-smi
BUS=00000000:01:00.0

setting() { # FILE DEFAULT: a setting as recorded this boot
    if [ -f "$STATE/$1" ]; then cat "$STATE/$1"; else printf '%s\n' "$2"; fi
}

record() { # a setting call: who asked, in which boot, what
    mkdir -p "$STATE" "$LOG_DIR"
    printf '%s uid=%s %s\n' "$(cat /proc/sys/kernel/random/boot_id)" "$(id -u)" "$*" >>"$LOG_DIR/calls"
}

root_only() {
    if [ "$(id -u)" != 0 ]; then
        echo "Insufficient Permissions" >&2
        exit 4
    fi
}

field() { # one field of --query-gpu
    cap=$(setting lgc "")
    case $1 in
        index) echo 0 ;;
        name) echo "$NAME" ;;
        compute_cap) echo "$CAP" ;;
        persistence_mode) if [ "$(setting pm 0)" = 1 ]; then echo Enabled; else echo Disabled; fi ;;
        clocks.sm|clocks.current.sm) echo "${cap:-$MAX_SM}" ;;
        clocks.max.sm|clocks.max.sm_clock) echo "$MAX_SM" ;;
        power.draw) echo "${POWER_DRAW}" ;;
        power.limit) setting pl "$POWER_DEFAULT" ;;
        power.min_limit) echo "$POWER_MIN" ;;
        power.max_limit) echo "$POWER_MAX" ;;
        power.default_limit) echo "$POWER_DEFAULT" ;;
        temperature.gpu) echo "$TEMPERATURE" ;;
        clocks_event_reasons.active)
            # OLD_DRIVER=1: a driver before 535, which knows only the older name.
            if [ "${OLD_DRIVER:-0}" = 1 ]; then echo "Field \"$1\" is not a valid field to query." >&2; exit 2; fi
            echo 0x0000000000000000 ;;
        clocks_throttle_reasons.active) echo 0x0000000000000000 ;;
        *) echo "sparkrig lab stand-in nvidia-smi: no GPU in the lab" >&2; exit 9 ;;
    esac
}

query() { # FIELDS (comma-separated): one csv line
    line=
    old_ifs=$IFS
    IFS=,
    for f in $1; do
        IFS=$old_ifs
        value=$(field "$f") || exit
        line="${line:+$line, }$value"
    done
    IFS=$old_ifs
    echo "$line"
}

case "$1" in
    --query-gpu=*)
        case "$2" in
            --format=csv,noheader|--format=csv,noheader,nounits) query "${1#--query-gpu=}"; exit 0 ;;
        esac ;;
    -L)
        echo "GPU 0: $NAME (UUID: GPU-sparkrig-lab-stand-in)"; exit 0 ;;
    -pm)
        root_only; record "$@"
        case "$2" in
            0|1) printf '%s\n' "$2" >"$STATE/pm"
                 if [ "$2" = 1 ]; then echo "Enabled persistence mode for GPU $BUS."; else echo "Disabled persistence mode for GPU $BUS."; fi
                 echo "All done."; exit 0 ;;
        esac ;;
    -lgc)
        root_only; record "$@"
        high=${2#*,}
        case "$high" in
            ''|*[!0-9]*) ;;
            *) if [ "$high" -gt "$MAX_SM" ]; then echo "Invalid clock value(s): at most $MAX_SM MHz." >&2; exit 2; fi
               printf '%s\n' "$high" >"$STATE/lgc"
               echo "GPU clocks set to \"(gpuClkMin ${2%%,*}, gpuClkMax $high)\" for GPU $BUS"; echo "All done."; exit 0 ;;
        esac ;;
    -rgc)
        root_only; record "$@"; rm -f "$STATE/lgc"; echo "All done."; exit 0 ;;
    -pl)
        root_only; record "$@"
        if [ "$POWER_MAX" = "[N/A]" ]; then
            echo "Changing power management limit is not supported for GPU: $BUS." >&2; exit 3
        fi
        case "$2" in
            ''|*[!0-9]*) ;;
            *) if [ "$2" -lt "${POWER_MIN%.*}" ] || [ "$2" -gt "${POWER_MAX%.*}" ]; then
                   echo "Provided power limit $2.00 W is not a valid power limit which should be between $POWER_MIN W and $POWER_MAX W for GPU $BUS" >&2; exit 2
               fi
               printf '%s.00\n' "$2" >"$STATE/pl"
               echo "Power limit for GPU $BUS was set to $2.00 W from $POWER_DEFAULT W."; echo "All done."; exit 0 ;;
        esac ;;
esac
echo "sparkrig lab stand-in nvidia-smi: no GPU in the lab" >&2
exit 9
