#!/usr/bin/env bash
# A PostgreSQL server for the MLflow tracking server, owned by this project: a database cluster
# in $SQ_PG_DIR (default .cluster/pg), listening on 127.0.0.1 only, with a role and a database
# for MLflow created by this script. The password lives in a pgpass file (mode 600) that libpq
# reads (PGPASSFILE); it never appears in a URI, a command line or a log.
#
#   bash cluster/postgres.sh install   apt-get install postgresql (Debian's 15; root)
#   bash cluster/postgres.sh up        init (once) and start; prints the backend-store URI
#   bash cluster/postgres.sh down      stop (the data stays)
#   bash cluster/postgres.sh status    exit 0 when it answers
#   bash cluster/postgres.sh uri       the SQLAlchemy URI for `mlflow server --backend-store-uri`
#   bash cluster/postgres.sh env       `export PGPASSFILE=...` for the shell that starts the server
#
# Run as root (it starts the server as the `postgres` system user, which PostgreSQL requires)
# or as an ordinary user (the server then runs as that user).
set -euo pipefail
cd "$(dirname "$0")/.."
PG_DIR=${SQ_PG_DIR:-$PWD/.cluster/pg}
PG_PORT=${SQ_PG_PORT:-5433}
PG_DB=${SQ_PG_DB:-mlflow}
PG_ROLE=${SQ_PG_ROLE:-sq}
DATA=$PG_DIR/data
PASSFILE=$PG_DIR/pgpass
LOG=$PG_DIR/postgres.log

bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do [ -x "$d/initdb" ] && { echo "$d"; return; }; done
  command -v initdb >/dev/null 2>&1 && { dirname "$(command -v initdb)"; return; }
  echo "postgres: no PostgreSQL server here: bash cluster/postgres.sh install (root, Debian)" >&2
  return 1
}

as_owner() {  # run a server command as the data folder's owner
  if [ "$(id -u)" = 0 ]; then runuser -u postgres -- "$@"; else "$@"; fi
}

cmd_install() {
  export DEBIAN_FRONTEND=noninteractive
  command -v apt-get >/dev/null || { echo "postgres: install needs apt-get (Debian)" >&2; exit 1; }
  bindir >/dev/null 2>&1 || { apt-get update -qq && apt-get install -y -qq postgresql >/dev/null; }
  bindir
}

cmd_status() {
  local bin; bin=$(bindir)
  "$bin/pg_isready" -q -h 127.0.0.1 -p "$PG_PORT"
}

cmd_up() {
  local bin; bin=$(bindir)
  mkdir -p "$PG_DIR"
  chmod 711 "$PG_DIR"  # the server (user postgres) must reach data/; the pgpass file stays 600
  if [ ! -s "$PASSFILE" ]; then
    local pw; pw=${SQ_PG_PASSWORD:-$(head -c 24 /dev/urandom | od -An -tx1 | tr -d ' \n')}
    umask 077
    printf '127.0.0.1:%s:%s:%s:%s\n' "$PG_PORT" "$PG_DB" "$PG_ROLE" "$pw" >"$PASSFILE"
  fi
  chmod 600 "$PASSFILE"
  if [ ! -f "$DATA/PG_VERSION" ]; then
    mkdir -p "$DATA"
    [ "$(id -u)" = 0 ] && chown -R postgres: "$DATA"
    chmod 700 "$DATA"
    as_owner "$bin/initdb" -D "$DATA" -U postgres --auth-local=trust --auth-host=scram-sha-256 >/dev/null
    {
      echo "listen_addresses = '127.0.0.1'"
      echo "port = $PG_PORT"
      echo "unix_socket_directories = '$DATA'"
      echo "max_connections = 300"
      echo "password_encryption = scram-sha-256"
    } >>"$DATA/postgresql.conf"
    # local socket: trust (the folder is the owner's only); TCP: password (scram) only
    printf 'local all all trust\nhost all all 127.0.0.1/32 scram-sha-256\n' >"$DATA/pg_hba.conf"
    [ "$(id -u)" = 0 ] && chown postgres: "$DATA/postgresql.conf" "$DATA/pg_hba.conf"
  fi
  if ! cmd_status 2>/dev/null; then
    [ "$(id -u)" = 0 ] && { touch "$LOG"; chown postgres: "$LOG"; }
    as_owner "$bin/pg_ctl" -D "$DATA" -l "$LOG" -w -t 60 start >/dev/null
  fi
  local pw; pw=$(cut -d: -f5- "$PASSFILE")
  # role and database, idempotent; the password goes through stdin, never argv
  as_owner "$bin/psql" -qAt -h "$DATA" -p "$PG_PORT" -U postgres -d postgres -v ON_ERROR_STOP=1 <<SQL >/dev/null
SELECT 'CREATE ROLE $PG_ROLE LOGIN' WHERE NOT EXISTS (SELECT 1 FROM pg_roles WHERE rolname = '$PG_ROLE')\gexec
ALTER ROLE $PG_ROLE PASSWORD '$pw';
SELECT 'CREATE DATABASE $PG_DB OWNER $PG_ROLE' WHERE NOT EXISTS (SELECT 1 FROM pg_database WHERE datname = '$PG_DB')\gexec
SQL
  echo "postgres: up on 127.0.0.1:$PG_PORT, database $PG_DB, role $PG_ROLE (password in $PASSFILE)"
  cmd_uri
}

cmd_down() {
  local bin; bin=$(bindir)
  if [ -f "$DATA/postmaster.pid" ]; then
    as_owner "$bin/pg_ctl" -D "$DATA" -m fast -w -t 60 stop >/dev/null || true
  fi
  echo "postgres: down"
}

cmd_uri() { echo "postgresql+psycopg://$PG_ROLE@127.0.0.1:$PG_PORT/$PG_DB"; }
cmd_env() { echo "export PGPASSFILE=$PASSFILE"; }

case "${1:-}" in
  install) cmd_install ;;
  up) cmd_up ;;
  down) cmd_down ;;
  status) cmd_status ;;
  uri) cmd_uri ;;
  env) cmd_env ;;
  *) echo "usage: $0 install|up|down|status|uri|env" >&2; exit 2 ;;
esac
