# shellcheck shell=bash
# What the engine scripts (pg.sh, qdrant.sh, pgbouncer.sh, citus.sh) share; each sources it
# after setting REPO_ROOT, and sets before using these:
#   PORT, PORT_VARIABLE, PORT_LAST  the port, the variable that sets it, its largest value
#   BASE                            the directory whose .lock serialises start and stop
#   LOG                             the server log that `fail_with_log` shows the end of
# Messages go to stderr, named by the script (stdout carries only the export lines).

SCRIPT_NAME="${0##*/}"
readonly SCRIPT_NAME

log() { printf '%s: %s\n' "$SCRIPT_NAME" "$*" >&2; }

die() {
    log "error: $*"
    exit 1
}

is_root() { [[ $(id -u) -eq 0 ]]; }

# checkout_port FIRST STEP: FIRST plus STEP times a number (0-999) derived from the checkout's
# path, so two checkouts on one machine get ports of their own and a repeated run in one finds
# its server again.
checkout_port() {
    local sum
    sum=$(printf '%s' "$REPO_ROOT" | cksum | cut -d' ' -f1)
    echo $(($1 + $2 * (sum % 1000)))
}

check_port() {
    if ! [[ $PORT =~ ^[1-9][0-9]{0,4}$ ]] || ((PORT > PORT_LAST)); then
        die "$PORT_VARIABLE must be a port number up to $PORT_LAST, got '$PORT'"
    fi
}

# lock [SECONDS]: hold $BASE/.lock (fd 9) until the script exits, waiting up to SECONDS (120)
# for another start or stop of the same directory. A server started while it is held must not
# inherit fd 9 (it would hold the lock for as long as it runs).
lock() {
    exec 9>"$BASE/.lock"
    flock -w "${1:-120}" 9 || die "timed out waiting for another $SCRIPT_NAME on $BASE"
}

fail_with_log() {
    log "error: $1; last lines of $LOG:"
    tail -n 30 -- "$LOG" >&2 || true
    exit 1
}
