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
# metrics-before.txt, metrics-after.txt, exit.txt, summary.txt (figures and verdict, written by
# tools/soak/verdict.sh, which can be rerun on the folder). Exit status 0 when every check of the verdict
# passes, 1 otherwise. Not run in CI (it takes wall time).
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
rm -f "$OUT/summary.txt" "$OUT/samples.tsv" "$OUT/exit.txt"

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

printf 'server_died=%s\nserver_exit=%s\nclient_exit=%s\nwall_secs=%s\n' "$server_died" "$SRC" "$CRC" \
    $(($(date +%s) - START)) >"$OUT/exit.txt"
echo "ended: $(date -u +%Y-%m-%dT%H:%M:%SZ)" >>"$OUT/setup.txt"
bash "$(dirname "$0")/verdict.sh" "$OUT"
