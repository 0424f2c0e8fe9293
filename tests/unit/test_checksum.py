import subprocess
import sys
import zlib

import pytest
import torch

from slurm_elastic.worker.sharded import checksum


def _bytes(t: torch.Tensor) -> bytes:
    return t.contiguous().numpy().tobytes()


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16, torch.int8, torch.int64])
@pytest.mark.parametrize("shape", [(1,), (7,), (3, 5), (4096, 3)])
def test_the_crc_is_the_standard_crc32_of_the_tensor_bytes(dtype: torch.dtype, shape: tuple[int, ...]) -> None:
    t = (torch.randn(shape) * 100).to(dtype)
    raw = t.view(torch.uint8).numpy().tobytes() if dtype == torch.bfloat16 else _bytes(t)
    assert checksum.crc32(t) == zlib.crc32(raw)


def test_a_strided_view_is_checked_in_its_logical_order() -> None:
    t = torch.arange(24, dtype=torch.float32).reshape(4, 6)
    view = t.t()[1:4]
    assert not view.is_contiguous()
    assert checksum.crc32(view) == zlib.crc32(_bytes(view))


def test_a_digest_chains_the_tensors_in_order_and_skips_empty_ones() -> None:
    a, b, empty = torch.randn(100), torch.randn(33, dtype=torch.float64), torch.empty(0)
    assert checksum.digest([a, empty, b]) == zlib.crc32(_bytes(a) + _bytes(b))
    assert checksum.digest([b, a]) != checksum.digest([a, b])
    assert checksum.digest([]) == 0 == checksum.crc32(empty)


def test_one_flipped_bit_changes_the_digest() -> None:
    t = torch.randn(10_000)
    before = checksum.digest([t])
    t.view(torch.uint8)[12_345] ^= 4
    assert checksum.digest([t]) != before


def test_the_accelerated_crc_agrees_with_the_standard_library() -> None:
    """Ranks with and without the `fast` extra compare digests, so both engines must give the same values."""
    from zlib_ng import zlib_ng

    data = torch.randn(1 << 20).numpy().tobytes()
    for start in (0, 1, 0xFFFFFFFF, zlib.crc32(b"seed")):
        assert zlib_ng.crc32(data, start) == zlib.crc32(data, start)
        assert zlib_ng.crc32(data[:13], start) == zlib.crc32(data[:13], start)


def test_the_project_environment_uses_the_accelerated_crc() -> None:
    """The dev extra (what `make test` and the benchmarks install) includes zlib-ng: the figures the bench
    reports are those of an install with the `fast` extra."""
    assert checksum.ENGINE == "zlib-ng"


def test_without_the_fast_extra_the_standard_library_gives_the_same_digest() -> None:
    probe = (
        "import sys; sys.modules['zlib_ng'] = None\n"  # an install without the `fast` extra
        "import torch\n"
        "from slurm_elastic.worker.sharded import checksum\n"
        "print(checksum.ENGINE, checksum.digest([torch.arange(1000, dtype=torch.float32), torch.ones(3)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out[0] == "zlib"
    assert int(out[1]) == checksum.digest([torch.arange(1000, dtype=torch.float32), torch.ones(3)])
