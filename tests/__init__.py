"""The tests (a package, so that tests.support and benchmarks import by name): unit/, integration/, support/."""
