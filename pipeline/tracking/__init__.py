"""MLflow, without losing anything: every key the project logs (`keys`), the append-first
ledger each job logs through and its replay (`ledger`), and the store and the login node's
run calls (`store`). Torch-free; imports only `home` of the project."""
