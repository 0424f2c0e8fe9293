"""The configuration resolver: precedence of the layers and one-line errors that name the culprit."""

from __future__ import annotations

from pathlib import Path

import pytest

from slurm_elastic.config import ENV_PREFIX, JobConfig, resolve_config
from slurm_elastic.errors import ConfigError


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "job.toml"
    path.write_text(text)
    return path


def test_defaults() -> None:
    cfg = resolve_config()
    assert cfg == JobConfig()
    assert cfg.nodes == 1 and cfg.recovery == "in_process" and cfg.checkpoint_dir is None
    assert cfg.expected_workers == 1 and cfg.min_workers == 1


def test_precedence_cli_over_env_over_file_over_default(tmp_path: Path) -> None:
    path = write(tmp_path, 'nodes = 2\nport = 7000\nbackend = "gloo"\nmax_restarts = 9\n')
    env = {"SLURM_ELASTIC_NODES": "3", "SLURM_ELASTIC_PORT": "7001", "SLURM_ELASTIC_LOG_LEVEL": "DEBUG"}
    cfg = resolve_config({"nodes": 4, "port": None}, env, path)
    assert cfg.nodes == 4  # command line
    assert cfg.port == 7001  # environment (the command line said nothing: None)
    assert cfg.log_level == "DEBUG"  # environment only
    assert cfg.backend == "gloo" and cfg.max_restarts == 9  # file only
    assert cfg.hang_timeout_s == 60.0  # default
    assert resolve_config(None, env, path).nodes == 3
    assert resolve_config(None, None, path).nodes == 2


def test_env_values_are_parsed_and_other_prefixed_variables_ignored() -> None:
    env = {
        "SLURM_ELASTIC_LEASE_TIMEOUT_S": "2.5",
        "SLURM_ELASTIC_CHECKPOINT_DIR": "/ckpt",
        "SLURM_ELASTIC_WORKER_ID": "n1:0:0",  # set for workers; not a job setting
        "NODES": "7",
    }
    cfg = resolve_config(None, env)
    assert cfg.lease_timeout_s == 2.5 and cfg.checkpoint_dir == Path("/ckpt") and cfg.nodes == 1
    assert ENV_PREFIX == "SLURM_ELASTIC_"


def test_file_with_a_slurm_elastic_table(tmp_path: Path) -> None:
    path = write(tmp_path, "[tool.other]\nx = 1\n\n[slurm_elastic]\nnodes = 5\nmin_nodes = 2\nnproc_per_node = 4\n")
    cfg = resolve_config(file=path)
    assert cfg.nodes == 5 and cfg.expected_workers == 20 and cfg.min_workers == 8


def test_config_is_frozen() -> None:
    with pytest.raises(Exception, match="frozen"):
        resolve_config().nodes = 3  # type: ignore[misc]


def one_line(exc: pytest.ExceptionInfo[ConfigError]) -> str:
    text = str(exc.value)
    assert "\n" not in text
    return text


def test_bad_literal_from_the_command_line_names_the_flag_value_and_choices() -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_config({"recovery": "bogus"})
    assert one_line(exc) == "invalid --recovery: 'bogus' (input should be 'in_process', 'restart' or 'requeue')"


def test_bad_literal_from_the_environment_names_the_variable() -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_config({"recovery": None}, {"SLURM_ELASTIC_BACKEND": "mpi"})
    text = one_line(exc)
    assert text.startswith("invalid SLURM_ELASTIC_BACKEND: 'mpi' (")
    assert all(v in text for v in ("'auto'", "'gloo'", "'nccl'"))


def test_bad_value_from_a_file_names_the_setting_and_the_file(tmp_path: Path) -> None:
    path = write(tmp_path, 'recovery = "bogus"\n')
    with pytest.raises(ConfigError) as exc:
        resolve_config(file=path)
    text = one_line(exc)
    assert (
        text
        == f"invalid recovery in config file {path}: 'bogus' (input should be 'in_process', 'restart' or 'requeue')"
    )


def test_the_layer_that_set_the_value_is_blamed(tmp_path: Path) -> None:
    path = write(tmp_path, "nodes = 0\n")
    with pytest.raises(ConfigError, match=r"^invalid --nodes: -1 \(input should be greater than or equal to 1\)$"):
        resolve_config({"nodes": -1}, {"SLURM_ELASTIC_NODES": "2"}, path)
    with pytest.raises(ConfigError, match=r"^invalid SLURM_ELASTIC_NODES: 'four' \(input should be a valid integer"):
        resolve_config(None, {"SLURM_ELASTIC_NODES": "four"}, path)
    with pytest.raises(ConfigError, match=r"invalid --nproc-per-node: 0 "):
        resolve_config({"nproc_per_node": 0})


@pytest.mark.parametrize(
    ("cli", "needle"),
    [
        ({"port": 70000}, "invalid --port: 70000 (input should be less than or equal to 65535)"),
        ({"job_id": "a b"}, "invalid --job-id: 'a b' (string should match pattern"),
        ({"lease_timeout_s": 0}, "invalid --lease-timeout-s: 0 (input should be greater than 0)"),
        ({"log_format": "xml"}, "invalid --log-format: 'xml' (input should be 'console' or 'json')"),
    ],
)
def test_bad_cli_values(cli: dict[str, object], needle: str) -> None:
    with pytest.raises(ConfigError) as exc:
        resolve_config(cli)
    assert needle in one_line(exc)


def test_unknown_key_in_a_file(tmp_path: Path) -> None:
    path = write(tmp_path, "[slurm_elastic]\nnodez = 3\n")
    with pytest.raises(ConfigError) as exc:
        resolve_config(file=path)
    text = one_line(exc)
    assert text.startswith(f"unknown setting 'nodez' in config file {path} (valid: job_id, nodes, ")
    assert "recovery" in text and "ledger_dir" in text


def test_unknown_key_on_the_command_line() -> None:
    with pytest.raises(ConfigError, match=r"^unknown setting 'colour' in command line \(valid: "):
        resolve_config({"colour": "red"})


def test_unreadable_and_malformed_files(tmp_path: Path) -> None:
    missing = tmp_path / "missing.toml"
    with pytest.raises(ConfigError, match=rf"cannot read config file {missing}"):
        resolve_config(file=missing)
    bad = write(tmp_path, "nodes = [\n")
    with pytest.raises(ConfigError) as exc:
        resolve_config(file=bad)
    assert one_line(exc).startswith(f"config file {bad} is not valid TOML")
    scalar = write(tmp_path, "slurm_elastic = 3\n")
    with pytest.raises(ConfigError, match=r"\[slurm_elastic\] must be a table"):
        resolve_config(file=scalar)
