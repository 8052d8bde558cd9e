#!/usr/bin/env bash
# Keeps nginx from sending conversations to an instance that cannot take them at all: one that is still
# loading its model (its port is bound and accepts connections, but nothing is answered until the model
# has loaded), hung, or gone. For every `server HOST:PORT ...;` line of the configuration it asks
# http://HOST:PORT/readyz (READYZ_TIMEOUT seconds, default 2):
#   - any HTTP answer (200 = a slot free, 503 = full): the instance is up; a ` down` flag is removed.
#     Full or not is left to max_conns, which nginx counts exactly (deploy/README.md);
#   - no answer: ` down` is added, so nginx picks it for nothing new.
# When that changes the file, it is checked (`$NGINX_TEST`, default `nginx -t -q`) and nginx reloaded
# (`$NGINX_RELOAD`, default `nginx -s reload`). A reload keeps open conversations, but nginx's per-instance
# counts restart from zero, so changes are rare by design: only when an instance comes or goes.
#
#   deploy/nginx/readyz-sync.sh /etc/nginx/conf.d/moshi.conf          # once (e.g. from a timer)
#   INTERVAL=5 deploy/nginx/readyz-sync.sh --loop /etc/nginx/conf.d/moshi.conf
#
# Needs bash, curl, sed. Prints one line per instance whose state it changed.
set -euo pipefail

loop=0
if [ "${1:-}" = --loop ]; then
    loop=1
    shift
fi
conf=${1:?usage: readyz-sync.sh [--loop] NGINX_CONF}
READYZ_TIMEOUT=${READYZ_TIMEOUT:-2}
INTERVAL=${INTERVAL:-5}
read -r -a nginx_test <<<"${NGINX_TEST:-nginx -t -q}"
read -r -a nginx_reload <<<"${NGINX_RELOAD:-nginx -s reload}"

sync_once() {
    local addrs new a re code
    # Upstream members only (HOST:PORT), not the `server {` blocks.
    addrs=$(sed -n -E 's/^[[:space:]]*server[[:space:]]+([A-Za-z0-9._-]+:[0-9]+)[[:space:];].*/\1/p' "$conf" | sort -u)
    new=$(mktemp)
    cp "$conf" "$new"
    for a in $addrs; do
        re=${a//./\\.}
        code=$(curl -s -o /dev/null -w '%{http_code}' --max-time "$READYZ_TIMEOUT" "http://$a/readyz" || true)
        if [ "$code" = 200 ] || [ "$code" = 503 ]; then
            sed -i -E "s/^([[:space:]]*server[[:space:]]+$re([[:space:]][^;]*)?)[[:space:]]+down;/\1;/" "$new"
        else
            sed -i -E "/^[[:space:]]*server[[:space:]]+$re[[:space:];]/{/[[:space:]]down;/!s/;[[:space:]]*$/ down;/}" "$new"
        fi
    done
    if cmp -s "$conf" "$new"; then
        rm -f "$new"
        return 0
    fi
    diff "$conf" "$new" | sed -n 's/^> *//p' | sed 's/^/readyz-sync: now /' || true
    # Swap the file in, and back out again if nginx finds it wrong.
    cp "$conf" "$new.old"
    cp "$new" "$conf"
    rm -f "$new"
    if ! "${nginx_test[@]}"; then
        cp "$new.old" "$conf"
        rm -f "$new.old"
        return 1
    fi
    rm -f "$new.old"
    "${nginx_reload[@]}"
}

sync_once
while [ "$loop" = 1 ]; do
    sleep "$INTERVAL"
    sync_once || echo "readyz-sync: pass failed (configuration left as it was checked)" >&2
done
