#!/usr/bin/env bash
# The MLflow UI over the project's store (`make ui`). HOST, PORT and BACKEND come from make's
# environment as typed (SQ_HOST, SQ_PORT, SQ_BACKEND): they reach mlflow as single words,
# never as shell or make code. A port that is taken is an error (exit 2), not a silent exit 0.
set -euo pipefail
VENV=${1:-.venv}
HOST=${SQ_HOST:-127.0.0.1}
PORT=${SQ_PORT:-5000}
BACKEND=${SQ_BACKEND:-sqlite:///$PWD/mlruns.db}
if ! [[ "$PORT" =~ ^[0-9]{1,5}$ ]] || [ "$PORT" -lt 1 ] || [ "$PORT" -gt 65535 ]; then
  printf 'make ui: PORT=%q is not a port number (1-65535). Not started.\n' "$PORT" >&2
  exit 2
fi
# bind the address the UI will use, once, before MLflow does: its server only logs the error
if ! "$VENV/bin/python" - "$HOST" "$PORT" <<'PY'
import socket, sys
host, port = sys.argv[1], int(sys.argv[2])
try:
    infos = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM)
except (OSError, UnicodeError) as e:
    sys.exit(f"make ui: HOST={host!r} does not resolve ({e}). Not started.")
fam, _, _, _, addr = infos[0]
s = socket.socket(fam, socket.SOCK_STREAM)
try:
    s.bind(addr)
except OSError as e:
    sys.exit(f"make ui: {host}:{port} is taken ({e.strerror}); another UI or server runs there. "
             f"Stop it, or choose another port: make ui PORT={port + 1}. Not started.")
finally:
    s.close()
PY
then
  exit 2
fi
# no MLflow job runner (GenAI jobs): eight more processes that nothing here uses (mlflow_server.sh)
export MLFLOW_SERVER_ENABLE_JOB_EXECUTION=${MLFLOW_SERVER_ENABLE_JOB_EXECUTION:-false}
exec "$VENV/bin/mlflow" ui --backend-store-uri "$BACKEND" --host "$HOST" --port "$PORT"
