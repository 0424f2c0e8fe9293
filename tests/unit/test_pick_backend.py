"""Which backend a worker's process groups use: the model's device decides "auto" (a CPU model on a GPU host
trains over gloo; NCCL's collectives take CUDA tensors only, as a run on an H200 showed), and an explicit
NCCL for a CPU model is refused in one line that names the device."""

from __future__ import annotations

import pytest
import torch

from slurm_elastic.errors import ConfigError
from slurm_elastic.worker.membership.comm import pick_backend

CPU, GPU, META = torch.device("cpu"), torch.device("cuda", 0), torch.device("meta")


@pytest.mark.parametrize(
    ("requested", "device", "picked"),
    [
        ("auto", CPU, "gloo"),
        ("auto", META, "gloo"),
        ("auto", GPU, "nccl"),
        ("gloo", CPU, "gloo"),
        ("gloo", GPU, "gloo"),
        ("nccl", GPU, "nccl"),
    ],
)
def test_the_backend_follows_the_request_and_the_models_device(
    requested: str, device: torch.device, picked: str
) -> None:
    assert pick_backend(requested, device) == picked


@pytest.mark.parametrize("device", [CPU, META])
def test_nccl_for_a_model_off_the_gpu_is_refused_in_one_line_naming_the_device(device: torch.device) -> None:
    with pytest.raises(ConfigError) as refused:
        pick_backend("nccl", device)
    message = str(refused.value)
    assert "\n" not in message
    assert f"not {device.type}" in message and "'nccl'" in message and "'gloo' or 'auto'" in message
