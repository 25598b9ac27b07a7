#!/usr/bin/env bash
# `openarray bench --compare` held against bench/matrix.sh: the two measure
# openarray's LUN against tgt's in one run, on the same targets, and their
# openarray/tgt ratios are printed side by side with the difference.
#
# The targets, their LUN contents and the fio points are bench/matrix.sh's
# own (this script sources it): tgt and openarray over loopback, each with
# a 1 GiB file LUN on tmpfs; 4K randread and randwrite, 4M read and write,
# at QD 1/32/128, fio's libiscsi engine (built by bench/fio-libiscsi.sh),
# one session per run. `openarray bench` runs the same points with
# `--seq-block-size 4M` and the same fio (OPENARRAY_FIO), pattern by
# pattern, taking turns with matrix.sh's runs of that pattern; which of the
# two targets is URL and which URL2 alternates by round.
#
# Usage: bench/bench-vs-matrix.sh [--quick]
#   --quick   2 s per run, QD 1 and 32, one round; the report goes to
#             /tmp/openarray-bench-vs-matrix unless COMPARE_OUT is set
# Environment (optional), besides bench/matrix.sh's ports and DISK_DIR:
#   RUNTIME=5          seconds per run (--quick: 2)
#   COMPARE_ROUNDS=2   rounds (--quick: 1); the round-to-round spread of the
#                      ratios is the noise the difference is judged against
#   COMPARE_OUT=docs/bench   where bench-command-vs-matrix.md goes; the
#                      report folders of `openarray bench` go to
#                      COMPARE_OUT/bench-vs-matrix/ (--quick only) or /tmp
set -euo pipefail

HERE=$(cd "$(dirname "$0")" && pwd)
case "${1:-}" in
    --quick) set -- --quick ;;
    "") set -- ;;
    *) echo "usage: $0 [--quick]" >&2; exit 2 ;;
esac
# shellcheck source=bench/matrix.sh
. "$HERE/matrix.sh"

if [ "$QUICK" -eq 1 ]; then
    COMPARE_OUT=${COMPARE_OUT:-/tmp/openarray-bench-vs-matrix}
    COMPARE_ROUNDS=${COMPARE_ROUNDS:-1}
    FOLDERS=$COMPARE_OUT/bench-vs-matrix
else
    COMPARE_OUT=${COMPARE_OUT:-$ROOT/docs/bench}
    COMPARE_ROUNDS=${COMPARE_ROUNDS:-2}
    # Plots of every run are not worth committing: the folders stay in /tmp.
    FOLDERS=/tmp/openarray-bench-vs-matrix
fi
WORKLOADS="4k-randread 4k-randwrite 4m-read 4m-write"

# openarray bench's pattern for a matrix.sh workload.
pattern_of() {
    case $1 in
        4k-randread) echo randread ;;
        4k-randwrite) echo randwrite ;;
        4m-read) echo seqread ;;
        4m-write) echo seqwrite ;;
    esac
}

# One pattern at every depth through `openarray bench`, openarray's LUN
# compared with tgt's. The command alternates which target goes first from
# point to point, the same way in every run; swapping the two URLs every
# other round keeps a point from always running in the same order.
bench_run() { # round workload
    local out="$FOLDERS/r$1-$2" first=openarray second=tgt
    [ $(($1 % 2)) -eq 0 ] && { first=tgt; second=openarray; }
    rm -rf "$out"
    if ! run_child timeout $((RUNTIME * 12 + 120)) "$OA_BIN" bench "$(lun_url "$first")" \
        --compare "$(lun_url "$second")" --patterns "$(pattern_of "$2")" --depths "${DEPTHS// /,}" \
        --seq-block-size 4M --runtime "$RUNTIME" --destroy-data --out "$out" \
        >"$WORK/bench-r$1-$2.out" 2>&1; then
        log "openarray bench $2 failed: $(tail -3 "$WORK/bench-r$1-$2.out")"
        FAILED=1
        return
    fi
    log "openarray bench $2, round $1: $out/report.md"
}

matrix_points() { # round workload
    local depth system
    for depth in $DEPTHS; do
        for system in $(targets_in_round "$1"); do fio_run "$system" "$2" "$depth"; done
    done
}

compare_main() {
    local load_before started=$SECONDS
    load_before=$(cut -d' ' -f1-3 /proc/loadavg)
    install_tools
    port_in_use "$OA_PORT" && die "port $OA_PORT is taken; set OA_PORT"
    port_in_use "$TGT_PORT" && die "port $TGT_PORT is taken; set TGT_PORT"
    port_in_use "$NBD_PORT" && die "port $NBD_PORT is taken; set NBD_PORT"

    log "building openarray (release)"
    run_child cargo build --release --quiet --manifest-path "$ROOT/Cargo.toml" -p openarray --bin openarray
    OA_BIN=${CARGO_TARGET_DIR:-$ROOT/target}/release/openarray
    # Both tools drive the targets with the one fio.
    export OPENARRAY_FIO=$FIO
    local commit dirty
    commit=$(git -C "$ROOT" rev-parse --short HEAD 2>/dev/null || echo unknown)
    dirty=$(git -C "$ROOT" status --porcelain --untracked-files=no -- src crates bench Cargo.toml Cargo.lock 2>/dev/null | wc -l)
    [ "$dirty" -eq 0 ] || commit="$commit (+ uncommitted changes in $dirty files)"

    WORK=$(mktemp -d /dev/shm/openarray-bench-vs-matrix.XXXXXX)
    RESULTS=$WORK/results.tsv
    : >"$RESULTS"
    mkdir -p "$FOLDERS" "$COMPARE_OUT"
    log "writing the LUN contents (random, ${LUN_MIB} MiB, the same for both targets)"
    make_random_file "$WORK/base.img"
    cp "$WORK/base.img" "$WORK/openarray.img"
    cp "$WORK/base.img" "$WORK/tgt.img"
    # matrix.sh's targets also serve an O_DIRECT LUN; it is not measured here.
    DISK_FILE=$(mktemp "$DISK_DIR/openarray-bench-vs-matrix.XXXXXX")
    truncate -s "${LUN_MIB}M" "$DISK_FILE"
    start_openarray
    start_tgt

    FAILED=0
    local round workload i=0
    for round in $(seq 1 "$COMPARE_ROUNDS"); do
        log "round $round of $COMPARE_ROUNDS"
        for workload in $WORKLOADS; do
            # Which tool goes first alternates, so a drift of the machine
            # does not always favour the same one.
            if [ $((i % 2)) -eq 0 ]; then
                matrix_points "$round" "$workload"
                bench_run "$round" "$workload"
            else
                bench_run "$round" "$workload"
                matrix_points "$round" "$workload"
            fi
            i=$((i + 1))
        done
    done

    local cmd="bench/bench-vs-matrix.sh"
    [ "$QUICK" -eq 1 ] && cmd="$cmd --quick"
    cp "$RESULTS" "$FOLDERS/matrix-results.tsv"
    python3 "$ROOT/bench/bench_vs_matrix.py" --matrix "$RESULTS" --bench-dir "$FOLDERS" \
        --rounds "$COMPARE_ROUNDS" --command "$cmd" --commit "$commit" --runtime "$RUNTIME" \
        --load-before "$load_before" --load-after "$(cut -d' ' -f1-3 /proc/loadavg)" \
        --minutes "$(( (SECONDS - started + 59) / 60 ))" --fio "$FIO" \
        --openarray-url "$(lun_url openarray)" --out "$COMPARE_OUT/bench-command-vs-matrix.md"
    log "report written to $COMPARE_OUT/bench-command-vs-matrix.md"
    return "$FAILED"
}

compare_main
