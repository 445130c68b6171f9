"""A gzip file is held to a compression ratio on every path that reads one (issue 28): a file of
newlines that inflates a thousand times was read to its end by ``stepfork validate`` (40 minutes
for 1 GiB) and ``stepfork import`` (15 minutes), memory bounded but time not. Now each reader
stops with its typed error after the first megabytes, counted here in bytes, never in seconds."""

from __future__ import annotations

import gzip
import zlib
from pathlib import Path

import pytest

from stepfork_otel.cli import main
from stepfork_otel.trace.bundle import load_trace, read_trace, save_trace, schema_problems
from stepfork_otel.trace.errors import BundleError
from stepfork_otel.trace.limits import (
    DEFAULT_LIMITS,
    ExpansionLimitError,
    ReadLimits,
    open_regular,
)
from stepfork_otel.trace.otlp import ImportReport, OtlpImportError, iter_traces_from_otlp_json

EXPANDED = 200 << 20  # what the bomb inflates to: 200 MiB of newlines


def _bomb(path: Path) -> Path:
    """200 MiB of newlines, gzipped a megabyte at a time (~200 KB on disk)."""
    packer = zlib.compressobj(6, zlib.DEFLATED, 31)
    chunk = b"\n" * (1 << 20)
    with path.open("wb") as handle:
        for _ in range(EXPANDED >> 20):
            handle.write(packer.compress(chunk))
        handle.write(packer.flush())
    assert path.stat().st_size < EXPANDED // 500
    return path


@pytest.fixture(scope="module")
def bomb(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _bomb(tmp_path_factory.mktemp("bomb") / "newlines.sftrace.gz")


def _stopped_early(error: BaseException, path: Path) -> None:
    """The read stopped at the ratio limit, after a few kilobytes of the file and at most a few
    megabytes of what they expand to."""
    assert "(the compression-ratio limit;" in str(error)
    limit = error if isinstance(error, ExpansionLimitError) else error.__context__
    assert isinstance(limit, ExpansionLimitError)
    assert limit.consumed < path.stat().st_size // 20
    expanded = int(str(error).split("; ")[-1].split(" bytes")[0])
    assert DEFAULT_LIMITS.ratio_free_bytes < expanded <= 4 * DEFAULT_LIMITS.ratio_free_bytes
    assert expanded < EXPANDED // 50


def test_every_bundle_reader_stops_at_the_ratio(bomb: Path) -> None:
    for read in (load_trace, read_trace):
        with pytest.raises(BundleError) as info:
            read(bomb)
        _stopped_early(info.value, bomb)
    assert schema_problems(bomb) == []  # (an unreadable bundle: read_trace says why)


def test_the_importer_stops_at_the_ratio(bomb: Path, tmp_path: Path) -> None:
    otlp = tmp_path / "newlines.jsonl.gz"
    otlp.write_bytes(bomb.read_bytes())
    with pytest.raises(OtlpImportError) as info:
        list(iter_traces_from_otlp_json(otlp, report=ImportReport()))
    _stopped_early(info.value, otlp)


def test_validate_and_import_exit_2_with_one_line(
    bomb: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    otlp = tmp_path / "newlines.jsonl.gz"
    otlp.write_bytes(bomb.read_bytes())
    for argv in (["validate", str(bomb)], ["import", str(otlp), "-o", str(tmp_path / "out")]):
        assert main(argv) == 2
        (line,) = capsys.readouterr().err.strip().splitlines()
        assert "expands more than 200 times its compressed size" in line


def test_the_meter_counts_every_member_and_starts_again_on_rewind(tmp_path: Path) -> None:
    """Two members of 1 MiB of newlines each: neither alone is past the ratio-free start, both
    together are; reading the first member twice (a rewind in between) is not."""
    member = gzip.compress(b"\n" * (1 << 20))
    path = tmp_path / "two.gz"
    path.write_bytes(member * 3)
    limits = ReadLimits(ratio_free_bytes=(1 << 20) + 1)
    with open_regular(path, limits) as handle:
        assert handle.read(len(member)) == member
        handle.seek(0)
        assert handle.read(len(member)) == member
        with pytest.raises(ExpansionLimitError, match="compression-ratio limit"):
            handle.read()


def test_the_size_cap_holds_in_the_meter_too(tmp_path: Path) -> None:
    path = tmp_path / "spaces.gz"
    path.write_bytes(gzip.compress(b" " * (3 << 20)))
    limits = ReadLimits(max_decompressed_bytes=2 << 20, max_compression_ratio=10**6)
    with (
        open_regular(path, limits) as handle,
        pytest.raises(ExpansionLimitError, match="expands beyond 2097152 bytes"),
    ):
        handle.read()


def test_plain_files_and_ordinary_bundles_read_as_before(tmp_path: Path) -> None:
    """A small file expands as much as it likes below the ratio-free start; a real bundle
    compresses ~5 times; a plain file is not metered at all."""
    small = tmp_path / "small.gz"
    small.write_bytes(gzip.compress(b"\n" * (512 << 10)))
    with open_regular(small) as handle:
        assert gzip.decompress(handle.read()) == b"\n" * (512 << 10)
    golden = Path(__file__).parent / "golden" / "dinner_lisbon.sftrace"
    trace = load_trace(golden)
    compressed = save_trace(trace, tmp_path / "dinner.sftrace.gz")
    assert load_trace(compressed) == trace
    plain = tmp_path / "plain.sftrace"
    plain.write_bytes(b"\n" * (8 << 20))
    with open_regular(plain) as handle:
        assert not hasattr(handle, "_inflater")
        assert len(handle.read()) == 8 << 20
