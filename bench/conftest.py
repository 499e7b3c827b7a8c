"""Benchmarks (pytest-benchmark). Run: pytest bench/ --benchmark-columns=min,median,ops"""
