"""All pure parsers of Slurm output, text in and records out (see parse_text and parse_json)."""

from __future__ import annotations

from .parse_json import json_version, parse_jobs_json, parse_nodes_json, parse_sinfo_json
from .parse_text import (
    TestOnlyResult,
    parse_duration_minutes,
    parse_key_values,
    parse_sbatch_parsable,
    parse_sbatch_test_only,
    parse_scontrol_jobs,
    parse_scontrol_nodes,
    parse_sinfo_nodes,
    parse_version,
)

__all__ = [
    "TestOnlyResult",
    "json_version",
    "parse_duration_minutes",
    "parse_jobs_json",
    "parse_key_values",
    "parse_nodes_json",
    "parse_sbatch_parsable",
    "parse_sbatch_test_only",
    "parse_scontrol_jobs",
    "parse_scontrol_nodes",
    "parse_sinfo_json",
    "parse_sinfo_nodes",
    "parse_version",
]
