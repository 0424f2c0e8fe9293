"""Benchmarks: commands that measure, in one invocation, what the project claims."""
