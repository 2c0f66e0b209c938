# Sourced by .ci/run (and usable by hand: `source .ci/postgres.sh && start_postgres`): a
# throwaway PostgreSQL on loopback for the ledger tests, stopped when the shell exits.
# Installs Debian's `postgresql` package when no server is present. Needs root.
#
# The server speaks plain TCP and TLS on one port, with a certificate for 127.0.0.1 and
# localhost signed by a CA made here. It exports IDEMPOTENT_RETRY_PG_URL (plain),
# IDEMPOTENT_RETRY_PG_TLS_URL (sslmode=require) and IDEMPOTENT_RETRY_PG_CA (the CA's PEM file,
# which the TLS tests trust).

start_postgres() {
  local bin
  bin=$(ls -d /usr/lib/postgresql/*/bin 2>/dev/null | sort -V | tail -n 1)
  if [ -z "$bin" ] || [ ! -x "$bin/initdb" ]; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q postgresql >/dev/null
    bin=$(ls -d /usr/lib/postgresql/*/bin | sort -V | tail -n 1)
  fi
  if ! command -v openssl >/dev/null; then
    apt-get update -q
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q openssl >/dev/null
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
  # P-256 keys: generated in milliseconds, where RSA would slow the start.
  local tls=$PG_DIR/tls
  mkdir "$tls"
  openssl req -x509 -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$tls/ca.key" -out "$tls/ca.pem" -days 2 -subj "/CN=idempotent-retry test CA" \
    2>/dev/null
  openssl req -new -nodes -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 \
    -keyout "$tls/server.key" -out "$tls/server.csr" -subj "/CN=127.0.0.1" 2>/dev/null
  printf 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n' \
    >"$tls/server.ext"
  openssl x509 -req -in "$tls/server.csr" -CA "$tls/ca.pem" -CAkey "$tls/ca.key" \
    -CAcreateserial -out "$tls/server.pem" -days 2 -extfile "$tls/server.ext" 2>/dev/null
  chown -R postgres "$tls"
  chmod 600 "$tls/server.key"
  runuser -u postgres -- "$bin/pg_ctl" -D "$PG_DIR/data" -l "$PG_DIR/log" -w \
    -o "-c listen_addresses=127.0.0.1 -p $PG_PORT -k $PG_DIR/data -c max_connections=100 \
        -c ssl=on -c ssl_cert_file=$tls/server.pem -c ssl_key_file=$tls/server.key" start >/dev/null
  PG_BIN=$bin
  trap stop_postgres EXIT
  export IDEMPOTENT_RETRY_PG_URL="postgresql://postgres@127.0.0.1:$PG_PORT/postgres"
  export IDEMPOTENT_RETRY_PG_TLS_URL="$IDEMPOTENT_RETRY_PG_URL?sslmode=require"
  export IDEMPOTENT_RETRY_PG_CA="$tls/ca.pem"
  echo "PostgreSQL $("$bin/postgres" --version | awk '{print $3}') on 127.0.0.1:$PG_PORT"
}

stop_postgres() {
  if [ -n "${PG_DIR:-}" ] && [ -d "$PG_DIR/data" ]; then
    runuser -u postgres -- "$PG_BIN/pg_ctl" -D "$PG_DIR/data" -m fast -w stop >/dev/null || true
    rm -rf "$PG_DIR"
  fi
}
