"""A full disk is survived (issue 16, item 2): the real `memoria serve` on a small filesystem.

The data dir is a 64 MiB tmpfs mounted for the test (root needed; CI runs as root, and a run
without it fails with a clear message rather than skipping). The server runs with a 16 MiB
watermark. A file then fills the filesystem to below the watermark: writes that add data are
refused with STORAGE_FULL (RESOURCE_EXHAUSTED), reads and search keep working, health's
overall entry turns NOT_SERVING while each service stays SERVING, the process stays up; the
file removed, everything resumes by itself. A restart while the disk is short refuses in one
line, without a traceback.

On PostgreSQL (a cluster of the test's own on a small tmpfs, filled the same way) a write the
database cannot make room for answers STORAGE_FULL too, and writes resume once space returns.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path

import grpc
import pytest
from google.protobuf.timestamp_pb2 import Timestamp
from grpc_health.v1 import health_pb2, health_pb2_grpc

from memoria.v1 import conversation_search_service_pb2 as search_pb
from memoria.v1 import conversation_search_service_pb2_grpc as search_grpc
from memoria.v1 import memory_block_pb2 as block_pb
from memoria.v1 import memory_block_service_pb2 as pb
from memoria.v1 import memory_block_service_pb2_grpc as pb_grpc
from server.adapters.sql import migrate
from server.adapters.sql.blocks import SqlMemoryStore
from server.adapters.sql.database import SqlDatabase
from server.adapters.sql.engine import create_store_engine
from server.domain.errors import ErrorReason, MemoriaError
from server.domain.memory import MemoryBlocks
from server.domain.model import Identity, Writer
from tests.api.conftest import Metadata, error_info
from tests.conftest import APP_ROLE
from tests.postgres_server import OwnPostgres, free_port
from tests.processes import MEMORIA, clean_env, wait_for_port

MiB = 1 << 20
DISK = 64 * MiB
WATERMARK = 16 * MiB
START_TIMEOUT_S = 60.0
WHO: Metadata = (("x-memoria-tenant", "t-disk"), ("x-memoria-principal", "ana"))
SERVING = health_pb2.HealthCheckResponse.SERVING
NOT_SERVING = health_pb2.HealthCheckResponse.NOT_SERVING
SERVICES = (
    "memoria.v1.MemoryBlockService",
    "memoria.v1.AuditService",
    "memoria.v1.ConversationSearchService",
)


@contextlib.contextmanager
def _tmpfs(mount: Path, size: int) -> Iterator[Path]:
    """A tmpfs of `size` bytes at `mount`, unmounted at the end."""
    if os.geteuid() != 0:
        pytest.fail("test_disk_full mounts a small tmpfs and needs root (CI runs as root)")
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(mount)], check=True)
    try:
        yield mount
    finally:
        subprocess.run(["umount", "-l", str(mount)], check=True)


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """A 64 MiB tmpfs."""
    with _tmpfs(tmp_path / "disk", DISK) as mount:
        yield mount


def _free(path: Path) -> int:
    stat = os.statvfs(path)
    return stat.f_bavail * stat.f_frsize


def _fill(path: Path, leave: int) -> Path:
    """A file that leaves `leave` bytes free on the filesystem of `path`."""
    filler = path / "filler"
    with filler.open("wb") as file:
        os.posix_fallocate(file.fileno(), 0, _free(path) - leave)
    return filler


def _env() -> dict[str, str]:
    return clean_env(
        MEMORIA_DISK_MIN_FREE_BYTES=str(WATERMARK),
        MEMORIA_DISK_MIN_FREE_PERCENT="0",
        MEMORIA_SHUTDOWN_GRACE_SECONDS="1",
    )


def _command(data_dir: Path) -> list[str]:
    return [str(MEMORIA), "serve", "--listen", "127.0.0.1:0", "--data-dir", str(data_dir)]


def _serve(data_dir: Path, tmp_path: Path, log: Path) -> subprocess.Popen[bytes]:
    port_file = tmp_path / "port"
    port_file.unlink(missing_ok=True)
    with log.open("wb") as out:
        return subprocess.Popen(
            [*_command(data_dir), "--port-file", str(port_file)],
            cwd=tmp_path,
            env=_env(),
            stdout=out,
            stderr=subprocess.STDOUT,
        )


def _watch_until(channel: grpc.Channel, service: str, status: int) -> None:
    """Follow health Watch of `service` until it reports `status` (bounded by the call)."""
    watch = health_pb2_grpc.HealthStub(channel).Watch(
        health_pb2.HealthCheckRequest(service=service), timeout=15
    )
    try:
        for response in watch:
            if response.status == status:
                return
    finally:
        watch.cancel()


def _rewrite(blocks: pb_grpc.MemoryBlockServiceStub, text: str) -> pb.RewriteMemoryBlockResponse:
    request = pb.RewriteMemoryBlockRequest(text=text, writer=block_pb.WRITER_USER)
    return blocks.RewriteMemoryBlock(request, metadata=WHO, timeout=10)


def _index(search: search_grpc.ConversationSearchServiceStub, turn: str) -> None:
    search.IndexTurn(
        search_pb.IndexTurnRequest(
            conversation_id="c-1",
            turn_id=turn,
            question=f"Which account did refund {turn} go to?",
            answer=f"To acct-48{turn}, on 2026-11-02.",
            turn_time=Timestamp(seconds=1_790_000_000),
            wait=True,
        ),
        metadata=WHO,
        timeout=30,
    )


def _refused_full(call: grpc.RpcError) -> bool:
    assert isinstance(call, grpc.Call)
    return (
        call.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        and error_info(call).reason == "ERROR_REASON_STORAGE_FULL"
    )


def test_a_full_disk_refuses_writes_keeps_reads_and_recovers(
    small_disk: Path, tmp_path: Path
) -> None:
    data_dir = small_disk / "data"
    log = tmp_path / "server.log"
    process = _serve(data_dir, tmp_path, log)
    try:
        port = wait_for_port(process, tmp_path / "port", log, timeout=START_TIMEOUT_S)
        channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        blocks = pb_grpc.MemoryBlockServiceStub(channel)
        search = search_grpc.ConversationSearchServiceStub(channel)
        _rewrite(blocks, "Preferred name: Ana")
        _index(search, "1")
        assert _free(small_disk) > WATERMARK, "the server alone must fit on the disk"

        filler = _fill(small_disk, leave=WATERMARK // 2)
        _watch_until(channel, "", NOT_SERVING)  # the monitor's next probe (about 1 s)
        health = health_pb2_grpc.HealthStub(channel)
        for service in SERVICES:  # reads keep working, so the services stay in rotation
            check = health.Check(health_pb2.HealthCheckRequest(service=service), timeout=5)
            assert check.status == SERVING, service

        # Every write that adds data is refused, several times over (none slips through).
        for attempt in range(5):
            with pytest.raises(grpc.RpcError) as caught:
                _rewrite(blocks, f"Preferred name: Ana {attempt}")
            assert _refused_full(caught.value)
            info = error_info(caught.value)
            assert int(info.metadata["free_bytes"]) < int(info.metadata["watermark_bytes"])
        with pytest.raises(grpc.RpcError) as caught:
            blocks.UpdateMemorySettings(
                pb.UpdateMemorySettingsRequest(memory_enabled=False, writer=block_pb.WRITER_USER),
                metadata=WHO,
                timeout=10,
            )
        assert _refused_full(caught.value)
        with pytest.raises(grpc.RpcError) as caught:
            _index(search, "2")
        assert _refused_full(caught.value)

        # Reads and search work; an identical rewrite is the no-op it always is.
        got = blocks.GetMemoryBlock(pb.GetMemoryBlockRequest(), metadata=WHO, timeout=10)
        assert got.memory_block.text == "Preferred name: Ana"
        render = blocks.RenderMemoryBlock(pb.RenderMemoryBlockRequest(), metadata=WHO, timeout=10)
        assert render.prompt_section.endswith("Preferred name: Ana")
        assert _rewrite(blocks, "Preferred name: Ana").changed is False
        found = search.SearchConversations(
            search_pb.SearchConversationsRequest(query="acct-481"), metadata=WHO, timeout=10
        )
        assert [hit.turn_id for hit in found.hits] == ["1"]
        assert process.poll() is None, "the server must stay up"

        # Space returns: health and writes come back by themselves.
        filler.unlink()
        _watch_until(channel, "", SERVING)
        assert _rewrite(blocks, "Preferred name: Ana B.").changed is True
        _index(search, "2")
        found = search.SearchConversations(
            search_pb.SearchConversationsRequest(query="acct-482"), metadata=WHO, timeout=10
        )
        assert "2" in [hit.turn_id for hit in found.hits]
        output = log.read_text(errors="replace")
        assert output.count("health: data dir short of space") == 1, output
        assert output.count("health: data dir has space again") == 1, output
        assert "Traceback" not in output
        channel.close()
    finally:
        process.terminate()
        assert process.wait(timeout=30) == 0

    # A restart on a short disk refuses in one line, at once.
    _fill(small_disk, leave=WATERMARK // 2)
    restart = subprocess.run(
        _command(data_dir),
        cwd=tmp_path,
        env=_env(),
        capture_output=True,
        text=True,
        timeout=START_TIMEOUT_S,
    )
    assert restart.returncode == 1
    lines = restart.stderr.strip().splitlines()
    last = lines[-1]
    assert last.startswith(f"memoria serve: the data dir {data_dir} has "), restart.stderr
    assert "below the watermark of 16.0 MiB" in last
    assert not any("Traceback" in line for line in lines), restart.stderr


@pytest.fixture
def pg_disk() -> Iterator[Path]:
    """A 160 MiB tmpfs (room for a fresh cluster and its first WAL segments) under /tmp,
    which the `postgres` user can reach (pytest's tmp_path is not, when run as root)."""
    parent = Path(tempfile.mkdtemp(prefix="memoria-pg-disk-"))
    parent.chmod(0o755)
    try:
        with _tmpfs(parent / "disk", 160 * MiB) as mount:
            mount.chmod(0o755)
            yield mount
    finally:
        shutil.rmtree(parent, ignore_errors=True)


@pytest.fixture
def postgres_on_small_disk(pg_disk: Path) -> Iterator[OwnPostgres]:
    """A PostgreSQL cluster of this test's own whose data directory is on a small tmpfs."""
    cluster = OwnPostgres(pg_disk / "pg", free_port())
    cluster.directory.mkdir()
    cluster.directory.chmod(0o755)
    cluster.start()
    try:
        owner = create_store_engine(cluster.owner_url, pool_size=1)
        try:
            migrate.upgrade(owner, app_role=APP_ROLE)
        finally:
            owner.dispose()
        yield cluster
    finally:
        cluster.stop()


@pytest.mark.postgres
def test_postgres_out_of_disk_answers_storage_full_and_recovers(
    postgres_on_small_disk: OwnPostgres, pg_disk: Path
) -> None:
    """PostgreSQL refuses to extend a table on a full disk (SQLSTATE 53100, "could not extend
    file"); Memoria answers STORAGE_FULL for that write, reads keep working, and writes resume
    once space is freed. (The data dir watermark is not involved: it guards embedded stores.)"""
    store = SqlMemoryStore(
        SqlDatabase(create_store_engine(postgres_on_small_disk.app_url, pool_size=2))
    )
    blocks = MemoryBlocks(store, lambda: datetime.now(UTC))
    ana = Identity("t-pg-disk", "ana")
    try:
        blocks.rewrite(ana, "Preferred name: Ana", Writer.USER)
        filler = _fill(pg_disk, leave=256 << 10)
        refused: MemoriaError | None = None
        for attempt in range(2000):  # each write adds a row version and an audit event
            try:
                blocks.rewrite(ana, f"Preferred name: Ana\n{attempt} " + "y" * 3900, Writer.USER)
            except MemoriaError as error:
                refused = error
                break
        assert refused is not None, "the disk never filled"
        print(f"\nPostgreSQL refused write {attempt}: {refused.reason} {refused.message}")
        assert refused.reason is ErrorReason.STORAGE_FULL, refused.reason
        assert blocks.get(ana).text.startswith("Preferred name: Ana")  # reads keep working

        filler.unlink()
        blocks.rewrite(ana, "Preferred name: Ana B.", Writer.USER)
        assert blocks.get(ana).text == "Preferred name: Ana B."
    finally:
        store.db.dispose()
