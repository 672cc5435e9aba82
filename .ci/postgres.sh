# A throwaway PostgreSQL cluster for the multi-machine tuning test (tests/studies/test_tune_postgres.py).
# Source it, then `pg_start`: it initialises a cluster in a temp folder, starts it on a free private port
# (Unix socket in the same folder), exports TREEWISE_PG_URL and stops and deletes the cluster at exit.
# As root the server runs as the `postgres` user (PostgreSQL refuses root); installs it with apt when absent.

_pg_bin() {
  local initdb
  initdb=$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
  if [ -z "$initdb" ] && [ "$(id -u)" = 0 ]; then
    apt-get update -q >/dev/null && DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
    initdb=$(ls -d /usr/lib/postgresql/*/bin/initdb 2>/dev/null | sort -V | tail -n 1 || true)
  fi
  [ -n "$initdb" ] || { echo "pg_start: no PostgreSQL server binaries (apt-get install postgresql)" >&2; return 1; }
  dirname "$initdb"
}

_pg_as() {  # run a command as the cluster's owner
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

pg_stop() {
  if [ -n "${_PG_DIR:-}" ] && [ -d "$_PG_DIR" ]; then
    _pg_as "$_PG_BIN/pg_ctl" -D "$_PG_DIR/data" -m immediate -w stop >/dev/null 2>&1 || true
    rm -rf "$_PG_DIR"
  fi
}

pg_start() {
  _PG_BIN=$(_pg_bin) || return 1
  _PG_DIR=$(mktemp -d /tmp/treewise-pg.XXXXXX)
  trap pg_stop EXIT
  if [ "$(id -u)" = 0 ]; then chown postgres "$_PG_DIR"; fi
  local port
  port=$(python3 -c 'import socket; s = socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])')
  _pg_as "$_PG_BIN/initdb" -D "$_PG_DIR/data" -A trust -U postgres >"$_PG_DIR/initdb.log" 2>&1 \
    || { cat "$_PG_DIR/initdb.log" >&2; return 1; }
  _pg_as "$_PG_BIN/pg_ctl" -D "$_PG_DIR/data" -l "$_PG_DIR/server.log" -w \
    -o "-p $port -k $_PG_DIR -c listen_addresses=127.0.0.1 -c fsync=off" start >/dev/null \
    || { cat "$_PG_DIR/server.log" >&2; return 1; }
  export TREEWISE_PG_URL="postgresql://postgres@127.0.0.1:$port/postgres"
  echo "PostgreSQL $("$_PG_BIN/postgres" --version | awk '{print $3}') for the tests at $TREEWISE_PG_URL"
}
