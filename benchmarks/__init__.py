"""Measurements: load tests, the decode-step profile, and the charts and tables made from them.

Each script runs from the repository root either as a file (`python3 benchmarks/bench.py`)
or as a module (`python3 -m benchmarks.bench`). Run as a file, Python puts `benchmarks/` on
the import path instead of the root, so every script first inserts the root itself.

live_server.py starts, waits for and stops the servers the scripts measure (also from the
shell scripts, as a command) and reads their event streams; studies/ holds one-off studies.
"""
