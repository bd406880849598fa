"""One-off studies behind a choice or a figure in the docs (which library, which kernel, how
accurate a quantization is); rerun by hand, not part of benchmarks/run_all.sh. Like the
scripts one folder up, each runs from the repository root as a file or as a module.
"""
