# shellcheck shell=bash
# Helpers shared by the benchmark scripts (sourced, not run): logging,
# child processes that a signal can interrupt, ports, the CPU time of a
# process and the A/B scripts' one-LUN config. Callers set CLK_TCK and WORK
# (the scratch directory for logs).

log() { printf '[bench] %s\n' "$*" >&2; }
die() { log "error: $*"; exit 1; }

# Install Debian packages (with sudo unless root), quietly; progress on stderr.
apt_install() {
    local sudo=""
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    log "installing: $*"
    DEBIAN_FRONTEND=noninteractive $sudo apt-get update -qq
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends "$@" >&2
}

CHILD=""
CHILDREN=""

# Ask politely, then insist: tgtd ignores SIGTERM while it has targets.
stop_process() {
    local pid=$1
    kill -TERM "$pid" 2>/dev/null || return 0
    for _ in $(seq 1 20); do
        kill -0 "$pid" 2>/dev/null || { wait "$pid" 2>/dev/null; return 0; }
        sleep 0.1
    done
    kill -KILL "$pid" 2>/dev/null
    wait "$pid" 2>/dev/null
    return 0
}

# Run a command as a waited-for background child, so that a signal to the
# script runs its cleanup trap at once instead of after the command ends.
run_child() {
    local rc=0
    "$@" &
    CHILD=$!
    wait "$CHILD" || rc=$?
    CHILD=""
    return "$rc"
}

# End the child of run_child and the ones listed in CHILDREN, if any.
kill_children() {
    local pid
    for pid in $CHILD $CHILDREN; do
        kill -TERM "$pid" 2>/dev/null
        wait "$pid" 2>/dev/null
    done
    CHILD=""
    CHILDREN=""
}

port_in_use() { (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null; }

# Wait until 127.0.0.1:PORT accepts, failing early if PID has exited.
wait_for_port() {
    local port=$1 pid=$2 name=$3
    for _ in $(seq 1 300); do
        port_in_use "$port" && return 0
        kill -0 "$pid" 2>/dev/null || die "$name exited before listening on port $port (log: $WORK/$name.log)"
        sleep 0.1
    done
    die "$name did not listen on port $port within 30 s"
}

# utime+stime of a whole process (every thread), in clock ticks. The command
# name in field 2 may hold spaces, so fields are counted after its ')'.
cpu_ticks() {
    sed 's/.*) //' "/proc/$1/stat" | awk '{print $12 + $13}'
}

# Milliseconds of CPU (user and system) used so far by this shell's waited-for
# children and theirs, into the variable named $1. Not a function to call as
# $(...): that would fork a shell of its own, which has no children. `times`
# prints them on its second line as "0m1.234s 0m0.567s".
children_cpu_ms() {
    times >"$WORK/times"
    printf -v "$1" '%s' "$(sed -n 2p "$WORK/times" | awk '{
        ms = 0
        for (i = 1; i <= 2; i++) { split($i, t, "m"); ms += (t[1] * 60 + t[2]) * 1000 }
        printf "%d", ms }')"
}

# Busy and all jiffies of the whole machine so far (every CPU), from the
# first line of /proc/stat: busy is all but idle and iowait.
machine_ticks() { awk '/^cpu / { t = 0; for (i = 2; i <= NF; i++) t += $i; print t - $5 - $6, t; exit }' /proc/stat; }

# µs of CPU per I/O from a tick delta and an I/O count.
us_per_io() {
    awk -v t="$1" -v hz="$CLK_TCK" -v n="$2" 'BEGIN { if (n > 0) printf "%.1f", t * 1e6 / hz / n; else print "n/a" }'
}

# Voluntary and involuntary context switches of every live thread of a
# process (threads that ended since are not counted).
ctx_switches() {
    cat "/proc/$1"/task/*/status 2>/dev/null | awk '/ctxt_switches/ { n += $2 } END { print n + 0 }'
}

# Results are RESULTS+=("workload|column|iops|us_per_io") entries.
# The best (highest IOPS) result of workload $1 in column $2 (the system or
# the LUN), as "iops|us_per_io", or nothing if every run failed.
best_of() {
    local r w s iops us best="" best_iops=-1
    for r in "${RESULTS[@]}"; do
        IFS='|' read -r w s iops us <<<"$r"
        if [ "$w" != "$1" ] || [ "$s" != "$2" ]; then continue; fi
        [[ "$iops" =~ ^[0-9]+$ ]] || continue
        if [ "$iops" -gt "$best_iops" ]; then best_iops=$iops; best="$iops|$us"; fi
    done
    echo "$best"
}

# Every IOPS figure of workload $1 in column $2, comma separated.
all_of() {
    local r w s iops us out=""
    for r in "${RESULTS[@]}"; do
        IFS='|' read -r w s iops us <<<"$r"
        if [ "$w" = "$1" ] && [ "$s" = "$2" ]; then out="$out${out:+, }$iops"; fi
    done
    echo "$out"
}

# $1 / $2 with two decimals, or n/a unless both are positive.
ratio() { awk -v a="$1" -v b="$2" 'BEGIN { if (a+0 > 0 && b+0 > 0) printf "%.2f", a / b; else print "n/a" }'; }

# A file device of a benchmark config, on stdout; further arguments are
# extra lines of it (e.g. "direct = true").
# Usage: file_device_toml NAME PATH [DEVICE_LINE...]
file_device_toml() {
    local name=$1 path=$2
    shift 2
    printf '[[device]]\nname = "%s"\nkind = "file"\npath = "%s"\n' "$name" "$path"
    [ $# -eq 0 ] || printf '%s\n' "$@"
    printf '\n'
}

# A target of a benchmark config, on stdout, with LUN 0, 1, ... on the
# devices named, in that order.
# Usage: target_toml IQN DEVICE...
target_toml() {
    local iqn=$1 lun=0 device
    shift
    printf '[[target]]\nname = "%s"\n' "$iqn"
    for device in "$@"; do
        printf '\n[[target.lun]]\nlun = %d\ndevice = "%s"\n' "$lun" "$device"
        lun=$((lun + 1))
    done
}

# The A/B scripts' daemon config: one portal on 127.0.0.1:$2, target $3
# with LUN 0 on a file device at $4; further arguments are extra lines of
# that device (e.g. "direct = true").
# Usage: one_lun_config FILE PORT IQN PATH [DEVICE_LINE...]
one_lun_config() {
    local file=$1 port=$2 iqn=$3 path=$4
    shift 4
    {
        printf '[[portal]]\nlisten = "127.0.0.1:%s"\n\n' "$port"
        file_device_toml d "$path" "$@"
        target_toml "$iqn" d
    } >"$file"
}

# The A/B scripts' scratch directory: WORK, made under $1 and named after
# $2, removed on exit together with the build being served (PID).
# Usage: ab_workdir DIR NAME
ab_workdir() {
    WORK=$(mktemp -d "$1/openarray-$2.XXXXXX")
    PID=""
    trap ab_cleanup EXIT
}
ab_cleanup() {
    [ -z "$PID" ] || kill -9 "$PID" 2>/dev/null || true
    rm -rf "$WORK"
}

# The builds of an A/B in the order round ROUND runs them: as given in odd
# rounds, reversed in even ones, so that no build always runs right after
# the same thing (another build, or the disk's own figure).
# Usage: builds_in_round ROUND BIN...
builds_in_round() {
    local round=$1 i
    shift
    if [ $((round % 2)) -eq 1 ]; then
        printf '%s\n' "$@"
    else
        for ((i = $#; i >= 1; i--)); do printf '%s\n' "${!i}"; done
    fi
}

# Serve CONFIG with the build BIN until it listens on 127.0.0.1:PORT; its
# PID goes in PID, its log in $WORK/openarray.log.
# Usage: serve_build BIN CONFIG PORT
serve_build() {
    "$1" serve -c "$2" --log-level warn >"$WORK/openarray.log" 2>&1 &
    PID=$!
    wait_for_port "$3" "$PID" openarray
}

# The EXIT trap of a script that runs one openarray (OA_PID) with its files
# in WORK: end the children and the daemon, remove WORK, and keep the
# script's exit status. Usage: trap cleanup_openarray EXIT
cleanup_openarray() {
    local status=$?
    set +e
    kill_children
    [ -z "${OA_PID:-}" ] || stop_process "$OA_PID"
    [ -z "${WORK:-}" ] || rm -rf "$WORK"
    exit "$status"
}

# OA_BIN: the openarray binary to run; built (release) when not given.
build_openarray() {
    [ -z "${OA_BIN:-}" ] || return 0
    log "building openarray (release)"
    run_child cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml" -p openarray --bin openarray
    OA_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/openarray
}

# Serves $WORK/openarray.toml on 127.0.0.1:$OA_PORT with its admin socket
# in $WORK; its pid goes in OA_PID. Usage: serve_openarray
serve_openarray() {
    "$OA_BIN" serve --config "$WORK/openarray.toml" --listen "127.0.0.1:$OA_PORT" \
        --admin-socket "$WORK/admin.sock" >"$WORK/openarray.log" 2>&1 &
    OA_PID=$!
    wait_for_port "$OA_PORT" "$OA_PID" openarray
}
