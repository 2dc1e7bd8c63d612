"""Benchmarks of compress against the tools users would pick instead (see README.md)."""
