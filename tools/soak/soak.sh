#!/usr/bin/env bash
# Server soak: `moshi-native serve --model demo` on loopback with several real-time Ogg/Opus
# WebSocket clients (crates/server/examples/soak_client.rs) reconnecting every SESSION_SECS
# (every third session dropped without a close frame), for SECS seconds of wall time.
# Samples RSS, open file descriptors and thread count of the server every INTERVAL seconds.
#
#   tools/soak/soak.sh                      # 600 s, 3 clients, --max-sessions 3, debug build
#   SECS=3600 CLIENTS=4 PROFILE=release tools/soak/soak.sh
#
# Output: $OUT (default target/soak/<timestamp>/): samples.tsv, client.log, server.log,
# metrics-before.txt, metrics-after.txt, summary.txt. Not run in CI.
set -euo pipefail
cd "$(dirname "$0")/../.."

SECS=${SECS:-600}
CLIENTS=${CLIENTS:-3}
MAX_SESSIONS=${MAX_SESSIONS:-$CLIENTS}
SESSION_SECS=${SESSION_SECS:-45}
INTERVAL=${INTERVAL:-5}
PORT=${PORT:-18998}
PROFILE=${PROFILE:-debug}
OUT=${OUT:-target/soak/$(date -u +%Y%m%dT%H%M%SZ)}
mkdir -p "$OUT"

flag=()
[ "$PROFILE" = release ] && flag=(--release)
cargo build "${flag[@]}" -p moshi-native
cargo build "${flag[@]}" -p moshi-server-native --example soak_client
BIN=target/$PROFILE/moshi-native
CLIENT=target/$PROFILE/examples/soak_client

"$BIN" serve --model demo --host 127.0.0.1 --port "$PORT" --max-sessions "$MAX_SESSIONS" \
    >"$OUT/server.log" 2>&1 &
SPID=$!
trap 'kill -TERM $SPID 2>/dev/null || true' EXIT
for _ in $(seq 1 300); do
    curl -fsS "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-before.txt" 2>/dev/null && break
    sleep 0.2
done

sample() { # seconds rss_kib fds threads
    local t=$1
    local rss thr fds
    rss=$(awk '/^VmRSS/{print $2}' /proc/$SPID/status)
    thr=$(awk '/^Threads/{print $2}' /proc/$SPID/status)
    fds=$(ls /proc/$SPID/fd | wc -l)
    local m act conn
    m=$(curl -fsS "http://127.0.0.1:$PORT/metrics" 2>/dev/null || true)
    act=$(echo "$m" | awk '/^moshi_sessions_active /{print $2}')
    conn=$(echo "$m" | awk '/^moshi_connections_open /{print $2}')
    printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$t" "$rss" "$fds" "$thr" "$act" "$conn" >>"$OUT/samples.tsv"
}
printf 'secs\trss_kib\tfds\tthreads\tsessions_active\tconnections_open\n' >"$OUT/samples.tsv"
START=$(date +%s)
sample 0
"$CLIENT" --url "ws://127.0.0.1:$PORT/api/chat" --clients "$CLIENTS" --secs "$SECS" \
    --session-secs "$SESSION_SECS" >"$OUT/client.log" 2>&1 &
CPID=$!
while kill -0 $CPID 2>/dev/null; do
    sleep "$INTERVAL"
    kill -0 $SPID || { echo "server died" | tee -a "$OUT/summary.txt"; exit 1; }
    sample $(( $(date +%s) - START ))
done
wait $CPID || echo "client exited with $?" >>"$OUT/summary.txt"
sleep 5 # let the last sessions close
sample $(( $(date +%s) - START ))
curl -fsS "http://127.0.0.1:$PORT/metrics" >"$OUT/metrics-after.txt" || true
kill -TERM $SPID
set +e
wait $SPID
RC=$?
set -e
trap - EXIT
{
    echo "server exit code after SIGTERM: $RC"
    echo "wall seconds: $(( $(date +%s) - START ))"
    awk -F'\t' 'NR==2{r0=$2;f0=$3;t0=$4} NR>1{if($2>rmax)rmax=$2; if($3>fmax)fmax=$3; if($4>tmax)tmax=$4; r=$2;f=$3;t=$4; n++}
        NR==40{r40=$2}
        END{printf "samples: %d\nrss_kib first/after-warmup(sample 39)/last/max: %d/%d/%d/%d\nfds first/last/max: %d/%d/%d\nthreads first/last/max: %d/%d/%d\n", n, r0, r40, r, rmax, f0, f, fmax, t0, t, tmax}' "$OUT/samples.tsv"
    tail -n 1 "$OUT/client.log"
    grep -E '^moshi_(sessions|frames|messages|connections)' "$OUT/metrics-after.txt" || true
    grep -ci panic "$OUT/server.log" | sed 's/^/panics in server log: /'
} | tee -a "$OUT/summary.txt"
echo "results in $OUT"
