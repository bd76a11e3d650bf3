"""Start-up (docs/design.md, "Start-up"): the check that names a login-node package, and the
per-node start-up figures in the record and the report. A rank's real imports, in a fresh
process each, are tests/integration/test_startup_imports.py's."""

from __future__ import annotations

from tests.support.startup import login_only


def test_the_check_sees_a_login_node_import() -> None:
    """The helper the tests rely on names a login-node package when one is loaded."""
    assert login_only({"torch", "mlflow.server.handlers", "matplotlib", "analysis.report"}) == [
        "analysis.report",
        "matplotlib",
        "mlflow.server.handlers",
    ]


def test_each_node_gets_its_slowest_rank_and_a_tag() -> None:
    from pipeline.job.startup import node_tags, per_node

    rows = [
        {"node": "a", "import_s": 2.0, "model_build_s": 0.5},
        {"node": "a", "import_s": 3.5, "model_build_s": 0.25},
        {"node": "b", "import_s": 1.0},
    ]
    nodes = per_node(rows)
    assert nodes == {"a": {"import_s": 3.5, "model_build_s": 0.5}, "b": {"import_s": 1.0}}
    assert node_tags(nodes) == {
        "sq.startup.a": "import_s=3.500 model_build_s=0.500",
        "sq.startup.b": "import_s=1.000",
    }


def test_the_report_names_a_node_whose_imports_take_three_times_the_partitions_median() -> None:
    from analysis.runs import RunRecord
    from analysis.startup import slow_nodes, startup_table

    def run(partition: str, tags: dict[str, str]) -> RunRecord:
        return RunRecord("id", "p", "FINISHED", 0, {"sq.partition": partition, **tags}, {}, {})

    runs = [
        # h100: nodes 1-3 import in about 2 s, node 4 in 6.5 s and 5.5 s (median 6.0 >= 3 x 2.0)
        run("h100", {"sq.startup.n1": "import_s=2.0 model_build_s=0.5", "sq.startup.n4": "import_s=6.5"}),
        run("h100", {"sq.startup.n2": "import_s=1.9", "sq.startup.n3": "import_s=2.1"}),
        run("h100", {"sq.startup.n4": "import_s=5.5 model_build_s=bad"}),
        run("a100", {"sq.startup.m1": "import_s=9.0", "sq.startup.m2": "import_s=10.0"}),
    ]
    # by hand: h100 node medians 2.0, 1.9, 2.1, 6.0 -> median (2.0 + 2.1) / 2 = 2.05; 3 x 2.05 = 6.15
    # > 6.0: not slow at 3x; at 2.9x (5.945) it is
    assert slow_nodes({"n1": 2.0, "n2": 1.9, "n3": 2.1, "n4": 6.0}) == []
    assert slow_nodes({"n1": 2.0, "n2": 1.9, "n3": 2.1, "n4": 6.0}, factor=2.9) == ["n4"]
    assert slow_nodes({"n1": 1.0, "n2": 1.0, "n3": 3.0}) == ["n3"]  # median 1.0, 3.0 >= 3 x 1.0
    table = startup_table(runs)
    by_node = {row[1]: row for row in table.rows}
    assert [row[0] for row in table.rows] == ["a100", "a100", "h100", "h100", "h100", "h100"]
    assert by_node["n4"][2:] == ["6.00", "-", "2.05", "2", "ok"]
    assert by_node["n1"][2:4] == ["2.00", "0.50"] and by_node["m1"][4] == "9.50"
    runs.append(run("h100", {"sq.startup.n4": "import_s=12.0"}))  # n4's median now 6.5 >= 6.15
    assert startup_table(runs).rows[5][-1].startswith("slow imports")
