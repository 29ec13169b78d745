"""``python -m bench``: the benchmark suite of subagents (run from the repository).

Each ``bench/*_bench.py`` module registers groups with :func:`bench._harness.group`;
every compared row names a baseline measured in the same run. See README.md.
"""
