#!/bin/sh
# sparkrig's GPU policy (sparkrig.operations.gpu_policy): run by sparkrig-gpu-policy.service at
# every boot (nvidia-smi's settings do not survive one) and by the deploy when its settings
# changed. Its settings come from /etc/sparkrig/gpu-policy.env (root's, written atomically by
# the deploy) through the unit's EnvironmentFile=. Every setting is tried; one that the
# driver refuses is reported with nvidia-smi's own words and fails the unit.
set -u
cd / || exit 1
umask 022
APPLIED_DIR=/run/sparkrig
APPLIED=$APPLIED_DIR/gpu-policy.applied
GPU_PERSISTENCE=${GPU_PERSISTENCE:-0}
GPU_CLOCK_MAX_MHZ=${GPU_CLOCK_MAX_MHZ:-}
GPU_POWER_LIMIT_W=${GPU_POWER_LIMIT_W:-}

say() { printf 'sparkrig-gpu-policy: %s\n' "$*"; }

whole() { # NAME VALUE: VALUE is empty (leave alone) or a whole number, else refuse
    case $2 in
        '') ;;
        *[!0-9]*) say "$1=$2 is not a whole number: nothing applied"; exit 2 ;;
    esac
}
whole GPU_CLOCK_MAX_MHZ "$GPU_CLOCK_MAX_MHZ"
whole GPU_POWER_LIMIT_W "$GPU_POWER_LIMIT_W"
case $GPU_PERSISTENCE in
    0|1) ;;
    *) say "GPU_PERSISTENCE=$GPU_PERSISTENCE is neither 0 nor 1: nothing applied"; exit 2 ;;
esac

# Root runs only a root-owned nvidia-smi that nobody else may change.
if ! smi=$(command -v nvidia-smi) || [ -z "$(find "$smi" -maxdepth 0 -user root ! -perm /022)" ]; then
    say "no root-owned nvidia-smi that only root may change on PATH (${smi:-none found}): nothing applied"
    exit 1
fi

# The driver may still be loading at boot: wait for nvidia-smi to answer, 60 s at most.
tries=0
until timeout 10 "$smi" -L >/dev/null 2>&1; do
    tries=$((tries + 1))
    if [ "$tries" -ge 30 ]; then
        say "nvidia-smi -L did not answer in 60 s (no GPU, or no driver loaded): nothing applied"
        exit 1
    fi
    sleep 2
done

mkdir -p "$APPLIED_DIR" || exit 1
record=$(mktemp "$APPLIED_DIR/.gpu-policy.XXXXXX") || exit 1
printf 'boot %s\n' "$(cat /proc/sys/kernel/random/boot_id)" >>"$record"
failed=0

apply() { # WHAT VALUE NVIDIA-SMI-ARGS...: run it, say and record what became of it
    what=$1
    value=$2
    shift 2
    if out=$(timeout 30 "$smi" "$@" 2>&1); then
        say "$what $value: applied (nvidia-smi $*)"
        printf '%s %s ok\n' "$what" "$value" >>"$record"
        return
    else
        rc=$?
    fi
    say "$what $value: NOT applied: nvidia-smi $* exited $rc: $(printf '%s' "$out" | tr '\n' ' ')"
    if [ "$rc" = 3 ]; then
        say "$what: nvidia-smi's exit 3 means this GPU does not support it: set it to None for this host's hardware profile"
    fi
    printf '%s %s failed %s\n' "$what" "$value" "$rc" >>"$record"
    failed=1
}

if [ "$GPU_PERSISTENCE" = 1 ]; then
    apply persistence 1 -pm 1
fi
if [ -n "$GPU_CLOCK_MAX_MHZ" ]; then
    apply clock_max_mhz "$GPU_CLOCK_MAX_MHZ" -lgc "0,$GPU_CLOCK_MAX_MHZ"
fi
if [ -n "$GPU_POWER_LIMIT_W" ]; then
    apply power_limit_w "$GPU_POWER_LIMIT_W" -pl "$GPU_POWER_LIMIT_W"
fi
mv -f "$record" "$APPLIED" || exit 1
exit "$failed"
