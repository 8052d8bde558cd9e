#!/usr/bin/env bash
# Server soak: `moshi-native serve` on loopback with several real-time Ogg/Opus WebSocket clients
# (crates/server/examples/soak_client.rs) reconnecting every SESSION_SECS (every third session dropped
# without a close frame), for SECS seconds of wall time. Samples RSS, open file descriptors and thread
# count of the server every INTERVAL seconds, then judges the run (see "Verdict" below).
#
#   tools/soak/soak.sh                                  # demo model, 600 s, 3 clients, debug build
#   SECS=3600 CLIENTS=4 PROFILE=release tools/soak/soak.sh
#   # full size (a bundle from `moshi-native synth --format q4-gguf --out DIR`), taking idle CPU only:
#   MODEL_DIR=/work/soak-q4 PROFILE=release SECS=7200 CLIENTS=2 SERVE_ARGS="--kv-dtype bf16" \
#       OUT=/work/soak-out nice -n 19 tools/soak/soak.sh
#
# Settings (environment):
#   MODEL_DIR     bundle directory for `serve --model-dir`; unset: `--model demo`
#   PROFILE       debug | release: which target/<PROFILE> binaries are built and run
#   BUILD         1 (default): `cargo build` the server and the client first; 0: use the binaries as
#                 they are (BIN and CLIENT may point anywhere, e.g. copies that a rebuild cannot replace)
#   SERVE_ARGS    extra `serve` flags (word-split), e.g. "--kv-dtype bf16 --threads 2"
#   READY_SECS    how long to wait for the loaded server to answer /readyz (default 3600: a full-size
#                 bundle loads and times its start-up frames first, slowly on a busy machine)
#   SECS CLIENTS MAX_SESSIONS SESSION_SECS INTERVAL PORT OUT: as their names say
#
# Output under $OUT (default target/soak/<timestamp>/): samples.tsv, client.log, server.log,
# metrics-before.txt, metrics-after.txt, summary.txt (figures and verdict). Exit status 0 when every check
# of the verdict passes, 1 otherwise. Not run in CI (it takes wall time).
set -euo pipefail
cd "$(dirname "$0")/../.."

SECS=${SECS:-600}
CLIENTS=${CLIENTS:-3}
MAX_SESSIONS=${MAX_SESSIONS:-$CLIENTS}
SESSION_SECS=${SESSION_SECS:-45}
INTERVAL=${INTERVAL:-5}
PORT=${PORT:-18998}
PROFILE=${PROFILE:-debug}
BUILD=${BUILD:-1}
READY_SECS=${READY_SECS:-3600}
OUT=${OUT:-target/soak/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"
rm -f "$OUT/summary.txt" "$OUT/samples.tsv"

case "$PROFILE" in
    debug) flag=() ;;
    release) flag=(--release) ;;
    *)
        echo "PROFILE must be debug or release, not '$PROFILE'" >&2
        exit 2
        ;;
esac
BIN=${BIN:-target/$PROFILE/moshi-native}
CLIENT=${CLIENT:-target/$PROFILE/examples/soak_client}
if [ "$BUILD" = 1 ]; then
    cargo build "${flag[@]}" -p moshi-native
    cargo build "${flag[@]}" -p moshi-server-native --example soak_client
fi
if [ -n "${MODEL_DIR:-}" ]; then
    model=(--model-dir "$MODEL_DIR")
else
    model=(--model demo)
fi
read -r -a extra <<<"${SERVE_ARGS:-}"

{
    echo "started: $(date -u +%Y-%m-%dT%H:%M:%SZ)"
    echo "server: $BIN serve ${model[*]} --max-sessions $MAX_SESSIONS ${extra[*]}"
    echo "clients: $CLIENTS real-time, sessions of $SESSION_SECS s (every third dropped without a close), for $SECS s"
    echo "nice: $(nice)"
} >"$OUT/setup.txt"

"$BIN" serve "${model[@]}" --host 127.0.0.1 --port "$PORT" --max-sessions "$MAX_SESSIONS" "${extra[@]}" \
    >"$OUT/server.log" 2>&1 &
SPID=$!
trap 'kill -TERM $SPID 2>/dev/null || true' EXIT
# The port is bound before the model loads, but nothing is answered until it has loaded: wait for the
# readiness probe (what a load balancer would wait for), then record the metrics.
LOAD_START=$(date +%s)
until curl -fsS --max-time 10 "http://127.0.0.1:$PORT/readyz" >/dev/null 2>&1; do
    if ! kill -0 $SPID 2>/dev/null; then
        echo "FAIL: server exited before it was ready (see server.log)" | tee -a "$OUT/summary.txt"
        exit 1
    fi
    if [ $(($(date +%s) - LOAD_START)) -gt "$READY_SECS" ]; then
        echo "FAIL: server not ready after $READY_SECS s" | tee -a "$OUT/summary.txt"
        exit 1
    fi
    sleep 1
done
echo "ready after: $(($(date +%s) - LOAD_START)) s" >>"$OUT/setup.txt"
curl -fsS --max-time 10 "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-before.txt"

sample() { # seconds rss_kib fds threads sessions_active connections_open
    local t=$1
    local rss thr fds m act conn
    rss=$(awk '/^VmRSS/{print $2}' /proc/$SPID/status)
    thr=$(awk '/^Threads/{print $2}' /proc/$SPID/status)
    fds=$(find /proc/$SPID/fd -mindepth 1 -maxdepth 1 | wc -l)
    m=$(curl -fsS --max-time 10 "http://127.0.0.1:$PORT/metrics" 2>/dev/null || true)
    act=$(echo "$m" | awk '/^moshi_sessions_active /{print $2}')
    conn=$(echo "$m" | awk '/^moshi_connections_open /{print $2}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$rss" "$fds" "$thr" "${act:--}" "${conn:--}" >>"$OUT/samples.tsv"
}
printf 'secs\trss_kib\tfds\tthreads\tsessions_active\tconnections_open\n' >"$OUT/samples.tsv"
START=$(date +%s)
sample 0
"$CLIENT" --url "ws://127.0.0.1:$PORT/api/chat" --clients "$CLIENTS" --secs "$SECS" \
    --session-secs "$SESSION_SECS" >"$OUT/client.log" 2>&1 &
CPID=$!
server_died=0
while kill -0 $CPID 2>/dev/null; do
    sleep "$INTERVAL"
    if ! kill -0 $SPID 2>/dev/null; then
        server_died=1
        break
    fi
    sample $(($(date +%s) - START))
done
set +e
if [ "$server_died" = 1 ]; then
    kill -TERM $CPID 2>/dev/null
fi
wait $CPID
CRC=$?
set -e
if [ "$server_died" = 0 ]; then
    sleep 5 # let the last sessions close
    sample $(($(date +%s) - START))
    curl -fsS --max-time 10 "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-after.txt" || true
    kill -TERM $SPID
fi
set +e
wait $SPID
SRC=$?
set -e
trap - EXIT

# Verdict. "Flat" means the second half of the run reaches no higher than the first half did after
# warm-up (the first 10% of the samples, when the caches and pools are still filling, are left out):
# fds and threads not above it at all, RSS not more than 5% above it (allocator and page-cache jitter).
# The last sample is taken 5 s after the clients stopped: sessions_active must be back to 0 there.
# Errors: the client's connect errors, refusals and error messages, and ERROR or panic lines of the
# server, must all be 0. Dropped frames are NOT errors: a full-size model on a small machine cannot
# keep up in real time and drops frames by design (they are counted in the metrics).
metric() { awk -v n="$1" '$1==n{print $2}' "$OUT/metrics-after.txt" 2>/dev/null || true; }
total=$(tail -n 1 "$OUT/client.log" || true)
field() { echo "$total" | sed -n "s/.*\"$1\":\([0-9]*\).*/\1/p"; }
panics=$(grep -ci panic "$OUT/server.log" || true)
errors=$(grep -c -E '(^| )ERROR( |$)|"level":"ERROR"' "$OUT/server.log" || true)
fails=()
check() { # name ok(0/1) detail
    if [ "$2" = 1 ]; then echo "PASS $1: $3"; else
        echo "FAIL $1: $3"
        fails+=("$1")
    fi
}
{
    echo "wall seconds: $(($(date +%s) - START))"
    awk -F'\t' '
        NR > 1 { n++; s[n] = $1; r[n] = $2; f[n] = $3; t[n] = $4; a[n] = $5 }
        END {
            w = int(n / 10) + 1; h = int(n / 2)
            for (i = w; i <= h; i++) { if (r[i] > rw) rw = r[i]; if (f[i] > fw) fw = f[i]; if (t[i] > tw) tw = t[i] }
            for (i = h + 1; i <= n; i++) { if (r[i] > rl) rl = r[i]; if (f[i] > fl) fl = f[i]; if (t[i] > tl) tl = t[i] }
            printf "samples: %d (warm-up: samples 1-%d; first half after it: %d-%d; second half: %d-%d)\n", n, w - 1, w, h, h + 1, n
            printf "rss_kib first/last, max first half/max second half: %d/%d, %d/%d (growth %.2f%%)\n", r[1], r[n], rw, rl, rw ? 100 * (rl - rw) / rw : 0
            printf "fds first/last, max first half/max second half: %d/%d, %d/%d\n", f[1], f[n], fw, fl
            printf "threads first/last, max first half/max second half: %d/%d, %d/%d\n", t[1], t[n], tw, tl
            printf "flat_rss=%d flat_fds=%d flat_threads=%d sessions_active_last=%s\n", (n >= 4 && rl <= rw * 1.05), (n >= 4 && fl <= fw), (n >= 4 && tl <= tw), a[n]
        }' "$OUT/samples.tsv" | tee "$OUT/flat.txt"
    echo "client total: $total"
    grep -E '^moshi_(sessions|frames|messages|connections)' "$OUT/metrics-after.txt" 2>/dev/null || true
    echo "panics in server log: $panics; ERROR lines: $errors"
    echo "server exit code after SIGTERM: $SRC; client exit code: $CRC"
    echo "--- verdict"
    flat=$(tail -n 1 "$OUT/flat.txt")
    has() { case " $flat " in *" $1 "*) echo 1 ;; *) echo 0 ;; esac }
    check "server alive" $((server_died == 0)) "server_died=$server_died"
    check "clean exit" $((SRC == 0 && CRC == 0)) "server $SRC, client $CRC"
    check "rss flat" "$(has flat_rss=1)" "$(sed -n 2p "$OUT/flat.txt")"
    check "fds flat" "$(has flat_fds=1)" "$(sed -n 3p "$OUT/flat.txt")"
    check "threads flat" "$(has flat_threads=1)" "$(sed -n 4p "$OUT/flat.txt")"
    check "sessions closed" "$(has sessions_active_last=0)" "moshi_sessions_active at the end: $(metric moshi_sessions_active)"
    s=$(field sessions)
    ce=$(field connect_errors)
    rf=$(field refused)
    em=$(field error_messages)
    check "sessions ran" $((${s:-0} > 0)) "${s:-0} sessions"
    check "0 client errors" $((${ce:-1} == 0 && ${rf:-1} == 0 && ${em:-1} == 0)) \
        "connect_errors=${ce:-?} refused=${rf:-?} error_messages=${em:-?}"
    check "0 server errors" $((panics == 0 && errors == 0)) "panics=$panics ERROR lines=$errors"
    if [ "${#fails[@]}" -eq 0 ]; then echo "SOAK PASSED"; else echo "SOAK FAILED: ${fails[*]}"; fi
} | tee -a "$OUT/summary.txt"
echo "results in $OUT"
grep -q '^SOAK PASSED$' "$OUT/summary.txt"
