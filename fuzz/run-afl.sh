#!/usr/bin/env bash
# Coverage-guided fuzzing on the stable toolchain: AFL++ through afl.rs,
# what `make fuzz` runs when `cargo afl` is installed (`make fuzz-setup`).
#
#   fuzz/run-afl.sh TARGET...      # FUZZ_SECONDS (default 60) per target
#   FUZZ_CPU_SECONDS=3600 fuzz/run-afl.sh TARGET...   # stop on CPU time instead
#
# Wall time is what FUZZ_SECONDS bounds; on a shared machine a fuzzer may get
# a fraction of a core, so FUZZ_CPU_SECONDS bounds the CPU time that afl-fuzz,
# the target's fork server and every execution it reaped have used (read
# from /proc every few seconds), which is the figure a "CPU-hour" claim
# needs. Either way the CPU seconds used are printed and kept in
# fuzz/target/afl/TARGET/cpu_seconds. FUZZ_NICE (default 0) runs the
# fuzzer at that niceness, so a long run only takes idle CPU.
#
# Each target starts from its seeds (fuzz/seeds/TARGET/) and the minimized
# corpus of the runs before (fuzz/corpus/TARGET/, in the repository), runs
# for FUZZ_SECONDS with the dictionary fuzz/fuzz.dict, and ends by
# minimizing what it found (afl-cmin) back into fuzz/corpus/TARGET/, so the
# next run starts where this one stopped. A crash is copied to
# fuzz/artifacts/TARGET/crash-<sha1> and a hang (over 20 s) to
# timeout-<sha1>; either makes the exit status 1. AFL's own output stays in
# fuzz/target/afl/TARGET/ (log, fuzzer_stats, queue) until the next run.
# Replay a finding: fuzz/target/release/cube-fuzz-afl TARGET < FILE
set -euo pipefail
cd "$(dirname "$0")"

seconds=${FUZZ_SECONDS:-60}
cpu_seconds=${FUZZ_CPU_SECONDS:-}
niceness=${FUZZ_NICE:-0}
work=target/afl
bin=target/release/cube-fuzz-afl
hang_ms=20000

if [ $# -eq 0 ]; then
    echo "usage: $0 TARGET..." >&2
    exit 2
fi

# Lua is C, built by lua-src through the cc crate, not by rustc: without
# these flags AFL sees none of its edges (the program targets' parser and
# VM), and measured on the program_source seeds the map holds 2 130 tuples
# without and 4 650 with. clang's trace-pc-guard callbacks go to the same
# AFL++ runtime cargo-afl links for the Rust side. Lua also seeds its string
# hashes from the time and addresses (luai_makeseed in lstate.c): a fixed
# seed makes the same input take the same path, which AFL's stability needs.
if command -v clang >/dev/null 2>&1; then
    export CC=clang CFLAGS="-fsanitize-coverage=trace-pc-guard -Dluai_makeseed(L)=0u"
else
    echo "fuzz: no clang, so Lua is not instrumented (apt-get install clang, or make fuzz-setup)" >&2
fi
cargo afl build --release --no-default-features --features afl --bin cube-fuzz-afl

# afl-cmin looks for afl-showmap on PATH first: make that the one cargo-afl
# built for this toolchain, not an older system AFL++ (Debian's 4.04c
# lacks an option the newer afl-cmin passes).
release=$(rustc -vV | sed -n 's/^release: //p')
afl_bin=$(ls -d "${XDG_DATA_HOME:-$HOME/.local/share}"/afl.rs/rustc-"$release"-*/afl.rs-*/afl/bin 2>/dev/null | tail -n 1)
if [ -z "$afl_bin" ]; then
    echo "no AFL++ built by cargo-afl for rustc $release: run make fuzz-setup" >&2
    exit 1
fi
export PATH="$afl_bin:$PATH"

# No screen UI (the output goes to a log); the CPU governor, core binding
# and a piped core_pattern are the machine's business, not this script's:
# AFL would refuse to start over each of them.
export AFL_NO_UI=1 AFL_SKIP_CPUFREQ=1 AFL_NO_AFFINITY=1
export AFL_I_DONT_CARE_ABOUT_MISSING_CRASHES=1 AFL_SKIP_CRASHES=1

# Copies each file of $1 into $2 named by its SHA-1, prefixed with $3.
copy_by_hash() {
    local from=$1 to=$2 prefix=$3 f sum
    mkdir -p "$to"
    for f in "$from"/*; do
        [ -f "$f" ] || continue
        sum=$(sha1sum "$f" | cut -c1-40)
        cp "$f" "$to/$prefix$sum"
    done
}

stat_of() { sed -n "s/^$1 *: *//p" "$2"; }

# Every process under $1, $1 included.
process_tree() {
    local pid
    echo "$1"
    for pid in $(ps -o pid= --ppid "$1" 2>/dev/null); do
        process_tree "$pid"
    done
}

# CPU seconds used by the tree under $1: each live process's user and
# system time and those of the children it has reaped (fields 14-17 of
# /proc/PID/stat, after the command name, which may hold spaces).
tree_cpu_seconds() {
    local ticks=0 pid fields
    for pid in $(process_tree "$1"); do
        fields=$(sed 's/^.*) //' "/proc/$pid/stat" 2>/dev/null) || continue
        # After the name: state is field 3, so utime..cstime are 12..15 here.
        set -- $fields
        ticks=$((ticks + ${12} + ${13} + ${14} + ${15}))
    done
    echo $((ticks / $(getconf CLK_TCK)))
}

# Runs afl-fuzz in the background until it stops by itself (-V) or has used
# $cpu_seconds of CPU; keeps the last CPU reading in $dir/cpu_seconds.
fuzz_until_done() {
    local dir=$1 pid used=0 now status=0
    shift
    nice -n "$niceness" "$@" &
    pid=$!
    while kill -0 "$pid" 2>/dev/null; do
        # The largest reading: as the run ends its processes exit one by one
        # and a last reading would miss the ones already gone.
        now=$(tree_cpu_seconds "$pid")
        [ "$now" -gt "$used" ] && used=$now
        echo "$used" >"$dir/cpu_seconds"
        if [ -n "$cpu_seconds" ] && [ "$used" -ge "$cpu_seconds" ]; then
            # afl-fuzz stops cleanly on SIGINT: it writes its stats and exits 0.
            pkill -INT -x afl-fuzz -P "$pid" 2>/dev/null ||
                kill -INT "$pid"
        fi
        sleep 5
    done
    wait "$pid" || status=$?
    return "$status"
}

failed=0
for t in "$@"; do
    dir=$work/$t
    # A run that died before minimizing (killed, machine restarted) left
    # its queue: start from it too, so nothing it found is lost.
    rm -rf "$work/$t.left"
    if [ -d "$dir/out/default/queue" ] && [ ! -e "$dir/minimized" ]; then
        copy_by_hash "$dir/out/default/queue" "$work/$t.left" "left-"
    fi
    rm -rf "$dir"
    mkdir -p "$dir/in" "corpus/$t"
    cp seeds/"$t"/* "$dir/in/"
    copy_by_hash "corpus/$t" "$dir/in" ""
    if [ -d "$work/$t.left" ]; then
        mv "$work/$t.left"/* "$dir/in/" 2>/dev/null || true
        rm -rf "$work/$t.left"
    fi
    if [ -n "$cpu_seconds" ]; then
        bound=(); budget="$cpu_seconds CPU s"
    else
        bound=(-V "$seconds"); budget="$seconds s"
    fi
    echo "fuzz $t: AFL++ for $budget from $(ls "$dir/in" | wc -l) inputs (log: fuzz/$dir/afl.log)"
    if ! fuzz_until_done "$dir" cargo afl fuzz "${bound[@]}" -t "$hang_ms" -i "$dir/in" -o "$dir/out" \
        -x fuzz.dict -- "$bin" "$t" >"$dir/afl.log" 2>&1; then
        tail -n 30 "$dir/afl.log"
        echo "fuzz $t: afl-fuzz failed (log above)"
        failed=1
        continue
    fi
    stats=$dir/out/default/fuzzer_stats
    echo "fuzz $t: $(stat_of run_time "$stats") s, $(cat "$dir/cpu_seconds") CPU s, $(stat_of execs_done "$stats") executions," \
        "$(stat_of edges_found "$stats") of $(stat_of total_edges "$stats") edges," \
        "$(stat_of saved_crashes "$stats") crashes, $(stat_of saved_hangs "$stats") hangs," \
        "$(stat_of corpus_count "$stats") in the queue"
    found=0
    for kind in crashes:crash- hangs:timeout-; do
        sub=${kind%%:*}
        if ls "$dir/out/default/$sub"/id:* >/dev/null 2>&1; then
            copy_by_hash "$dir/out/default/$sub" "artifacts/$t" "${kind#*:}"
            found=1
        fi
    done
    if [ "$found" = 1 ]; then
        echo "fuzz $t: FINDINGS in fuzz/artifacts/$t/ (replay: fuzz/$bin $t < FILE)"
        failed=1
    fi
    # Minimize the queue into the kept corpus: the smallest inputs that
    # together reach every edge the queue reached.
    if cargo afl cmin -t "$hang_ms" -i "$dir/out/default/queue" -o "$dir/min" \
        -- "$bin" "$t" >"$dir/cmin.log" 2>&1; then
        rm -f "corpus/$t"/*
        copy_by_hash "$dir/min" "corpus/$t" ""
        touch "$dir/minimized"
        echo "fuzz $t: corpus minimized to $(ls "corpus/$t" | wc -l) inputs, $(du -sh --apparent-size "corpus/$t" | cut -f1)"
    else
        tail -n 20 "$dir/cmin.log"
        echo "fuzz $t: afl-cmin failed (log above); fuzz/corpus/$t/ left as it was"
        failed=1
    fi
done
exit "$failed"
