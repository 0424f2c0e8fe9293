"""Shared pieces of the command line: job settings as flags, results, and error reporting."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from slurm_elastic.config import JobConfig, resolve_config
from slurm_elastic.sanitize import printable_lines


def add_job_flags(parser: argparse.ArgumentParser) -> None:
    """Every JobConfig field as a flag; values are validated by the config model, not by argparse."""
    group = parser.add_argument_group("job settings (also SLURM_ELASTIC_<NAME> or --config FILE)")
    group.add_argument("--config", type=Path, default=None, help="a TOML file with job settings")
    for name, field in JobConfig.model_fields.items():
        flag = "--" + name.replace("_", "-")
        group.add_argument(
            flag,
            dest=f"cfg_{name}",
            default=None,
            metavar="VALUE",
            help=field.description or f"default: {field.default}",
        )


def job_config(args: argparse.Namespace, env: Any, **overrides: Any) -> JobConfig:
    cli = {k[4:]: v for k, v in vars(args).items() if k.startswith("cfg_") and v is not None}
    cli.update({k: v for k, v in overrides.items() if v is not None})
    return resolve_config(cli, env, args.config)


def command_after_dashes(argv: list[str]) -> list[str]:
    return argv[1:] if argv[:1] == ["--"] else argv


def print_result(result: dict[str, Any], as_json: bool) -> None:
    """A command's result: one JSON object, or one `key: value` line per entry."""
    if as_json:
        print(json.dumps(result))
    else:
        for key, value in result.items():
            print(f"{key}: {value}")


def fail(message: str, code: int = 2) -> int:
    """Print the error (which may quote a worker's stderr or a peer's reason: shown, never acted on)."""
    print(f"slurm-elastic: error: {printable_lines(message)}", file=sys.stderr)
    return code
