"""Pure arithmetic, used by the login node, the job and `analysis/` alike: FLOPs and
parameters (`flops`), memory (`memory`), collective bandwidth (`comm`), cost and goodput
(`cost`), step-time statistics (`stats`), and the names of an attempt's timeline marks
(`timeline`, set by the trainer, read by the job). Plain numbers in, plain numbers out.

Import rule (tests/unit/test_boundaries.py): besides itself, of the project it may import nothing;
of libraries only the standard library and numpy.
"""
