# shellcheck shell=bash
# What the RAID benchmarks (bench/raid.sh, bench/raid_rebuild.sh) share:
# the configuration of capped members and arrays, and talking to the
# daemon about them. Sourced after bench/common.sh; uses WORK, OA_BIN,
# OA_PORT, IQN, MEMBER_SIZE, MEMBER_IOPS and MEMBER_BW.

half_bw() { numfmt --from=iec "$MEMBER_BW" | awk '{ printf "%d", $1 / 2 }'; }

# A member: a file on tmpfs behind a delay device NAME, so that the cap,
# not the memory, limits it. Usage: member NAME [half]
member() {
    local iops=$MEMBER_IOPS bw=\"$MEMBER_BW\"
    if [ "${2:-}" = half ]; then iops=$((MEMBER_IOPS / 2)); bw=$(half_bw); fi
    printf '[[device]]\nname = "%s-file"\nkind = "file"\npath = "%s/%s.img"\nsize = "%s"\n\n' \
        "$1" "$WORK" "$1" "$MEMBER_SIZE"
    printf '[[device]]\nname = "%s"\nkind = "delay"\nover = "%s-file"\niops = %d\nbandwidth = %s\n\n' \
        "$1" "$1" "$iops" "$bw"
}

# Usage: raid NAME LEVEL "MEMBERS" ["SPARES"] [EXTRA_LINES]
raid() {
    local m s
    # shellcheck disable=SC2086 # the lists are split on purpose
    m=$(printf '"%s", ' $3); s=$(printf '"%s", ' ${4:-})
    printf '[[device]]\nname = "%s"\nkind = "raid"\nlevel = %d\nmembers = [%s]\nspares = [%s]\n%s\n\n' \
        "$1" "$2" "${m%, }" "${4:+${s%, }}" "${5:-}"
}

url() { echo "iscsi://127.0.0.1:$OA_PORT/$IQN/$1"; }
oa() { "$OA_BIN" "$@" --socket "$WORK/admin.sock"; }

# Whether array $1 is clean: no sync running, no replacement attached.
clean_now() {
    oa raid status "$1" --json >"$WORK/st.json"
    grep -q '"sync": null' "$WORK/st.json" && grep -q '"state": "clean"' "$WORK/st.json" &&
        ! grep -q '"state": "replacement"' "$WORK/st.json"
}

wait_clean() {
    for _ in $(seq 1 3000); do
        if clean_now "$1"; then return 0; fi
        sleep 0.1
    done
    die "$1 did not become clean"
}
