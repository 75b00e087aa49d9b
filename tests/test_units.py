"""Byte sizes as the plan prints them: three significant digits, never scientific notation."""

import torch
from hypothesis import given, strategies as st

import weightplan
from weightplan.units import format_bytes, parse_bytes

from tests.conftest import module_with, write_checkpoint


@given(st.integers(min_value=0, max_value=2**62))
def test_a_size_reads_back_within_its_rounding(n):
    text = format_bytes(n)
    assert "e" not in text.split()[0], text
    number, unit = text.split()
    if unit != "B":
        assert float(number) < 999.5 or unit == "TiB", text
    # half a unit in the third digit (0.5% of n at most), plus the whole byte parse_bytes
    # rounds to: 1152 B is 1.125 KiB, printed 1.12 KiB, read back as 1146 B
    assert abs(parse_bytes(text.replace(" ", "")) - n) <= 0.005 * n + 1, text


def test_a_plan_of_1000_kib_says_0_977_mib(tmp_path):
    tensor = torch.zeros(256_000)  # 1,024,000 bytes: 1000 KiB, printed "1e+03 KiB" before
    ckpt = write_checkpoint(tmp_path / "c", {"w": tensor})
    text = str(weightplan.explain(module_with({"w": ((256_000,), torch.float32)}), ckpt))
    assert "0.977 MiB" in text and "e+03" not in text


def test_a_lower_case_b_is_refused_not_read_as_bytes_or_bits():
    """transformers and accelerate read '5Gb' as gigabits (625 MB), '5GB' as bytes: the
    lower-case spelling is refused, naming both, instead of an 8× surprise either way."""
    import pytest

    from weightplan.errors import PlanError

    for text in ("5Gb", "500mb", "20Kb"):
        with pytest.raises(PlanError, match="bits to transformers.*write '"):
            parse_bytes(text, what="max_shard_size")
    assert parse_bytes("5GB") == 5 * 10**9 and parse_bytes("20KiB") == 20 * 1024
    assert parse_bytes("7b") == 7 and parse_bytes("3kib") == 3 * 1024
