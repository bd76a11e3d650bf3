"""From MLflow runs to a decision record: the runs (`runs`, through the MLflow API only), the
references (`references`), one row per candidate (`table`), the report and its plots
(`report`, `plots`) and new references from a sweep (`baseline`). Imports `measure`,
`tracking` and `home` of the pipeline; never torch, the job or the store's files."""
