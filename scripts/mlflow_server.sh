#!/usr/bin/env bash
# The MLflow tracking server for many concurrent jobs (`make mlflow-server`).
#
#   BACKEND=sqlite (default: mlruns.db in the project folder) | postgres (the project's own
#           PostgreSQL, cluster/postgres.sh, started if needed) | any SQLAlchemy URI
#   HOST=127.0.0.1 (default) PORT=5000 ARTIFACTS=<folder served by the server>
#   WORKERS=4 (default, MLflow's): request-handling processes
#
# Bound to 127.0.0.1 unless HOST says otherwise. Bound anywhere else, the server runs MLflow's
# basic-auth app, and refuses to start without credentials: MLFLOW_TRACKING_USERNAME and
# MLFLOW_TRACKING_PASSWORD in the environment (the same variables the jobs' MLflow client
# reads; or a netrc file for the clients). The admin password goes into a mode-600 config file
# and the process environment, never into a command line or a log.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}
HOST=${HOST:-127.0.0.1}
PORT=${PORT:-5000}
BACKEND=${BACKEND:-sqlite}
WORKERS=${WORKERS:-4}
ARTIFACTS=${ARTIFACTS:-$PWD/mlartifacts}
STATE=${SQ_MLFLOW_STATE:-$PWD/.cluster/mlflow}
if ! [[ "$PORT" =~ ^[0-9]{1,5}$ ]] || [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65535 ]; then
  printf 'mlflow-server: PORT=%q is not a port number (1-65535). Not started.\n' "$PORT" >&2
  exit 2
fi
if ! [[ "$HOST" =~ ^[A-Za-z0-9.:_-]+$ ]]; then
  printf 'mlflow-server: HOST=%q is not a host name or address. Not started.\n' "$HOST" >&2
  exit 2
fi
if ! [[ "$WORKERS" =~ ^[0-9]{1,3}$ ]] || [ "$WORKERS" -lt 1 ]; then
  printf 'mlflow-server: WORKERS=%q is not a number of processes (1-999). Not started.\n' "$WORKERS" >&2
  exit 2
fi
# MLflow 3's job runner (GenAI jobs: scorers, prompt optimisation) is on by default and starts
# eight more Python processes beside the server (a runner, seven huey consumers): 15 busy
# core-seconds at each start, measured here, and memory held for as long as it runs. Runs are
# only tracked here; set MLFLOW_SERVER_ENABLE_JOB_EXECUTION=true to have it anyway.
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
mkdir -p "$STATE" "$ARTIFACTS"
chmod 700 "$STATE"

case "$BACKEND" in
  sqlite) uri="sqlite:///$PWD/mlruns.db" ;;
  postgres)
    bash cluster/postgres.sh status 2>/dev/null || bash cluster/postgres.sh up >/dev/null
    eval "$(bash cluster/postgres.sh env)"  # PGPASSFILE: libpq reads the password from it
    export PGPASSFILE
    uri=$(bash cluster/postgres.sh uri) ;;
  *) uri=$BACKEND ;;
esac

args=(--backend-store-uri "$uri" --host "$HOST" --port "$PORT" --artifacts-destination "$ARTIFACTS" --serve-artifacts --workers "$WORKERS")
case "$HOST" in
  127.*|localhost|::1) loopback=1 ;;
  *) loopback=0 ;;
esac
if [ "$loopback" = 0 ] || [ "${SQ_MLFLOW_AUTH:-0}" = 1 ]; then
  if [ -z "${MLFLOW_TRACKING_USERNAME:-}" ] || [ -z "${MLFLOW_TRACKING_PASSWORD:-}" ]; then
    echo "mlflow-server: HOST=$HOST is reachable from other machines: set MLFLOW_TRACKING_USERNAME and MLFLOW_TRACKING_PASSWORD (the admin account of MLflow's basic-auth app; jobs use the same variables or a netrc file). Not started." >&2
    exit 2
  fi
  umask 077
  cat >"$STATE/basic_auth.ini" <<INI
[mlflow]
default_permission = READ
database_uri = sqlite:///$STATE/basic_auth.db
admin_username = $MLFLOW_TRACKING_USERNAME
authorization_function = mlflow.server.auth:authenticate_request_basic_auth
grant_default_workspace_access = false
INI
  # the Flask secret for CSRF tokens: one per state folder, kept across restarts (mode 600;
  # several servers behind one URL must share it: set MLFLOW_FLASK_SERVER_SECRET_KEY yourself)
  [ -s "$STATE/flask_secret" ] || head -c 32 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$STATE/flask_secret"
  export MLFLOW_FLASK_SERVER_SECRET_KEY=${MLFLOW_FLASK_SERVER_SECRET_KEY:-$(cat "$STATE/flask_secret")}
  export MLFLOW_AUTH_CONFIG_PATH=$STATE/basic_auth.ini
  export MLFLOW_AUTH_ADMIN_PASSWORD=$MLFLOW_TRACKING_PASSWORD
  # MLflow creates its admin only once, in basic_auth.db, and ignores a new password on later
  # starts: set the admin's password (and account) from the environment at every start, so the
  # new password works and the old one stops working; a previous admin of another name is removed.
  if [ -s "$STATE/basic_auth.db" ]; then
    SQ_AUTH_DB="sqlite:///$STATE/basic_auth.db" SQ_PREVIOUS_ADMIN=$(cat "$STATE/admin_user" 2>/dev/null || true) \
      "$VENV/bin/python" - <<'PY'
import os

from mlflow.server.auth.sqlalchemy_store import SqlAlchemyStore

store = SqlAlchemyStore()
store.init_db(os.environ["SQ_AUTH_DB"])
user, password = os.environ["MLFLOW_TRACKING_USERNAME"], os.environ["MLFLOW_TRACKING_PASSWORD"]
if store.has_user(user):
    store.update_user(user, password=password, is_admin=True)
else:
    store.create_user(user, password, is_admin=True)
previous = os.environ.get("SQ_PREVIOUS_ADMIN", "")
if previous and previous != user and store.has_user(previous):
    store.delete_user(previous)
PY
  fi
  printf '%s\n' "$MLFLOW_TRACKING_USERNAME" >"$STATE/admin_user"
  args+=(--app-name basic-auth)
fi
echo "mlflow-server: http://$HOST:$PORT, backend ${uri%%://*} ($BACKEND), artifacts $ARTIFACTS$([ "$loopback" = 1 ] || echo ', basic auth')"
exec "$VENV/bin/mlflow" server "${args[@]}"
