# Sourced by .ci/run (and usable by hand: `source .ci/postgres.sh && start_postgres`): a
# throwaway PostgreSQL on loopback for the ledger tests, stopped when the shell exits.
# Installs Debian's `postgresql` package when no server is present. Needs root.

start_postgres() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  PG_DIR=$(mktemp -d /tmp/idempotent-retry-pg.XXXXXX)
  chown postgres "$PG_DIR"
  # A free loopback port: the first one nothing answers on.
  PG_PORT=""
  local port
  for port in $(seq 25432 25532); do
    if ! (exec 3<>"/dev/tcp/127.0.0.1/$port") 2>/dev/null; then
      PG_PORT=$port
      break
    fi
  done
  if [ -z "$PG_PORT" ]; then
    echo "no free port for PostgreSQL" >&2
    return 1
  fi
  runuser -u postgres -- "$bin/initdb" -D "$PG_DIR/data" -A trust -U postgres >/dev/null
  runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR/data -c max_connections=100" start >/dev/null
  PG_BIN=$bin
  trap stop_postgres EXIT
  export IDEMPOTENT_RETRY_PG_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
  echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT"
}

stop_postgres() {
  if [ -n "${PG_DIR:-}" ] && [ -d "$PG_DIR/data" ]; then
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null || true
    rm -rf "$PG_DIR"
  fi
}
