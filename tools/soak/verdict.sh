#!/usr/bin/env bash
# Judges a finished soak (tools/soak/soak.sh) from its output folder and writes OUT/summary.txt:
#
#   tools/soak/verdict.sh OUT        # exit status 0 when every check passes, 1 otherwise
#
# "Flat" means the second half of the run reaches no higher than the first half did after warm-up (the
# first 10% of the samples, while caches and pools still fill, are left out): descriptors and threads
# not above it at all, RSS not more than RSS_SLACK_KIB above it (default 32 MiB: allocator arenas of
# session threads that come and go, see RELIABILITY.md; a fixed amount rather than a percentage, since
# at full size RSS is gigabytes of weights that say nothing about leaks). The least-squares slope of
# RSS after warm-up is printed too (KiB per hour), as a figure, not a check. The last sample is taken
# 5 s after the clients stopped: moshi_sessions_active must be back to 0 there. Errors: the client's
# connect errors, refusals and error messages, and ERROR or panic lines in the server log, must all
# be 0. Dropped frames are NOT errors: a full-size model on a small machine cannot keep up in real time
# and drops the oldest input frames by design (counted in the metrics, printed below).
set -uo pipefail
OUT=${1:?usage: verdict.sh OUT}
RSS_SLACK_KIB=${RSS_SLACK_KIB:-32768}
[ -f "$OUT/samples.tsv" ] && [ -f "$OUT/exit.txt" ] || {
    echo "$OUT: no samples.tsv or exit.txt (the soak did not finish)" >&2
    exit 1
}
# shellcheck disable=SC1091 # written by soak.sh: server_died, server_exit, client_exit, wall_secs
. "$OUT/exit.txt"

metric() { awk -v n="$1" '$1==n{print $2}' "$OUT/metrics-after.txt" 2>/dev/null; }
total=$(tail -n 1 "$OUT/client.log" 2>/dev/null)
field() { echo "$total" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
panics=$(grep -ci panic "$OUT/server.log")
errors=$(grep -c -E '(^| )ERROR( |$)|"level":"ERROR"' "$OUT/server.log")
flat=$(awk -F'\t' -v slack="$RSS_SLACK_KIB" '
    NR > 1 { n++; s[n] = $1; r[n] = $2; f[n] = $3; t[n] = $4; a[n] = $5 }
    END {
        w = int(n / 10) + 1; h = int(n / 2)
        for (i = w; i <= h; i++) { if (r[i] > rw) rw = r[i]; if (f[i] > fw) fw = f[i]; if (t[i] > tw) tw = t[i] }
        for (i = h + 1; i <= n; i++) { if (r[i] > rl) rl = r[i]; if (f[i] > fl) fl = f[i]; if (t[i] > tl) tl = t[i] }
        for (i = w; i <= n; i++) { m++; sx += s[i]; sy += r[i]; sxx += s[i] * s[i]; sxy += s[i] * r[i] }
        d = m * sxx - sx * sx
        slope = d > 0 ? (m * sxy - sx * sy) / d * 3600 : 0
        printf "samples=%d warmup=%d half=%d rss_first=%d rss_last=%d rss_w=%d rss_l=%d slope=%.0f ", n, w - 1, h, r[1], r[n], rw, rl, slope
        printf "fds_first=%d fds_last=%d fds_w=%d fds_l=%d threads_first=%d threads_last=%d threads_w=%d threads_l=%d ", f[1], f[n], fw, fl, t[1], t[n], tw, tl
        printf "flat_rss=%d flat_fds=%d flat_threads=%d sessions_active_last=%s\n", (n >= 4 && rl <= rw + slack), (n >= 4 && fl <= fw), (n >= 4 && tl <= tw), a[n]
    }' "$OUT/samples.tsv")
v() { echo "$flat" | tr ' ' '\n' | sed -n "s/^$1=//p"; }
fails=()
check() { # name ok(0/1) detail
    if [ "$2" = 1 ]; then echo "PASS $1: $3"; else
        echo "FAIL $1: $3"
        fails+=("$1")
    fi
}
s=$(field sessions)
ce=$(field connect_errors)
rf=$(field refused)
em=$(field error_messages)
{
    cat "$OUT/setup.txt" 2>/dev/null
    echo "wall seconds (clients start to end): $wall_secs"
    echo "samples: $(v samples) (warm-up: the first $(v warmup); first half after it: up to sample $(v half))"
    echo "rss_kib first/last: $(v rss_first)/$(v rss_last); max first half/second half: $(v rss_w)/$(v rss_l); slope after warm-up: $(v slope) KiB per hour"
    echo "fds first/last: $(v fds_first)/$(v fds_last); max first half/second half: $(v fds_w)/$(v fds_l)"
    echo "threads first/last: $(v threads_first)/$(v threads_last); max first half/second half: $(v threads_w)/$(v threads_l)"
    echo "client total: $total"
    grep -E '^moshi_(sessions|frames|messages|connections)' "$OUT/metrics-after.txt" 2>/dev/null
    echo "panics in server log: $panics; ERROR lines: $errors"
    echo "server exit code after SIGTERM: $server_exit; client exit code: $client_exit"
    echo "--- verdict"
    check "server alive" $((server_died == 0)) "server_died=$server_died"
    check "clean exit" $((server_exit == 0 && client_exit == 0)) "server $server_exit, client $client_exit"
    check "rss flat" "$(v flat_rss)" "second-half max $(v rss_l) KiB vs first-half max $(v rss_w) KiB + slack $RSS_SLACK_KIB"
    check "fds flat" "$(v flat_fds)" "second-half max $(v fds_l) vs first-half max $(v fds_w)"
    check "threads flat" "$(v flat_threads)" "second-half max $(v threads_l) vs first-half max $(v threads_w)"
    check "sessions closed" "$([ "$(v sessions_active_last)" = 0 ] && echo 1 || echo 0)" "moshi_sessions_active at the end: $(v sessions_active_last)"
    check "sessions ran" $((${s:-0} > 0)) "${s:-0} sessions"
    check "0 client errors" $((${ce:-1} == 0 && ${rf:-1} == 0 && ${em:-1} == 0)) \
        "connect_errors=${ce:-?} refused=${rf:-?} error_messages=${em:-?}"
    check "0 server errors" $((panics == 0 && errors == 0)) "panics=$panics ERROR lines=$errors"
    if [ "${#fails[@]}" -eq 0 ]; then echo "SOAK PASSED"; else echo "SOAK FAILED: ${fails[*]}"; fi
} >"$OUT/summary.txt"
cat "$OUT/summary.txt"
echo "results in $OUT"
grep -q '^SOAK PASSED$' "$OUT/summary.txt"
